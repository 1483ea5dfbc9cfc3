"""The history rule of harness 0.x (issue 8 to 21), kept as a baseline for the benchmarks.

Per run, against a lagging baseline: the median of the last LOOKBACK runs' medians with a MAD
band, a Mann-Whitney U test against the pooled samples of recent typical runs, and two
consecutive violations for a "regression". It was replaced by change points
(``harness.history.changepoints``): with one value per run it never alarms (the test needs two
samples a side), and a real step is re-flagged on every run until the median catches up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.history.two_runs import Shift, _clean, _mwu_p, _ratio, pairwise

ALPHA = 0.01
LOOKBACK = 30
MIN_HISTORY = 5
MAD_K = 2.0
_RECENT_RUNS = 5
_MAD_TO_SIGMA = 1.4826


def _usable_runs(history: Sequence[Sequence[float]]) -> list[np.ndarray]:
    # a run without finite samples says nothing about the level
    return [a for a in (_clean(h) for h in history) if a.size]


def _robust_baseline(runs: Sequence[np.ndarray]) -> tuple[float, float]:
    """(median of the run medians, MAD of the run medians)."""
    medians = np.array([np.median(r) for r in runs])
    base = float(np.median(medians))
    return base, float(np.median(np.abs(medians - base)))


def lookback_violation(history: Sequence[Sequence[float]], current: Sequence[float],
                       threshold: float, alpha: float = ALPHA, k: float = MAD_K, *,
                       lookback: int = LOOKBACK) -> Shift:
    """Does ``current`` leave the band of the recent history?

    ``history`` holds earlier runs' raw samples, newest first; the first ``lookback`` runs
    with samples are used. The baseline is the median of their medians. "slower" needs all of:

    - median > baseline * (1 + threshold): the change must matter in practice, however
      certain it is;
    - median > baseline + k * 1.4826 * MAD(run medians): the samples of one run are
      correlated (same boot, clocks, neighbours), so run-to-run noise is wider than any one
      run's spread suggests; a series that wanders that much between runs must move further;
    - MWU(current vs the pooled samples of the 5 most recent *typical* runs) p < alpha: the
      current run's distribution, not just its median, must sit above the machine's recent
      normal state. Typical runs have medians within max(band, threshold * baseline) of the
      baseline: a recent spike (a loaded machine makes whole runs 50-100% slower) in the
      reference would hide a real step behind it (benchmarks/regression_detection.py: recall
      at +10% went from 23% to 42-50% on noise recorded under load, false alarms +7 of 828).

    "faster" is symmetric. ``ratio`` is median(current) / baseline.
    """
    runs = _usable_runs(history)[: max(lookback, 1)]
    c = _clean(current)
    if not runs or c.size == 0:
        return Shift(math.nan, 1.0, "same")
    base, mad = _robust_baseline(runs)
    current_median = float(np.median(c))
    ratio = _ratio(current_median, base)
    if c.size < 2 or not math.isfinite(ratio):
        return Shift(ratio, 1.0, "same")
    band = k * _MAD_TO_SIGMA * mad
    typical = [r for r in runs if abs(float(np.median(r)) - base) <= max(band, threshold * base)]
    recent = np.concatenate((typical or runs)[:_RECENT_RUNS])
    p = _mwu_p(c, recent, slower=ratio >= 1.0)
    if (current_median > base * (1.0 + threshold) and current_median > base + band
            and p < alpha):
        return Shift(ratio, p, "slower")
    if (current_median < base / (1.0 + threshold) and current_median < base - band
            and p < alpha):
        return Shift(ratio, p, "faster")
    return Shift(ratio, p, "same")


def classify_series(history: Sequence[Sequence[float]], current: Sequence[float],
                    threshold: float, *, lookback: int = LOOKBACK) -> tuple[str, Shift | None]:
    """Verdict of one series: "new", "ok", "suspicious", "regression" or "improvement".

    ``history``: earlier runs' raw samples, newest first (runs without samples are skipped).
    With fewer than MIN_HISTORY earlier runs the current run is compared with the previous
    one alone (``pairwise``) and a slowdown is a "regression" at once: there is no history
    yet to tell a one-off spike from a step. Otherwise a run that violates the lookback band
    is "suspicious", and a "regression" when the previous run also violated the band of its
    own earlier history; two consecutive faster runs are an "improvement", one is "ok".
    """
    runs = _usable_runs(history)
    if not runs:
        return "new", None
    if len(runs) < MIN_HISTORY:
        shift = pairwise(runs[0], current, threshold)
        verdict = {"slower": "regression", "faster": "improvement"}.get(shift.direction, "ok")
        return verdict, shift
    shift = lookback_violation(runs, current, threshold, lookback=lookback)
    if shift.direction == "same":
        return "ok", shift
    previous = lookback_violation(runs[1:], runs[0], threshold, lookback=lookback)
    if shift.direction == "slower":
        return ("regression" if previous.direction == "slower" else "suspicious"), shift
    return ("improvement" if previous.direction == "faster" else "ok"), shift


