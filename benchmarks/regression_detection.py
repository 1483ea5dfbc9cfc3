"""Regression detection on real noise: recall, false alarms and alarms per step of the
harness's change point analysis, pytest-benchmark's ``--benchmark-compare-fail=median:5%``,
asv's ``continuous`` rule and the harness's previous rule (issues 8 and 22).

The noise is real: the same selection of cases (21 series at world size 1 across five
families, 5 collective series at world size 4) run 40 times with ``harness run`` on a 2-core
VM, every run's raw timing samples kept per series (world size, case id, impl). Three
recordings in ``benchmarks/data/``: ``regression_noise_quiet.json`` (the default, nothing else
running), ``regression_noise.json`` and ``regression_noise_holdout.json`` (made while other
work loaded the machine). ``--record`` redoes one (~10 min quiet); otherwise the script reads
the file, so the tables reproduce without timing anything.

Protocol: a nightly replay, the same data for every detector. Night after night from run 1,
each detector judges the newest run against the runs before it; ours keeps what it found
(its stored change points) from night to night, as ``harness run`` does with the history DB,
and alarms when a night finds a *new* slower change point of at least the threshold (5%), or
one found smaller grows past it. For each series and each run ``t`` from WARMUP on:

* false alarm: an alarm on night ``t`` of the unmodified runs;
* recall at slowdown ``s``: every run from ``t`` on is multiplied by ``1 + s`` (a step that
  persists, as a real regression does; ``--share F``: a seeded share F of each run's samples
  is, a regression that slows some launches only) and the nights from ``t`` on are replayed from the
  state of night ``t - 1``; found when a night ``t`` to ``t + PROMPT`` alarms (ours needs the
  new level twice, so its first chance is ``t + 1``);
* alarms per step: every alarm from night ``t`` to ``t + AFTER`` (a rule that re-flags a held
  step every night scores high: a nightly that fails for a week for one regression); and of
  them those not on a night that alarms on the unmodified runs too (a false alarm the step
  did not cause, counted among the false alarms already);
* recall not on a false alarm's night: found by an alarm on a night that does not alarm on
  the unmodified runs (a rule that alarms on many nights is "found" by chance otherwise).
* alarms per improvement: a step of -10% injected the same way; every alarm from night ``t``
  to ``t + AFTER`` is false, as the runs only got faster (slow runs right after an
  improvement, read against the level before it, look like a regression).

Only regressions count as alarms (ours also reports "suspicious" single runs, which do not
fail a run). The tables are split by world size and, at world size 1, by the series'
run-to-run noise (robust spread of its run medians).

    python benchmarks/regression_detection.py                 # markdown tables
    python benchmarks/regression_detection.py --json          # everything as JSON
    python benchmarks/regression_detection.py --per-series    # plus one row per series
    python benchmarks/regression_detection.py --prompt 4      # a step may be found 4 nights late
    python benchmarks/regression_detection.py --share 0.6     # a step slows 60% of the samples
    python benchmarks/regression_detection.py --record        # re-record the noise first
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from operator import index
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _figures import command, machine  # noqa: E402
from _figures import record as record_figure  # noqa: E402

DATA = HERE / "data" / "regression_noise_quiet.json"
#: the figure-name suffix of each recording (``recording_tag``)
RECORDINGS = {"regression_noise_quiet": "", "regression_noise": "_load",
              "regression_noise_holdout": "_holdout", "regression_noise_fresh": "_fresh"}

# ~21 timed series at world size 1 across five families, 5 collective series at world size 4
SELECTORS = [
    "strided_copy[dtype=f32,offset=0,*]",
    "fp8_gemm.per_tensor",
    "moe.router",
    "hopper_tasks.rmsnorm",
    "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
    "broadcast[dtype=f32,inplace=false,mode=exact,n=1031,root=0]",
]
WORLD_SIZES = "1,4"
# 0: the chance floor, nothing injected; -0.10: an improvement, after which every alarm of a
# slower change is false (the runs only got faster)
SLOWDOWNS = (0.0, 0.02, 0.05, 0.10, 0.20, -0.10)
IMPROVEMENT = -0.10
GOAL_SLOWDOWN, GOAL_RECALL, GOAL_ALARMS_PER_STEP = 0.10, 0.95, 1.2
WARMUP = 6  # nights judged from this run on (every detector has some history)
PROMPT = 2  # an injected step counts as found when alarmed within this many nights after t
AFTER = 5  # alarms per step: every alarm from night t to t + AFTER
QUIET = 0.03  # run-to-run noise below which a series counts as quiet in the breakdown
UNSLOWED = 0.05  # a run within this of its series' lower quartile: one the machine left alone

Samples = Sequence[float]
Detector = Callable[[list[Samples], Samples], bool]  # (history newest first, current) -> alarm


# --------------------------------------------------------------------------------- recording

def _round_sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits - 1}e}") if x else 0.0


def _loadavg() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def record(runs: int, work: Path, out: Path, note: str) -> None:
    """Run the selection ``runs`` times into a scratch DB and write the per-series samples."""
    work.mkdir(parents=True, exist_ok=True)
    db = work / "history.db"
    cmd = [sys.executable, "-m", "harness", "run", *SELECTORS, "--world-sizes", WORLD_SIZES,
           "--db", str(db), "--fail-on", "never"]
    loads = []
    t0 = time.time()
    for i in range(runs):
        before = _loadavg()
        start = time.time()
        done = subprocess.run(cmd, capture_output=True, text=True)
        loads.append({"run": i, "load_before": before, "load_after": _loadavg(),
                      "seconds": round(time.time() - start, 1), "rc": done.returncode})
        print(f"run {i + 1}/{runs}: rc {done.returncode}, {time.time() - start:.1f} s, "
              f"load {before}", file=sys.stderr, flush=True)
        if done.returncode not in (0, 1):
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    elapsed = time.time() - t0
    series = extract(db)
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.platform()}, torch CPU, gloo/MPI oversubscribed at W=4",
        "command": " ".join(["harness", "run", *(f"'{s}'" for s in SELECTORS),
                             "--world-sizes", WORLD_SIZES, "--db", "<scratch>/history.db",
                             "--fail-on", "never"]),
        "runs": runs,
        "recording_seconds": round(elapsed, 1),
        "load_note": note + "; load averages (1, 5, 15 min) before and after each run in "
                            "per_run_load",
        "per_run_load": loads,
        "samples_unit": "ns, rounded to 4 significant digits, in the order measured",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "series": series}, separators=(",", ":")) + "\n")
    print(f"{len(series)} series, {runs} runs, {elapsed:.0f} s -> {out}", file=sys.stderr)


def extract(db: Path) -> list[dict]:
    """Per series (world size, case id, impl) every run's samples, runs in start order."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT r.run_id, r.started_at, x.world_size, x.case_id, x.impl, x.status, x.record "
            "FROM results x JOIN runs r ON r.run_id = x.run_id "
            "ORDER BY r.started_at, x.world_size, x.case_id, x.impl").fetchall()
    run_order: list[str] = []
    by: dict[tuple[int, str, str], dict[str, list[float]]] = {}
    for run_id, _started, world, case, impl, status, rec in rows:
        if run_id not in run_order:
            run_order.append(run_id)
        timing = json.loads(rec).get("timing") if status == "pass" else None
        if not timing or not timing.get("samples"):
            continue
        by.setdefault((world, case, impl), {})[run_id] = [
            _round_sig(float(s)) for s in timing["samples"]]
    # one entry per run in run order; None where that run has no timing for the series
    return [{"world_size": world, "case_id": case, "impl": impl,
             "runs": [per_run.get(r) for r in run_order]}
            for (world, case, impl), per_run in sorted(by.items())]


