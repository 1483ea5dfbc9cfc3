"""The implementation under test: local argmax per shard, then an all-gather of (value,
global index) pairs and a pick over ranks that keeps the lowest index on ties."""

from __future__ import annotations

import torch
import torch.distributed as dist


def local_best(logits: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This shard's maximum per row and its global column."""
    values, index = logits.float().max(dim=-1)  # the first maximal value's index
    return values, index + rank * logits.shape[-1]


def pick_over_ranks(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(W, B) candidates -> (B,): the largest value; among equal ones, the lowest index."""
    best = values.max(dim=0, keepdim=True).values
    masked = torch.where(values == best, index, torch.iinfo(torch.int64).max)
    return masked.min(dim=0).values


def gather(world, t: torch.Tensor) -> torch.Tensor:
    """(W, ...) stack of every rank's ``t`` (all_gather works on gloo and NCCL alike)."""
    if world.size == 1:
        return t.unsqueeze(0)
    parts = [torch.empty_like(t) for _ in range(world.size)]
    dist.all_gather(parts, t, group=world.group)
    return torch.stack(parts)


def tp_argmax_torch(world, logits: torch.Tensor) -> torch.Tensor:
    values, index = local_best(logits, world.rank)
    return pick_over_ranks(gather(world, values), gather(world, index))
