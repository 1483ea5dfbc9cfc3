"""Render the history DB as a static site that opens from file:// with no network.

Layout of the output directory::

    index.html             status matrix per machine, findings, runs chart, ops, runs
    ops/<op>.html          trends per case, busbw against message size for collectives
    runs/<run>.html        environment, findings, failures with metrics, every result
    compare/<a>_<b>.html   a run against the previous run of its machine that ran some of the
                           same series (and --compare)
    assets/                plotly.min.js (written once), style.css, app.js

Every page is a jinja2 template with autoescape on; figures travel as JSON inside
``<script type="application/json">`` (escaped for HTML by ``htmlsafe_json_dumps``) and are
drawn by assets/app.js when they scroll into view, so an op with hundreds of cases opens fast.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
import shutil
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup

from harness.cli.common import fmt_us
from harness.core.discovery import BUILTIN_SUITE
from harness.core.results import FAILING
from harness.history import reads, regress, store, two_runs
from harness.history.triage import where_it_began
from reports import charts
from reports.data import (
    INDEX_KINDS,
    Entry,
    History,
    Run,
    judged_runs,
    latest_by_series,
    op_trend,
    status_matrix,
)

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """A file name for a DB string (op names and run ids come from ingested files): itself
    when harmless, else its harmless characters plus a hash, so two names never collide."""
    cleaned = _SAFE.sub("_", text)[:80]
    if cleaned == text and text not in ("", ".", ".."):
        return text
    return f"{cleaned}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def case_anchor(case_id: str) -> str:
    """The element id of a case's section on its op page (stable across renders)."""
    return "c-" + hashlib.sha1(case_id.encode()).hexdigest()[:12]


def _finite(obj: Any) -> Any:
    """JSON has no NaN or infinity: they become null (a gap in a chart)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _figjson(fig: Any) -> Markup:
    return htmlsafe_json_dumps(_finite(fig))


def _fmt_num(v: Any, digits: int = 3) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.{digits}g}"


def _fmt_us(ns: Any) -> str:
    """Nanoseconds as the CLI's tables show them (microseconds, one decimal); "-" if none."""
    ok = isinstance(ns, (int, float)) and not isinstance(ns, bool) and math.isfinite(ns)
    return fmt_us(ns if ok else None)


