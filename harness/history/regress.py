"""Regression analysis: timing changes and correctness changes of a run against its history.
Two runs compared with each other (``harness compare``) are ``harness.history.two_runs``'s.

Timing, against a history (per series: machine fingerprint, case id, impl, world size, timing
method): the series' change points (``harness.history.changepoints``), each found once and
kept in the DB with its triage (``harness.history.changes``). A new slower change point of at
least the op's threshold is a "regression" of the run that confirmed it, a faster one an
"improvement"; the newest run alone off the current level is "suspicious" until the next run
confirms or drops it.

Correctness: pass -> failure ("new_failure"), failure -> pass ("fixed"), an error metric grown
DRIFT_FACTOR x while still passing ("drift": against the lowest value since the series' last
such growth, so a creep of 2x a night is found when it has added up to 10x, once), and a
changed output hash of a deterministic op ("bits_changed").

Ops are looked up through ``harness.core.discovery.registry()`` only; results of ops it does
not know (ingested from elsewhere) get the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.results import FAILING, CaseResult, result_key
from harness.history import changepoints, changes, reads, sql, store, triage

#: a series' analysis looks at the run and up to this many earlier runs
HISTORY_RUNS = 100
#: change points smaller than this (percent) are not kept (Perfherder's floor); the op's
#: threshold decides which kept ones are findings
MIN_CHANGE_PCT = 2.0
#: timings are analysed in log: they vary by ratio (see ``noise.log_runs``)
TIMINGS_IN_LOG = True
#: and each run by the 10th percentile of its samples, not their median: a busy machine slows
#: a run's samples, never speeds them up, so a low quantile holds less of the machine and more
#: of the kernel. What a finding shows, and what the threshold is held against, is still the
#: medians; a run with fewer than ``noise.QUANTILE_SAMPLES`` samples is read by its median
#: too. ``changepoints.find`` reads the runs by their medians a second time, for steps that
#: slow part of the samples.
#: chosen by benchmarks/regression_detection.py (benchmarks/RESULTS.md)
TIMING_QUANTILE = 0.10
DRIFT_FACTOR = 10.0
DEFAULT_THRESHOLD = 0.05

KINDS = ("regression", "suspicious", "improvement", "new_failure", "fixed", "drift",
         "bits_changed")


# ----------------------------------------------------------------------------- op lookups


def _spec(op: str) -> Any:
    try:
        from harness.core.discovery import registry

        return registry().specs.get(op)
    except Exception:  # noqa: BLE001 - a broken suite or plugin must not stop the analysis
        return None


def threshold_of(op: str) -> float:
    """The op's regression threshold (``OpSpec.regression_threshold``), else 0.05."""
    value = getattr(_spec(op), "regression_threshold", None)
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return DEFAULT_THRESHOLD


def deterministic_of(op: str) -> bool | None:
    """Whether the op promises the same bits for the same inputs; None for an unknown op."""
    value = getattr(_spec(op), "deterministic", None)
    return value if isinstance(value, bool) else None


# ----------------------------------------------------------------------------- findings


@dataclass
class Finding:
    """One change worth reporting."""

    kind: str  # one of KINDS
    key: str
    op: str
    case_id: str
    impl: str
    world_size: int
    #: "median_ns" for timing; the output name for drift; "status"; "output_hash"
    metric: str
    baseline: float | None
    current: float | None
    ratio: float | None
    p_value: float | None
    baseline_run: str | None
    detail: str  # one human line
    #: the stored change point a timing finding reports (None for the other kinds)
    change_point_id: int | None = None

    @classmethod
    def from_stored(cls, d: dict[str, Any]) -> Finding:
        """A finding as ``triage.stored_findings`` gives it back (its key is derived)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"key"}
        return cls(key=result_key(d["case_id"], d["impl"], d["world_size"]),
                   **{k: d.get(k) for k in names})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (non-finite numbers become None so strict parsers accept it)."""
        d = dataclasses.asdict(self)
        if isinstance(d["change_point_id"], tuple):  # ("new", i) until stored
            d["change_point_id"] = list(d["change_point_id"])
        for name in ("baseline", "current", "ratio", "p_value"):
            v = d[name]
            if isinstance(v, float) and not math.isfinite(v):
                d[name] = None
        return d


