"""allgather: every rank receives every rank's piece, in rank order.

A case may gather one tensor (``tensors=1``, a plain allgather) or several: the rank's input
then holds the shards of ``tensors`` parameters end to end, as a ZeRO-3 rank keeps its
parameter partitions, and the output holds each gathered parameter contiguously. Two ways to
do that are the point of DeepSpeed's ``stage3_allgather_sequential``: ``bulk`` (one coalesced
allgather through a flat temporary buffer, then a copy out) and ``sequential`` (one allgather
per parameter, straight into its place: same bits, less peak memory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.api import OpSpec, Work, dtype_from_name, exact, overlaps, poisoned
from reference_kernels import collectives as ref

from .common import as_bytes, dist_fn, gather_rows, host, rank_values, sweep_counts, unique


def splits_for(n: int, tensors: int) -> tuple[int, ...]:
    """Uneven parameter sizes (weights 1..5) that add up to ``n``, none empty."""
    if tensors < 1 or n < tensors:
        raise ValueError(f"cannot split {n} elements into {tensors} non-empty tensors")
    weights = [1 + (7 * i) % 5 for i in range(tensors)]
    sizes = [max(1, n * w // sum(weights)) for w in weights]
    sizes[-1] += n - sum(sizes)
    while sizes[-1] < 1:  # rounding up the small ones overdrew the last: take from the largest
        big = max(range(tensors - 1), key=sizes.__getitem__)
        sizes[big] -= 1
        sizes[-1] += 1
    return tuple(sizes)


def _splits(params: Mapping[str, Any]) -> tuple[int, ...]:
    """The parameters' sizes: ``splits_for``, or with ``sizes=small_first`` a bias of 7 and a
    norm weight of 3 before one large weight (small neighbours a kernel may bucket together,
    each of which must still land whole in every rank's region)."""
    n, tensors = int(params["n"]), int(params["tensors"])
    if params.get("sizes") == "small_first":
        return (7, 3, n - 10)
    return splits_for(n, tensors)


def _values(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    return rank_values("allgather", params, rank, world_size, int(params["n"]), sums=False)


def allgather_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """``x`` (this rank's n values), ``out`` (W*n, poisoned) and the parameter ``splits``; in
    place, ``x`` is ``out``'s own-rank piece (one tensor only)."""
    n, tensors = int(params["n"]), int(params["tensors"])
    x = _values(params, rank, world_size)
    out = poisoned(world_size * n, x.dtype)
    if params["inplace"]:
        if tensors != 1:
            raise ValueError("an in-place allgather gathers one tensor (tensors=1)")
        out[rank * n : (rank + 1) * n] = x
        x = out[rank * n : (rank + 1) * n]
    return {"x": x, "out": out, "splits": _splits(params)}


def allgather_expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    inputs = [_values(params, r, world_size) for r in range(world_size)]
    return ref.allgather(inputs, _splits(params))


def allgather_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S*W/t, busbw = algbw * (W-1)/W, S the bytes per rank."""
    size = int(params["n"]) * dtype_from_name(params["dtype"]).itemsize
    return Work(bytes=size * world_size, bus_bytes=size * (world_size - 1))


def _pieces(x: torch.Tensor, out: torch.Tensor, splits: Sequence[int], world: int):
    """(shard of x, gathered region of out) per parameter."""
    src = dst = 0
    for count in splits:
        yield x[src : src + count], out[dst : dst + world * count]
        src += count
        dst += world * count


# ---------------------------------------------------------------- implementations
def allgather_torch(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                    ) -> torch.Tensor:
    """torch.distributed.all_gather (the list API) per parameter, into views of ``out``."""
    import torch.distributed as dist

    for shard, region in _pieces(x, out, splits, world.size):
        dist.all_gather(list(region.view(world.size, -1).unbind(0)), shard, group=world.group)
    return out


def allgather_mpi(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                  ) -> torch.Tensor:
    """mpi4py Allgather of raw bytes per parameter (MPI_IN_PLACE when x lies in out), on host
    buffers."""
    from mpi4py import MPI

    if out.device.type == "cpu" and overlaps(x, out):
        world.comm.Allgather(MPI.IN_PLACE, as_bytes(out))
        return out
    staged_x, staged_out = host(x).contiguous(), host(out)
    for shard, region in _pieces(staged_x, staged_out, splits, world.size):
        world.comm.Allgather(as_bytes(shard), as_bytes(region))
    return out if staged_out is out else out.copy_(staged_out)


def allgather_bulk(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                   ) -> torch.Tensor:
    """One coalesced allgather of the whole flat shard into a temporary (W, n) buffer, then
    a copy of each parameter into place (ZeRO-3's default)."""
    rows = gather_rows(world, x)
    start = 0
    for (_, region), count in zip(_pieces(x, out, splits, world.size), splits, strict=True):
        region.view(world.size, count).copy_(rows[:, start : start + count])
        start += count
    return out


def allgather_sequential(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                         ) -> torch.Tensor:
    """One allgather per parameter straight into its place: no temporary buffer
    (DeepSpeed's stage3_allgather_sequential)."""
    gather = dist_fn("all_gather_single", "all_gather_into_tensor")
    for shard, region in _pieces(x, out, splits, world.size):
        gather(region, shard, group=world.group)
    return out


# ---------------------------------------------------------------- negative controls
def allgather_rank_order(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                         ) -> torch.Tensor:
    """Bug: pieces land in reverse rank order (a peer index computed from the wrong end).
    Invisible at one rank."""
    allgather_sequential(world, x, out, splits)
    for _, region in _pieces(x, out, splits, world.size):
        rows = region.view(world.size, -1)
        rows.copy_(rows.flip(0))
    return out


def allgather_no_tail(world: Any, x: torch.Tensor, out: torch.Tensor, splits: Sequence[int]
                      ) -> torch.Tensor:
    """Bug: a 4-wide vectorised copy-out without the scalar tail: the last count % 4 elements
    of every piece are never written."""
    rows = gather_rows(world, x)
    start = 0
    for (_, region), count in zip(_pieces(x, out, splits, world.size), splits, strict=True):
        body = count - count % 4
        region.view(world.size, count)[:, :body].copy_(rows[:, start : start + body])
        start += count
    return out


_REGISTERED: dict[tuple[Any, ...], torch.Tensor] = {}


def allgather_stale_buffer(world: Any, x: torch.Tensor, out: torch.Tensor,
                           splits: Sequence[int]) -> torch.Tensor:
    """Bug: the first input buffer of each shape is 'registered' (as with symmetric memory)
    and later calls send from it instead of from x. Only a call on moved buffers shows it."""
    key = (tuple(x.shape), x.dtype, x.device, tuple(splits))
    source = _REGISTERED.setdefault(key, x)
    return allgather_sequential(world, source, out, splits)


# ---------------------------------------------------------------- grids
def _case(dtype: str, n: int, tensors: int = 1, inplace: bool = False,
          mode: str = "exact", **extra: Any) -> dict:
    return {"dtype": dtype, "n": n, "tensors": tensors, "inplace": inplace, "mode": mode,
            **extra}


def _smoke() -> list[dict]:
    return [
        _case("f32", 1031), _case("f32", 1031, inplace=True), _case("bf16", 7),
        _case("i32", 65539), _case("f16", 1, inplace=True), _case("f32", 4099, 5, mode="random"),
        _case("bf16", 1031, 7), _case("f32", 1031, mode="special"),
        _case("bf16", 1031, mode="special"),
        _case("f16", 67, inplace=True, mode="special"),
        # ~1 MiB per rank in 8 parameters: big enough for bulk's temporary to show in the
        # peak memory of every rank
        _case("f32", 262147, 8),
        # counts a vector width divides (a kernel's aligned fast path)
        _case("f32", 1024), _case("bf16", 4096, mode="special"),
        # a bias and a norm weight beside a weight: small neighbours, each whole
        _case("f32", 1031, 3, sizes="small_first"),
    ]


def _nightly() -> list[dict]:
    cases = []
    for dt in ("f32", "bf16"):
        for n in sweep_counts(dt):
            cases += [_case(dt, n), _case(dt, n, inplace=True)]
            if n >= 4096:  # ZeRO-3: a layer's parameters, gathered bulk or one by one
                cases.append(_case(dt, n + 5, 16))
    for dt in ("f16", "i32"):
        for n in (1, 1000003, (16 << 20) // 4 + 3):
            cases.append(_case(dt, n))
    cases += [_case("f32", (1 << 20) + 17, 4, mode="random"), _case("bf16", 65539, 64)]
    cases += [_case(dt, (1 << 20) + 17, mode="special") for dt in ("f32", "bf16")]
    cases += [_case("f32", (1 << 20) + 17, 3, sizes="small_first")]
    return unique(cases)


ALLGATHER = OpSpec(
    name="allgather",
    family="collectives",
    description="Every rank receives every rank's piece in rank order (one tensor, or the "
                "shards of several parameters, ZeRO-3 style).",
    reference=ref.allgather,
    make_inputs=allgather_inputs,
    expected=allgather_expected,
    tolerance=exact(),
    work=allgather_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": allgather_torch, "mpi": allgather_mpi, "bulk": allgather_bulk,
                     "sequential": allgather_sequential},
    negative_controls={"rank_order": allgather_rank_order, "no_tail": allgather_no_tail,
                       "stale_buffer": allgather_stale_buffer},
    distributed=True,
    out_buffers={"out": "out"}, replicated=("out",),
    deadline_s=60.0,
    any_alignment=True,
)
