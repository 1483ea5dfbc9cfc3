"""Reference DTensor layouts: the local tensor each rank holds under a placement.

A mesh of shape (m0, m1, ...) lays the ranks out row-major; rank r's coordinate is r unravelled
over the mesh shape. Placements apply left to right over the mesh dims:

- ``R`` Replicate: nothing changes.
- ``S<d>`` Shard(d): torch.chunk semantics. With c = ceil(L / n), coordinate i holds
  [i*c, min(L, (i+1)*c)); trailing coordinates may hold nothing (L=5, n=4: 2, 2, 1, 0).
- ``P`` / ``Psum``, ``Pavg``, ``Pmin``, ``Pmax`` Partial: the global value is the reduction of
  the locals. Going to Partial(sum) gives x / n on every coordinate; avg, min and max keep x.
- ``SS<d>sf<k>`` _StridedShard(d, split_factor=k): chunk dim d into k pieces, chunk each piece
  n ways, and coordinate i holds the concatenation of every piece's i-th chunk (arange(8),
  n=4, k=2: [0,4], [1,5], [2,6], [3,7]); FSDP sharding a tensor-parallel piece makes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PARTIAL_OPS = ("sum", "avg", "min", "max")
_TOKEN = re.compile(r"^(R|S(\d+)|P(sum|avg|min|max)?|SS(\d+)sf(\d+))$")


@dataclass(frozen=True)
class Placement:
    """One mesh dim's placement: kind R, S, P or SS (strided shard)."""

    kind: str
    dim: int = 0
    op: str = "sum"
    split_factor: int = 1

    def __str__(self) -> str:
        if self.kind == "R":
            return "R"
        if self.kind == "S":
            return f"S{self.dim}"
        if self.kind == "P":
            return "P" if self.op == "sum" else f"P{self.op}"
        return f"SS{self.dim}sf{self.split_factor}"


def parse(text: str) -> list[Placement]:
    """Placements from text like ``"S0,R"``, ``"Pmax"`` or ``"SS0sf2,S0"``."""
    out = []
    for token in (t.strip() for t in text.split(",")):
        m = _TOKEN.match(token)
        if m is None:
            raise ValueError(f"placement {token!r}: use R, S<d>, P[sum|avg|min|max] or "
                             f"SS<d>sf<k>")
        if token.startswith("SS"):
            out.append(Placement("SS", int(m.group(4)), split_factor=int(m.group(5))))
        elif token.startswith("S"):
            out.append(Placement("S", int(m.group(2))))
        elif token.startswith("P"):
            out.append(Placement("P", op=m.group(3) or "sum"))
        else:
            out.append(Placement("R"))
    return out


def coordinate(rank: int, mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """Rank r's coordinate in a row-major mesh."""
    if not 0 <= rank < math.prod(mesh_shape):
        raise ValueError(f"rank {rank} is not in a mesh of shape {tuple(mesh_shape)}")
    coord = []
    for extent in reversed(mesh_shape):
        coord.append(rank % extent)
        rank //= extent
    return tuple(reversed(coord))


def chunk(t: torch.Tensor, n: int, index: int, dim: int) -> torch.Tensor:
    """torch.chunk's piece ``index`` of n along dim, empty past the last real chunk."""
    length = t.shape[dim]
    size = -(-length // n)
    start = min(length, index * size)
    return t.narrow(dim, start, min(length, start + size) - start)


def local_shard(x: torch.Tensor, mesh_shape: Sequence[int],
                placements: Sequence[Placement] | str, coord: Sequence[int]) -> torch.Tensor:
    """The local tensor at mesh coordinate ``coord`` of global ``x`` under ``placements``."""
    if isinstance(placements, str):
        placements = parse(placements)
    if not (len(mesh_shape) == len(placements) == len(coord)):
        raise ValueError(f"mesh {tuple(mesh_shape)}, placements {list(map(str, placements))} "
                         f"and coordinate {tuple(coord)} must have one entry per mesh dim")
    t = x
    for n, p, i in zip(mesh_shape, placements, coord, strict=True):
        if not 0 <= i < n:
            raise ValueError(f"coordinate {tuple(coord)} lies outside mesh {tuple(mesh_shape)}")
        if p.kind in ("S", "SS") and p.dim >= x.dim():
            raise ValueError(f"{p} shards dim {p.dim} of a {x.dim()}-d tensor")
        if p.kind == "P":
            if p.op not in PARTIAL_OPS:
                raise ValueError(f"partial op {p.op!r}: use one of {PARTIAL_OPS}")
            if p.op == "sum":
                t = t / n
        elif p.kind == "S":
            t = chunk(t, n, i, p.dim)
        elif p.kind == "SS":
            pieces = [chunk(t, p.split_factor, j, p.dim) for j in range(p.split_factor)]
            t = torch.cat([chunk(piece, n, i, p.dim) for piece in pieces], dim=p.dim)
    return t.contiguous()


def all_locals(x: torch.Tensor, mesh_shape: Sequence[int],
               placements: Sequence[Placement] | str) -> list[torch.Tensor]:
    """Every rank's local tensor, in rank order."""
    return [local_shard(x, mesh_shape, placements, coordinate(r, mesh_shape))
            for r in range(math.prod(mesh_shape))]