def _fmt_time(ns: float) -> str:
    unit, scale = next(((u, f) for u, f in (("s", 1e9), ("ms", 1e6), ("us", 1e3))
                        if abs(ns) >= f), ("ns", 1.0))
    v = ns / scale
    text = f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return f"{text} {unit}"


def _short(run_id: str | None) -> str:
    return (run_id or "?")[:8]


def format_findings(findings: Sequence[Finding]) -> list[str]:
    """One plain-text line per finding, e.g. ``REGRESSION w1 allreduce[...]@torch: median
    12.3 us -> 14.1 us (x1.146, p=2e-05) vs run ab12cd34``."""
    return [f"{f.kind.upper()} w{f.world_size} {f.case_id}@{f.impl}: {f.detail}"
            + (f" [change point #{f.change_point_id}]"
               if isinstance(f.change_point_id, int) else "")
            for f in findings]


def _finding(kind: str, r: CaseResult, metric: str, detail: str, *,
             baseline: float | None = None, current: float | None = None,
             ratio: float | None = None, p_value: float | None = None,
             baseline_run: str | None = None) -> Finding:
    return Finding(kind=kind, key=r.key, op=r.op, case_id=r.case_id, impl=r.impl,
                   world_size=r.world_size, metric=metric, baseline=baseline, current=current,
                   ratio=ratio, p_value=p_value, baseline_run=baseline_run, detail=detail)


def in_series(r: CaseResult) -> bool:
    """Whether ``r``'s times belong in its regression series: it passed (times of wrong outputs
    mean nothing) and was not timed with a token budget because its ranks contended for CPUs
    or a GPU or an interpreter ran its kernels (``timing.minimal``: those times measure the
    contention or the interpreter)."""
    return (r.status == "pass" and isinstance(r.timing, dict)
            and not r.timing.get("minimal"))


def _samples(r: CaseResult) -> list[float]:
    """Raw timing samples of a result in its series (``in_series``), else []."""
    if not in_series(r):
        return []
    samples = r.timing.get("samples")
    return samples if isinstance(samples, list) else []


def timing_method(r: CaseResult) -> tuple[bool, bool]:
    """(CUDA-graph replay, L2 flushed): timings taken differently are different series (a
    replay leaves out launch overhead, a flushed cache adds misses)."""
    t = r.timing if isinstance(r.timing, dict) else {}
    return t.get("mode") == "graph", bool(t.get("l2_flush"))


_DRIFT_METRIC = {"exact": "max_abs", "allclose": "max_abs", "ulp": "max_abs",
                 "cos_diff": "cos_diff", "rel_l2": "rel_l2"}


def _drift_metric(tolerance: Any) -> str:
    """The error metric a tolerance bounds (an all_of: its first part's)."""
    if not isinstance(tolerance, dict):
        return "max_abs"
    if tolerance.get("kind") == "all_of":
        parts = tolerance.get("parts") or []
        return _drift_metric(parts[0]) if parts else "max_abs"
    return _DRIFT_METRIC.get(tolerance.get("kind"), "max_abs")


def _metric_value(entry: Any, metric: str) -> float | None:
    if not isinstance(entry, dict):
        return None
    metrics = entry.get("metrics")
    # records from older writers kept the metrics beside the tolerance
    value = (metrics if isinstance(metrics, dict) else entry).get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return max(value, 0.0)  # cos_diff rounds to tiny negatives when nothing differs


def _grew(level: float, value: float) -> bool:
    """Whether an error metric at ``value`` has drifted from ``level``."""
    return value > 0.0 if level == 0.0 else value >= DRIFT_FACTOR * level


def drift_level(values: Sequence[tuple[str, float]]) -> tuple[str, float, int]:
    """The level an error metric's next value is held against, from the series' earlier
    (run id, value) pairs, oldest first: the lowest value since the last one that drifted
    from the level before it (which starts a level of its own), with its run and how many
    runs ago it was."""
    run, level, at = values[0][0], values[0][1], 0
    for i, (run_id, value) in enumerate(values[1:], start=1):
        if _grew(level, value) or value < level:
            run, level, at = run_id, value, i
    return run, level, len(values) - at


