"""Looking things up across the runs of the history DB: a run id from its prefix, the earlier
run a run compares with, the rows of one series, and the annotations (notes on runs and
series, which ``add_annotation`` writes). One run's own record is read back by
``harness.history.store``; the findings and change points by ``harness.history.triage``."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from harness.history.sql import StoreError, db_label_of, insert_id, limit_clause, scalar, write_txn
from harness.history.store import get_run, run_ids

#: the shortest run id prefix the CLI accepts
MIN_RUN_PREFIX = 4


def resolve_run_id(conn: sqlite3.Connection, text: str) -> str:
    """The run id ``text`` names: itself, or the one run id it is a prefix of (at least
    MIN_RUN_PREFIX characters). StoreError, one line, otherwise."""
    if get_run(conn, text) is not None:
        return text
    label = db_label_of(conn)
    if len(text) < MIN_RUN_PREFIX:
        raise StoreError(f"run id {text!r} is not in {label} and a prefix needs at least "
                         f"{MIN_RUN_PREFIX} characters: give more of the run id")
    # all ids in Python: prefixes may hold LIKE wildcards (%, _), and run counts are small
    ids = run_ids(conn)
    matches = [r for r in ids if r.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(m[:12] for m in matches[:3]) + (" ..." if len(matches) > 3 else "")
        raise StoreError(f"run id prefix {text!r} matches {len(matches)} runs ({shown}): "
                         "give more characters")
    recent = ", ".join(r[:12] for r in ids[:3]) or "none"
    raise StoreError(f"unknown run id {text!r} in {label} (newest runs: {recent}): check the "
                     "id `harness run` printed, `harness ingest` the run, or pass the right --db")


def _result_keys(conn: sqlite3.Connection, run_id: str) -> set[tuple[str, str, int]]:
    return {tuple(row) for row in conn.execute(  # type: ignore[misc]
        "SELECT case_id, impl, world_size FROM results WHERE run_id = ?", (run_id,))}


def previous_comparable_run(conn: sqlite3.Connection, run_id: str, *,
                            search: int = 50) -> str | None:
    """The run to compare ``run_id`` with: the newest earlier run of its machine that has a
    result of the same series (case, impl, world size), among the ``search`` newest earlier
    runs; else the newest earlier run; None for a machine's first run. A night of two
    selections, or a partial rerun, then compares with its own kind, not with its neighbour."""
    run = get_run(conn, run_id)
    if run is None:
        raise StoreError(f"run {run_id} is not in history DB {db_label_of(conn)}")
    order = run_ids(conn, str((run.machine or {}).get("fingerprint")))
    earlier = order[order.index(run_id) + 1:]
    mine = _result_keys(conn, run_id)
    found = next((o for o in earlier[:search] if _result_keys(conn, o) & mine), None)
    return found or (earlier[0] if earlier else None)


def history(
    conn: sqlite3.Connection,
    case_id: str,
    impl: str,
    world_size: int,
    machine_fingerprint: str | None = None,
    limit: int | None = 30,
) -> list[sqlite3.Row]:
    """Result rows of one series, newest run first, joined with their run and machine.

    Besides the results columns each row has ``run_started_at``, ``run_finished_at``,
    ``run_status``, ``tier``, ``git_commit``, ``machine_fingerprint`` and ``hostname``
    (aliased where results has a column of the same name).
    """
    sql = """
        SELECT res.*, r.started_at AS run_started_at, r.finished_at AS run_finished_at,
               r.status AS run_status, r.tier, r.git_commit,
               m.fingerprint AS machine_fingerprint, m.hostname
        FROM results res
        JOIN runs r ON r.run_id = res.run_id
        JOIN machines m ON m.id = r.machine_id
        WHERE res.case_id = ? AND res.impl = ? AND res.world_size = ?
    """
    params: list[Any] = [case_id, impl, int(world_size)]
    if machine_fingerprint is not None:
        sql += " AND m.fingerprint = ?"
        params.append(machine_fingerprint)
    sql += " ORDER BY r.started_at DESC, r.run_id DESC" + limit_clause(params, limit)
    return conn.execute(sql, params).fetchall()


def add_annotation(
    conn: sqlite3.Connection,
    text: str,
    *,
    kind: str = "note",
    author: str | None = None,
    run_id: str | None = None,
    case_id: str | None = None,
    impl: str | None = None,
    world_size: int | None = None,
    created_at: float | None = None,
) -> int:
    """Attach a note to a run and/or a series (e.g. "known regression, driver bug"); its id.

    Every scope field is optional: a note with only ``case_id`` applies to that case's whole
    history, one with only ``run_id`` to a whole run.
    """
    with write_txn(conn):
        if (
            run_id is not None
            and scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None
        ):
            raise StoreError(
                f"run {run_id} is not in history DB {db_label_of(conn)}: "
                "check the run id, or ingest that run first"
            )
        return insert_id(
            conn,
            "INSERT INTO annotations (run_id, case_id, impl, world_size, created_at, author, "
            "kind, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id, case_id, impl, world_size,
                time.time() if created_at is None else created_at,
                author, kind, text,
            ),
        )  # fmt: skip


def annotations(
    conn: sqlite3.Connection,
    *,
    run_id: str | None = None,
    case_id: str | None = None,
    impl: str | None = None,
    world_size: int | None = None,
) -> list[sqlite3.Row]:
    """Annotations that apply to the given scope, oldest first.

    A filter matches notes with that value or with the field unset (a note on a whole case
    applies to every impl and world size of it).
    """
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("run_id", run_id),
        ("case_id", case_id),
        ("impl", impl),
        ("world_size", world_size),
    ):
        if value is not None:
            clauses.append(f"({column} = ? OR {column} IS NULL)")
            params.append(value)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return conn.execute(
        f"SELECT * FROM annotations{where} ORDER BY created_at, id", params
    ).fetchall()
