"""What the collective ops share: inputs by construction, tolerances, and the plumbing of the
torch.distributed and mpi4py implementations.

Every collective writes into the output buffer the harness passes as ``out`` (poisoned, so an
element left unwritten fails). In-place cases pass overlapping buffers, as nccl-tests does:
``out is x`` for allreduce and broadcast, ``x`` is ``out``'s own-rank piece for allgather, and
``out`` is ``x``'s own-rank piece for reduce_scatter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness.api import (
    DEFAULT_RTOL_ATOL,
    Tolerance,
    allclose,
    dtype_from_name,
    exact,
    generate,
    plant_specials,
    poisoned,
    seed_from,
    ulp,
)
from suites._grid import unique  # noqa: F401  (the collectives' grids import it here)


# ---------------------------------------------------------------- inputs
def precision_bits(dtype: torch.dtype) -> int:
    """Largest p such that every integer of magnitude <= 2**p is exact in ``dtype``."""
    if dtype.is_floating_point:
        return round(-math.log2(torch.finfo(dtype).eps)) + 1
    return torch.iinfo(dtype).bits - 1


def full_mantissa_uniform(shape: tuple[int, ...], dtype: torch.dtype, seed: int,
                          region: Any = None) -> torch.Tensor:
    """Uniform values in [-1, 1) that carry the dtype's full mantissa: two draws (each on a
    grid of about 2**-22) combined in float64, then rounded once. Values on a coarse grid
    add exactly while partial sums stay small, so every order of adding three ranks gives
    the same bits, and a rank that adds in its own order would pass."""
    coarse = generate(shape, torch.float64, seed=seed, dist="uniform", low=-1.0, high=1.0,
                      region=region)
    fine = generate(shape, torch.float64, seed=seed + 7, dist="uniform", low=-1.0, high=1.0,
                    region=region)
    return (coarse + fine * 2.0**-24).clamp(-1.0, 1.0).to(dtype)


def exact_bound(dtype: torch.dtype, world_size: int) -> int:
    """Magnitude bound per element so that sums over up to max(W, 8) ranks stay exact."""
    return max(1, (2 ** precision_bits(dtype) - 1) // max(world_size, 8))


def rank_values(tag: str, params: Mapping[str, Any], rank: int, world_size: int, count: int,
                *, sums: bool) -> torch.Tensor:
    """Rank ``rank``'s ``count`` input values, a pure function of (tag, params, rank).

    ``exact`` mode: integers exact in the dtype; bounded so that sums over the ranks stay exact
    when ``sums`` (reductions), over the dtype's whole exact range otherwise (data movement,
    where many distinct values make a misplaced element visible). ``random`` mode: uniform
    values in [-1, 1) for floats; integers as in exact mode. ``special`` mode: for data
    movement, exact mode with -0.0, subnormals, +-inf and NaN planted (harness.core.inputs.
    plant_specials), which a copy carries bit for bit and arithmetic on the way does not; for
    sums, ``plant_sum_specials``.
    """
    dtype = dtype_from_name(params["dtype"])
    mode = params["mode"]
    key = ",".join(f"{k}={params[k]}" for k in sorted(params))
    seed = seed_from(tag, key, world_size if sums else 0, rank)
    if mode == "random" and dtype.is_floating_point:
        return full_mantissa_uniform((count,), dtype, seed)
    if mode not in ("exact", "random", "special"):
        raise ValueError(f"mode {mode!r}: use exact, random or special")
    bound = exact_bound(dtype, world_size) if sums else 2 ** min(precision_bits(dtype), 62) - 1
    values = generate((count,), dtype, seed=seed, dist="int", low=-bound, high=bound)
    if mode != "special":
        return values
    if sums and params.get("op") in ("min", "max"):
        return plant_extreme_specials(values, rank, world_size)
    if sums:
        return plant_sum_specials(values, rank, world_size)
    return plant_specials(values, every=5 + rank % 3)


#: special values of a sum, by position modulo 11 (the rest are exact-mode integers)
SUM_SPECIAL_PERIOD = 11


def plant_sum_specials(values: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s part of a sum whose special results every summation order gives (IEEE
    754): -0.0 on every rank sums to -0.0 (an accumulator started at +0.0 gives +0.0); the
    smallest subnormal on every rank sums exactly to W of them (a kernel that flushes
    subnormals gives 0); NaN on one rank gives NaN; +inf on one rank gives +inf; +inf and -inf
    on two ranks give NaN. Changes ``values`` (a float tensor) in place and returns it."""
    if not values.dtype.is_floating_point:
        return values
    flat = values.view(-1)
    info = torch.finfo(values.dtype)
    last = world_size - 1
    where = torch.arange(flat.numel()) % SUM_SPECIAL_PERIOD
    flat[where == 0] = -0.0
    flat[where == 2] = info.tiny * info.eps  # the smallest subnormal, exactly
    if rank == 0:
        flat[where == 4] = math.nan
        flat[where == 8] = math.inf
    if rank == last:
        flat[where == 6] = math.inf
        if last:
            flat[where == 8] = -math.inf
    return values


