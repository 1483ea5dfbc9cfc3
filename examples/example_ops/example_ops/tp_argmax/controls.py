"""Negative controls: plausible wrong kernels the checks must fail."""

from __future__ import annotations

import torch

from .torch_impl import gather, local_best, pick_over_ranks


def no_shard_offset(world, logits: torch.Tensor) -> torch.Tensor:
    """Returns the shard-local column: right at one rank, wrong wherever the winner is past
    rank 0's shard."""
    values, index = local_best(logits, 0)
    return pick_over_ranks(gather(world, values), gather(world, index))


def last_on_ties(world, logits: torch.Tensor) -> torch.Tensor:
    """Keeps the last of equal maxima, within a shard and across ranks."""
    flipped = logits.flip(-1)
    values, index = flipped.float().max(dim=-1)
    index = logits.shape[-1] - 1 - index + world.rank * logits.shape[-1]
    values, index = gather(world, values), gather(world, index)
    best = values.max(dim=0, keepdim=True).values
    return torch.where(values == best, index, -1).max(dim=0).values
