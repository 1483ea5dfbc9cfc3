"""What an op suite may import: the stable surface for suites in other repositories.

Everything here keeps its name and meaning across minor releases; a change is announced in the
changelog one release ahead. Suites import from here only (``from harness.api import OpSpec,
case_tensor, allclose``), never from the harness's other modules, which may change; the
built-in suites too.

- Describing an op: ``OpSpec``, ``Work``, ``SpecError``.
- Tolerances (``harness.core.compare``): ``exact``, ``allclose``, ``ulp``, ``cos_diff``,
  ``cos_diff_per_row`` (each row's own: a fault confined to one token), ``rel_l2``,
  ``all_of``, ``default_for``, ``rounding`` (the precision lens's share, for an output
  ``OpSpec.exact`` names: ``{"out:exact": rounding(0.1)}``), ``rounded_near`` (a quantizer's
  codes against its float64 quotient), and ``Tolerance`` itself.
- Inputs (``harness.core.inputs``): ``case_tensor`` (an op's deterministic input, by name),
  ``generate`` (the generator under it), ``seed_from``, ``hash32``, ``special_values`` and
  ``plant_specials`` (-0.0, subnormals, inf, NaN for ops that move bits), ``dtype_from_name``.
- Testing an op in the suite's own tests: ``run_cases(spec, "impl or control")`` runs each
  case at world size 1 in this process, through every check of a run, and returns the
  results (``.status``, ``.reason``); multi-rank bugs need ``harness run --world-sizes 4``.
- Buffers (``harness.core.buffers``): ``poisoned`` (a new buffer full of poison, for an op's
  output buffers) and ``overlaps`` (whether two tensors share memory).
- Memory: ``available_bytes`` (what a new tensor can use on a device, for a case's skip).
- CUDA C++ and Triton implementations: ``from_source`` (a CUDA C++ file made an
  implementation), ``cuda_launch`` (its launch, inside a launcher), ``TritonImplementation``
  (a Triton kernel's wrapper, run by Triton's interpreter on the CPU).
- ``DEFAULT_RTOL_ATOL``: the (rtol, atol) ``default_for`` takes per dtype.
- Distributed ops: ``shard`` (a rank's slice of a dimension). Implementations receive the
  ``World`` first: ``world.rank``, ``world.size``, ``world.device``, ``world.group`` (a
  torch.distributed process group) and ``world.comm`` (an mpi4py communicator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.core.buffers import overlaps, poisoned
from harness.core.compare import (
    DEFAULT_RTOL_ATOL,
    Tolerance,
    all_of,
    allclose,
    cos_diff,
    cos_diff_per_row,
    default_for,
    exact,
    rel_l2,
    rounded_near,
    rounding,
    ulp,
)
from harness.core.inputs import (
    dtype_from_name,
    generate,
    hash32,
    plant_specials,
    seed_from,
    special_values,
)
from harness.core.spec import OpSpec, SpecError, Work
from harness.device.cuda_impl import cuda_launch, from_source
from harness.device.memory import available_bytes
from harness.device.triton_impl import TritonImplementation
from harness.engine.local import run_cases

__all__ = [
    "DEFAULT_RTOL_ATOL", "OpSpec", "SpecError", "Tolerance", "TritonImplementation", "Work",
    "all_of", "allclose", "available_bytes", "case_tensor", "cos_diff", "cos_diff_per_row",
    "cuda_launch", "default_for", "dtype_from_name", "exact", "from_source", "generate",
    "hash32", "overlaps", "plant_specials", "poisoned", "rel_l2", "rounded_near", "rounding",
    "run_cases", "seed_from", "shard", "special_values", "ulp",
]


def case_tensor(op: str, params: Mapping[str, Any], name: str, shape: tuple[int, ...],
                dtype: torch.dtype = torch.bfloat16, *, low: float = -1.0, high: float = 1.0,
                dist: str = "uniform", region: object = None) -> torch.Tensor:
    """The input ``name`` of one case of ``op``: deterministic from (op, params, name), the same
    on every machine and rank, uniform in [low, high) by default (``dist`` as in
    ``generate``). ``region`` makes only a rank's part of a global tensor (a tuple of slices,
    e.g. ``(slice(None), shard(n, rank, world_size))``)."""
    key = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return generate(shape, dtype, seed=seed_from(op, key, name), dist=dist, low=low, high=high,
                    region=region)


def shard(total: int, rank: int, world_size: int, *, uneven: bool = False) -> slice:
    """Rank ``rank``'s equal slice of a dimension of ``total``; a ValueError when it does not
    split evenly (say so in the grid rather than pad silently). ``uneven=True`` takes
    torch.chunk's rule instead: chunks of ceil(total / world_size), the last ranks' shorter or
    empty (5 over 4 ranks: 2, 2, 1, 0), as DTensor's Shard places them."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    if uneven:
        size = -(-total // world_size)
        return slice(min(total, rank * size), min(total, (rank + 1) * size))
    if total % world_size:
        raise ValueError(f"a dimension of {total} does not split over {world_size} ranks; "
                         "shard(..., uneven=True) takes torch.chunk's rule")
    size = total // world_size
    return slice(rank * size, (rank + 1) * size)
