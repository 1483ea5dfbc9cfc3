"""The tensors a process made last, kept for their next request (``generate``'s memo).

A rank's reference for a collective makes every rank's inputs, and a golden derivation makes
each world size's per-rank references in one process: the same deterministic tensors are
asked for again and again. ``Recent`` keeps the newest ones up to a byte budget and hands out
copies, so a caller may write what it gets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch


class Recent:
    """A least-recently-used map of CPU tensors, at most ``budget`` bytes in all and
    ``largest`` bytes each (bigger ones are not kept)."""

    def __init__(self, budget: int = 32 << 20, largest: int = 4 << 20) -> None:
        self.budget, self.largest = budget, largest
        self._kept: OrderedDict[Hashable, torch.Tensor] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable) -> torch.Tensor | None:
        """A copy of the tensor kept under ``key``, or None."""
        t = self._kept.get(key)
        if t is None:
            return None
        self._kept.move_to_end(key)
        return t.clone()

    def put(self, key: Hashable, t: torch.Tensor) -> None:
        """Keep a copy of ``t`` (a CPU tensor of at most ``largest`` bytes; others are not)."""
        size = t.numel() * t.element_size()
        if t.device.type != "cpu" or size > self.largest or key in self._kept:
            return
        self._kept[key] = t.clone()
        self._bytes += size
        while self._bytes > self.budget:
            _, old = self._kept.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0
