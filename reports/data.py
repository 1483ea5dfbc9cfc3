"""What the dashboard shows, read from the history DB in one pass.

Results are loaded without their raw timing samples (the charts use the stored median, p10
and p90; the compare page reloads its two runs whole). Findings come from the ``findings``
table that ``harness run`` and ``harness ingest`` fill; runs stored before that table existed
are analysed here first, once, and their findings stored.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.core.results import FAILING, CaseResult, RunInfo
from harness.history import regress, store, triage

#: marker kinds on the latency trends: change points (slower, faster) and suspicious runs
TIMING_KINDS = ("regression", "suspicious", "improvement")
#: finding kinds listed on the index, most urgent first
INDEX_KINDS = ("new_failure", "regression", "suspicious", "drift", "bits_changed", "fixed",
               "improvement")


@dataclass
class Run:
    """One run and what is known about it."""

    info: RunInfo
    machine: str  # fingerprint
    machine_name: str
    index: int  # position in start order, 0 = oldest
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.info.run_id

    @property
    def short(self) -> str:
        return self.info.run_id[:8]

    @property
    def commit(self) -> str:
        return (self.info.git_commit or "")[:10]


@dataclass
class Entry:
    """One result of one run (samples dropped)."""

    result: CaseResult
    run: Run

    @property
    def series(self) -> tuple[str, str, str, int, str]:
        """(machine, case id, impl, world size, timing method): one trend line."""
        r = self.result
        return (self.run.machine, r.case_id, r.impl, r.world_size, timing_label(r))


@dataclass
class History:
    """Everything the site is rendered from."""

    db_label: str
    runs: list[Run]
    entries: list[Entry]
    findings: list[dict[str, Any]]
    #: the timing series' change points with their triage (``triage.change_points``)
    change_points: list[dict[str, Any]]
    #: op -> names of its negative controls (known-wrong versions that must fail)
    controls: dict[str, set[str]]
    #: op -> (family, description, implementations, suite, origin) from the registry, where
    #: the op is known
    ops_known: dict[str, dict[str, Any]]

    def runs_of(self, machine: str) -> list[Run]:
        return [r for r in self.runs if r.machine == machine]

    def machines(self) -> list[tuple[str, str]]:
        """(fingerprint, name) of every machine, the most recently active first."""
        seen: dict[str, str] = {}
        for run in reversed(self.runs):
            seen.setdefault(run.machine, run.machine_name)
        return list(seen.items())

    def is_control(self, op: str, impl: str) -> bool:
        return impl in self.controls.get(op, ())

    def by_op(self) -> dict[str, list[Entry]]:
        out: dict[str, list[Entry]] = defaultdict(list)
        for e in self.entries:
            out[e.result.op].append(e)
        return dict(sorted(out.items()))

    def suite_of(self, op: str) -> str:
        """The suite an op comes from, "" where the loaded suites do not have it (pass
        ``--suite`` or run in the project to name it)."""
        known = self.ops_known.get(op)
        return str(known.get("suite") or "") if known else ""

    def family_of(self, op: str) -> str:
        known = self.ops_known.get(op)
        if known:
            return str(known["family"])
        return next((e.result.family for e in self.entries if e.result.op == op), "")


timing_label = regress.timing_label


def unanalysed(conn: sqlite3.Connection) -> list[str]:
    """The runs that have no stored findings yet (oldest first)."""
    return triage.unanalyzed_runs(conn)


def analyze_missing(conn: sqlite3.Connection) -> list[str]:
    """Analyse and store the runs that have no stored findings yet (oldest first)."""
    todo = triage.unanalyzed_runs(conn)
    for run_id in todo:
        regress.analyze_and_store(conn, run_id)
    return todo


def _registry_view() -> tuple[dict[str, set[str]], dict[str, dict[str, Any]]]:
    try:
        from harness.core.discovery import registry

        reg = registry()
    except Exception:  # noqa: BLE001 - a broken suite must not stop the report of the history
        return {}, {}
    controls = {name: set(spec.negative_controls) for name, spec in reg.specs.items()}
    known = {name: {"family": spec.family, "description": spec.description,
                    "implementations": sorted(spec.implementations),
                    "suite": reg.suite_of.get(name, ""),
                    "origin": reg.origin_of(name)}
             for name, spec in reg.specs.items()}
    return controls, known


def load(conn: sqlite3.Connection, db_label: str) -> History:
    """Read every run, result (without samples) and stored finding of the DB."""
    runs: list[Run] = []
    by_id: dict[str, Run] = {}
    rows = conn.execute(
        "SELECT r.run_id, m.fingerprint FROM runs r JOIN machines m ON m.id = r.machine_id "
        "ORDER BY r.started_at, r.run_id").fetchall()
    for i, row in enumerate(rows):
        info = store.get_run(conn, row["run_id"])
        assert info is not None
        name = str((info.machine or {}).get("name") or row["fingerprint"])
        run = Run(info=info, machine=row["fingerprint"], machine_name=name, index=i)
        runs.append(run)
        by_id[run.run_id] = run
    entries = []
    for row in conn.execute("SELECT run_id, record FROM results ORDER BY world_size, case_id, "
                            "impl").fetchall():
        data = json.loads(row["record"])
        timing = data.get("timing")
        if isinstance(timing, dict):
            timing.pop("samples", None)  # the bulk of a record; charts need stats
            if timing.get("minimal"):  # a token timing (contended ranks, an interpreter):
                # no trend point
                data["timing"] = {k: timing.get(k)
                                  for k in ("minimal", "contention", "interpreter")}
        result = CaseResult.from_dict(data)
        run = by_id[row["run_id"]]
        run.counts[result.status] = run.counts.get(result.status, 0) + 1
        entries.append(Entry(result, run))
    controls, known = _registry_view()
    return History(db_label=db_label, runs=runs, entries=entries,
                   findings=triage.stored_findings(conn),
                   change_points=triage.change_points(conn), controls=controls,
                   ops_known=known)


# ----------------------------------------------------------------------------- views


@dataclass
class Cell:
    """Latest status of every series in one (family, impl, world size) cell."""

    total: int = 0
    passed: int = 0
    failed: int = 0  # fail, error, timeout, crash
    skipped: int = 0
    control: bool = False

    @property
    def state(self) -> str:
        """ok / bad / skip / empty; for a negative control, failing is what it must do."""
        if not self.total:
            return "empty"
        if self.control:
            return "ok" if self.passed == 0 and self.failed else "bad"
        if self.failed:
            return "bad"
        return "ok" if self.passed else "skip"

    @property
    def text(self) -> str:
        if self.control:
            return f"{self.failed}/{self.total - self.skipped} caught"
        return f"{self.passed}/{self.total - self.skipped}" + (
            f" ({self.skipped} skip)" if self.skipped else "")


def latest_by_series(entries: Iterable[Entry]) -> dict[tuple, Entry]:
    """The newest entry of each series (entries come in any order)."""
    out: dict[tuple, Entry] = {}
    for e in entries:
        key = e.series
        if key not in out or e.run.index > out[key].run.index:
            out[key] = e
    return out


def status_matrix(history: History, machine: str
                  ) -> tuple[list[int], list[tuple[str, str, bool, dict[int, Cell]]]]:
    """(world sizes, rows of (family, impl, is control, {world size: Cell})) from the latest
    result of every series on ``machine``: the state of the code, not of one partial run."""
    cells: dict[tuple[str, str], dict[int, Cell]] = defaultdict(dict)
    sizes: set[int] = set()
    latest = latest_by_series(e for e in history.entries if e.run.machine == machine)
    for e in latest.values():
        r = e.result
        sizes.add(r.world_size)
        control = history.is_control(r.op, r.impl)
        cell = cells[(r.family, r.impl)].setdefault(r.world_size, Cell(control=control))
        cell.total += 1
        cell.passed += r.status == "pass"
        cell.failed += r.status in FAILING
        cell.skipped += r.status == "skip"
    rows = []
    for (family, impl), by_size in sorted(cells.items()):
        control = any(c.control for c in by_size.values())
        rows.append((family, impl, control, by_size))
    rows.sort(key=lambda row: (row[0], row[2], row[1]))  # controls after implementations
    return sorted(sizes), rows


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(logs) / len(logs)) if logs else None


def op_trend(entries: list[Entry]) -> list[tuple[Run, float]]:
    """Per run, the geometric mean over the op's passing series of median / that series'
    first median: one number per run that moves when the op as a whole gets slower."""
    first: dict[tuple, float] = {}
    per_run: dict[str, list[float]] = defaultdict(list)
    runs: dict[str, Run] = {}
    for e in sorted(entries, key=lambda e: e.run.index):
        median = (e.result.timing or {}).get("median")
        if e.result.status != "pass" or not median:
            continue
        base = first.setdefault(e.series, median)
        per_run[e.run.run_id].append(median / base)
        runs[e.run.run_id] = e.run
    trend = []
    for run_id, ratios in per_run.items():
        g = geomean(ratios)
        if g is not None:
            trend.append((runs[run_id], g))
    return sorted(trend, key=lambda t: t[0].index)


def judged_runs(history: History, run_ids: Iterable[str] = ()) -> list[Run]:
    """The runs ``--fail-on`` judges: the named ones, else the newest run of each machine."""
    named = list(run_ids)
    if named:
        by_id = {r.run_id: r for r in history.runs}
        return [by_id[r] for r in named]
    newest: dict[str, Run] = {}
    for run in history.runs:
        newest[run.machine] = run
    return list(newest.values())
