"""reduce_scatter: the elementwise reduction of every rank's input, of which rank r keeps
piece r (sum, avg, max). Exact-by-construction and random inputs as for allreduce."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Work, dtype_from_name
from reference_kernels import collectives as ref

from .allreduce import reduce_low_precision
from .common import (
    MPI_WIRE,
    as_array,
    dist_fn,
    gather_rows,
    host,
    mpi_op,
    native_avg,
    rank_values,
    reduction_out,
    reduction_tolerance,
    sweep_counts,
    torch_op,
    unique,
)


def _values(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    return rank_values("reduce_scatter", params, rank, world_size,
                       world_size * int(params["n"]), sums=True)


def reduce_scatter_inputs(params: Mapping[str, Any], rank: int, world_size: int
                          ) -> dict[str, Any]:
    """``x`` (W*n values), ``out`` (n, poisoned: ``reduction_out``; in place, x's own-rank
    piece) and ``op``."""
    n = int(params["n"])
    x = _values(params, rank, world_size)
    out = (x[rank * n : (rank + 1) * n] if params["inplace"]
           else reduction_out(n, x.dtype, params["op"]))
    return {"x": x, "out": out, "op": params["op"]}


def reduce_scatter_expected(params: Mapping[str, Any], rank: int, world_size: int
                            ) -> torch.Tensor:
    inputs = [_values(params, r, world_size) for r in range(world_size)]
    random_sum = params["mode"] == "random" and params["op"] in ("sum", "avg")
    return ref.reduce_scatter(inputs, params["op"], rank,
                              out_dtype=torch.float64 if random_sum else None)


def reduce_scatter_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S*W/t, busbw = algbw * (W-1)/W, S the bytes each rank receives."""
    size = int(params["n"]) * dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=size * world_size, bus_bytes=size * (world_size - 1))


# ---------------------------------------------------------------- implementations
def reduce_scatter_torch(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                         ) -> torch.Tensor:
    """torch.distributed.reduce_scatter_single (gloo has no AVG: sum, then divide)."""
    import torch.distributed as dist

    scatter = dist_fn("reduce_scatter_single", "reduce_scatter_tensor")
    if op == "avg" and not native_avg(world):
        scatter(out, x, op=dist.ReduceOp.SUM, group=world.group)
        return out.div_(world.size)
    scatter(out, x, op=torch_op(op), group=world.group)
    return out


def reduce_scatter_mpi(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                       ) -> torch.Tensor:
    """mpi4py Reduce_scatter_block on host buffers (16-bit floats as float32)."""
    wire = MPI_WIRE.get(x.dtype, x.dtype)
    send = host(x).to(wire, copy=True)  # a copy: out may be a piece of x
    recv = torch.empty(out.numel(), dtype=wire)
    world.comm.Reduce_scatter_block(as_array(send), as_array(recv), op=mpi_op(op))
    if op == "avg":
        recv.div_(world.size)
    return out.copy_(recv)


# ---------------------------------------------------------------- negative controls
def reduce_scatter_wrong_piece(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                               ) -> torch.Tensor:
    """Bug: rank r keeps piece r+1 (a rotated ring schedule). Invisible at one rank."""
    import torch.distributed as dist

    full = x.clone()
    if op == "avg" and not native_avg(world):
        dist.all_reduce(full, op=dist.ReduceOp.SUM, group=world.group)
        full.div_(world.size)
    else:
        dist.all_reduce(full, op=torch_op(op), group=world.group)
    n = out.numel()
    piece = (world.rank + 1) % world.size
    return out.copy_(full[piece * n : (piece + 1) * n])


def reduce_scatter_low_precision(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                                 ) -> torch.Tensor:
    """Bug: partial results kept in a narrower type than the data (bf16 for float32, fp8 for
    16-bit floats, int16 for int32)."""
    n = out.numel()
    rows = gather_rows(world, x)[:, world.rank * n : (world.rank + 1) * n]
    return out.copy_(reduce_low_precision(rows, op, x.dtype))


def reduce_scatter_no_tail(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                           ) -> torch.Tensor:
    """Bug: a 4-wide vectorised store without the scalar tail: the last n % 4 elements of the
    output are never written."""
    result = torch.empty_like(out)
    reduce_scatter_torch(world, x.clone(), result, op)
    body = out.numel() - out.numel() % 4
    out[:body] = result[:body]
    return out


# ---------------------------------------------------------------- grids
def _case(dtype: str, n: int, op: str, inplace: bool = False, mode: str = "exact") -> dict:
    return {"dtype": dtype, "n": n, "op": op, "inplace": inplace, "mode": mode}


def _smoke() -> list[dict]:
    cases = [_case(dt, 1031, op) for dt in ("f32", "bf16") for op in ("sum", "avg", "max")]
    cases += [_case("i32", 1031, "sum"), _case("i32", 1031, "max")]
    cases += [_case("f32", 1031, "sum", True), _case("bf16", 1031, "max", True)]
    cases += [_case("f16", 7, "sum"), _case("f32", 1, "sum")]
    cases += [_case("f32", 4099, op, mode="random") for op in ("sum", "max")]
    cases += [_case("bf16", 4099, "avg", mode="random"), _case("f16", 1031, "sum", mode="random")]
    # -0.0, subnormals, NaN and infinities, whose sums every order gives; subnormals and
    # infinities for max
    cases += [_case("f32", 1031, "sum", mode="special"),
              _case("f16", 67, "sum", inplace=True, mode="special"),
              _case("bf16", 1031, "sum", mode="special"), _case("f32", 1031, "max", mode="special")]
    # counts a vector width divides (a kernel's aligned fast path)
    cases += [_case("f32", 1024, "sum"), _case("f16", 1024, "sum", mode="special")]
    return cases


def _nightly() -> list[dict]:
    cases = []
    for dt in ("f32", "bf16", "f16"):
        for n in sweep_counts(dt):
            cases += [_case(dt, n, "sum"), _case(dt, n, "sum", True)]
        for op in ("avg", "max"):
            for n in (1, 1000003, (16 << 20) // 4 + 3):
                cases.append(_case(dt, n, op))
    for op in ("sum", "max"):
        cases += [_case("i32", n, op) for n in (1, 1000003)]
    for dt in ("f32", "bf16"):
        cases += [_case(dt, (1 << 20) + 17, op, mode="random") for op in ("sum", "avg")]
        cases.append(_case(dt, (1 << 20) + 17, "sum", mode="special"))
        cases.append(_case(dt, (1 << 20) + 17, "max", mode="special"))
    cases.append(_case("f16", (1 << 20) + 17, "sum", mode="random"))
    return unique(cases)


REDUCE_SCATTER = OpSpec(
    name="reduce_scatter",
    family="collectives",
    description="Elementwise reduction across ranks; rank r keeps piece r of the result.",
    reference=ref.reduce_scatter,
    make_inputs=reduce_scatter_inputs,
    expected=reduce_scatter_expected,
    tolerance=reduction_tolerance,
    work=reduce_scatter_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": reduce_scatter_torch, "mpi": reduce_scatter_mpi},
    negative_controls={"wrong_piece": reduce_scatter_wrong_piece,
                       "low_precision": reduce_scatter_low_precision,
                       "no_tail": reduce_scatter_no_tail},
    distributed=True,
    out_buffers={"out": "out"},
    deadline_s=60.0,
    any_alignment=True,
)