# ------------------------------------------------------------------------- pytest-benchmark

def pytest_benchmark_median_5pct(history: list[Samples], current: Samples) -> bool:
    """``--benchmark-compare --benchmark-compare-fail=median:5%``.

    pytest_benchmark/utils.py ``parse_compare_fail`` turns "median:5%" into
    ``PercentageRegressionCheck("median", 5)`` (the percentage parsed as an int);
    ``RegressionCheck.fails`` flags when ``compute(current, compared) > threshold`` with
    ``PercentageRegressionCheck.compute = current[field] / compared[field] * 100 - 100`` (inf
    when the baseline is 0). ``--benchmark-compare`` with no argument loads only the latest
    saved run (session.py ``handle_loading``: ``list(self.storage.load())[-1:]``), so the
    baseline is the previous run; ``median`` is stats.py ``Stats.median`` =
    ``statistics.median(data)`` over the rounds. No statistical test. (pytest-benchmark 5.2.3)
    """
    compared = statistics.median(history[0])
    if not compared:
        return True
    return statistics.median(current) / compared * 100 - 100 > 5


# -------------------------------------------------------------------------------------- asv
# asv 0.6.6 / asv_runner 0.3.2 (BSD-3-Clause, (c) the asv developers), ported line by line so
# the project does not depend on asv. `asv continuous` records samples by default
# (commands/continuous.py: add_record_samples(parser, record_default=True)), compares with
# --factor 1.1 by default (commands/common_args.py add_compare) and reports "worsened" through
# commands/compare.py ``_is_result_better(time_1, time_2, ss_1, ss_2, factor)``, i.e. the new
# result is worse when the old one is better by the factor AND the two differ significantly
# (asv/_stats.py ``is_different``, p_threshold 0.002). The result value is the median of the
# samples with a 99% CI (asv_runner/statistics.py ``compute_stats``).

def _asv_binom(n: int, k: int) -> int:
    """asv/_stats.py ``binom``."""
    n, k = index(n), index(k)
    if not 0 <= k <= n:
        return 0
    m = n + 1
    num = den = 1
    for j in range(1, min(k, n - k) + 1):
        num *= m - j
        den *= j
    return num // den


_MWU_MEMO: dict[tuple[int, int, int], int] = {}


def _asv_mwu_r(m: int, n: int, u: int) -> int:
    """asv/_stats.py ``mann_whitney_u_r``: number of orderings with statistic u."""
    if u < 0:
        return 0
    if m == 0 or n == 0:
        return 1 if u == 0 else 0
    key = (m, n, u)
    value = _MWU_MEMO.get(key)
    if value is None:
        value = _asv_mwu_r(m, n - 1, u) + _asv_mwu_r(m - 1, n, u - n)
        _MWU_MEMO[key] = value
    return value


