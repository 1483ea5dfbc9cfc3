"""all_to_all: rank j sends its piece r to rank r; rank r receives the pieces in rank order.

Splits are ``equal`` (n elements to every peer) or ``uneven``: a fixed pseudo-random count
matrix, with every rank sending nothing to its right-hand neighbour (empty pieces are where
offset arithmetic goes wrong), as MoE expert-parallel dispatch produces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.api import OpSpec, Work, dtype_from_name, exact, hash32, poisoned, seed_from
from reference_kernels import collectives as ref

from .common import as_bytes, host, rank_values, sweep_counts, unique


def send_counts(params: Mapping[str, Any], world_size: int) -> list[list[int]]:
    """counts[j][r]: how many elements rank j sends to rank r."""
    n = int(params["n"])
    if params["splits"] == "equal":
        return [[n] * world_size for _ in range(world_size)]
    if params["splits"] not in ("uneven", "idle"):
        raise ValueError(f"splits {params['splits']!r}: use equal, uneven or idle")
    index = torch.arange(world_size * world_size, dtype=torch.int64)
    draws = hash32(index, seed_from("all_to_all.splits", n, world_size)) % (2 * n + 1)
    counts = draws.view(world_size, world_size).tolist()
    for j in range(world_size):
        if world_size > 1:
            counts[j][(j + 1) % world_size] = 0
        else:
            counts[j][j] = max(counts[j][j], 1)
    if params["splits"] == "idle" and world_size > 1:
        # rank 1 sends nothing to anyone, and still receives its pieces
        counts[1] = [0] * world_size
    return counts


def _values(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    total = sum(send_counts(params, world_size)[rank])
    return rank_values("all_to_all", params, rank, world_size, total, sums=False)


def all_to_all_inputs(params: Mapping[str, Any], rank: int, world_size: int
                      ) -> dict[str, Any]:
    """``x`` (this rank's pieces for ranks 0..W-1 back to back), ``out`` (poisoned), and the
    split sizes as torch's all_to_all_single takes them."""
    counts = send_counts(params, world_size)
    in_splits = list(counts[rank])
    out_splits = [counts[j][rank] for j in range(world_size)]
    x = _values(params, rank, world_size)
    return {"x": x, "out": poisoned(sum(out_splits), x.dtype), "in_splits": in_splits,
            "out_splits": out_splits}


def all_to_all_expected(params: Mapping[str, Any], rank: int, world_size: int
                        ) -> torch.Tensor:
    inputs = [_values(params, r, world_size) for r in range(world_size)]
    return ref.all_to_all(inputs, send_counts(params, world_size), rank)


def all_to_all_work(params: Mapping[str, Any], world_size: int) -> Work:
    """nccl-tests: algbw = S*W/t, busbw = algbw * (W-1)/W, with S*W the bytes a rank sends
    (the mean over ranks for uneven splits)."""
    item = dtype_from_name(params["dtype"]).itemsize
    sent = sum(map(sum, send_counts(params, world_size))) / world_size * item
    return Work(bytes=sent, bus_bytes=sent * (world_size - 1) / world_size)


def _offsets(counts: Sequence[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


# ---------------------------------------------------------------- implementations
def all_to_all_torch(world: Any, x: torch.Tensor, out: torch.Tensor, in_splits: Sequence[int],
                     out_splits: Sequence[int]) -> torch.Tensor:
    """torch.distributed.all_to_all_single with split sizes."""
    import torch.distributed as dist

    dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=world.group)
    return out


def all_to_all_mpi(world: Any, x: torch.Tensor, out: torch.Tensor, in_splits: Sequence[int],
                   out_splits: Sequence[int]) -> torch.Tensor:
    """mpi4py Alltoallv of raw bytes on host buffers."""
    from mpi4py import MPI

    item = x.element_size()
    send_b = [c * item for c in in_splits]
    recv_b = [c * item for c in out_splits]
    staged = host(out)
    world.comm.Alltoallv([as_bytes(host(x).contiguous()), (send_b, _offsets(send_b)), MPI.BYTE],
                         [as_bytes(staged), (recv_b, _offsets(recv_b)), MPI.BYTE])
    return out if staged is out else out.copy_(staged)


# ---------------------------------------------------------------- negative controls
def _received(world: Any, x: torch.Tensor, out: torch.Tensor, in_splits: Sequence[int],
              out_splits: Sequence[int]) -> list[torch.Tensor]:
    """The pieces this rank receives, by source rank (a correct exchange into a temporary)."""
    tmp = torch.empty_like(out)
    all_to_all_torch(world, x, tmp, in_splits, out_splits)
    return list(tmp.split(list(out_splits)))


def all_to_all_splits_transposed(world: Any, x: torch.Tensor, out: torch.Tensor,
                                 in_splits: Sequence[int], out_splits: Sequence[int]
                                 ) -> torch.Tensor:
    """Bug: the receiver lays out what it got with its own send counts, assuming every peer
    sends it as much as it sends that peer. Invisible with equal splits."""
    offsets = _offsets(in_splits)
    for piece, start, room in zip(_received(world, x, out, in_splits, out_splits), offsets,
                                  in_splits, strict=True):
        count = max(0, min(piece.numel(), room, out.numel() - start))
        out[start : start + count] = piece[:count]
    return out


def all_to_all_rank_order(world: Any, x: torch.Tensor, out: torch.Tensor,
                          in_splits: Sequence[int], out_splits: Sequence[int]) -> torch.Tensor:
    """Bug: received pieces concatenated in reverse rank order. Invisible at one rank."""
    pieces = _received(world, x, out, in_splits, out_splits)
    return out.copy_(torch.cat(pieces[::-1]))


def all_to_all_no_tail(world: Any, x: torch.Tensor, out: torch.Tensor,
                       in_splits: Sequence[int], out_splits: Sequence[int]) -> torch.Tensor:
    """Bug: a 4-wide vectorised copy-out without the scalar tail: the last count % 4 elements
    of every received piece are never written."""
    pieces = _received(world, x, out, in_splits, out_splits)
    for piece, start in zip(pieces, _offsets(out_splits), strict=True):
        body = piece.numel() - piece.numel() % 4
        out[start : start + body] = piece[:body]
    return out


# ---------------------------------------------------------------- grids
def _case(dtype: str, n: int, splits: str, mode: str = "exact") -> dict:
    return {"dtype": dtype, "n": n, "splits": splits, "mode": mode}


def _smoke() -> list[dict]:
    return [_case("f32", 1031, "equal"), _case("f32", 1031, "uneven"), _case("bf16", 7, "equal"),
            _case("bf16", 65, "uneven"), _case("i32", 1031, "uneven"), _case("f16", 1, "equal"),
            _case("f32", 4099, "uneven", mode="random"),
            _case("bf16", 1031, "uneven", mode="special"),
            _case("f32", 67, "equal", mode="special"),
            # counts a vector width divides (a kernel's aligned fast path)
            _case("f32", 1024, "equal"), _case("bf16", 4096, "uneven", mode="special"),
            # a rank with nothing to send still unpacks what it receives
            _case("f32", 1031, "idle")]


def _nightly() -> list[dict]:
    cases = []
    for dt in ("f32", "bf16"):
        for n in sweep_counts(dt, high_bytes=16 << 20):  # per peer: W * 16 MiB per rank
            cases += [_case(dt, n, "equal"), _case(dt, n, "uneven")]
    cases += [_case(dt, 1000003, "uneven") for dt in ("f16", "i32")]
    cases += [_case("f32", (1 << 18) + 17, "uneven", mode="random"),
              _case("f32", (1 << 18) + 17, "idle")]
    cases += [_case(dt, (1 << 18) + 17, "uneven", mode="special") for dt in ("f32", "bf16")]
    return unique(cases)


ALL_TO_ALL = OpSpec(
    name="all_to_all",
    family="collectives",
    description="Rank j's piece r goes to rank r; equal or uneven split sizes.",
    reference=ref.all_to_all,
    make_inputs=all_to_all_inputs,
    expected=all_to_all_expected,
    tolerance=exact(),
    work=all_to_all_work,
    grid={"smoke": _smoke(), "nightly": _nightly()},
    implementations={"torch": all_to_all_torch, "mpi": all_to_all_mpi},
    negative_controls={"splits_transposed": all_to_all_splits_transposed,
                       "rank_order": all_to_all_rank_order, "no_tail": all_to_all_no_tail},
    distributed=True,
    out_buffers={"out": "out"},
    deadline_s=60.0,
    any_alignment=True,
)
