"""How ``harness run`` shows its outcome: the results (nccl-tests blocks for collectives, a
table for the rest), their footnotes, the findings against the history, and the summary."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from harness.cli.common import console, fmt_us

_FINDING_STYLE = {"regression": "red", "new_failure": "red", "suspicious": "yellow",
                  "drift": "yellow", "bits_changed": "yellow", "improvement": "green",
                  "fixed": "green"}


def print_findings(findings: Sequence[Any], run_id: str | None = None) -> None:
    """Changes against this machine's history: regressions first, one line each; then how to
    triage them (``run_id``: the run that found them all, for marking them at once)."""
    from harness.history.regress import KINDS, format_findings

    ordered = sorted(findings, key=lambda f: KINDS.index(f.kind) if f.kind in KINDS else 99)
    for f, line in zip(ordered, format_findings(ordered), strict=True):
        style = _FINDING_STYLE.get(f.kind, "white")
        head, _, rest = line.partition(" ")
        console.print(f"[{style}]{head}[/{style}] {escape(rest)}", soft_wrap=True)
    regressions = [f for f in ordered if f.kind == "regression"]
    if regressions:
        console.print(escape("a regression is reported once, by the run that confirmed it; "
                             "mark it with `harness triage ID acknowledged|expected|invalid|"
                             "fixed --note TEXT` (`harness triage` lists them)"), soft_wrap=True)
    series = len({f.key for f in regressions})
    if run_id is not None and series > 1:
        # a busy machine slows most series of a run together: one mark for the night
        console.print(escape(f"{series} series regressed in this run at once: if the "
                             "machine was busy, `harness triage --run "
                             f"{run_id} invalid --note TEXT` marks them all"),
                      soft_wrap=True)


def _fmt_bw(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _fmt_pct(derived: dict[str, float]) -> str:
    # of the calibrated matmul peak when the op counts flops, else of the copy bandwidth
    pct = derived.get("pct_peak_flops", derived.get("pct_peak_bw"))
    return "-" if pct is None else f"{pct:.1f}"


def _no_work(op: str, params: Any, world_size: int) -> Any:
    return None


def print_results(results: Sequence[Any], work_of: Callable[..., Any] = _no_work,
                  controls: Mapping[str, Collection[str]] | None = None) -> None:
    """Collectives as nccl-tests prints them (one line per size, #wrong beside the bandwidth;
    ``work_of(op, params, world_size)`` gives their size column); everything else as a table,
    one row per case. ``controls``: each op's negative controls (a control that passed every
    case is called out)."""
    from harness.cli.nccl_table import format_blocks

    collective, others = [], []
    for r in results:
        (collective if r.family == "collectives" and "n" in r.params else others).append(r)
    if collective:
        click.echo(format_blocks(collective, work_of))
    if others:
        _print_table(others)
    print_contention(results)
    print_interpreted(results)
    print_absent_goldens(results)
    print_uncaught_controls(results, controls or {})
    bound = [r for r in results if (r.timing or {}).get("launch_bound")]
    if bound:
        console.print(f"* {len(bound)} time(s) launch-bound: the host took most of the interval "
                      "between the CUDA events to enqueue the call, so it measures the launch "
                      "set-up, not the kernel; --timing-mode graph times the kernel alone",
                      highlight=False)


def _print_table(others: Sequence[Any]) -> None:
    table = Table(title="results", show_lines=False, header_style="bold")
    for col, just in (("world", "right"), ("case", "left"), ("impl", "left"),
                      ("status", "left"), ("time us", "right"), ("GB/s", "right"),
                      ("TFLOP/s", "right"), ("% peak", "right"), ("peak MB", "right"),
                      ("#wrong", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    style = {"pass": "green", "fail": "red", "error": "red", "timeout": "magenta",
             "crash": "magenta", "skip": "yellow"}
    for r in others:
        median = (r.timing or {}).get("median")
        peak = "n/m" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 1e6:.2f}"
        table.add_row(str(r.world_size), escape(r.case_id), escape(r.impl),
                      f"[{style.get(r.status, 'white')}]{r.status}[/]",
                      fmt_us(median) + r.time_marks,
                      _fmt_bw(r.derived.get("gbps")), _fmt_bw(r.derived.get("tflops")),
                      _fmt_pct(r.derived), peak,
                      str(r.wrong) if r.status in ("pass", "fail") else "-")
    console.print(table)


def print_uncaught_controls(results: Sequence[Any],
                            controls: Mapping[str, Collection[str]]) -> None:
    """A warning for each negative control (``controls``: by op) that passed every case it
    ran: its bug is not caught by this selection (the cases, the tolerance or the world sizes
    miss it)."""
    ran: dict[tuple[str, str], set[str]] = {}
    for r in results:
        op = r.case_id.split("[")[0]
        if r.impl in controls.get(op, ()):
            ran.setdefault((op, r.impl), set()).add(r.status)
    for (op, impl), statuses in sorted(ran.items()):
        if statuses <= {"pass", "skip"} and "pass" in statuses:
            console.print(f"[yellow]warning[/yellow]: negative control {escape(op)}@"
                          f"{escape(impl)} passed every case it ran: this selection does not "
                          "catch its bug (another case, tier or world size may)",
                          highlight=False, soft_wrap=True)


def print_absent_goldens(results: Sequence[Any]) -> None:
    """A note when cases ran without a stored golden (checked against the reference only):
    a new case passes silently otherwise, and a later ``golden verify`` finds it missing."""
    absent = sorted({(r.world_size, r.case_id) for r in results
                     if (r.golden or {}).get("status") == "absent"})
    if not absent:
        return
    first = absent[0][1]
    console.print(f"note: {len(absent)} case(s) have no stored golden (checked against the "
                  f"reference only), e.g. w{absent[0][0]} {escape(first)}; store them with "
                  f"`harness golden generate` and the same selectors and world sizes",
                  highlight=False, soft_wrap=True)


def print_contention(results: Sequence[Any]) -> None:
    """The footnote of the ``~`` times: taken while ranks contended for CPUs or a GPU."""
    contended = [r for r in results if (r.timing or {}).get("contention")]
    if not contended:
        return
    why = "; ".join(sorted({f"world size {r.world_size}: {r.timing['contention']}"
                            for r in contended}))
    token = sum(1 for r in contended if r.timing.get("minimal"))
    if token:
        console.print(f"~ {token} time(s) taken while ranks contended ({why}): they measure "
                      "the contention, not the implementation, so each got a token budget "
                      "(still checked after the repeats) and stays out of the regression "
                      "series; --bench times them fully", highlight=False)
    if len(contended) > token:
        console.print(f"~ {len(contended) - token} time(s) taken fully (--bench) while ranks "
                      f"contended ({why}): compare them only with times taken the same way",
                      highlight=False)


def print_interpreted(results: Sequence[Any]) -> None:
    """The footnote of the ``i`` times: Triton kernels run by Triton's interpreter."""
    n = sum(1 for r in results if r.interpreter and r.timing)
    if n:
        console.print(f"i {n} time(s) of Triton kernels run by Triton's interpreter (a CPU "
                      "run): the results are checked as on a GPU, but the time is the "
                      "interpreter's, so each got a token budget and stays out of the "
                      "history's series", highlight=False)


