"""allreduce (nccl-tests style), with torch.distributed, mpi4py and Mirage's tile
decomposition as implementations.

Inputs come in two modes. ``exact``: small integers chosen so that every partial result is
exactly representable in the dtype, so every summation order gives the same bits and the check
is bitwise (nccl-tests, torch's c10d tests; 2 ulp for float avg, as nccl-tests allows).
``random``: uniform(-1, 1) values checked against a float64 reference within the error bound
of recursive summation (Higham: |err| <= (W-1) u sum|x_i|, plus the final rounding), or of a
product's W-1 roundings (|err| <= (W-1) u |prod|: exact-mode factors are powers of two, which a
product kept in a narrower type still gets right).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Work, dtype_from_name, from_source, generate, seed_from
from reference_kernels import collectives as ref
from suites._cuda import source
from suites._cuda.tile_reduce import DTYPES as TILE_DTYPES
from suites._cuda.tile_reduce import launch_allreduce_tile
from suites._triton import triton_impl

from .common import (
    MPI_WIRE,
    as_array,
    exact_bound,
    full_mantissa_uniform,
    gather_rows,
    host,
    is_same,
    mpi_op,
    native_avg,
    plant_extreme_specials,
    plant_sum_specials,
    reduction_out,
    reduction_tolerance,
    sweep_counts,
    torch_op,
    unique,
)


# ---------------------------------------------------------------- inputs and expectations
def _rank_input(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s input: row ``rank`` of a global (ranks, n) tensor."""
    dtype = dtype_from_name(params["dtype"])
    n, op, mode = int(params["n"]), params["op"], params["mode"]
    seed = seed_from("allreduce", mode, op, params["dtype"], n)
    shape = (max(world_size, rank + 1), n)
    region = (rank,)
    if mode == "random":
        return full_mantissa_uniform(shape, dtype, seed, region)
    if op == "prod":
        # floats: factors of magnitude 1 or 2, so any product is a signed power of two, exact
        # everywhere; integers: magnitudes up to the W-th root of 2**31 - 1, so products pass
        # 2**24 (a float32 accumulator rounds them) and stay inside int32
        top = 1
        if not dtype.is_floating_point:
            top = int(round((2**31 - 1) ** (1 / world_size)))
            while top ** world_size > 2**31 - 1:
                top -= 1
        mag = generate(shape, torch.int64, seed=seed, dist="int", low=1, high=max(top, 2),
                       region=region)
        sign = generate(shape, torch.int64, seed=seed + 1, dist="sign", region=region)
        return (sign * mag).to(dtype)
    bound = exact_bound(dtype, world_size)
    values = generate(shape, dtype, seed=seed, dist="int", low=-bound, high=bound, region=region)
    if mode == "special":
        if op not in ("sum", "min", "max"):
            raise ValueError(f"mode special is defined for sum, min and max, not {op}")
        plant = plant_sum_specials if op == "sum" else plant_extreme_specials
        plant(values, rank, world_size)
    return values


def allreduce_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Keyword arguments of one rank's allreduce call: ``out is x`` when in place."""
    x = _rank_input(params, rank, world_size)
    out = x if params["inplace"] else reduction_out(x.shape, x.dtype, params["op"])
    return {"x": x, "out": out, "op": params["op"]}


def allreduce_expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """The reference over every rank's input: rounded once to the dtype in exact mode, float64
    in random mode (compared under the summation error bound)."""
    inputs = [_rank_input(params, r, world_size) for r in range(world_size)]
    out_dtype = torch.float64 if params["mode"] == "random" else None
    return ref.allreduce(inputs, params["op"], out_dtype=out_dtype)