def _asv_mwu_cdf(m: int, n: int, u: int) -> float:
    """asv/_stats.py ``mann_whitney_u_cdf`` (sum of ``mann_whitney_u_pmf``)."""
    total = _asv_binom(m + n, m)
    return sum(_asv_mwu_r(m, n, uu) / total for uu in range(u + 1))


def asv_mann_whitney_u(x: Samples, y: Samples) -> tuple[int, float]:
    """asv/_stats.py ``mann_whitney_u(x, y, method='auto')``: two-sided p, ties broken
    conservatively, exact below 21 samples per side, normal approximation above."""
    m, n = len(x), len(y)
    method = "normal" if max(m, n) > 20 else "exact"
    u = ties = 0
    for xx in x:
        for yy in y:
            if xx > yy:
                u += 1
            elif xx == yy:
                ties += 1
    if u <= m * n // 2 and u + ties >= m * n // 2:
        ties = m * n // 2 - u
    ux1 = min(u, m * n - u)
    ux2 = min(u + ties, m * n - (u + ties))
    if ux1 >= ux2:
        ux = ux1
    else:
        u = u + ties
        ux = ux2
    if method == "exact":
        p1 = _asv_mwu_cdf(m, n, ux)
        p2 = 1.0 - _asv_mwu_cdf(m, n, max(m * n // 2, m * n - ux - 1))
        p = p1 + p2
    else:
        var = m * n * (m + n + 1) / 12
        z = (ux - m * n / 2) / math.sqrt(var)
        p = 2 * 0.5 * math.erfc(-z / math.sqrt(2))
    return u, p


def _asv_binom_pmf(n: int, k: int, p: float) -> float:
    """asv_runner/statistics.py ``binom_pmf``."""
    if not 0 <= k <= n:
        return 0
    if p == 0:
        return 1.0 * (k == 0)
    if p == 1.0:
        return 1.0 * (k == n)
    return math.exp(math.lgamma(1 + n) - math.lgamma(1 + n - k) - math.lgamma(1 + k)
                    + k * math.log(p) + (n - k) * math.log(1 - p))


def _asv_quantile(x: Samples, q: float) -> float:
    """asv_runner/statistics.py ``quantile`` (linear interpolation)."""
    y = sorted(x)
    n = len(y)
    z = (n - 1) * q
    j = int(math.floor(z))
    z -= j
    return y[-1] if j == n - 1 else (1 - z) * y[j] + z * y[j + 1]


def _asv_quantile_ci(x: Samples, q: float, alpha_min: float = 0.01):
    """asv_runner/statistics.py ``quantile_ci``: order-statistic CI, +-inf where none."""
    y = sorted(x)
    n = len(y)
    alpha_min = min(alpha_min, 1 - alpha_min)
    pa = alpha_min / 2
    pb = 1 - pa
    a, b = -math.inf, math.inf
    f = 0.0
    for k, yp in enumerate(y):
        f += _asv_binom_pmf(n, k, q)
        if f <= pa:
            a = yp
        if f >= pb:
            b = yp
            break
    return _asv_quantile(y, q), (a, b)


class _AsvLaplacePosterior:
    """asv_runner/statistics.py ``LaplacePosterior`` (only what ``compute_stats`` uses: ppf)."""

    def __init__(self, y: Samples) -> None:
        self.nu = len(y) - 1
        y = sorted(y)
        self.mle = _asv_quantile(y, 0.5)
        self._y_scale = sum(abs(yp - self.mle) for yp in y)
        self._y_scale *= self.nu ** (1 / (self.nu + 1))
        if self._y_scale != 0:
            self.y = [(yp - self.mle) / self._y_scale for yp in y]
        else:
            self.y = [0 for _ in y]
        self._cdf_norm: float | None = None
        self._cdf_memo: dict[int, float] = {}

    def _cdf_unnorm(self, beta: float) -> float:
        if beta != beta:
            return beta
        k0 = next((k for k, y in enumerate(self.y) if y > beta), len(self.y))
        nu = self.nu
        if k0 - 1 in self._cdf_memo:
            k_start = k0
            cdf = self._cdf_memo[k0 - 1]
        else:
            k_start = 0
            cdf = 0
        for k in range(k_start, k0 + 1):
            c = 2 * k - len(self.y)
            y = sum(self.y[k:]) - sum(self.y[:k])
            a = -math.inf if k == 0 else self.y[k - 1]
            b = beta if k == k0 else self.y[k]
            if c == 0:
                term = (b - a) / y ** (nu + 1)
            else:
                term = 1 / (nu * c) * ((a * c + y) ** (-nu) - (b * c + y) ** (-nu))
            cdf += max(0, term)
            if k != k0:
                self._cdf_memo[k] = cdf
        if beta == math.inf:
            self._cdf_memo[len(self.y)] = cdf
        return cdf

    def _ppf_unnorm(self, cdfx: float) -> float:
        for k in range(len(self.y) + 1):  # noqa: B007 (k is used after the loop, as in asv)
            if cdfx <= self._cdf_memo[k]:
                break
        c = 2 * k - len(self.y)
        y = sum(self.y[k:]) - sum(self.y[:k])
        nu = self.nu
        if k == 0:
            term = cdfx
        else:
            a = self.y[k - 1]
            term = cdfx - self._cdf_memo[k - 1]
        if k == 0:
            z = -nu * c * term
            beta = (z ** (-1 / nu) - y) / c if z > 0 else -math.inf
        elif c == 0:
            beta = a + term * y ** (nu + 1)
        else:
            z = (a * c + y) ** (-nu) - nu * c * term
            beta = (z ** (-1 / nu) - y) / c if z > 0 else math.inf
        if k < len(self.y):
            beta = min(beta, self.y[k])
        return beta

    def ppf(self, cdf: float) -> float:
        if cdf < 0 or cdf > 1.0:
            return math.nan
        if self._y_scale == 0:
            return self.mle
        if self._cdf_norm is None:
            self._cdf_norm = self._cdf_unnorm(math.inf)
        cdfx = min(cdf * self._cdf_norm, self._cdf_norm)
        return self._ppf_unnorm(cdfx) * self._y_scale + self.mle


def asv_compute_stats(samples: Samples) -> tuple[float, dict]:
    """asv_runner/statistics.py ``compute_stats``: the median and its 99% CI (order
    statistics, widened by a Laplace posterior where the sample is too small for one)."""
    y = list(samples)
    y_50, ci_50 = _asv_quantile_ci(y, 0.5, alpha_min=0.99)
    a, b = ci_50
    if (math.isinf(a) or math.isinf(b)) and len(y) > 1:
        c = _AsvLaplacePosterior(y)
        if math.isinf(a):
            a = min(c.ppf(0.01 / 2), min(y))
        if math.isinf(b):
            b = max(c.ppf(1 - 0.01 / 2), max(y))
    return y_50, {"ci_99_a": a, "ci_99_b": b, "repeat": len(y)}


def asv_is_different(samples_a: Samples, samples_b: Samples, stats_a: dict, stats_b: dict,
                     p_threshold: float = 0.002) -> bool:
    """asv/_stats.py ``is_different``: Mann-Whitney U when the sample sizes allow
    p < p_threshold at all, otherwise "the 99% CIs of the medians do not overlap"."""
    a = [x for x in samples_a if not math.isnan(x)]
    b = [x for x in samples_b if not math.isnan(x)]
    p_min = 1 / _asv_binom(len(a) + len(b), min(len(a), len(b)))
    if p_min < p_threshold:
        _, p = asv_mann_whitney_u(a, b)
        return p < p_threshold
    ci_a = (stats_a["ci_99_a"], stats_a["ci_99_b"])
    ci_b = (stats_b["ci_99_a"], stats_b["ci_99_b"])
    return not (ci_a[1] >= ci_b[0] and ci_a[0] <= ci_b[1])


def asv_continuous(history: list[Samples], current: Samples, factor: float = 1.1) -> bool:
    """``asv continuous --factor 1.1 BASE HEAD`` marks HEAD worsened ('+'): compare.py
    ``_is_result_better(time_1, time_2, ss_1, ss_2, factor)`` with 1 = baseline (the previous
    run) and 2 = current: statistics only when neither side has a single repeat."""
    time_1, stats_1 = asv_compute_stats(history[0])
    time_2, stats_2 = asv_compute_stats(current)
    if stats_1["repeat"] != 1 and stats_2["repeat"] != 1:
        if not asv_is_different(history[0], current, stats_1, stats_2):
            return False
    return time_1 < time_2 / factor


# ------------------------------------------------------------------------------- nightlies
#
# Every detector is replayed as a nightly: night t sees runs 0..t and says whether it alarms.
# A per-run rule (pytest-benchmark, asv, harness 0.x) compares run t with what came before.
# Ours is the analysis `harness run` stores: change points matched with the ones earlier
# nights found (harness.history.changes.judge_series), an alarm being a *new* slower change point of
# at least the threshold.

Nightly = Callable[[list[Samples], int, "dict | None"], tuple[bool, "dict | None"]]


def per_run_rule(rule: Detector) -> Nightly:
    def night(runs: list[Samples], t: int, state: dict | None) -> tuple[bool, dict | None]:
        return rule(runs[:t][::-1], runs[t]), None

    return night


def v1_rule(threshold: float = 0.05) -> Detector:
    """harness 0.x: ``classify_series``; only "regression" is an alarm."""
    sys.path.insert(0, str(HERE))
    from v1_rule import classify_series

    def detect(history: list[Samples], current: Samples) -> bool:
        return classify_series(history, current, threshold)[0] == "regression"

    return detect


def ours(threshold: float = 0.05, history_runs: int | None = None, *,
         keep_run: Callable[[int], bool] | None = None,
         may_report: Callable[[int], bool] | None = None,
         first_sight: Callable[[int], bool] | None = None) -> Nightly:
    """The nightly analysis: ``judge_series`` on the last ``history_runs`` runs, with the
    change points earlier nights stored (``state``: a copy per replay).

    The hooks are for variants that know more than the series (the other series of the same
    run: benchmarks/cross_series_on_recorded_noise.py); ``harness run`` has none of them.
    ``keep_run(i)``: earlier run ``i`` stays in the history (the newest always does);
    ``may_report(t)``: night ``t`` may report a slower change (one it may not stays stored,
    unreported, and is reported by the first night that may, as one found small and grown);
    ``first_sight(t)``: night ``t`` reports a slower outlier at once, without waiting for a
    second run at its level."""
    from harness.history import changepoints, changes, regress

    window = history_runs or regress.HISTORY_RUNS

    def night(runs: list[Samples], t: int, state: dict | None) -> tuple[bool, dict | None]:
        stored = [dict(s) for s in (state or {}).get("stored", [])]
        kept = [i for i in range(t) if keep_run is None or keep_run(i)]
        kept = (kept + [t])[-window:]
        ids = [str(i) for i in kept]
        verdict = changes.judge_series([runs[i] for i in kept], ids, stored, float(t),
                                       min_change_pct=regress.MIN_CHANGE_PCT,
                                       threshold_pct=100 * threshold,
                                       log=regress.TIMINGS_IN_LOG,
                                       quantile=regress.TIMING_QUANTILE)
        rec = verdict.reconciled
        by_id = {s["id"]: s for s in stored}
        slower_ok = may_report is None or may_report(t)
        alarm = False
        for cp_id, cp in rec.matched.items():
            by_id[cp_id].update(before=cp.before, after=cp.after, state="open")
            # reported now, as `harness run` does
            if cp_id in verdict.grown and (slower_ok or cp.direction != "up"):
                by_id[cp_id]["reported_at"] = float(t)
                alarm |= cp.direction == "up"
        for cp_id in rec.withdrawn:
            by_id[cp_id]["state"] = "withdrawn"
        for i, cp in enumerate(rec.new):
            if i in verdict.over:  # a slow stretch over when found: neither stored nor told
                continue
            reported = (changepoints.moved(cp.before, cp.after, 100 * threshold)
                        and (slower_ok or cp.direction != "up"))
            stored.append(_stored_point(len(stored) + 1, ids[cp.index], cp.direction, t,
                                        cp.before, cp.after, reported))
            alarm |= cp.direction == "up" and reported
        seen = verdict.outlier
        if (first_sight is not None and not alarm and seen is not None
                and seen.direction == "up" and first_sight(t)):
            # stored at the newest run, so that the change point the next run confirms there
            # is this one found again, not a second report
            stored.append(_stored_point(len(stored) + 1, str(t), "up", t, seen.level,
                                        seen.value, True))
            alarm = True
        return alarm, {"stored": stored}

    return night


def _stored_point(cp_id: int, run_id: str, direction: str, t: int, before: float,
                  after: float, reported: bool) -> dict:
    """A change point as the history DB holds it (``store.series_change_points``), found on
    night ``t`` and reported then if ``reported``."""
    return {"id": cp_id, "run_id": run_id, "direction": direction, "found_in_run": str(t),
            "found_started_at": float(t), "state": "open", "before": before, "after": after,
            "triage": None, "reported_at": float(t) if reported else None}


def replay(night: Nightly, runs: list[Samples], start: int, stop: int,
           state: dict | None = None, keep_states: bool = False
           ) -> tuple[list[int], list[dict | None]]:
    """Nights start..stop-1 in order: the alarming nights, and (keep_states) the state after
    each night."""
    alarms, states = [], []
    for t in range(start, stop):
        alarm, state = night(runs, t, state)
        if alarm:
            alarms.append(t)
        if keep_states:
            states.append(state)
    return alarms, states


# ---------------------------------------------------------------------------------- protocol

def load(path: Path) -> tuple[dict, list[dict]]:
    data = json.loads(path.read_text())
    series = []
    for s in data["series"]:
        runs = [r for r in s["runs"] if r]  # a run without timing for a series is skipped
        series.append({**s, "runs": runs, "missing": len(s["runs"]) - len(runs)})
    return data["meta"], series


def slowed(run: Samples, factor: float, share: float, seed: int) -> list[float]:
    """``run`` with ``share`` of its samples (rounded up; all for 1) multiplied by ``factor``,
    the same samples for the same ``seed``: a regression that slows some launches only (a slow
    path taken now and then), where 1 slows every launch, as a deterministic kernel's does."""
    if share >= 1:
        return [x * factor for x in run]
    hit = set(np.random.default_rng(seed).permutation(len(run))[:math.ceil(share * len(run))])
    return [x * factor if i in hit else x for i, x in enumerate(run)]


def evaluate(series: list[dict], detectors: dict[str, Nightly], warmup: int,
             slowdowns: Sequence[float] = SLOWDOWNS, prompt: int = PROMPT,
             after: int = AFTER, share: float = 1.0) -> dict:
    """Per detector and series: false alarms on the recording, and per slowdown the injected
    steps found and the alarms they caused (``share``: of each run's samples, those slowed)."""
    out: dict = {name: [] for name in detectors}
    for s in series:
        runs = s["runs"]
        n = len(runs)
        points = list(range(warmup, n - prompt))  # a step at t has `prompt` nights to be found
        for name, night in detectors.items():
            # the clean replay from the first night; its states seed each injected replay
            clean, states = replay(night, runs, 1, n, keep_states=True)
            clean = [t for t in clean if t >= warmup]
            found, found_beyond, alarms, beyond = {}, {}, {}, {}
            also_clean = set(clean)
            for slow in slowdowns:
                f = 1 + slow
                hit = hit_beyond = caused = extra = 0
                for t in points:
                    stepped = runs[:t] + [slowed(r, f, share, i)
                                          for i, r in enumerate(runs[t:], start=t)]
                    stop = min(n, t + after + 1)
                    got, _ = replay(night, stepped, t, stop, state=states[t - 2])
                    hit += any(t <= a < t + prompt + 1 for a in got)
                    # found on a night that does not alarm on the unmodified runs anyway
                    hit_beyond += any(t <= a < t + prompt + 1 and a not in also_clean
                                      for a in got)
                    caused += len(got)
                    # the alarms the step brought: not the nights the recording alarms anyway
                    extra += sum(a not in also_clean for a in got)
                found[f"{slow:g}"], alarms[f"{slow:g}"] = hit, caused
                found_beyond[f"{slow:g}"] = hit_beyond
                beyond[f"{slow:g}"] = extra
            out[name].append({"world_size": s["world_size"], "case_id": s["case_id"],
                              "impl": s["impl"], "evaluations": len(points),
                              "nights": n - warmup, "false_alarms": len(clean),
                              "false_alarm_points": clean, "detections": found,
                              "detections_beyond_false": found_beyond,
                              "alarms": alarms, "alarms_beyond_false": beyond,
                              "unslowed": unslowed_in_windows(runs, warmup, prompt)})
    return out


def unslowed_in_windows(runs: list[Samples], warmup: int, prompt: int = PROMPT) -> list[int]:
    """Per injection point t (as ``evaluate``'s), how many of the runs t..t+prompt, the nights
    a step must be found in, the machine left alone: run median within UNSLOWED of the
    series' lower quartile of run medians. With a step injected, only such runs show the new
    level as it is; the others show it times a slowdown of unknown size."""
    medians = np.array([np.median(r) for r in runs])
    alone = medians <= np.quantile(medians, 0.25) * (1 + UNSLOWED)
    return [int(alone[t:t + prompt + 1].sum()) for t in range(warmup, len(runs) - prompt)]


def summarize(rows: list[dict], slowdowns: Sequence[float] = SLOWDOWNS) -> dict:
    ev = sum(r["evaluations"] for r in rows)
    nights = sum(r["nights"] for r in rows)
    fa = sum(r["false_alarms"] for r in rows)
    return {
        "series": len(rows),
        "evaluations": ev,
        "nights": nights,
        "recall": {f"{s:g}": (sum(r["detections"][f"{s:g}"] for r in rows) / ev if ev else None)
                   for s in slowdowns},
        "recall_beyond_false": {
            f"{s:g}": (sum(r["detections_beyond_false"][f"{s:g}"] for r in rows) / ev
                       if ev else None) for s in slowdowns},
        "alarms_per_step": {f"{s:g}": (sum(r["alarms"][f"{s:g}"] for r in rows) / ev
                                       if ev else None) for s in slowdowns},
        "alarms_per_step_beyond_false": {
            f"{s:g}": (sum(r["alarms_beyond_false"][f"{s:g}"] for r in rows) / ev
                       if ev else None) for s in slowdowns},
        "false_alarms": fa,
        "false_alarm_rate": fa / nights if nights else None,
        # the steps whose nights hold at least two (one) runs the machine left alone
        "steps_with_two_unslowed_runs": (sum(sum(k >= 2 for k in r["unslowed"]) for r in rows)
                                         / ev if ev else None),
        "steps_with_one_unslowed_run": (sum(sum(k >= 1 for k in r["unslowed"]) for r in rows)
                                        / ev if ev else None),
        "series_with_false_alarm": sum(1 for r in rows if r["false_alarms"]),
    }


def is_quiet(series: dict) -> bool:
    """A series of the quiet group the goal is judged on: world size 1, run-to-run noise
    under QUIET."""
    return series["world_size"] == 1 and run_to_run_noise(series["runs"]) < QUIET


def run_to_run_noise(runs: list[Samples]) -> float:
    """1.4826 * MAD of the run medians / their median: the robust run-to-run spread."""
    medians = np.array([np.median(r) for r in runs])
    centre = float(np.median(medians))
    return float(1.4826 * np.median(np.abs(medians - centre)) / centre)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(summary: dict[str, dict], title: str) -> str:
    steps = [s for s in SLOWDOWNS if s > 0]
    better = f"{IMPROVEMENT:g}"
    lines = [f"**{title}**", "",
             "| detector | " + " | ".join(f"recall +{100 * s:g}%" for s in steps)
             + " | recall +10% not on a false alarm's night "
             "| alarms per +10% step | of them not on a false alarm's night "
             f"| alarms per {100 * IMPROVEMENT:g}% step (all false) | of them not on a false "
             "alarm's night | false alarms (per night) | series with one |",
             "|---" * (len(steps) + 8) + "|"]
    for name, sm in summary.items():
        rec = " | ".join(_pct(sm["recall"][f"{s:g}"]) for s in steps)
        lines.append(f"| {name} | {rec} | {_pct(sm['recall_beyond_false']['0.1'])} | "
                     f"{sm['alarms_per_step']['0.1']:.2f} | "
                     f"{sm['alarms_per_step_beyond_false']['0.1']:.2f} | "
                     f"{sm['alarms_per_step'][better]:.2f} | "
                     f"{sm['alarms_per_step_beyond_false'][better]:.2f} | "
                     f"{sm['false_alarms']}/{sm['nights']} ({_pct(sm['false_alarm_rate'])}) | "
                     f"{sm['series_with_false_alarm']}/{sm['series']} |")
    return "\n".join(lines)


def per_series_markdown(result: dict) -> str:
    names = list(result)
    lines = ["| W | case | impl | run-to-run noise | evals | " + " | ".join(
        f"{n}: FA, recall@10%" for n in names) + " |", "|---" * (5 + len(names)) + "|"]
    for i, row in enumerate(result[names[0]]):
        cells = []
        for n in names:
            r = result[n][i]
            cells.append(f"{r['false_alarms']}, {r['detections']['0.1']}/{r['evaluations']}")
        lines.append(f"| {row['world_size']} | `{row['case_id']}` | {row['impl']} | "
                     f"{_pct(row['run_to_run_noise'])} | {row['evaluations']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def recording_tag(path: Path) -> str:
    """"" for the quiet recording, "_load", "_holdout", "_fresh" for the others, "_<stem>" for
    another file: the suffix of the figures measured on it."""
    return RECORDINGS.get(path.stem, f"_{path.stem}")


def recording_name(path: Path) -> str:
    """The recording in words, for a figure's sentence."""
    return {"": "the quiet recording", "_load": "the recording made under load",
            "_holdout": "the holdout recording (made under load)",
            "_fresh": "a later quiet recording"}.get(recording_tag(path), path.name)


def figure_details(summary: dict[str, dict]) -> dict[str, dict]:
    """One group's summary, per detector, as a figure's details: recall and alarms per step in
    percent and per step, by step size."""
    def pct(x: float | None) -> float | None:
        return None if x is None else round(100 * x, 1)

    def per(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    out = {}
    for name, sm in summary.items():
        steps = [k for k in sm["recall"] if float(k) > 0]
        both = [k for k in sm["alarms_per_step"] if float(k) != 0]
        label = {k: f"{100 * float(k):+g}%" for k in sm["recall"]}
        out[name] = {
            "recall_pct": {label[k]: pct(sm["recall"][k]) for k in steps},
            "recall_pct_not_on_false_alarm_night":
                {label[k]: pct(sm["recall_beyond_false"][k]) for k in steps},
            "alarms_per_step": {label[k]: per(sm["alarms_per_step"][k]) for k in both},
            "alarms_per_step_not_on_false_alarm_night":
                {label[k]: per(sm["alarms_per_step_beyond_false"][k]) for k in both},
            "false_alarms": sm["false_alarms"], "nights": sm["nights"], "series": sm["series"]}
    return out


def _record(args: argparse.Namespace, meta: dict, summary: dict, quiet: str,
            mine: dict, goal: dict) -> None:
    """This replay's figure, named by its recording and settings."""
    tag = recording_tag(args.data) + ("" if args.share == 1 else f"_share{args.share:g}") + (
        "" if args.prompt == PROMPT else f"_prompt{args.prompt}") + (
        "" if args.warmup == WARMUP else f"_warmup{args.warmup}")
    what = "" if args.data == DATA else f", {recording_name(args.data)}"
    record_figure(
        f"regression_detection{tag}",
        figure="Regression detection: nightly replay of recorded noise, quiet series, injected "
               f"steps that persist{what}"
               + ("" if args.share == 1 else f", each slowing {args.share:.0%} of the samples")
               + ("" if args.prompt == PROMPT else f", found within {args.prompt} nights"),
        value=f"{_pct(mine['recall']['0.1'])} / {mine['false_alarms']} of {mine['nights']} / "
              f"{mine['alarms_per_step']['0.1']:.2f}",
        unit="recall at +10% / false alarms / alarms per step",
        command=command(__file__, *sys.argv[1:]), machine=machine(),
        details={"goal": f"recall >= {GOAL_RECALL:.0%} at +{GOAL_SLOWDOWN:.0%}, fewer false "
                         "alarms than pytest-benchmark and asv, <= "
                         f"{GOAL_ALARMS_PER_STEP} alarms per step",
                 "alarms_per_step_exact": round(mine["alarms_per_step"]["0.1"], 3),
                 "goal_met": {k: goal[k] for k in ("recall_goal_met",
                                                   "fewer_false_alarms_than_both",
                                                   "once_goal_met")},
                 "detectors": figure_details(summary[quiet]),
                 "recording": {"file": args.data.name, "date": meta.get("date"),
                               "machine": meta.get("machine")}},
        headline=tag == "")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="re-record the noise first")
    parser.add_argument("--runs", type=int, default=40, help="runs to record")
    parser.add_argument("--note", default="nothing else was meant to run on the machine",
                        help="what else ran on the machine while recording (stored)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/regression_noise"),
                        help="scratch folder for the recording's DB")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--per-series", action="store_true", help="one row per series too")
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="runs before the first night that is judged")
    parser.add_argument("--prompt", type=int, default=PROMPT,
                        help="nights after a step's own in which an alarm still finds it "
                             f"(default {PROMPT}; at most {AFTER})")
    parser.add_argument("--share", type=float, default=1.0,
                        help="the share of each run's samples a step slows (default 1: all; "
                             "0.6: a regression that slows 60%% of the launches)")
    args = parser.parse_args()
    if not 0 < args.share <= 1:
        parser.error(f"--share {args.share}: give a share of the samples above 0, at most 1")
    if not 0 <= args.prompt <= AFTER:
        parser.error(f"--prompt {args.prompt}: give 0 to {AFTER} (alarms per step are counted "
                     f"over {AFTER} nights after the step)")
    return args


def _groups(series: list[dict]) -> tuple[dict[str, Callable[[dict], bool]], str]:
    """The groups of series summarized, each a test of a result row, and the name of the
    quiet group the goal is held on."""
    groups: dict[str, Callable[[dict], bool]] = {"all series": lambda r: True}
    for w in sorted({s["world_size"] for s in series}):
        groups[f"world size {w}"] = lambda r, w=w: r["world_size"] == w
    quiet = f"world size 1, run-to-run noise < {QUIET:.0%}"
    groups[quiet] = lambda r: r["world_size"] == 1 and r["run_to_run_noise"] < QUIET
    groups[f"world size 1, run-to-run noise >= {QUIET:.0%}"] = (
        lambda r: r["world_size"] == 1 and r["run_to_run_noise"] >= QUIET)
    return groups, quiet


def _goal(quiet: dict[str, dict], main_name: str, others: list[str]) -> dict:
    """The goal held on the quiet series' summary: recall, false alarms against ``others``,
    alarms per step."""
    mine = quiet[main_name]
    return {
        "quiet_recall_at_10pct": mine["recall"]["0.1"],
        "recall_goal_met": mine["recall"]["0.1"] >= GOAL_RECALL,
        "fewer_false_alarms_than_both": all(
            mine["false_alarms"] < quiet[n]["false_alarms"] for n in others),
        "alarms_per_step": mine["alarms_per_step"]["0.1"],
        "once_goal_met": mine["alarms_per_step"]["0.1"] <= GOAL_ALARMS_PER_STEP,
        "steps_with_two_unslowed_runs": mine["steps_with_two_unslowed_runs"],
        "steps_with_one_unslowed_run": mine["steps_with_one_unslowed_run"],
    }


def _print_markdown(args: argparse.Namespace, meta: dict, series: list[dict], summary: dict,
                    main_name: str, goal: dict) -> None:
    runs = [len(s["runs"]) for s in series]
    print(f"Noise: {len(series)} series, {min(runs)}-{max(runs)} runs each, recorded "
          f"{meta['date']} on {meta['machine']}; nights judged from run {args.warmup}; a step "
          f"is injected at every run t from {args.warmup} on that leaves {args.prompt} nights "
          f"after it, and persists, slowing {_pct(args.share)} of each run's samples. Found: an "
          f"alarm within {args.prompt} nights of t; alarms per "
          f"step: all alarms from night t to t+{AFTER}. Run-to-run noise: 1.4826 * MAD of a "
          "series' run medians over its median.\n")
    for title, sm in summary.items():
        print(markdown(sm, f"{title} ({sm[main_name]['series']} series)") + "\n")
    print(f"Goal on the quiet series (recall >= {GOAL_RECALL:.0%} at +{GOAL_SLOWDOWN:.0%}, fewer "
          f"false alarms than pytest-benchmark and asv, <= {GOAL_ALARMS_PER_STEP} alarms per "
          f"step): recall {'met' if goal['recall_goal_met'] else 'NOT met'}, false alarms "
          f"{'fewer' if goal['fewer_false_alarms_than_both'] else 'NOT fewer'}, alarms per step "
          f"{goal['alarms_per_step']:.2f} ({'met' if goal['once_goal_met'] else 'NOT met'}).")
    print(f"Of the steps injected there, {_pct(goal['steps_with_two_unslowed_runs'])} have two "
          f"runs the machine left alone (median within {UNSLOWED:.0%} of the series' lower "
          f"quartile) in the {args.prompt + 1} nights they must be found in, "
          f"{_pct(goal['steps_with_one_unslowed_run'])} at least one; the rest of their runs "
          "read as the new level plus a slowdown of unknown size.")


def main() -> int:
    args = _arguments()
    if args.record:
        record(args.runs, args.work, args.data, args.note)
    meta, series = load(args.data)
    detectors: dict[str, Nightly] = {
        "ours (change points, 5%)": ours(0.05),
        "pytest-benchmark median:5%": per_run_rule(pytest_benchmark_median_5pct),
        "asv continuous --factor 1.1": per_run_rule(asv_continuous),
        "harness 0.x rule (classify_series, 5%)": per_run_rule(v1_rule(0.05)),
    }
    result = evaluate(series, detectors, args.warmup, prompt=args.prompt, share=args.share)
    for rows in result.values():
        for row, s in zip(rows, series, strict=True):
            row["run_to_run_noise"] = run_to_run_noise(s["runs"])
    groups, quiet = _groups(series)
    summary = {g: {n: summarize([r for r in rows if keep(r)]) for n, rows in result.items()}
               for g, keep in groups.items()}
    main_name = next(iter(detectors))
    goal = _goal(summary[quiet], main_name, list(detectors)[1:3])
    _record(args, meta, summary, quiet, summary[quiet][main_name], goal)
    if args.json:
        print(json.dumps({"meta": {k: v for k, v in meta.items() if k != "per_run_load"},
                          "warmup": args.warmup, "prompt": args.prompt, "share": args.share,
                          "slowdowns": list(SLOWDOWNS),
                          "summary": summary, "goal": goal, "per_series": result}, indent=1))
        return 0
    _print_markdown(args, meta, series, summary, main_name, goal)
    if args.per_series:
        print("\n" + per_series_markdown(result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