def _drift(history: Sequence[CaseResult], cur: CaseResult) -> list[Finding]:
    """``history``: the series' earlier passing results, newest first."""
    out = []
    for name, entry in cur.outputs.items():
        if not isinstance(entry, dict) or entry.get("passed") is False:
            continue
        metric = _drift_metric(entry.get("tolerance"))
        c = _metric_value(entry, metric)
        values = [(r.run_id, v) for r in reversed(history)
                  if (v := _metric_value(r.outputs.get(name), metric)) is not None]
        if c is None or not values:
            continue
        run, b, ago = drift_level(values)
        if not _grew(b, c):
            continue
        tol = entry.get("tolerance")
        tol_text = tol.get("text", tol.get("kind", "")) if isinstance(tol, dict) else str(tol)
        if b == 0.0:
            detail = f"{metric} of {name!r} grew from 0 to {c:.3g}, still within {tol_text}"
            ratio = None
        else:
            ratio = c / b
            detail = (f"{metric} of {name!r} {b:.3g} -> {c:.3g} (x{ratio:.1f}), "
                      f"still within {tol_text}")
        since = f"vs run {_short(run)}" + ("" if ago == 1 else f", {ago} runs back: it crept")
        out.append(_finding("drift", cur, name, f"{detail} {since}",
                            baseline=b, current=c, ratio=ratio, baseline_run=run))
    return out


def correctness_findings(base: CaseResult, cur: CaseResult,
                         history: Sequence[CaseResult] = ()) -> list[Finding]:
    """new_failure, fixed, drift and bits_changed of ``cur`` against an earlier ``base``;
    drift against ``history`` (the series' earlier results, newest first, ``base`` the first
    with a verdict) where given, else against ``base`` alone."""
    vs = f"vs run {_short(base.run_id)}"
    if base.status == "pass" and cur.status in FAILING:
        reason = cur.reason.splitlines()[0] if cur.reason else "no reason recorded"
        return [_finding("new_failure", cur, "status", f"pass -> {cur.status}: {reason} {vs}",
                         baseline_run=base.run_id)]
    if base.status in FAILING and cur.status == "pass":
        return [_finding("fixed", cur, "status", f"{base.status} -> pass {vs}",
                         baseline_run=base.run_id)]
    if base.status != "pass" or cur.status != "pass":
        return []
    out = _drift([r for r in history if r.status == "pass"] or [base], cur)
    deterministic = deterministic_of(cur.op)
    # an op not in the registry may still be deterministic: flag it, and say so
    if (deterministic is not False and base.output_hash and cur.output_hash
            and base.output_hash != cur.output_hash):
        why = "deterministic op" if deterministic else "op unknown to this harness"
        out.append(_finding(
            "bits_changed", cur, "output_hash",
            f"output hash {base.output_hash[:12]} -> {cur.output_hash[:12]} ({why}, both "
            f"passing) {vs}", baseline_run=base.run_id))
    return out


# ----------------------------------------------------------------------------- history


def _earlier_results(conn: sqlite3.Connection, r: CaseResult, fingerprint: str,
                     earlier: set[str], newer: int, lookback: int) -> list[CaseResult]:
    """The series' results from ``earlier`` runs, newest first, enough for ``lookback``."""
    # rows of `newer` later runs and of the run itself come first in reads.history's order;
    # grow the window until lookback + 1 passing results (the previous run's own lookback)
    # are in it, or the series ends
    limit = newer + lookback + 2
    while True:
        rows = reads.history(conn, r.case_id, r.impl, r.world_size,
                             machine_fingerprint=fingerprint, limit=limit)
        prior = [CaseResult.from_dict(json.loads(row["record"])) for row in rows
                 if row["run_id"] in earlier]
        if len(rows) < limit or sum(1 for p in prior if _samples(p)) > lookback:
            return prior
        limit *= 2


