"""`harness triage` and `harness detect`: the change points of timing histories.

``triage`` lists the change points the nightly analysis stored in the history DB and marks
them (acknowledged, expected, invalid, fixed) so that ``--fail-on regression`` stops failing on
them. ``detect`` runs the same change point analysis (``harness.history.changepoints``) on
any history: a history DB, or a CSV with one row per run (or per sample of a run).
"""

from __future__ import annotations

import csv
import getpass
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from harness.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    HarnessExit,
    console,
    fmt_us,
    open_history,
    printable,
)
from harness.history.triage import where_it_began

_STATES = ("acknowledged", "expected", "invalid", "fixed", "clear")


def _point_line(cp: dict[str, Any]) -> str:
    pct = cp.get("change_pct")
    timing = f" ({cp['timing']})" if cp.get("timing") else ""
    text = (f"#{cp['id']} {cp['triage'] or 'untriaged'} "
            f"{'slower' if cp['direction'] == 'up' else 'faster'} "
            f"w{cp['world_size']} {cp['case_id']}@{cp['impl']}{timing}: median "
            f"{fmt_us(cp.get('before'))} -> {fmt_us(cp.get('after'))} us"
            + (f" ({pct:+.1f}%)" if isinstance(pct, float) else "")
            + f" {where_it_began(cp)}, found by run {cp['found_in_run'][:8]}")
    if cp["state"] != "open":
        text += f" [{cp['state']}]"
    if cp.get("triage_note"):
        text += f"; {cp['triage_note']}"
    if cp.get("triage_by"):
        text += f" ({cp['triage_by']})"
    return text


@click.command("triage")
@click.argument("words", nargs=-1, metavar="[ID]... [STATE]")
@click.option("--run", "run", default=None, metavar="RUN",
              help="Mark every open, untriaged change point this run found (with clear: "
                   "clear the marks of every one it found). A unique prefix of the run id "
                   "will do.")
@click.option("--note", default=None, help="Why (shown on the dashboard and in the list).")
@click.option("--by", "by", default=None, help="Who triaged it (default: $USER).")
@click.option("--all", "show_all", is_flag=True,
              help="List triaged and withdrawn change points too.")
@click.option("--db", default=None, help="History DB (default $HARNESS_DB or "
                                         "harness-results/history.db).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def triage(words: tuple[str, ...], run: str | None, note: str | None, by: str | None,
           show_all: bool, db: str | None, as_json: bool) -> None:
    """List change points, or mark change point ID (several: ID ID ...) with STATE.

    STATE: acknowledged (seen, being worked on: still shown, no longer fails), expected (an
    intended change), invalid (not a real change: noise, a broken machine), fixed (the old
    level is back), or clear (remove the mark). With no ID: the open, untriaged change points,
    slower ones first. A busy machine slows many series in one run: `--run RUN invalid` marks
    what that run found at once.
    """
    from harness.history.reads import resolve_run_id
    from harness.history.sql import StoreError
    from harness.history.triage import change_points, triage_change_points

    ids, state = _triage_words(words, run)
    conn = open_history(db, writes=state is not None)
    try:
        if state is None:
            points = change_points(conn) if show_all else [
                cp for cp in change_points(conn, untriaged=True) if cp["state"] == "open"]
            points.sort(key=lambda cp: (cp["direction"] != "up",
                                        -(cp.get("run_started_at") or 0.0)))
            if as_json:
                click.echo(json.dumps(points, indent=1))
                return
            for cp in points:
                console.print(escape(printable(_point_line(cp))), soft_wrap=True, highlight=False)
            what = "change point(s)" if show_all else "untriaged change point(s)"
            console.print(f"{len(points)} {what}" + ("" if show_all or not points else
                          ": mark one with `harness triage ID STATE --note TEXT`"))
            return
        who = by or os.environ.get("USER") or _user()
        try:
            if run is not None:
                run_id = resolve_run_id(conn, run)
                ids = [cp["id"] for cp in change_points(conn, found_in_run=run_id)
                       if (cp["triage"] is not None if state == "clear"
                           else cp["triage"] is None and cp["state"] == "open")]
                if not ids:
                    raise HarnessExit(
                        f"run {run_id[:8]} found no change point "
                        f"{'with a mark' if state == 'clear' else 'that is open and untriaged'}"
                        ": `harness triage --all` lists them all", EXIT_USAGE)
            marked = triage_change_points(conn, ids, None if state == "clear" else state,
                                          note=note, by=who)
        except StoreError as exc:
            raise HarnessExit(str(exc), EXIT_USAGE) from exc
    finally:
        conn.close()
    if as_json:
        click.echo(json.dumps(marked[0] if len(marked) == 1 and run is None else marked,
                              indent=1))
        return
    for cp in marked:
        console.print(escape(printable(_point_line(cp))), soft_wrap=True, highlight=False)
    if len(marked) > 1:
        console.print(f"{len(marked)} change point(s) marked "
                      f"{'clear' if state == 'clear' else state}")