def plant_extreme_specials(values: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s part of a min or max whose special values every order gives: rank r
    holds r + 1 times the smallest subnormal (min: one of them, max: W of them; a path that
    flushes subnormals gives 0), and its negative, at positions 2 and 4 modulo
    SUM_SPECIAL_PERIOD; +inf on rank 0 and -inf on the last rank. No NaN (MPI's MAX and
    torch's disagree on it) and no zero (the sign of min(-0.0, +0.0) is left open by IEEE)."""
    if not values.dtype.is_floating_point:
        return values
    flat = values.view(-1)
    info = torch.finfo(values.dtype)
    where = torch.arange(flat.numel()) % SUM_SPECIAL_PERIOD
    smallest = info.tiny * info.eps
    flat[where == 2] = smallest * (rank + 1)
    flat[where == 4] = -smallest * (rank + 1)
    if rank == 0:
        flat[where == 6] = math.inf
    if rank == world_size - 1:
        flat[where == 8] = -math.inf
    return values


def reduction_out(shape: int | tuple[int, ...], dtype: torch.dtype, op: str) -> torch.Tensor:
    """An out-of-place reduction's output buffer: poison (NaN, the integer minimum), but for
    min and max the value that wins the reduction (-inf or the integer minimum for min, +inf
    or the maximum for max): fmax and fmin skip NaN, and the integer minimum is max's identity,
    so a kernel that folds the ranks into whatever ``out`` held would pass on poison."""
    out = poisoned(shape, dtype)
    if op in ("min", "max"):
        low = op == "min"
        if dtype.is_floating_point:
            out.fill_(-math.inf if low else math.inf)
        else:
            info = torch.iinfo(dtype)
            out.fill_(info.min if low else info.max)
    return out


def resolve_root(root: int, world_size: int) -> int:
    """A root written as an index into the ranks (-1 is the last rank), for any world size."""
    return root % world_size


# ---------------------------------------------------------------- checks
def reduction_tolerance(params: Mapping[str, Any], world_size: int) -> Tolerance:
    """Bitwise for exact inputs and for min/max (which never round), any NaN for a NaN (a
    sum's NaN is computed: its bits are the device's); 2 ulp for float avg (nccl-tests); random
    sums within Higham's bound for recursive summation, random products within (W-1) roundings."""
    dtype = dtype_from_name(params["dtype"])
    op = params["op"]
    if op in ("min", "max"):
        return exact(any_nan=True)
    if params["mode"] == "random":
        unit_roundoff = torch.finfo(dtype).eps / 2
        rtol, _ = DEFAULT_RTOL_ATOL[dtype]
        if op == "prod":
            # each of the W - 1 products rounds once: |err| <= (W-1) u |prod|, relative
            # whatever the magnitude (a product of W values in [-1, 1) can be tiny)
            return allclose(rtol=rtol + max(world_size - 1, 1) * unit_roundoff,
                            atol=torch.finfo(dtype).tiny)
        # inputs in [-1, 1): sum|x_i| <= W, so |err| <= (W-1) * u * W before the last rounding;
        # avg divides that error by W (a bound W times too loose let a dropped rank pass),
        # and NCCL's premultiplied avg adds two roundings a term (_premul_avg_roundings)
        if op == "avg":
            roundings = max(world_size - 1, 1) + _premul_avg_roundings(world_size)
            return allclose(rtol=rtol, atol=roundings * unit_roundoff)
        return allclose(rtol=rtol, atol=max(world_size - 1, 1) * unit_roundoff * world_size)
    if op == "avg":
        if _premul_avg_roundings(world_size) and dtype.is_floating_point:
            # each term x_i * fl(1/W) off by 2u|x_i|/W, and the W - 1 sums of such terms,
            # partial sums up to the bound B, off by u*B each: (W + 1) u B at most, which on
            # inputs that cancel is many ulps of the result (a dropped rank is B/W off)
            bound = exact_bound(dtype, world_size)
            return allclose(rtol=2 * torch.finfo(dtype).eps,
                            atol=(world_size + 1) * torch.finfo(dtype).eps / 2 * bound)
        return ulp(2)
    return exact(any_nan=True)


def _premul_avg_roundings(world_size: int) -> int:
    """Roundings per term of NCCL's float avg beyond a sum's: NCCL multiplies each rank's
    value by 1/W held in the dtype before summing (``ncclDevPreMulSum``, src/enqueue.cc),
    exact where W is a power of two, two roundings a term (1/W's and the product's)
    elsewhere."""
    return 0 if world_size & (world_size - 1) == 0 else 2


# ---------------------------------------------------------------- torch.distributed
def torch_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}[op]


def native_avg(world: Any) -> bool:
    """NCCL has an AVG reduction; gloo does not (sum, then divide)."""
    return world.backend == "nccl"


def dist_fn(new: str, old: str) -> Any:
    """torch 2.13 renamed the tensor collectives (all_gather_into_tensor ->
    all_gather_single, reduce_scatter_tensor -> reduce_scatter_single); take whichever this
    torch has, the new name first."""
    import torch.distributed as dist

    return getattr(dist, new, None) or getattr(dist, old)


def gather_rows(world: Any, x: torch.Tensor) -> torch.Tensor:
    """(W, *x.shape): every rank's x, gathered through one flat buffer."""
    flat = x.contiguous().reshape(-1)
    buf = torch.empty(world.size * flat.numel(), dtype=x.dtype, device=x.device)
    dist_fn("all_gather_single", "all_gather_into_tensor")(buf, flat, group=world.group)
    return buf.view(world.size, *x.shape)


# ---------------------------------------------------------------- mpi4py
# MPI has no standard 16-bit float datatype: reductions on half types travel as float32, which
# is exact for the conversion and at least as accurate for the arithmetic. Data movement sends
# raw bytes, which is exact for every dtype.
MPI_WIRE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def mpi_op(op: str) -> Any:
    from mpi4py import MPI

    return {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "avg": MPI.SUM}[op]


def host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor (MPI built without CUDA support reads host memory);
    host tensors are used as they are."""
    if t.device.type == "cuda":
        return t.cpu()
    return t


def as_bytes(t: torch.Tensor) -> Any:
    """A numpy uint8 view of a contiguous host tensor: the buffer MPI sends or fills."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("MPI buffers must be contiguous host tensors")
    return t.reshape(-1).view(torch.uint8).numpy()


def as_array(t: torch.Tensor) -> Any:
    """A numpy view of a contiguous host tensor of an MPI-native dtype."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("MPI buffers must be contiguous host tensors")
    return t.reshape(-1).numpy()


def is_same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same buffer (an in-place call)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


# ---------------------------------------------------------------- grids


def sweep_counts(dtype: str, low_bytes: int = 8, high_bytes: int = 64 << 20) -> list[int]:
    """nccl-tests' sweep: element counts for low..high bytes by factors of 2."""
    item = dtype_from_name(dtype).itemsize
    counts, size = [], low_bytes
    while size <= high_bytes:
        counts.append(max(1, size // item))
        size *= 2
    return sorted(set(counts))