def print_failure(r: Any) -> None:
    """One line for a failing result: ``FAIL w4 case@impl: the first line of its reason``."""
    reason = r.reason.splitlines()[0] if r.reason else ""
    console.print(f"[red]{r.status.upper()}[/red] "
                  + escape(f"w{r.world_size} {r.case_id}@{r.impl}: {reason}"), soft_wrap=True)


def summarize(results: Sequence[Any], missing: set[str], seconds: float, db_path: Path | str,
              run_id: str, kept_in: Path | None = None) -> None:
    """Counts, the failures with their reasons, and where the run was stored (``kept_in``:
    its folder, where it waits when the DB could not take it)."""
    from harness.history import store

    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    for r in results:
        if r.status in ("fail", "error", "timeout", "crash"):
            print_failure(r)
        elif r.status == "skip":  # a case that cannot run here says why, never silently
            console.print("[yellow]SKIP[/yellow] "
                          + escape(f"w{r.world_size} {r.case_id}@{r.impl}: {r.reason}"))
    if missing:
        console.print(f"[yellow]{len(missing)} case(s) did not run[/yellow]: "
                      + escape(", ".join(sorted(missing)[:5]))
                      + (" ..." if len(missing) > 5 else ""))
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    where = (f"kept in {kept_in}, not stored" if kept_in is not None
             else f"stored in {store.db_label(db_path)}")
    console.print(f"{parts or 'no results'} in {seconds:.1f} s; run {run_id} {where}")


def print_outcome(outcome: Any) -> None:
    """Everything a finished run shows (``outcome``: a ``session.Outcome``)."""
    print_results(outcome.results, outcome.work_of, outcome.controls)
    print_findings(outcome.findings, outcome.run_id)
    summarize(outcome.results, outcome.missing, outcome.seconds, outcome.db_path,
              outcome.run_id, None if outcome.stored else outcome.run_dir)