def _triage_words(words: tuple[str, ...], run: str | None) -> tuple[list[int], str | None]:
    """(ids, state) of ``harness triage [ID]... [STATE]`` (``--run``: STATE alone); state is
    None for a listing. HarnessExit (exit 2), one line, for anything else."""
    usage = f"harness triage ID [ID]... {'|'.join(_STATES)} [--note TEXT]"
    if not words:
        if run is not None:
            raise HarnessExit(f"say what run {run}'s change points are: harness triage --run "
                              f"{run} {'|'.join(_STATES)} [--note TEXT]", EXIT_USAGE)
        return [], None
    *head, last = words
    if last not in _STATES:
        if last.lstrip("#").isdigit():
            raise HarnessExit(f"say what change point #{last.lstrip('#')} is: {usage}",
                              EXIT_USAGE)
        raise HarnessExit(f"unknown state {last!r}: one of {', '.join(_STATES)} ({usage})",
                          EXIT_USAGE)
    if run is not None and head:
        raise HarnessExit(f"give change point ids or --run {run}, not both: {usage}, or "
                          f"harness triage --run RUN STATE", EXIT_USAGE)
    if run is None and not head:
        raise HarnessExit(f"say which change point is {last}: {usage} (`harness triage` "
                          "lists them), or --run RUN for all a run found", EXIT_USAGE)
    # (an id past SQLite's 64-bit integers is none: OverflowError when bound)
    bad = [w for w in head if not w.lstrip("#").isdigit() or int(w.lstrip("#")) >= 1 << 63]
    if bad:
        raise HarnessExit(f"{bad[0]!r} is not a change point id (a number, as `harness "
                          f"triage` lists them): {usage}", EXIT_USAGE)
    return [int(w.lstrip("#")) for w in head], last


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in a bare container
        return None


# ----------------------------------------------------------------------------- detect


#: the most runs of one series `harness detect` analyses (27 years of nightly runs): its search
#: grows with the square of a series' length, and a hostile CSV must get an answer, not hang
MAX_RUNS = 10_000


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"