def _fmt_date(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("reports", "templates"),
                             autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(us=_fmt_us, num=_fmt_num, date=_fmt_date, figjson=_figjson,
                       anchor=case_anchor, safe_name=safe_name)
    return env


@dataclass
class Site:
    """What a render wrote."""

    out_dir: Path
    n_runs: int
    n_results: int
    op_pages: int
    run_pages: int
    compare_pages: int
    seconds: float

    @property
    def index(self) -> Path:
        return self.out_dir / "index.html"


class _Writer:
    """Renders templates into the site, numbering figures so their ids are unique."""

    def __init__(self, out_dir: Path, history: History) -> None:
        self.out_dir = out_dir
        self.env = _environment()
        self.history = history
        self.generated = _fmt_date(time.time())

    def page(self, rel: str, template: str, **context: Any) -> None:
        depth = rel.count("/")
        html = self.env.get_template(template).render(
            root="../" * depth, db_label=self.history.db_label, generated=self.generated,
            op_href=lambda op: f"{'../' * depth}ops/{safe_name(op)}.html",
            run_href=lambda run_id: f"{'../' * depth}runs/{safe_name(run_id)}.html",
            **context)
        path = self.out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")


def write_assets(out_dir: Path) -> None:
    """plotly.min.js (copied from the plotly package, only when missing or changed), the
    stylesheet and the page script."""
    assets = out_dir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    plotly_js = resources.files("plotly") / "package_data" / "plotly.min.js"
    target = assets / "plotly.min.js"
    with resources.as_file(plotly_js) as src:
        if not target.exists() or target.stat().st_size != src.stat().st_size:
            shutil.copyfile(src, target)
    for name in ("style.css", "app.js"):
        data = (resources.files("reports") / "static" / name).read_bytes()
        (assets / name).write_bytes(data)


def _markers(history: History) -> dict[tuple, list[dict[str, Any]]]:
    """Change markers by (case id, impl, world size, run id): each open change point at the
    first run of its new level (hollow once triaged), each suspicious run at itself."""
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for cp in history.change_points:
        if cp["state"] != "open":
            continue
        kind = "regression" if cp["direction"] == "up" else "improvement"
        out[(cp["case_id"], cp["impl"], cp["world_size"], cp["run_id"])].append(
            {"kind": kind, "triage": cp["triage"], "detail": change_point_text(cp)})
    for f in history.findings:
        if f["kind"] == "suspicious":
            out[(f["case_id"], f["impl"], f["world_size"], f["run_id"])].append(f)
    return out


def change_point_text(cp: dict[str, Any]) -> str:
    """One line: the change, where it starts, who found it, its triage."""
    pct = cp.get("change_pct")
    text = (f"change point #{cp['id']}: median {_fmt_us(cp.get('before'))} -> "
            f"{_fmt_us(cp.get('after'))} µs"
            + (f" ({pct:+.1f}%)" if isinstance(pct, float) else "")
            + f" {where_it_began(cp)}, found by run {cp['found_in_run'][:8]}")
    if cp.get("triage"):
        text += f"; {cp['triage']}" + (f": {cp['triage_note']}" if cp.get("triage_note") else "")
    return text


def _index_change_points(history: History, limit: int = 50) -> list[dict[str, Any]]:
    """Open change points for the index: untriaged slower ones first, then the rest, newest
    first within each."""
    open_points = [cp for cp in history.change_points if cp["state"] == "open"]
    ranked = sorted(open_points, key=lambda cp: (cp["triage"] is not None,
                                                 cp["direction"] != "up",
                                                 -(cp.get("run_started_at") or 0.0)))
    return ranked[:limit]


def _suite_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Ops grouped by suite: this project's first, then the others by name, then ops of no
    loaded suite; by family and name inside a suite."""
    suite = row["suite"]
    rank = 0 if suite == BUILTIN_SUITE else 2 if not suite else 1
    return (rank, suite, row["family"], row["op"])


def _size_of(history: History):
    """Message size per rank of a collective result: the work model's bytes (nccl-tests'
    size column) where the op is known, else algbw x time, which is the same number."""
    from harness.core.discovery import registry

    try:
        specs = registry().specs
    except Exception:  # noqa: BLE001 - a broken suite must not stop the report
        specs = {}

    def size(e: Entry) -> float | None:
        spec = specs.get(e.result.op)
        if spec is not None and spec.work is not None:
            try:
                return spec.work(e.result.params, e.result.world_size).bytes
            except Exception:  # noqa: BLE001 - params of an older grid
                pass
        gbps, median = e.result.derived.get("gbps"), (e.result.timing or {}).get("median")
        return gbps * median if gbps and median else None

    return size


def _findings_of(history: History, runs: list[Run]) -> list[dict[str, Any]]:
    ids = {r.run_id for r in runs}
    found = [f for f in history.findings if f["run_id"] in ids]
    return sorted(found, key=lambda f: (INDEX_KINDS.index(f["kind"])
                                        if f["kind"] in INDEX_KINDS else 99, f["case_id"]))


def render(conn: sqlite3.Connection, history: History, out_dir: Path, *,
           max_run_pages: int = 100, compare_pairs: list[tuple[str, str]] | None = None
           ) -> Site:
    """Write the whole site for ``history`` (from ``data.load``) into ``out_dir``; ``conn``
    serves the compare pages, which need the raw samples of their two runs."""
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_assets(out_dir)
    w = _Writer(out_dir, history)
    by_op = history.by_op()
    markers = _markers(history)
    size_of = _size_of(history)
    runs_by_id = {r.run_id: r for r in history.runs}
    paged_runs = history.runs[-max_run_pages:] if max_run_pages > 0 else []
    paged_ids = {r.run_id for r in paged_runs}
    previous = {}  # run id -> the run its compare page compares it with
    for run in paged_runs:
        other = reads.previous_comparable_run(conn, run.run_id)
        if other is not None:
            previous[run.run_id] = runs_by_id[other]
    pairs = [(previous[r.run_id].run_id, r.run_id) for r in paged_runs if r.run_id in previous]
    pairs += [p for p in (compare_pairs or []) if p not in pairs]
    compare_href = {b: f"compare/{safe_name(a)}_{safe_name(b)}.html" for a, b in pairs}

    # ------------------------------------------------------------------ op pages
    op_rows = []
    for op, entries in by_op.items():
        by_case: dict[str, list[Entry]] = defaultdict(list)
        for e in entries:
            by_case[e.result.case_id].append(e)
        cases = []
        for case_id, case_entries in sorted(by_case.items()):
            latest = latest_by_series(case_entries)
            cases.append({"case_id": case_id,
                          "latest": sorted(latest.values(), key=lambda e: e.series),
                          "figure": charts.case_figure(history, case_entries, markers)})
        collective = any(e.result.derived.get("busbw_gbps") for e in entries)
        busbw = charts.busbw_vs_size(history, entries, size_of) if collective else None
        trend = op_trend(entries)
        latest_all = latest_by_series(entries)
        impls = [e for e in latest_all.values() if not history.is_control(op, e.result.impl)]
        op_rows.append({
            "op": op, "family": history.family_of(op), "suite": history.suite_of(op),
            "series": len(latest_all),
            "passing": sum(1 for e in impls if e.result.status == "pass"),
            "judged": sum(1 for e in impls if e.result.status != "skip"),
            "spark": charts.sparkline([v for _, v in trend]),
            "trend_last": trend[-1][1] if trend else None,
        })
        w.page(f"ops/{safe_name(op)}.html", "op.html.j2", op=op,
               family=history.family_of(op), known=history.ops_known.get(op),
               controls=sorted(history.controls.get(op, ())), cases=cases, busbw=busbw,
               is_control=lambda impl, op=op: history.is_control(op, impl),
               run_pages=paged_ids)

    # ------------------------------------------------------------------ run pages
    entries_by_run: dict[str, list[Entry]] = defaultdict(list)
    for e in history.entries:
        entries_by_run[e.run.run_id].append(e)
    for run in paged_runs:
        entries = entries_by_run.get(run.run_id, [])
        failures = [e for e in entries if e.result.status in FAILING]
        w.page(f"runs/{safe_name(run.run_id)}.html", "run.html.j2", run=run,
               entries=entries, failures=failures,
               findings=_findings_of(history, [run]), compare=compare_href.get(run.run_id),
               is_control=lambda op, impl: history.is_control(op, impl))

    # ------------------------------------------------------------------ compare pages
    for a, b in pairs:
        results_a = store.results_for_run(conn, a)
        results_b = store.results_for_run(conn, b)
        shifts = two_runs.timing_shifts(results_a, results_b)
        rows = two_runs.compare_rows(results_a, results_b, shifts)
        by_a = {r.key: r for r in results_a}  # timing verdicts are in the rows already
        findings = [f.to_dict() for r in results_b if r.key in by_a
                    for f in regress.correctness_findings(by_a[r.key], r)]
        counts = {d: sum(1 for s in shifts.values() if s.direction == d)
                  for d in ("slower", "faster", "same")}
        w.page(f"compare/{safe_name(a)}_{safe_name(b)}.html", "compare.html.j2",
               run_a=runs_by_id[a], run_b=runs_by_id[b], rows=rows, counts=counts,
               findings=findings, op_of={r.key: r.op for r in (*results_a, *results_b)},
               run_pages=paged_ids)

    # ------------------------------------------------------------------ index
    machines = []
    judged = judged_runs(history)
    for fingerprint, name in history.machines():
        sizes, matrix = status_matrix(history, fingerprint)
        newest = next(r for r in judged if r.machine == fingerprint)
        machines.append({"fingerprint": fingerprint, "name": name, "sizes": sizes,
                         "matrix": matrix, "newest": newest,
                         "details": newest.info.machine,
                         "n_runs": len(history.runs_of(fingerprint))})
    findings = _findings_of(history, judged)
    w.page("index.html", "index.html.j2", machines=machines, findings=findings,
           change_points=_index_change_points(history),
           n_change_points=sum(1 for cp in history.change_points if cp["state"] == "open"),
           findings_by_kind={k: [f for f in findings if f["kind"] == k] for k in INDEX_KINDS},
           runs_fig=charts.runs_figure(history) if history.runs else None,
           op_rows=sorted(op_rows, key=_suite_order),
           runs=list(reversed(history.runs[-30:])), n_runs=len(history.runs),
           n_results=len(history.entries), compare_href=compare_href,
           run_pages=paged_ids, latest_compare=(
               compare_href.get(history.runs[-1].run_id) if history.runs else None))
    return Site(out_dir=out_dir, n_runs=len(history.runs), n_results=len(history.entries),
                op_pages=len(by_op), run_pages=len(paged_runs), compare_pages=len(pairs),
                seconds=time.perf_counter() - start)
