"""The newest run of a series off its current level: "suspicious" until the next run says
whether it was a step (then ``changepoints.find`` finds it) or one bad night (then
nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.history.changepoints import (
    ALPHA,
    WINDOW,
    change_pct_of,
    find,
    moved,
    mwu_p,
)
from harness.history.excursions import level_sigma
from harness.history.noise import readings
from harness.history.segmentation import MIN_SIZE, p_value


@dataclass(frozen=True)
class Outlier:
    """The newest run off its series' current level: "suspicious" until the next run says
    whether it was a step (then a change point) or one bad night (then nothing)."""

    value: float
    level: float  # median of the current level's runs (since the last change point)
    change_pct: float
    p_value: float

    @property
    def direction(self) -> str:
        return "up" if self.value > self.level else "down"


def newest_outlier(runs: Sequence[Sequence[float] | float], *, min_change_pct: float = 0.0,
                   alpha: float = ALPHA, log: bool = False,
                   quantile: float = 0.5, since: int | None = None) -> Outlier | None:
    """Whether the newest run left the level of the runs since the last change point before it
    (the later of the one the runs before it show and ``since``, a run index):
    the same p-value as ``find`` (one run against the level, the series' run-to-run sigma) and
    the same ``min_change_pct``; where both sides have raw samples, a one-sided Mann-Whitney U
    test of the newest run's samples against the level's 5 newest runs must agree too (a run
    whose median moved but whose samples overlap the level's is noise). ``log`` and
    ``quantile`` as in ``find``."""
    shown, _, raw, floor = readings(runs, log, (quantile,))[0]
    keep = np.flatnonzero(np.isfinite(raw))
    if keep.size < MIN_SIZE + 1 or keep[-1] != len(runs) - 1:
        return None
    values, shown = raw[keep], shown[keep]
    earlier = values[:-1]
    bounds = [b.index for b in find([float(v) for v in earlier], alpha=alpha)]
    start = bounds[-1] if bounds else 0
    if since is not None:
        start = max(start, int(np.searchsorted(keep, since)))
    level_runs = earlier[start:][-WINDOW:]
    if level_runs.size < MIN_SIZE:
        return None
    level, value = float(np.median(shown[:-1][start:][-WINDOW:])), float(shown[-1])
    change = change_pct_of(level, value)
    sigma = level_sigma(values, floor)
    p = p_value(level_runs, values[-1:], sigma)
    if p > alpha or not moved(level, value, min_change_pct):
        return None
    newest = runs[-1]
    recent = [runs[int(i)] for i in keep[:-1][start:][-5:]]
    if not isinstance(newest, (int, float)) and all(not isinstance(r, (int, float))
                                                     for r in recent):
        pooled = np.concatenate([np.asarray(r, dtype=np.float64).reshape(-1) for r in recent])
        cur = np.asarray(newest, dtype=np.float64).reshape(-1)
        if mwu_p(cur[np.isfinite(cur)], pooled[np.isfinite(pooled)],
                  slower=value > level) >= 0.01:
            return None
    return Outlier(value=value, level=level, change_pct=change, p_value=p)
