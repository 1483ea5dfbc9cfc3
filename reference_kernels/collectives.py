"""Reference collectives as pure functions of every rank's input.

Each function takes the list of all ranks' tensors (index = rank) and returns what the
collective must produce. Reductions accumulate in float64 (int64 for integer dtypes) and round
once to ``out_dtype`` (default: the input dtype), so with exact-by-construction inputs the
result is the one every summation order gives, and with random inputs a float64 value to
compare against under a tolerance.
"""

from __future__ import annotations

import functools
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
    wide = [x.to(_accumulator(dtype)) for x in inputs]
    if op in ("sum", "avg", "prod"):
        # rank by rank, as a ring or tree adds: IEEE gives -0.0 + -0.0 = -0.0, while
        # torch.sum starts from +0.0 and returns +0.0
        combine = torch.mul if op == "prod" else torch.add
        result = functools.reduce(combine, wide)
        if op == "avg":
            result = result / len(inputs)
    else:
        stacked = torch.stack(wide)
        result = stacked.amin(0) if op == "min" else stacked.amax(0)
    return result.to(out_dtype or dtype)


def allgather(inputs: Sequence[torch.Tensor], splits: Sequence[int] | None = None) -> torch.Tensor:
    """Every rank's flat input, concatenated in rank order; every rank receives this.

    ``splits`` (counts summing to each input's numel) says the input is the shard of several
    tensors laid end to end, as ZeRO-3 keeps a rank's parameter shards: then the output holds
    each gathered tensor contiguously, in order, each one the concatenation of its shards in
    rank order. Without ``splits`` it is one tensor: a plain allgather.
    """
    if not inputs:
        raise ValueError("allgather needs the input of at least one rank")
    flat = [x.reshape(-1) for x in inputs]
    n = flat[0].numel()
    if any(f.numel() != n or f.dtype != flat[0].dtype for f in flat):
        raise ValueError("allgather needs the same count and dtype on every rank")
    splits = [n] if splits is None else list(splits)
    if sum(splits) != n or any(s < 0 for s in splits):
        raise ValueError(f"splits {splits} do not add up to the per-rank count {n}")
    pieces = []
    offset = 0
    for count in splits:
        pieces.extend(f[offset : offset + count] for f in flat)
        offset += count
    return torch.cat(pieces)


def reduce_scatter(
    inputs: Sequence[torch.Tensor],
    op: str,
    rank: int,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Piece ``rank`` of the elementwise reduction of every rank's input: each input holds W
    equal pieces, and rank r receives the reduction of piece r (the allreduce, scattered)."""
    if not inputs:
        raise ValueError("reduce_scatter needs the input of at least one rank")
    world = len(inputs)
    numel = inputs[0].numel()
    if any(x.numel() != numel for x in inputs):
        raise ValueError("reduce_scatter needs the same count on every rank")
    if numel % world:
        raise ValueError(f"reduce_scatter input of {numel} elements does not split into "
                         f"{world} equal pieces")
    n = numel // world
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    pieces = [x.reshape(-1)[rank * n : (rank + 1) * n] for x in inputs]
    return allreduce(pieces, op, out_dtype=out_dtype)


def all_to_all(
    inputs: Sequence[torch.Tensor], send_counts: Sequence[Sequence[int]], rank: int
) -> torch.Tensor:
    """What ``rank`` receives: from every rank j in rank order, the piece j addressed to it.

    ``send_counts[j][r]`` is how many elements rank j sends to rank r; rank j's input holds its
    pieces for ranks 0..W-1 back to back. Equal splits are the case send_counts[j][r] == n.
    """
    world = len(inputs)
    if len(send_counts) != world or any(len(row) != world for row in send_counts):
        raise ValueError(f"send_counts must be {world} x {world}")
    if any(c < 0 for row in send_counts for c in row):
        raise ValueError("send_counts must not be negative")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    received = []
    for j, x in enumerate(inputs):
        row = list(send_counts[j])
        if sum(row) != x.numel():
            raise ValueError(f"rank {j} sends {sum(row)} elements but holds {x.numel()}")
        start = sum(row[:rank])
        received.append(x.reshape(-1)[start : start + row[rank]])
    return torch.cat(received)


def broadcast(inputs: Sequence[torch.Tensor], root: int) -> torch.Tensor:
    """Root's input; every rank receives it (the other ranks' inputs are not read)."""
    if not 0 <= root < len(inputs):
        raise ValueError(f"root {root} is outside a world of {len(inputs)}")
    return inputs[root].clone()