@dataclass
class Analysis:
    """What the analysis of one run found, and what it changes in the stored change points."""

    run_id: str
    machine_fingerprint: str
    findings: list[Finding]
    #: change points found for the first time: series identity and figures (store columns)
    new_points: list[dict[str, Any]]
    #: (stored change point id, columns to set)
    updates: list[tuple[int, dict[str, Any]]]


def analyze(conn: sqlite3.Connection, run_id: str,
            threshold: Callable[[str], float] = threshold_of,
            history_runs: int = HISTORY_RUNS) -> Analysis:
    """The findings of one stored run against the earlier runs of the same machine.

    Timing, per result that passed: the change points of its series (``changepoints.find`` on
    the run and up to ``history_runs`` earlier passing runs of the same machine and timing
    method; runs that started after ``run_id`` are ignored), matched with the stored ones
    (``changes.reconcile``). A change point found for the first time is a "regression" (slower)
    or an "improvement" (faster) when it moved by the op's threshold or more; the newest run
    alone off the current level by as much is "suspicious". Correctness kinds: against the
    series' most recent earlier result with a verdict (a "skip" has none). Raises
    ``sql.StoreError`` for a run not in the DB.
    """
    run = store.get_run(conn, run_id)
    if run is None:
        raise sql.StoreError(f"run {run_id} is not in the history DB: ingest its run "
                             "directory with `harness ingest` or pass the right --db")
    fingerprint = str((run.machine or {}).get("fingerprint"))
    order = store.run_ids(conn, fingerprint)  # newest first, the order reads.history uses
    pos = order.index(run_id)
    earlier = set(order[pos + 1:])
    out = Analysis(run_id, fingerprint, [], [], [])
    for cur in store.results_for_run(conn, run_id):
        prior = _earlier_results(conn, cur, fingerprint, earlier, pos, history_runs)
        if _samples(cur):
            timed = [p for p in prior
                     if _samples(p) and timing_method(p) == timing_method(cur)][:history_runs]
            if timed:
                _series_changes(conn, out, run, cur, timed[::-1], threshold(cur.op))
        reference = next((p for p in prior if p.status != "skip"), None)
        if reference is not None:
            out.findings.extend(correctness_findings(reference, cur, prior[:history_runs]))
    return out


def analyze_run(conn: sqlite3.Connection, run_id: str,
                threshold: Callable[[str], float] = threshold_of,
                history_runs: int = HISTORY_RUNS) -> list[Finding]:
    """``analyze``'s findings (nothing is stored)."""
    return analyze(conn, run_id, threshold, history_runs).findings


def timing_label(r: CaseResult) -> str:
    """How a result was timed when that makes it a series of its own ("" for the default)."""
    graph, flushed = timing_method(r)
    return "+".join(p for p, on in (("graph", graph), ("l2 flush", flushed)) if on)


def _point_columns(conn: sqlite3.Connection, cp: changepoints.ChangePoint,
                   series: list[CaseResult]) -> dict[str, Any]:
    """A change point's stored columns: its figures, where it began (the first run of its new
    level) and, where the runs leave it open, the first and last run it may have begun at."""
    first = series[cp.index]
    earliest = series[cp.earliest] if cp.earliest is not None else None
    latest = series[cp.latest] if cp.latest is not None else None
    return {"run_id": first.run_id, "git_commit": _commit_of(conn, first.run_id),
            "earliest_run_id": earliest.run_id if earliest else None,
            "earliest_commit": _commit_of(conn, earliest.run_id) if earliest else None,
            "latest_run_id": latest.run_id if latest else None,
            "latest_commit": _commit_of(conn, latest.run_id) if latest else None,
            "state": "open", **{k: v for k, v in cp.to_dict().items()
                                if k not in ("index", "earliest_index", "latest_index")}}


def _commit_of(conn: sqlite3.Connection, run_id: str) -> str | None:
    info = store.get_run(conn, run_id)
    return str(info.git_commit) if info is not None and info.git_commit else None


