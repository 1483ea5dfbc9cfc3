"""broadcast: every rank receives the root's tensor. Roots are written as rank indices
(-1 is the last rank), so one grid covers rank 0, rank 1 and the last rank at every world
size. Out of place, only the root's ``x`` holds data (the others' is poison, as nothing may
read it); in place, ``out is x``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Work, dtype_from_name, exact, poisoned
from reference_kernels import collectives as ref

from .common import as_bytes, host, is_same, rank_values, resolve_root, sweep_counts, unique


def _root_values(params: Mapping[str, Any], world_size: int) -> torch.Tensor:
    return rank_values("broadcast", params, 0, world_size, int(params["n"]), sums=False)


def broadcast_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    root = resolve_root(int(params["root"]), world_size)
    data = _root_values(params, world_size)
    x = data if rank == root else poisoned(data.shape, data.dtype)
    out = x if params["inplace"] else poisoned(data.shape, data.dtype)
    return {"x": x, "out": out, "root": root}


def broadcast_expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    root = resolve_root(int(params["root"]), world_size)
    inputs = [broadcast_inputs(params, r, world_size)["x"] for r in range(world_size)]
    return ref.broadcast(inputs, root)


def broadcast_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S/t, busbw = algbw."""
    size = int(params["n"]) * dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=size, bus_bytes=size)


# ---------------------------------------------------------------- implementations
def broadcast_torch(world: Any, x: torch.Tensor, out: torch.Tensor, root: int) -> torch.Tensor:
    """torch.distributed.broadcast of ``out`` (the root first copies x into it)."""
    import torch.distributed as dist

    if world.rank == root and not is_same(out, x):
        out.copy_(x)
    dist.broadcast(out, src=root, group=world.group)
    return out


def broadcast_mpi(world: Any, x: torch.Tensor, out: torch.Tensor, root: int) -> torch.Tensor:
    """mpi4py Bcast of raw bytes on a host buffer."""
    if world.rank == root and not is_same(out, x):
        out.copy_(x)
    staged = host(out)
    world.comm.Bcast(as_bytes(staged), root=root)
    return out if staged is out else out.copy_(staged)


# ---------------------------------------------------------------- negative controls
def broadcast_root_zero(world: Any, x: torch.Tensor, out: torch.Tensor, root: int
                        ) -> torch.Tensor:
    """Bug: the root argument is ignored; rank 0 always sends."""
    return broadcast_torch(world, x, out, 0)


def broadcast_no_tail(world: Any, x: torch.Tensor, out: torch.Tensor, root: int
                      ) -> torch.Tensor:
    """Bug: a 4-wide vectorised copy without the scalar tail: the last n % 4 elements are
    neither copied on the root nor sent."""
    import torch.distributed as dist

    body = out.numel() - out.numel() % 4
    if world.rank == root and not is_same(out, x):
        out[:body] = x[:body]
    if body:
        head = out[:body].clone()
        dist.broadcast(head, src=root, group=world.group)
        out[:body] = head
    return out


def broadcast_root_out_unwritten(world: Any, x: torch.Tensor, out: torch.Tensor, root: int
                                 ) -> torch.Tensor:
    """Bug: out of place, the root sends x but never writes its own out. In place it is
    right."""
    import torch.distributed as dist

    buf = x.clone() if world.rank == root else out
    dist.broadcast(buf, src=root, group=world.group)
    return out


# ---------------------------------------------------------------- grids
def _case(dtype: str, n: int, root: int, inplace: bool = False, mode: str = "exact") -> dict:
    return {"dtype": dtype, "n": n, "root": root, "inplace": inplace, "mode": mode}


def _smoke() -> list[dict]:
    return [_case("f32", 1031, 0), _case("f32", 1031, 1), _case("f32", 1031, -1),
            _case("f32", 1031, 1, inplace=True), _case("bf16", 7, -1, inplace=True),
            # past 1 MiB, a count no power of two divides: a pipeline of whole chunks
            # (bytes or elements) leaves a partial last one
            _case("i32", 300001, 1), _case("f16", 1, 0, inplace=True),
            _case("f32", 4099, -1, mode="random"), _case("bf16", 1031, 1, mode="special"),
            _case("f16", 67, -1, inplace=True, mode="special"),
            # counts a vector width divides (a kernel's aligned fast path)
            _case("f32", 1024, 1), _case("bf16", 4096, -1, mode="special")]


def _nightly() -> list[dict]:
    cases = []
    for dt in ("f32", "bf16"):
        for n in sweep_counts(dt):
            for root in (0, -1):
                cases += [_case(dt, n, root), _case(dt, n, root, inplace=True)]
    cases += [_case(dt, 1000003, 1) for dt in ("f16", "i32")]
    cases += [_case("f32", (1 << 20) + 17, -1, mode="random")]
    cases += [_case(dt, (1 << 20) + 17, 1, mode="special") for dt in ("f32", "bf16")]
    return unique(cases)


BROADCAST = OpSpec(
    name="broadcast",
    family="collectives",
    description="Every rank receives the root's tensor; roots 0, 1 and the last rank.",
    reference=ref.broadcast,
    make_inputs=broadcast_inputs,
    expected=broadcast_expected,
    tolerance=exact(),
    work=broadcast_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": broadcast_torch, "mpi": broadcast_mpi},
    negative_controls={"root_zero": broadcast_root_zero, "no_tail": broadcast_no_tail,
                       "root_out_unwritten": broadcast_root_out_unwritten},
    distributed=True,
    out_buffers={"out": "out"}, replicated=("out",),
    deadline_s=60.0,
    any_alignment=True,
)
