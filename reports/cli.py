"""`harness report`: render the dashboard, and judge the newest runs for CI.

Registered with the ``harness`` command through the entry-point group ``harness.commands``
(the harness package never imports this one: imports point down).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.markup import escape

from harness.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    HarnessExit,
    console,
    err_console,
    open_history,
    suite_option,
)

DEFAULT_SITE = Path("harness-results/site")


@click.command("report")
@suite_option
@click.option("--db", default=None, help="History DB (default $HARNESS_DB or "
                                         "harness-results/history.db).")
@click.option("--out", "out_dir", default=str(DEFAULT_SITE), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory the site is written to (open its index.html).")
@click.option("--fail-on", default="never", show_default=True,
              type=click.Choice(["failure", "regression", "never"]),
              help="After rendering, exit 1 when a judged run has a correctness failure; "
                   "with 'regression' also exit 3 on a confirmed performance regression.")
@click.option("--run", "judge", multiple=True, metavar="RUN",
              help="A run --fail-on judges (id or prefix; repeatable). Default: the newest "
                   "run of each machine.")
@click.option("--compare", "compare_pair", nargs=2, default=None, metavar="RUN_A RUN_B",
              help="Also render a compare page of RUN_A against RUN_B.")
@click.option("--max-run-pages", default=100, show_default=True, type=click.IntRange(0),
              help="Run pages (and compare pages) for the newest N runs only.")
@click.pass_context
def report(ctx: click.Context, db: str | None, out_dir: Path, fail_on: str,
           judge: tuple[str, ...], compare_pair: tuple[str, str] | None,
           max_run_pages: int) -> None:
    """Render the history DB as a static HTML site (works from file://, no network).

    Index: status matrix per machine, regressions, drift and changed bits of the newest runs,
    per-op trends; a page per op (trend charts per case, busbw against size for
    collectives), per run (environment, failures with their metrics) and a compare page per
    run against the previous run of its machine.
    """
    from harness.history import reads, sql, store
    from reports import data, render

    start = time.perf_counter()
    conn = open_history(db)
    label = store.db_label(store.resolve_db_path(db))
    try:
        try:
            # a DB this process cannot write keeps what its runs stored: none is analysed here
            frozen = store.is_read_only(conn)
            unanalysed = data.unanalysed(conn) if frozen else []
            analysed = [] if frozen else data.analyze_missing(conn)
            judged_ids = [reads.resolve_run_id(conn, r) for r in judge]
            pair = None
            if compare_pair:
                pair = (reads.resolve_run_id(conn, compare_pair[0]),
                        reads.resolve_run_id(conn, compare_pair[1]))
            history = data.load(conn, label)
        except sql.StoreError as exc:
            raise HarnessExit(str(exc), EXIT_USAGE) from exc
        try:
            site = render.render(conn, history, out_dir, max_run_pages=max_run_pages,
                                 compare_pairs=[pair] if pair else None)
        except OSError as exc:
            raise HarnessExit(f"cannot write the site to {out_dir} ({exc.strerror or exc}): "
                              "pass another --out", EXIT_USAGE) from exc
    finally:
        conn.close()
    if analysed:
        err_console.print(f"analysed {len(analysed)} run(s) stored without findings")
    if unanalysed:
        err_console.print(f"{len(unanalysed)} run(s) stored without findings are shown without "
                          "their regressions: the DB is read-only here (a report where it can "
                          "be written analyses them)")
    console.print(escape(
        f"site: {site.index} ({site.n_runs} runs, {site.n_results} results; {site.op_pages} "
        f"op, {site.run_pages} run and {site.compare_pages} compare pages) in "
        f"{time.perf_counter() - start:.1f} s"), soft_wrap=True)
    ctx.exit(_judge(history, judged_ids, fail_on))


def _judge(history, run_ids: list[str], fail_on: str) -> int:
    """Print the judged runs' failures and regressions; the exit code ``fail_on`` asks for."""
    from harness.cli.show import print_failure, print_findings
    from harness.core.results import FAILING
    from harness.history.regress import Finding
    from reports.data import judged_runs

    runs = judged_runs(history, run_ids)
    ids = {r.run_id for r in runs}
    failing = [e.result for e in history.entries
               if e.run.run_id in ids and e.result.status in FAILING]
    # a regression someone triaged (acknowledged, expected, invalid, fixed) no longer fails
    regressions = [f for f in history.findings
                   if f["run_id"] in ids and f["kind"] == "regression" and not f.get("triage")]
    for r in failing:
        print_failure(r)
    # all from one run (a nightly judges one): how to mark them at once if the machine was busy
    found_by = {f["run_id"] for f in regressions}
    print_findings([Finding.from_stored(f) for f in regressions],
                   found_by.pop() if len(found_by) == 1 else None)
    console.print(escape(f"judged {len(runs)} run(s) ({', '.join(r.short for r in runs)}): "
                         f"{len(failing)} failing result(s), {len(regressions)} "
                         "untriaged regression(s)"), soft_wrap=True)
    if failing and fail_on in ("failure", "regression"):
        return EXIT_FAIL
    if regressions and fail_on == "regression":
        return EXIT_REGRESSION
    return EXIT_OK
