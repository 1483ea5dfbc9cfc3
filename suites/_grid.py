"""Helpers shared by the suites' parameter grids."""

from __future__ import annotations

from collections.abc import Iterable


def unique(cases: Iterable[dict]) -> list[dict]:
    """Cases in order, each once."""
    seen, out = set(), []
    for c in cases:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