def allreduce_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S/t, busbw = algbw * 2(W-1)/W, S the bytes per rank."""
    size = int(params["n"]) * dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=size, bus_bytes=size * 2 * (world_size - 1) / world_size)


# ---------------------------------------------------------------- implementations
def allreduce_torch(world: Any, x: torch.Tensor, out: torch.Tensor, op: str) -> torch.Tensor:
    """torch.distributed.all_reduce on ``out`` (a copy of x when out of place)."""
    import torch.distributed as dist

    if not is_same(out, x):
        out.copy_(x)
    if op == "avg" and not native_avg(world):
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=world.group)
        out.div_(world.size)
    else:
        dist.all_reduce(out, op=torch_op(op), group=world.group)
    return out


def allreduce_mpi(world: Any, x: torch.Tensor, out: torch.Tensor, op: str) -> torch.Tensor:
    """mpi4py Allreduce on host buffers (16-bit floats as float32)."""
    from mpi4py import MPI

    wire = MPI_WIRE.get(x.dtype, x.dtype)
    if wire == x.dtype and out.device.type == "cpu":
        if is_same(out, x):
            world.comm.Allreduce(MPI.IN_PLACE, as_array(out), op=mpi_op(op))
        else:
            world.comm.Allreduce(as_array(x), as_array(out), op=mpi_op(op))
        result = out
    else:
        buf = host(x).to(wire, copy=True)
        world.comm.Allreduce(MPI.IN_PLACE, as_array(buf), op=mpi_op(op))
        result = buf
    if op == "avg":
        result.div_(world.size)
    if result is not out:
        out.copy_(result)
    return out


def _reduce_rows(rows: torch.Tensor, op: str, acc: torch.dtype) -> torch.Tensor:
    a = rows.to(acc)
    if op in ("sum", "avg", "prod"):
        # in rank order from rank 0's row, as the CUDA and Triton tiles do: torch.sum starts
        # from +0.0, and -0.0 on every rank would come back +0.0
        result = a[0].clone()
        for row in a[1:]:
            result = result * row if op == "prod" else result + row
        return result / rows.shape[0] if op == "avg" else result
    return a.amin(0) if op == "min" else a.amax(0)


def allreduce_tile(world: Any, x: torch.Tensor, out: torch.Tensor, op: str) -> torch.Tensor:
    """Mirage's decomposition: allgather into a (W, ...) buffer, then a local float32
    reduction (int64 for integers)."""
    rows = gather_rows(world, x)
    acc = torch.float32 if x.dtype.is_floating_point else torch.int64
    return out.copy_(_reduce_rows(rows, op, acc))


# ---------------------------------------------------------------- negative controls
def allreduce_drop_rank(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                        ) -> torch.Tensor:
    """Bug: the last rank's contribution is lost (an off-by-one in the ring)."""
    rows = gather_rows(world, x)
    if world.size > 1:
        rows = rows[:-1]
    acc = torch.float64 if x.dtype.is_floating_point else torch.int64
    result = _reduce_rows(rows, op, acc)
    if op == "avg":
        result = result * rows.shape[0] / world.size
    return out.copy_(result)


def allreduce_doubling_pow2_only(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                                 ) -> torch.Tensor:
    """Bug: recursive doubling (rank i combines with rank i ^ 1, then i ^ 2, ...) with no step
    for the ranks left over where the world size is no power of two: a partner past the last
    rank is skipped, so at 3 ranks rank 2 never gets rank 1's part. Right at 1, 2, 4 and 8."""
    rows = gather_rows(world, x)
    acc = torch.float64 if x.dtype.is_floating_point else torch.int64
    held = [row.to(acc) for row in rows]
    combine = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum,
               "max": torch.maximum}[op]
    step = 1
    while step < world.size:  # each pair combined low rank first: the same bits on both
        held = [combine(held[min(i, i ^ step)], held[max(i, i ^ step)])
                if i ^ step < world.size else held[i] for i in range(world.size)]
        step <<= 1
    result = held[world.rank]
    return out.copy_(result / world.size if op == "avg" else result)


LOW = {torch.float32: torch.bfloat16, torch.float64: torch.float32,
       torch.bfloat16: torch.float8_e4m3fn, torch.float16: torch.float8_e4m3fn,
       torch.int32: torch.int16, torch.int64: torch.int32}


def reduce_low_precision(rows: torch.Tensor, op: str, dtype: torch.dtype) -> torch.Tensor:
    """The reduction of ``rows`` with every partial result kept in a type narrower than
    ``dtype``: the accumulation-precision bug."""
    low = LOW[dtype]
    acc = rows[0].to(low)
    step = "sum" if op == "avg" else op
    for i in range(1, rows.shape[0]):
        acc = _reduce_rows(torch.stack([acc.to(dtype), rows[i]]), step, dtype).to(low)
    result = acc.to(dtype)
    return result / rows.shape[0] if op == "avg" else result


def allreduce_zero_started(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                           ) -> torch.Tensor:
    """Bug: the sum starts from a zeroed accumulator (0.0 + x, as torch.sum does): -0.0 on
    every rank comes back +0.0; every other value is right."""
    allreduce_torch(world, x, out, op)
    return out.add_(0) if op == "sum" and out.dtype.is_floating_point else out


def allreduce_low_precision(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                            ) -> torch.Tensor:
    """Bug: partial results are kept in a narrower type than the data (bf16 for float32,
    fp8 for 16-bit floats, int16 for int32)."""
    return out.copy_(reduce_low_precision(gather_rows(world, x), op, x.dtype))


