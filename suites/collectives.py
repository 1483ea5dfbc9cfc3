"""Collectives: allreduce (nccl-tests style), with torch.distributed, mpi4py and Mirage's tile
decomposition as implementations.

Inputs come in two modes. ``exact``: small integers chosen so that every partial result is
exactly representable in the dtype, so every summation order gives the same bits and the check
is bitwise (nccl-tests, torch's c10d tests; 2 ulp for float avg, as nccl-tests allows).
``random``: uniform(-1, 1) values checked against a float64 reference within the error bound
of recursive summation (Higham: |err| <= (W-1) u sum|x_i|, plus the final rounding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness import compare
from harness.inputs import dtype_from_name, generate, seed_from
from harness.spec import OpSpec, Work
from reference_kernels import collectives as ref

FAMILY = "collectives"


# ---------------------------------------------------------------- inputs and expectations
def _precision_bits(dtype: torch.dtype) -> int:
    """Largest p such that every integer of magnitude <= 2**p is exact in ``dtype``."""
    if dtype.is_floating_point:
        return round(-math.log2(torch.finfo(dtype).eps)) + 1
    return torch.iinfo(dtype).bits - 1


def _exact_bound(dtype: torch.dtype, world_size: int) -> int:
    """Magnitude bound per element so that sums over up to max(W, 8) ranks stay exact."""
    return max(1, (2 ** _precision_bits(dtype) - 1) // max(world_size, 8))


def _rank_input(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s input: row ``rank`` of a global (ranks, n) tensor."""
    dtype = dtype_from_name(params["dtype"])
    n, op, mode = int(params["n"]), params["op"], params["mode"]
    seed = seed_from("allreduce", mode, op, params["dtype"], n)
    shape = (max(world_size, rank + 1), n)
    region = (rank,)
    if mode == "random":
        return generate(shape, dtype, seed=seed, dist="uniform", low=-1.0, high=1.0,
                        region=region)
    if op == "prod":
        # factors of magnitude 1 or 2: any product is a signed power of two, exact everywhere
        mag = generate(shape, torch.int64, seed=seed, dist="int", low=0, high=1, region=region)
        sign = generate(shape, torch.int64, seed=seed + 1, dist="sign", region=region)
        return (sign * (1 + mag)).to(dtype)
    bound = _exact_bound(dtype, world_size)
    return generate(shape, dtype, seed=seed, dist="int", low=-bound, high=bound, region=region)


def allreduce_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Keyword arguments of one rank's allreduce call."""
    return {"x": _rank_input(params, rank, world_size), "op": params["op"],
            "inplace": bool(params["inplace"])}


def allreduce_expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """The reference over every rank's input: rounded once to the dtype in exact mode, float64
    in random mode (compared under the summation error bound)."""
    inputs = [_rank_input(params, r, world_size) for r in range(world_size)]
    out_dtype = torch.float64 if params["mode"] == "random" else None
    return ref.allreduce(inputs, params["op"], out_dtype=out_dtype)


def allreduce_tolerance(params: Mapping[str, Any], world_size: int) -> compare.Tolerance:
    dtype = dtype_from_name(params["dtype"])
    if params["mode"] == "random":
        unit_roundoff = torch.finfo(dtype).eps / 2
        rtol, _ = compare.DEFAULT_RTOL_ATOL[dtype]
        # inputs in [-1, 1): sum|x_i| <= W, so |err| <= (W-1) * u * W before the last rounding;
        # avg divides that error by W (a bound W times too loose let a dropped rank pass)
        scale = 1 if params["op"] == "avg" else world_size
        return compare.allclose(rtol=rtol, atol=max(world_size - 1, 1) * unit_roundoff * scale)
    if params["op"] == "avg":
        return compare.ulp(2)
    return compare.exact()


def allreduce_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S/t, busbw = algbw * 2(W-1)/W, S the bytes per rank."""
    size = int(params["n"]) * dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=size, bus_bytes=size * 2 * (world_size - 1) / world_size)


# ---------------------------------------------------------------- implementations
def _torch_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}[op]


def allreduce_torch(world: Any, x: torch.Tensor, op: str, inplace: bool) -> torch.Tensor:
    """torch.distributed.all_reduce (gloo has no AVG: sum, then divide)."""
    import torch.distributed as dist

    buf = x if inplace else x.clone()
    if op == "avg" and world.backend != "nccl":
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=world.group)
        buf.div_(world.size)
    else:
        dist.all_reduce(buf, op=_torch_op(op), group=world.group)
    return buf


# MPI has no standard 16-bit float datatype: half types travel as float32, which is exact for
# the conversion and at least as accurate for the reduction.
_MPI_WIRE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _mpi_cuda_aware() -> bool:
    from mpi4py import MPI

    query = getattr(MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query else False
    except Exception:
        return False


def allreduce_mpi(world: Any, x: torch.Tensor, op: str, inplace: bool) -> torch.Tensor:
    """mpi4py Allreduce on host buffers (device buffers when the MPI library is CUDA-aware)."""
    from mpi4py import MPI

    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}
    wire_dtype = _MPI_WIRE.get(x.dtype, x.dtype)
    on_device = x.device.type == "cuda" and _mpi_cuda_aware()
    buf = x if on_device else x.cpu()
    if wire_dtype != x.dtype or not inplace or buf is not x:
        buf = buf.to(wire_dtype, copy=True)
    if buf.device.type == "cuda":
        torch.cuda.current_stream().synchronize()  # MPI does not know torch's stream
        world.comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op[op])
    else:
        world.comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=mpi_op[op])
    if op == "avg":
        buf.div_(world.size)
    result = buf.to(device=x.device, dtype=x.dtype)
    if inplace:
        if result.data_ptr() != x.data_ptr():
            x.copy_(result)
        return x
    return result


def _allgather_rows(world: Any, x: torch.Tensor) -> torch.Tensor:
    """(W, *x.shape) buffer holding every rank's input."""
    import torch.distributed as dist

    flat = x.contiguous().reshape(-1)
    buf = torch.empty(world.size * flat.numel(), dtype=x.dtype, device=x.device)
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(buf, flat, group=world.group)
    return buf.view(world.size, *x.shape)