def _series_changes(conn: sqlite3.Connection, out: Analysis, run: Any, cur: CaseResult,
                    earlier: list[CaseResult], threshold: float) -> None:
    """Change points and a suspicious newest run of ``cur``'s timing series (``earlier``:
    its earlier runs, oldest first), into ``out``."""
    series = [*earlier, cur]
    stored = triage.series_change_points(conn, out.machine_fingerprint, cur.case_id, cur.impl,
                                         cur.world_size, timing_label(cur))
    verdict = changes.judge_series([_samples(p) for p in series], [p.run_id for p in series],
                                   stored, float(run.started_at or 0.0),
                                   min_change_pct=MIN_CHANGE_PCT, threshold_pct=100 * threshold,
                                   log=TIMINGS_IN_LOG, quantile=TIMING_QUANTILE)
    rec = verdict.reconciled
    position = {p.run_id: i for i, p in enumerate(series)}
    open_points = [s for s in stored if s["state"] == "open"]
    fixed: set[int] = set()

    def mark_fixed(recovery: changepoints.ChangePoint) -> None:
        """The stored slower steps ``recovery`` takes the series back from, marked fixed."""
        for old in changes.returned(open_points, recovery, 100.0 * threshold, position,
                                    float(run.started_at or 0.0)):
            if old["id"] not in fixed:
                fixed.add(old["id"])
                out.updates.append((old["id"], {
                    "triage": "fixed", "triage_by": "harness", "triaged_at": time.time(),
                    "triage_note": f"back to {_fmt_time(recovery.after)} from run "
                                   f"{_short(series[recovery.index].run_id)}"}))

    for cp_id, cp in rec.matched.items():
        # its figures refreshed, and where it began re-dated as the runs now in view say: a
        # night between the two levels is no longer blamed once the new level's runs came
        columns = _point_columns(conn, cp, series)
        out.updates.append((cp_id, columns))
        if cp_id in verdict.grown:
            out.findings.append(_change_finding(cur, series[cp.index], cp, cp_id, columns))
        # a return found while a slow night still held its new level up: judged again as
        # its level settles
        mark_fixed(cp)
    out.updates.extend((cp_id, {"state": "withdrawn"}) for cp_id in rec.withdrawn)
    own = {i: cp_id for cp_id, i in rec.refound.items()}
    for i, cp in enumerate(rec.new):
        if i in verdict.over:  # a slow stretch already over when found: nothing to tell
            continue
        columns = _point_columns(conn, cp, series)
        # triaged already, as the slow runs that first showed it: not reported again
        carried = changes.carried_triage(stored, columns["run_id"], cp.direction, rec.matched)
        if i in own:
            ref: Any = own[i]
            out.updates.append((own[i], columns))
        else:
            out.new_points.append({"case_id": cur.case_id, "impl": cur.impl,
                                   "world_size": cur.world_size, "timing": timing_label(cur),
                                   "op": cur.op, **columns,
                                   **({**carried, "triaged_at": time.time()} if carried
                                      else {})})
            ref = ("new", len(out.new_points) - 1)
        back = changes.partly_back(stored, cp, position, 100.0 * threshold)
        if changepoints.moved(cp.before, cp.after, 100.0 * threshold) and carried is None:
            out.findings.append(_change_finding(cur, series[cp.index], cp, ref, columns,
                                                back))
        mark_fixed(cp)
        if back is not None and (back[0].get("triage") == "invalid"
                                 or changes.reopened(back[0], cur.run_id)):
            _reopen(out, cur, series, position, cp, *back)
    outlier = verdict.outlier
    if outlier is not None and outlier.direction == "up":
        out.findings.append(_finding(
            "suspicious", cur, "median_ns",
            f"median {_fmt_time(outlier.level)} -> {_fmt_time(outlier.value)} "
            f"({outlier.change_pct:+.1f}%, p={outlier.p_value:.1g}) in this run alone, against "
            "the level since the last change point; the next run confirms or drops it",
            baseline=outlier.level, current=outlier.value,
            ratio=outlier.value / outlier.level if outlier.level else None,
            p_value=outlier.p_value, baseline_run=earlier[-1].run_id))


