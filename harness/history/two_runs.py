"""Two runs compared (``harness compare``, the dashboard's compare page): per result key, the
timing shift of the raw samples and the correctness findings of run B against run A.

Timing changed only when two things agree: the median moved by more than the op's threshold
(practical significance) AND a one-sided Mann-Whitney U test on the raw samples says p < ALPHA
(statistical significance). Two runs cannot tell a spike from a step: against a history,
``harness.history.regress`` reads change points instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.results import CaseResult
from harness.history.changepoints import mwu_p as _mwu_p
from harness.history.regress import (
    Finding,
    _finding,
    _fmt_time,
    _samples,
    _short,
    correctness_findings,
    in_series,
    threshold_of,
    timing_method,
)

#: Mann-Whitney U significance of two runs' samples (``pairwise``)
ALPHA = 0.01


@dataclass(frozen=True)
class Shift:
    """How a set of timing samples moved against a baseline."""

    ratio: float  # median(current) / median(baseline); nan when undefined
    p_value: float  # one-sided Mann-Whitney U p-value in the direction of the change
    direction: str  # "slower" | "faster" | "same"


def _clean(samples: Sequence[float] | None) -> np.ndarray:
    """Finite float samples; anything unreadable counts as no samples (never raises)."""
    if samples is None:
        return np.empty(0)
    try:
        a = np.asarray(list(samples), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return np.empty(0)
    return a[np.isfinite(a)]


def _ratio(current_median: float, baseline_median: float) -> float:
    if not (baseline_median > 0 and math.isfinite(current_median)):
        return math.nan
    return current_median / baseline_median


def pairwise(baseline: Sequence[float], current: Sequence[float], threshold: float,
             alpha: float = ALPHA) -> Shift:
    """Compare two runs' raw samples.

    "slower" iff the median ratio exceeds ``1 + threshold`` and the one-sided MWU p-value is
    below ``alpha``; "faster" symmetrically (ratio below ``1 / (1 + threshold)``). Fewer than
    two samples on a side, or all samples equal, give "same" with p = 1. Note that few
    samples can never be significant: 3 against 3 cannot go below p = 0.05.
    """
    b, c = _clean(baseline), _clean(current)
    if b.size == 0 or c.size == 0:
        return Shift(math.nan, 1.0, "same")
    ratio = _ratio(float(np.median(c)), float(np.median(b)))
    if b.size < 2 or c.size < 2 or not math.isfinite(ratio):
        return Shift(ratio, 1.0, "same")
    p = _mwu_p(c, b, slower=ratio >= 1.0)
    if ratio > 1.0 + threshold and p < alpha:
        return Shift(ratio, p, "slower")
    if ratio < 1.0 / (1.0 + threshold) and p < alpha:
        return Shift(ratio, p, "faster")
    return Shift(ratio, p, "same")


def _fmt_shift(base: float, cur: float, shift: Shift) -> str:
    return (f"median {_fmt_time(base)} -> {_fmt_time(cur)} "
            f"(x{shift.ratio:.3f}, p={shift.p_value:.1g})")


def timing_shifts(baseline: Sequence[CaseResult], current: Sequence[CaseResult],
                  threshold: Callable[[str], float] = threshold_of) -> dict[str, Shift]:
    """``pairwise`` shift per result key, for results that passed with samples in both runs."""
    base_by_key = {r.key: r for r in baseline}
    shifts: dict[str, Shift] = {}
    for cur in current:
        base = base_by_key.get(cur.key)
        if base is None:
            continue
        b, c = _samples(base), _samples(cur)
        if b and c and timing_method(base) == timing_method(cur):
            shifts[cur.key] = pairwise(b, c, threshold(cur.op))
    return shifts


def compare_runs(baseline: Sequence[CaseResult], current: Sequence[CaseResult],
                 threshold: Callable[[str], float] = threshold_of,
                 shifts: dict[str, Shift] | None = None) -> list[Finding]:
    """Findings of ``current`` against one ``baseline`` run, results matched by key.

    Timing: ``pairwise`` on the samples of results that passed in both ("regression" when
    slower, "improvement" when faster; two runs cannot tell a spike from a step), or the
    ``shifts`` a caller already has from ``timing_shifts``.
    Correctness: new_failure, fixed, drift, bits_changed.
    """
    base_by_key = {r.key: r for r in baseline}
    if shifts is None:
        shifts = timing_shifts(baseline, current, threshold)
    findings: list[Finding] = []
    for cur in current:
        base = base_by_key.get(cur.key)
        if base is None:
            continue
        shift = shifts.get(cur.key)
        if shift is not None and shift.direction != "same":
            kind = "regression" if shift.direction == "slower" else "improvement"
            b = float(np.median(_clean(_samples(base))))
            c = float(np.median(_clean(_samples(cur))))
            findings.append(_finding(
                kind, cur, "median_ns", f"{_fmt_shift(b, c, shift)} vs run {_short(base.run_id)}",
                baseline=b, current=c, ratio=shift.ratio, p_value=shift.p_value,
                baseline_run=base.run_id))
        findings.extend(correctness_findings(base, cur))
    return findings


def _median_of(r: CaseResult | None) -> float | None:
    median = (r.timing or {}).get("median") if r is not None else None
    return float(median) if isinstance(median, (int, float)) else None


def compare_rows(results_a: Sequence[CaseResult], results_b: Sequence[CaseResult],
                 shifts: dict[str, Shift]) -> list[dict[str, Any]]:
    """The rows of a run-A-vs-run-B table (``harness compare``, the dashboard's compare page):
    one per result key in either run, in B's order, then keys only A has; ``shifts`` from
    ``timing_shifts``. Verdict: slower/faster/same, only in A/B, a status change, or no
    samples."""
    by_a = {r.key: r for r in results_a}
    by_b = {r.key: r for r in results_b}
    rows = []
    for key in list(by_b) + [k for k in by_a if k not in by_b]:
        a, b = by_a.get(key), by_b.get(key)
        some = b or a
        shift = shifts.get(key)
        if shift is not None:
            verdict = shift.direction
        elif a is None:
            verdict = "only in B"
        elif b is None:
            verdict = "only in A"
        elif a.status != "pass" or b.status != "pass":
            verdict = f"{a.status} -> {b.status}"
        elif not (in_series(a) and in_series(b)):
            verdict = "not a measurement (ranks contended)"
        else:
            verdict = "no samples"
        ratio = shift.ratio if shift is not None and math.isfinite(shift.ratio) else None
        rows.append({"key": key, "case_id": some.case_id, "impl": some.impl,
                     "world_size": some.world_size, "median_a_ns": _median_of(a),
                     "median_b_ns": _median_of(b), "ratio": ratio,
                     "p_value": shift.p_value if shift is not None else None,
                     "verdict": verdict})
    return rows