def tile_unsupported(params: Mapping[str, Any]) -> str | None:
    """The dtypes the Triton tile reduction takes (suites/_triton/tile_reduce.py)."""
    if params.get("dtype") not in TILE_DTYPES:  # those of the CUDA tile kernel too
        return "the Triton tile reduction takes f32, bf16, f16 and i32"
    return None


# ---------------------------------------------------------------- grids
_FLOAT_OPS = ("sum", "prod", "min", "max", "avg")
_INT_OPS = ("sum", "prod", "min", "max")


def _case(dtype: str, n: int, op: str, inplace: bool = False, mode: str = "exact") -> dict:
    return {"dtype": dtype, "n": n, "op": op, "inplace": inplace, "mode": mode}


def _smoke() -> list[dict]:
    cases = [_case(dt, 1031, op) for dt in ("f32", "bf16") for op in _FLOAT_OPS]
    cases += [_case("i32", 1031, op) for op in _INT_OPS]
    cases += [_case(dt, 1031, op, inplace=True) for dt in ("f32", "bf16") for op in ("sum", "max")]
    # 65539 float32 elements: past 256 KiB, where libraries switch to another algorithm,
    # with a count that no world size divides
    cases += [_case("f16", 7, "sum"), _case("f32", 1, "sum"), _case("f32", 65539, "sum", True)]
    cases += [_case("f32", 4099, "sum", mode="random"), _case("bf16", 4099, "avg", mode="random"),
              _case("f16", 1031, "sum", mode="random"), _case("f32", 1031, "prod", mode="random")]
    # -0.0, subnormals, NaN and infinities, whose sums every order gives; subnormals and
    # infinities for min and max
    cases += [_case("f32", 1031, "sum", mode="special"),
              _case("bf16", 67, "sum", inplace=True, mode="special"),
              _case("f32", 1031, "max", mode="special"), _case("bf16", 1031, "min", mode="special")]
    # counts a vector width divides (a kernel's aligned fast path, where the odd counts above
    # take the general one); max and min at 64-512 KiB, a protocol of its own with its own
    # table of reduction ops
    cases += [_case("f16", 1024, "sum", mode="special"), _case("bf16", 65536, "max"),
              _case("f32", 32771, "min")]
    return cases


def _nightly() -> list[dict]:
    """nccl-tests' sweep: 8 B to 64 MiB per rank by factors of 2 for sum, every op and dtype
    at a few sizes, counts that are not powers of two, in- and out-of-place, random mode."""
    cases = []
    for dt in ("f32", "bf16", "f16", "i32"):
        item = dtype_from_name(dt).itemsize
        for n in sweep_counts(dt):
            for inplace in (False, True):
                cases.append(_case(dt, n, "sum", inplace))
        ops = _FLOAT_OPS if dt != "i32" else _INT_OPS
        for op in ops:
            for n in (1, 1000003 // item, (16 << 20) // item + 3):
                cases.append(_case(dt, n, op))
    for dt in ("f32", "bf16", "f16"):
        for op in ("sum", "avg", "prod"):
            cases.append(_case(dt, (1 << 20) + 17, op, mode="random"))
        cases += [_case(dt, (1 << 20) + 17, op, mode="special") for op in ("sum", "min", "max")]
    return unique(cases)


ALLREDUCE = OpSpec(
    name="allreduce",
    family="collectives",
    description="Elementwise reduction across ranks; every rank gets the result.",
    reference=ref.allreduce,
    make_inputs=allreduce_inputs,
    expected=allreduce_expected,
    tolerance=reduction_tolerance,
    work=allreduce_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": allreduce_torch, "mpi": allreduce_mpi, "tile": allreduce_tile,
                     "tile_cuda": from_source(source("tile_reduce.cu"), launch_allreduce_tile),
                     "tile_triton": triton_impl("tile_reduce:allreduce_tile",
                                                unsupported=tile_unsupported)},
    negative_controls={"drop_rank": allreduce_drop_rank, "low_precision": allreduce_low_precision,
                       "zero_started": allreduce_zero_started,
                       "doubling_pow2_only": allreduce_doubling_pow2_only,
                       "tile_triton_partials_in_bf16":
                           triton_impl("tile_reduce:allreduce_tile_partials_in_bf16",
                                       unsupported=tile_unsupported)},
    distributed=True,
    out_buffers={"out": "out"}, replicated=("out",),
    deadline_s=60.0,
    any_alignment=True,
)
