"""Reference: the greedy token, argmax over the whole vocabulary, first index on ties.

With tensor parallelism the LM head's output is sharded by vocabulary: rank r holds columns
[r * V/W, (r + 1) * V/W) of the logits. Every rank must return the same global token ids,
as if one device had seen the whole row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import case_tensor, hash32, seed_from, shard

OP = "example.tp_argmax"


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,) int64: the first index of each row's maximum (torch.argmax documents
    the first of several maximal values)."""
    return torch.argmax(logits.float(), dim=-1)


def _planted(params: Mapping[str, Any]) -> dict[int, list[int]]:
    """Global columns that get the row's maximum (4.0), per row: one, spread by a hash, or,
    with ``values=ties``, also a second one in another shard and one right after it."""
    b, vocab = params["b"], params["vocab"]
    picks = (hash32(torch.arange(3 * b), seed_from(OP, b, vocab)) % vocab).tolist()
    out = {}
    for row in range(b):
        cols = [picks[row]]
        if params.get("values") == "ties":
            cols += [(picks[row] + vocab // 2 + 1) % vocab, (picks[row] + 1) % vocab]
        out[row] = cols
    return out


def full_logits(params: Mapping[str, Any]) -> torch.Tensor:
    """The whole (B, V) logits a single device would see."""
    return make_inputs(params, 0, 1)["logits"]


def make_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's vocabulary shard of the logits, uniform in [-1, 1) but for the planted
    maxima (made alone, from the global tensor's generator)."""
    cols = shard(params["vocab"], rank, world_size)
    logits = case_tensor(OP, params, "logits", (params["b"], params["vocab"]),
                         region=(slice(None), cols))
    for row, planted in _planted(params).items():
        for col in planted:
            if cols.start <= col < cols.stop:
                logits[row, col - cols.start] = 4.0
    return {"logits": logits}


def expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """The single-device answer, on every rank."""
    return greedy_token(full_logits(params))