def _reduce_rows(rows: torch.Tensor, op: str, acc: torch.dtype) -> torch.Tensor:
    a = rows.to(acc)
    if op in ("sum", "avg"):
        out = a.sum(0)
        return out / rows.shape[0] if op == "avg" else out
    if op == "prod":
        return a.prod(0)
    return a.amin(0) if op == "min" else a.amax(0)


def _finish(x: torch.Tensor, result: torch.Tensor, inplace: bool) -> torch.Tensor:
    if inplace:
        x.copy_(result)
        return x
    return result.to(x.dtype)


def allreduce_tile(world: Any, x: torch.Tensor, op: str, inplace: bool) -> torch.Tensor:
    """Mirage's decomposition: allgather into a (W, ...) buffer, then a local float32
    reduction (int64 for integers)."""
    rows = _allgather_rows(world, x)
    acc = torch.float32 if x.dtype.is_floating_point else torch.int64
    return _finish(x, _reduce_rows(rows, op, acc), inplace)


# ---------------------------------------------------------------- negative controls
def allreduce_drop_rank(world: Any, x: torch.Tensor, op: str, inplace: bool) -> torch.Tensor:
    """Bug: the last rank's contribution is lost (an off-by-one in the ring)."""
    rows = _allgather_rows(world, x)
    if world.size > 1:
        rows = rows[:-1]
    acc = torch.float64 if x.dtype.is_floating_point else torch.int64
    result = _reduce_rows(rows, op, acc)
    if op == "avg":
        result = result * rows.shape[0] / world.size
    return _finish(x, result, inplace)


_LOW = {torch.float32: torch.bfloat16, torch.float64: torch.float32,
        torch.bfloat16: torch.float8_e4m3fn, torch.float16: torch.float8_e4m3fn,
        torch.int32: torch.int16, torch.int64: torch.int32}


def allreduce_low_precision(world: Any, x: torch.Tensor, op: str, inplace: bool) -> torch.Tensor:
    """Bug: partial results are kept in a narrower type than the data (bf16 for float32,
    fp8 for 16-bit floats, int16 for int32)."""
    rows = _allgather_rows(world, x)
    low = _LOW[x.dtype]
    acc = rows[0].to(low)
    for i in range(1, world.size):
        step = "sum" if op == "avg" else op
        partial = _reduce_rows(torch.stack([acc.to(x.dtype), rows[i]]), step, x.dtype)
        acc = partial.to(low)
    result = acc.to(x.dtype)
    if op == "avg":
        result = result / world.size
    return _finish(x, result, inplace)


# ---------------------------------------------------------------- grids
_FLOAT_OPS = ("sum", "prod", "min", "max", "avg")
_INT_OPS = ("sum", "prod", "min", "max")


def _case(dtype: str, n: int, op: str, inplace: bool = False, mode: str = "exact") -> dict:
    return {"dtype": dtype, "n": n, "op": op, "inplace": inplace, "mode": mode}


def _smoke() -> list[dict]:
    cases = [_case(dt, 1031, op) for dt in ("f32", "bf16") for op in _FLOAT_OPS]
    cases += [_case("i32", 1031, op) for op in _INT_OPS]
    cases += [_case(dt, 1031, op, inplace=True) for dt in ("f32", "bf16") for op in ("sum", "max")]
    cases += [_case("f16", 7, "sum"), _case("f32", 1, "sum"), _case("bf16", 65539, "sum", True)]
    cases += [_case("f32", 4099, "sum", mode="random"), _case("bf16", 4099, "avg", mode="random")]
    return cases


def _nightly() -> list[dict]:
    """nccl-tests' sweep: 8 B to 64 MiB per rank by factors of 2 for sum, every op and dtype
    at a few sizes, counts that are not powers of two, in- and out-of-place, random mode."""
    cases = []
    for dt in ("f32", "bf16", "f16", "i32"):
        item = dtype_from_name(dt).itemsize
        sizes = [max(1, (8 << k) // item) for k in range(24)]  # 8 B .. 64 MiB, factor 2
        for n in sizes:
            for inplace in (False, True):
                cases.append(_case(dt, n, "sum", inplace))
        ops = _FLOAT_OPS if dt != "i32" else _INT_OPS
        for op in ops:
            for n in (1, 1000003 // item, (16 << 20) // item + 3):
                cases.append(_case(dt, n, op))
    for dt in ("f32", "bf16", "f16"):
        for op in ("sum", "avg"):
            cases.append(_case(dt, (1 << 20) + 17, op, mode="random"))
    # de-duplicate while keeping order (sum at n=1 appears twice)
    seen, out = set(), []
    for c in cases:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


ALLREDUCE = OpSpec(
    name="allreduce",
    family=FAMILY,
    description="Elementwise reduction across ranks; every rank gets the result.",
    reference=ref.allreduce,
    make_inputs=allreduce_inputs,
    expected=allreduce_expected,
    tolerance=allreduce_tolerance,
    work=allreduce_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": allreduce_torch, "mpi": allreduce_mpi, "tile": allreduce_tile},
    negative_controls={"drop_rank": allreduce_drop_rank, "low_precision": allreduce_low_precision},
    distributed=True,
    inplace_inputs=("x",),
    deadline_s=60.0,
)

SPECS = [ALLREDUCE]
