"""`harness ingest` and `harness export`: runs in and out of the history DB."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import click
from rich.markup import escape

from harness.cli.common import (
    EXIT_INFRA,
    EXIT_USAGE,
    HarnessExit,
    console,
    err_console,
    open_history,
    printable,
)
from harness.core.results import scratch_beside

#: shortest run id prefix `harness export` accepts; shorter ones match too much by accident
_DB_HELP = "History DB (default $HARNESS_DB or harness-results/history.db)."


@click.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--db", default=None, help=_DB_HELP)
def ingest(files: tuple[Path, ...], db: str | None) -> None:
    """Add runs to the history DB: run directories, run JSON files (`harness export
    --format json`) or pytest-benchmark JSON files (`pytest --benchmark-json`).

    Each FILE is its own transaction and ingesting again updates instead of duplicating. A
    file that cannot be read, or holds a field of the wrong kind, is reported (one line each,
    naming the file and the line) and skipped, the others are still ingested, and the command
    exits 2; a DB error stops at once.
    """
    from harness.core.results import ResultsError
    from harness.history import exchange, regress, sql, store

    db_path = store.resolve_db_path(db)
    loaded, bad = [], []
    for path in files:
        try:
            loaded.append((path, exchange.load(path)))
        except exchange.ExchangeError as exc:
            bad.append(str(exc))

    def work(conn):  # done again, whole, on a new connection if a PostgreSQL server restarts
        store.check_integrity(conn)  # a damaged file is named, never written to
        lines, ingested = [], []
        for path, runs in loaded:
            for run, results in runs:
                try:
                    summary = store.ingest(conn, run, results)
                except ResultsError as exc:  # what the DB holds: later files would fail alike
                    raise sql.StoreError(f"{path}: {exc}") from exc
                ingested.append(summary.run_id)
                state = "new" if summary.new_run else "updated"
                lines.append(f"{summary.run_id}  {summary.n_results} results  {state}  {path}")
        # regression analysis against the machine's history, stored for reports and
        # `harness report --fail-on`; later runs of the machine are redone when one lands
        # out of order
        return lines, ingested, regress.analyze_ingested(conn, ingested) if ingested else []

    try:
        lines, ingested, analysed = store.reconnecting(db_path, work)
    except sql.StoreError as exc:
        _report(bad)
        raise HarnessExit(str(exc), EXIT_INFRA if isinstance(exc, sql.Unavailable)
                          else EXIT_USAGE) from exc
    for line in lines:
        click.echo(printable(line))
    if len(analysed) > len(ingested):
        click.echo(f"{len(analysed) - len(ingested)} later run(s) re-analysed against the "
                   "history that now includes the ingested ones")
    click.echo(f"{len(ingested)} run(s) ingested into {db_path}"
               + (f"; {len(bad)} file(s) skipped" if bad else ""))
    if bad:
        _report(bad[:-1])
        raise HarnessExit(bad[-1], EXIT_USAGE)


def _report(messages: list[str]) -> None:
    for msg in messages:
        err_console.print(f"[red]error:[/red] {escape(printable(msg))}", soft_wrap=True)


@click.command("export")
@click.argument("run_id", metavar="RUN")
@click.option("--format", "fmt", default="json", show_default=True,
              type=click.Choice(["json", "csv", "pytest-benchmark"]),
              help="json: the run JSON `harness ingest` reads; csv: one row per result; "
                   "pytest-benchmark: for `pytest-benchmark compare`.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write (default: stdout).")
@click.option("--db", default=None, help=_DB_HELP)
def export(run_id: str, fmt: str, out: Path | None, db: str | None) -> None:
    """Write run RUN (an id, or a unique prefix of at least 4 characters) from the DB."""
    from harness.core.results import ResultsError
    from harness.history import exchange, reads, sql, store

    conn = open_history(db)
    try:
        full_id = reads.resolve_run_id(conn, run_id)
        run = store.get_run(conn, full_id)
        results = store.results_for_run(conn, full_id)
    except (sql.StoreError, ResultsError) as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    finally:
        conn.close()
    assert run is not None  # resolve_run_id found it
    text = exchange.export_run(run, results, fmt)
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        write_whole(out, text)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise HarnessExit(f"cannot write {out}: the disk is full ({exc.strerror}); {out} "
                              "is as it was: free space and retry, or pass another --out",
                              EXIT_INFRA) from exc
        raise HarnessExit(f"cannot write {out} ({exc.strerror}): pass another --out",
                          EXIT_USAGE) from exc
    note = ""
    if fmt == "pytest-benchmark":
        left_out = len(results) - len(exchange.pytest_benchmark_doc(run, results)["benchmarks"])
        if left_out:
            note = f" ({left_out} without timing left out)"
    console.print(escape(f"run {full_id}: {len(results)} results as {fmt} -> {out}{note}"),
                  soft_wrap=True)


def write_whole(out: Path, text: str) -> None:
    """``text`` into ``out`` whole or not at all: written to a temporary file in its folder,
    then renamed over it, so that a full disk or a crash leaves ``out`` as it was (and no
    temporary file behind). A new file gets the mode the umask allows, an old one keeps its;
    what is no regular file (/dev/stdout, a pipe) is written to as it is."""
    if out.exists() and not out.is_file():
        out.write_text(text, encoding="utf-8")
        return
    target = Path(os.path.realpath(out))  # a link stays a link to the written file
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    with scratch_beside(target, mode) as tmp:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