def _reopen(out: Analysis, cur: CaseResult, series: list[CaseResult],
            position: dict[str, int], recovery: changepoints.ChangePoint,
            slow: dict[str, Any], left: float) -> None:
    """A change point its user marked invalid (noise) that the series came back from only
    partway (``changes.partly_back``): the mark is lifted and what is left is a regression."""
    since = f"run {_short(series[recovery.index].run_id)}"
    out.updates.append((slow["id"], {
        "triage": None, "triage_by": changes.CARRIED_BY, "triaged_at": None,
        "triage_note": changes.REOPENED.format(run=cur.run_id)
        + f": marked invalid, but back only to {_fmt_time(recovery.after)} from {since}, "
          f"{left:+.1f}% above the level before it"}))
    first = series[position[slow["run_id"]]]
    where = triage.where_it_began(slow)
    f = _finding("regression", cur, "median_ns",
                 f"median {_fmt_time(slow['before'])} -> {_fmt_time(recovery.after)} "
                 f"({left:+.1f}%) {where}: change point {slow['id']}, marked invalid, came "
                 f"back from {_fmt_time(slow['after'])} only partway ({since}); its mark "
                 "is lifted", baseline=slow["before"], current=recovery.after,
                 ratio=recovery.after / slow["before"], baseline_run=first.run_id)
    f.change_point_id = slow["id"]
    out.findings.append(f)


def _share_words(share: float) -> str:
    """0.1 -> "tenth", 0.25 -> "quarter", another share as a percentage."""
    words = {0.5: "half", 0.25: "quarter", 0.2: "fifth", 0.1: "tenth", 0.05: "twentieth"}
    return words.get(round(share, 6), f"{100 * share:g}%")


def _change_finding(cur: CaseResult, first: CaseResult, cp: changepoints.ChangePoint,
                    ref: Any, columns: dict[str, Any],
                    back: tuple[dict[str, Any], float] | None = None) -> Finding:
    """The finding that reports a change point (``columns``: its stored columns, where it
    began among them)."""
    kind = "regression" if cp.direction == "up" else "improvement"
    where = triage.where_it_began(columns)
    if first.run_id == cur.run_id and not columns.get("earliest_run_id"):
        where = "from this run"
    detail = (f"median {_fmt_time(cp.before)} -> {_fmt_time(cp.after)} ({cp.change_pct:+.1f}%, "
              f"p={cp.p_value:.1g}) {where}; {cp.n_before} runs before, {cp.n_after} after")
    if cp.partial:
        detail += ("; part of the samples moved (the medians, not the fastest "
                   f"{_share_words(TIMING_QUANTILE)})")
    if back is not None:
        slow, left = back
        detail += (f"; only partway back from change point {slow['id']}: still {left:+.1f}% "
                   f"above {_fmt_time(slow['before'])}, its level before")
    f = _finding(kind, cur, "median_ns", detail, baseline=cp.before, current=cp.after,
                 ratio=cp.after / cp.before if cp.before else None, p_value=cp.p_value,
                 baseline_run=first.run_id)
    f.change_point_id = ref
    return f


# ----------------------------------------------------------------------------- stored analysis


def analyze_and_store(conn: sqlite3.Connection, run_id: str,
                      threshold: Callable[[str], float] = threshold_of) -> list[Finding]:
    """``analyze``, stored: the run's findings (replacing earlier ones) and its change points,
    so that reports and triage read them instead of re-deriving every run's history."""
    a = analyze(conn, run_id, threshold)
    ids = triage.save_analysis(conn, run_id, a.machine_fingerprint,
                               [f.to_dict() for f in a.findings], a.new_points, a.updates)
    for f in a.findings:
        if isinstance(f.change_point_id, tuple):
            f.change_point_id = ids[f.change_point_id[1]]
    return a.findings


def analyze_ingested(conn: sqlite3.Connection, run_ids: Sequence[str],
                     threshold: Callable[[str], float] = threshold_of) -> list[str]:
    """Store the analysis of newly ingested runs and of every later run of their machines,
    oldest first (a run ingested out of order changes the baseline of the runs after it);
    the runs analysed, in order."""
    todo = {r for run_id in run_ids for r in triage.runs_from(conn, run_id)}
    ordered = sorted(todo, key=lambda r: (getattr(store.get_run(conn, r), "started_at", 0.0)
                                          or 0.0, r))
    for run_id in ordered:
        analyze_and_store(conn, run_id, threshold)
    return ordered