def _order_key(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def read_csv(path: Path) -> dict[str, list[tuple[str, list[float], str | None]]]:
    """Series of a CSV with columns ``series,order,value[,commit]``: per series, its runs in
    order as (order, values, commit); rows with the same series and order are the samples of
    one run. HarnessExit (exit 2) naming the line for anything unreadable."""
    runs: dict[str, dict[str, list[float]]] = defaultdict(dict)
    commits: dict[tuple[str, str], str] = {}
    try:
        # utf-8-sig: a spreadsheet's export starts with a byte order mark, which would
        # otherwise be part of the first column's name
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames:  # "series, order, value" names the same columns
                reader.fieldnames = [name.strip().lower() for name in reader.fieldnames]
            missing = [c for c in ("series", "order", "value")
                       if c not in (reader.fieldnames or [])]
            if missing:
                raise HarnessExit(
                    f"{path}: no column {', '.join(missing)} in its header "
                    f"({', '.join(reader.fieldnames or []) or 'empty'}): a detect CSV has the "
                    "columns series,order,value[,commit]", EXIT_USAGE)
            for row in reader:
                line = reader.line_num
                series, order = (row.get("series") or "").strip(), (row.get("order") or "").strip()
                text = (row.get("value") or "").strip()
                if not series or not order:
                    raise HarnessExit(f"{path} line {line}: empty series or order: every row "
                                      "names its series and its run's order", EXIT_USAGE)
                try:
                    value = float(text)
                except ValueError:
                    raise HarnessExit(f"{path} line {line}: value '{printable(text)}' is not a "
                                      "number", EXIT_USAGE) from None
                if not math.isfinite(value):  # a NaN would sort and average into nonsense
                    raise HarnessExit(f"{path} line {line}: value {text!r} is not a finite "
                                      "number: leave out the rows of runs without a value",
                                      EXIT_USAGE)
                runs[series].setdefault(order, []).append(value)
                commit = (row.get("commit") or "").strip()
                if commit:
                    commits.setdefault((series, order), commit)
    except UnicodeDecodeError as exc:
        raise HarnessExit(f"{path} is not a UTF-8 CSV ({exc.reason}): give a CSV or a history "
                          "DB", EXIT_USAGE) from exc
    except csv.Error as exc:
        raise HarnessExit(f"{path}: not a readable CSV ({exc})", EXIT_USAGE) from exc
    return {series: [(order, values, commits.get((series, order)))
                     for order, values in sorted(by_order.items(),
                                                 key=lambda kv: _order_key(kv[0]))]
            for series, by_order in runs.items()}


def read_db(path: str | Path) -> dict[str, list[tuple[str, list[float], str | None]]]:
    """The timing series of a history DB (as ``harness run`` analyses them: passing results
    with samples, per machine and timing method), as ``read_csv`` gives them; the order of a
    run is its id."""
    from harness.core.results import CaseResult
    from harness.history import regress

    conn = open_history(str(path))
    try:
        out: dict[str, list[tuple[str, list[float], str | None]]] = defaultdict(list)
        rows = conn.execute(
            "SELECT res.record, r.run_id, r.git_commit, m.fingerprint FROM results res "
            "JOIN runs r ON r.run_id = res.run_id JOIN machines m ON m.id = r.machine_id "
            "ORDER BY r.started_at, r.run_id").fetchall()
        for row in rows:
            r = CaseResult.from_dict(json.loads(row["record"]))
            samples = regress._samples(r)
            if not samples:
                continue
            label = regress.timing_label(r)
            name = (f"{row['fingerprint']}:w{r.world_size}:{r.case_id}@{r.impl}"
                    + (f"({label})" if label else ""))
            out[name].append((row["run_id"], [float(v) for v in samples], row["git_commit"]))
        return dict(out)
    finally:
        conn.close()


def _finite_pct(value: float | None) -> float | None:
    """--min-change as given; nan (which every comparison passes) is an error."""
    if value is not None and not math.isfinite(value):
        raise HarnessExit(f"--min-change {value}: give a percent, 0 or more (e.g. 2)",
                          EXIT_USAGE)
    return value


def _found_line(d: dict[str, Any], series: dict[str, Any], from_db: bool) -> str:
    """One change point ``detect`` found, in words: where it began and may have."""
    where = f"run {d['run'][:8]}" if from_db else f"order {series[d['series']][d['index']][0]}"
    if d.get("commit"):
        where += f" commit {str(d['commit'])[:10]}"
    for end, words in (("earliest", "may have begun at"), ("latest", "or as late as")):
        if d[f"{end}_index"] == d["index"]:
            continue
        run = f"run {d[f'{end}_run'][:8]}" if from_db else f"order {d[f'{end}_order']}"
        if d.get(f"{end}_commit"):
            run += f" commit {str(d[f'{end}_commit'])[:10]}"
        where += f"; {words} index {d[f'{end}_index']} ({run})"
    pct = d["change_pct"]
    shown = "?" if pct is None or not math.isfinite(pct) else f"{pct:+.1f}"
    return (f"{d['series']}  index {d['index']} ({where}): {d['before']:.6g} -> "
            f"{d['after']:.6g} ({shown}%, p={d['p_value']:.1g}) {d['direction']}")


@click.command("detect")
@click.argument("target", metavar="PATH")
@click.option("--min-change", default=None, type=click.FloatRange(min=0),
              callback=lambda ctx, param, value: _finite_pct(value),
              help="Report only changes of at least this many percent of the level before "
                   "them (0 keeps every significant one; a move off a level of 0 is larger "
                   "than any).  [default: 2, the change `harness run` stores]")
@click.option("--log/--linear", "log", default=None,
              help="Analyse the logs of the values (for data that varies by ratio, such as "
                   "timings) or the values.  [default: --log for a history DB, --linear for "
                   "a CSV]")
# changepoints.MODELS, spelled out: importing it would load numpy for every command's --help
@click.option("--model", type=click.Choice(["level", "trend"]), default=None,
              help="Between change points a series is a level plus run-to-run noise (level: "
                   "timings, what `harness run` analyses) or a line plus noise (trend: any "
                   "series; a drift or a wander is not a change, a jump or a turn is).  "
                   "[default: level for a history DB, trend for a CSV]")
@click.option("--json", "as_json", is_flag=True,
              help="A JSON list of {series, index, run or commit, earliest_index and "
                   "latest_index (and their runs or commits), before, after, change_pct, "
                   "p_value, direction}.")
@click.pass_context
def detect(ctx: click.Context, target: str, min_change: float | None, log: bool | None,
           model: str | None, as_json: bool) -> None:
    """The change points of every series in PATH, both directions.

    PATH is a history DB (an SQLite file or a postgresql:// URL), or a CSV with the columns
    series,order,value[,commit]: one row per run, or several rows with the same series and
    order for the samples of one run. `index` is the 0-based position, in the series' order,
    of the first run at the new level; `earliest_index` and `latest_index` the first and last
    run it may have begun at, where runs between the two levels, slow runs or runs without a
    value leave it open: bisect that range.
    """
    from harness.history import changepoints, pg, regress

    path = Path(target)
    if not pg.is_url(target) and not path.is_file():
        raise HarnessExit(f"{path} does not exist: give a history DB or a CSV with the columns "
                          "series,order,value[,commit]", EXIT_USAGE)
    from_db = pg.is_url(target) or _is_sqlite(path)
    series = read_db(target) if from_db else read_csv(path)
    longest = max(series.items(), key=lambda kv: len(kv[1]), default=None)
    if longest is not None and len(longest[1]) > MAX_RUNS:
        raise HarnessExit(f"{pg.label(target)}: series '{printable(longest[0])}' has "
                          f"{len(longest[1])} runs and detect analyses at most {MAX_RUNS} per "
                          "series (the search grows with the square of its length): keep its "
                          f"latest {MAX_RUNS} runs, or split it", EXIT_USAGE)
    if log is None:  # a history holds timings, analysed as `harness run` does
        log = regress.TIMINGS_IN_LOG if from_db else False
    if model is None:
        model = "level" if from_db else "trend"
    if min_change is None:
        # a change `harness run` would not store is none on its history, and none in another
        # tool's: a significant 0.2% move in a long, quiet performance history is no finding
        # (Perfherder makes no alert under 2% unless a series sets its own threshold: treeherder's
        # perf/alerts.py, PERFHERDER_REGRESSION_THRESHOLD); chosen by
        # benchmarks/tcpd_changepoints.py and benchmarks/detect_on_synthetic_histories.py
        min_change = regress.MIN_CHANGE_PCT
    if log:
        for name, runs in series.items():
            bad = next(((order, v) for order, values, _ in runs for v in values if not v > 0),
                       None)
            if bad is not None:
                raise HarnessExit(f"{pg.label(target)}: series {name!r} order {bad[0]} has "
                                  f"the value {bad[1]:g}, which has no log: pass --linear",
                                  EXIT_USAGE)
    # a history DB's runs by a low quantile of their samples, as `harness run` judges them; a
    # CSV's samples by their median (they need not be timings)
    quantile = regress.TIMING_QUANTILE if from_db else 0.5
    found = []
    for name, runs in series.items():
        for cp in changepoints.find([values for _, values, _ in runs],
                                    min_change_pct=min_change, log=log, model=model,
                                    quantile=quantile):
            order, _, commit = runs[cp.index]
            first_order, _, first_commit = runs[cp.first_possible]
            d = {"series": name, "index": cp.index}
            if from_db:
                d["run"] = order
            d["commit"] = commit
            d["earliest_index"] = cp.first_possible
            d["earliest_run" if from_db else "earliest_order"] = first_order
            d["earliest_commit"] = first_commit
            last_order, _, last_commit = runs[cp.last_possible]
            d["latest_index"] = cp.last_possible
            d["latest_run" if from_db else "latest_order"] = last_order
            d["latest_commit"] = last_commit
            found.append({**d, **{k: v for k, v in cp.to_dict().items() if k not in d}})
    if as_json:
        click.echo(json.dumps(found, indent=1))
        ctx.exit(EXIT_OK)
    for d in found:
        console.print(escape(printable(_found_line(d, series, from_db))), soft_wrap=True,
                      highlight=False)
    console.print(f"{len(found)} change point(s) in {len(series)} series")
