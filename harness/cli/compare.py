"""`harness compare`: performance and correctness changes between two runs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from harness.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    HarnessExit,
    console,
    err_console,
    fmt_us,
    open_history,
    suite_option,
)


def _resolve(conn: sqlite3.Connection, text: str) -> str:
    from harness.history import reads, sql

    try:
        return reads.resolve_run_id(conn, text)
    except sql.StoreError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc


def _fingerprint(conn: sqlite3.Connection, run_id: str) -> str:
    from harness.history import store

    run = store.get_run(conn, run_id)
    return str(((run.machine if run else None) or {}).get("fingerprint"))


def _pick_runs(conn: sqlite3.Connection, runs: Sequence[str]) -> tuple[str, str]:
    """(baseline A, current B) from zero, one or two run arguments; with fewer than two, A is
    the previous run of B's machine that ran some of B's series (reads.previous_comparable_run)
    and B, by default, this machine's newest run."""
    from harness.device import envinfo
    from harness.history import reads, sql, store

    if len(runs) > 2:
        raise HarnessExit(f"compare takes at most two runs, got {len(runs)}: "
                          "harness compare [RUN_A RUN_B]", EXIT_USAGE)
    if len(runs) == 2:
        a, b = _resolve(conn, runs[0]), _resolve(conn, runs[1])
        if a == b:
            raise HarnessExit(f"RUN_A and RUN_B are the same run {a}: name two different runs",
                              EXIT_USAGE)
        return a, b
    if len(runs) == 1:
        b = _resolve(conn, runs[0])
        a = reads.previous_comparable_run(conn, b)
        if a is None:
            raise HarnessExit(f"run {b} is the first run of machine {_fingerprint(conn, b)} "
                              f"in {sql.db_label_of(conn)}: name a second run to compare it "
                              "with", EXIT_USAGE)
        return a, b
    fp = envinfo.machine()["fingerprint"]
    last = store.run_ids(conn, fp, limit=1)
    a = reads.previous_comparable_run(conn, last[0]) if last else None
    if a is None:
        raise HarnessExit(f"{sql.db_label_of(conn)} holds {len(last)} run(s) of this "
                          f"machine (fingerprint {fp}), need two: run `harness run` again, or name "
                          "the runs: harness compare RUN_A RUN_B", EXIT_USAGE)
    return a, last[0]


def _table(rows: Sequence[dict[str, Any]], run_a: str, run_b: str) -> Table:
    table = Table(title=f"A {run_a[:12]} -> B {run_b[:12]}", header_style="bold")
    for col, just in (("case", "left"), ("impl", "left"), ("world", "right"),
                      ("median A us", "right"), ("median B us", "right"), ("ratio", "right"),
                      ("p", "right"), ("verdict", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    style = {"slower": "red", "faster": "green", "same": "white"}
    for row in rows:
        verdict = row["verdict"]
        table.add_row(
            escape(row["case_id"]), escape(row["impl"]), str(row["world_size"]),
            fmt_us(row["median_a_ns"]), fmt_us(row["median_b_ns"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.3f}",
            "-" if row["p_value"] is None else f"{row['p_value']:.1g}",
            f"[{style.get(verdict, 'yellow')}]{escape(verdict)}[/]")
    return table


@click.command("compare")
@suite_option
@click.argument("runs", nargs=-1)
@click.option("--db", default=None, help="History DB (default $HARNESS_DB or "
                                         "harness-results/history.db).")
@click.option("--fail-on", default="never", show_default=True,
              type=click.Choice(["regression", "never"]),
              help="Exit 1 when B newly fails somewhere, else 3 when it is slower; or "
                   "never.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def compare(ctx: click.Context, runs: tuple[str, ...], db: str | None, fail_on: str,
            as_json: bool) -> None:
    """Compare run B with run A: timing (median ratio and Mann-Whitney U on the raw samples)
    and correctness (new failures, fixes, numerical drift, changed bits).

    RUN_A RUN_B are run ids or unique prefixes (4+ characters). One run: it against the
    previous run of its machine that ran some of the same series. None: this machine's newest
    run against that run.
    """
    from harness.core.results import ResultsError
    from harness.history import regress, sql, store, two_runs

    conn = open_history(db)
    try:
        run_a, run_b = _pick_runs(conn, runs)
        results_a = store.results_for_run(conn, run_a)
        results_b = store.results_for_run(conn, run_b)
        fp_a, fp_b = _fingerprint(conn, run_a), _fingerprint(conn, run_b)
    except (sql.StoreError, ResultsError) as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    except Exception as exc:
        err = sql.error_of(conn, exc)
        if err is None:
            raise
        raise HarnessExit(f"{err} (reading runs {', '.join(runs) or 'the newest two'})",
                          EXIT_USAGE) from exc
    finally:
        conn.close()

    shifts = two_runs.timing_shifts(results_a, results_b)  # one Mann-Whitney test per series
    findings = two_runs.compare_runs(results_a, results_b, shifts=shifts)
    rows = two_runs.compare_rows(results_a, results_b, shifts)
    correctness = [f for f in findings if f.kind not in ("regression", "improvement")]
    counts = {d: sum(1 for s in shifts.values() if s.direction == d)
              for d in ("slower", "faster", "same")}
    kinds = {k: sum(1 for f in correctness if f.kind == k)
             for k in ("new_failure", "fixed", "drift", "bits_changed")}
    only_a = sum(1 for r in rows if r["verdict"] == "only in A")
    only_b = sum(1 for r in rows if r["verdict"] == "only in B")

    if as_json:
        click.echo(json.dumps({
            "run_a": run_a, "run_b": run_b, "machine_a": fp_a, "machine_b": fp_b,
            "rows": rows, "findings": [f.to_dict() for f in findings],
            "summary": {**counts, **kinds, "only_in_a": only_a, "only_in_b": only_b},
        }, indent=1))
    else:
        if fp_a != fp_b:
            err_console.print(f"[yellow]warning:[/yellow] A ran on machine {escape(fp_a)} and "
                              f"B on {escape(fp_b)}: timings may differ for that reason alone",
                              soft_wrap=True)
        console.print(_table(rows, run_a, run_b))
        for line in regress.format_findings(correctness):
            colour = "green" if line.startswith("FIXED") else "red"
            console.print(f"[{colour}]{escape(line)}[/]", soft_wrap=True)
        console.print(
            f"{len(shifts)} timed in both: {counts['slower']} slower, {counts['faster']} "
            f"faster, {counts['same']} same; {kinds['new_failure']} new failure(s), "
            f"{kinds['fixed']} fixed, {kinds['drift']} drift, {kinds['bits_changed']} bits "
            f"changed; {only_a} only in A, {only_b} only in B "
            f"(A {run_a[:12]}, B {run_b[:12]})", soft_wrap=True)
    if fail_on == "regression" and kinds["new_failure"]:  # correctness first, as `run`
        ctx.exit(EXIT_FAIL)
    ctx.exit(EXIT_REGRESSION if fail_on == "regression" and counts["slower"] else EXIT_OK)
