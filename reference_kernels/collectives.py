"""Reference collectives as pure functions of every rank's input.

Each function takes the list of all ranks' tensors (index = rank) and returns what the
collective must produce. Reductions accumulate in float64 (int64 for integer dtypes) and round
once to ``out_dtype`` (default: the input dtype), so with exact-by-construction inputs the
result is the one every summation order gives, and with random inputs a float64 value to
compare against under a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

REDUCE_OPS = ("sum", "prod", "min", "max", "avg")


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_floating_point:
        return torch.float64
    if dtype == torch.bool:
        return torch.int64
    return torch.int64


def allreduce(
    inputs: Sequence[torch.Tensor], op: str = "sum", out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Elementwise reduction of all ranks' tensors; every rank receives this result.

    ``avg`` is the sum divided by the number of ranks and is defined for floating dtypes only
    (NCCL's ncclAvg; gloo has none).
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction {op!r}; use one of {REDUCE_OPS}")
    if not inputs:
        raise ValueError("allreduce needs the input of at least one rank")
    dtype = inputs[0].dtype
    if op == "avg" and not dtype.is_floating_point:
        raise ValueError("avg is defined for floating dtypes only")
    stacked = torch.stack([x.to(_accumulator(dtype)) for x in inputs])
    if op == "sum":
        result = stacked.sum(0)
    elif op == "prod":
        result = stacked.prod(0)
    elif op == "min":
        result = stacked.amin(0)
    elif op == "max":
        result = stacked.amax(0)
    else:
        result = stacked.sum(0) / len(inputs)
    return result.to(out_dtype or dtype)
