"""What each run's analysis stored in the history DB: its findings (``regress.Finding``), the
change points of its timing series that they report, the marks people put on those
(``TRIAGE_STATES``), and which runs still wait for their analysis."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness.history.sql import StoreError, db_label_of, insert_id, scalar, write_txn

_FINDING_COLUMNS = ("kind", "case_id", "op", "impl", "world_size", "metric", "baseline",
                    "current", "ratio", "p_value", "baseline_run", "detail", "change_point_id")


def save_findings(conn: sqlite3.Connection, run_id: str, findings: Iterable[dict[str, Any]],
                  analyzed_at: float | None = None) -> int:
    """Replace the stored findings of ``run_id`` (``regress.Finding.to_dict()`` dicts) and mark
    the run analysed, in one transaction; returns how many were stored."""
    with write_txn(conn):
        return _replace_findings(conn, run_id, list(findings),
                                 time.time() if analyzed_at is None else analyzed_at)


def _replace_findings(conn: sqlite3.Connection, run_id: str, findings: list[dict[str, Any]],
                      analyzed_at: float) -> int:
    if scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None:
        raise StoreError(f"run {run_id} is not in history DB {db_label_of(conn)}: "
                         "ingest it before storing its analysis")
    conn.execute("DELETE FROM findings WHERE run_id = ?", (run_id,))
    conn.executemany(
        f"INSERT INTO findings (run_id, {', '.join(_FINDING_COLUMNS)}) "
        f"VALUES (?, {', '.join('?' for _ in _FINDING_COLUMNS)})",
        [(run_id, *(f.get(c) for c in _FINDING_COLUMNS)) for f in findings])
    conn.execute("UPDATE runs SET analyzed_at = ? WHERE run_id = ?", (analyzed_at, run_id))
    return len(findings)


def stored_findings(conn: sqlite3.Connection, run_id: str | None = None) -> list[dict[str, Any]]:
    """Stored findings (of one run, or all), as dicts with ``run_id``, the Finding fields and
    ``triage`` (the triage of the change point a timing finding reports, else None), ordered
    by run start, then as analysed."""
    sql = ("SELECT f.*, cp.triage AS triage FROM findings f JOIN runs r ON r.run_id = f.run_id"
           " LEFT JOIN change_points cp ON cp.id = f.change_point_id"
           + (" WHERE f.run_id = ?" if run_id is not None else "")
           + " ORDER BY r.started_at, f.id")
    params = (run_id,) if run_id is not None else ()
    return [{k: row[k] for k in ("run_id", *_FINDING_COLUMNS, "triage")}
            for row in conn.execute(sql, params).fetchall()]


def runs_from(conn: sqlite3.Connection, run_id: str) -> list[str]:
    """``run_id`` and every run of the same machine that started after it, oldest first."""
    return [row[0] for row in conn.execute(
        "SELECT r.run_id FROM runs r JOIN runs me ON me.run_id = ? "
        "WHERE r.machine_id = me.machine_id AND (r.started_at > me.started_at "
        "OR (r.started_at = me.started_at AND r.run_id >= me.run_id)) "
        "ORDER BY r.started_at, r.run_id", (run_id,))]


def unanalyzed_runs(conn: sqlite3.Connection) -> list[str]:
    """Runs whose findings were never stored, oldest first (the order to analyse them in)."""
    return [row[0] for row in conn.execute(
        "SELECT run_id FROM runs WHERE analyzed_at IS NULL ORDER BY started_at, run_id")]


#: what a person (or the harness, for "fixed") can say about a change point
TRIAGE_STATES = ("acknowledged", "expected", "invalid", "fixed")
#: the columns a change point's analysis writes (the rest is its identity and its triage)
CHANGE_POINT_STATS = ("run_id", "git_commit", "earliest_run_id", "earliest_commit",
                      "latest_run_id", "latest_commit",
                      "direction", "before", "after", "change_pct", "p_value", "n_before",
                      "n_after", "state")
_TRIAGE_COLUMNS = ("triage", "triage_note", "triage_by", "triaged_at")
# reported_at: when the first run whose findings report it started (NULL: never reported, as
# a change smaller than its op's threshold is not, until it grows)
_CP_SELECT = ("SELECT cp.*, m.fingerprint AS machine_fingerprint, r.started_at AS run_started_at, "
              "f.started_at AS found_started_at, (SELECT min(fr.started_at) FROM findings x "
              "JOIN runs fr ON fr.run_id = x.run_id WHERE x.change_point_id = cp.id) "
              "AS reported_at "
              "FROM change_points cp JOIN machines m ON m.id = cp.machine_id "
              "JOIN runs r ON r.run_id = cp.run_id JOIN runs f ON f.run_id = cp.found_in_run")


def series_change_points(conn: sqlite3.Connection, machine_fingerprint: str, case_id: str,
                         impl: str, world_size: int, timing: str) -> list[dict[str, Any]]:
    """Stored change points of one timing series, oldest first."""
    rows = conn.execute(
        _CP_SELECT + " WHERE m.fingerprint = ? AND cp.case_id = ? AND cp.impl = ? AND "
        "cp.world_size = ? AND cp.timing = ? ORDER BY r.started_at, cp.id",
        (machine_fingerprint, case_id, impl, int(world_size), timing)).fetchall()
    return [dict(row) for row in rows]


def change_points(conn: sqlite3.Connection, *, found_in_run: str | None = None,
                  untriaged: bool = False, state: str | None = None) -> list[dict[str, Any]]:
    """Stored change points (optionally those a run's analysis found, the untriaged ones, or
    one state), oldest first, with ``machine_fingerprint``, ``run_started_at`` (of the first
    run at the new level) and ``found_started_at`` (of the run whose analysis found it)."""
    clauses, params = [], []
    if found_in_run is not None:
        clauses.append("cp.found_in_run = ?")
        params.append(found_in_run)
    if untriaged:
        clauses.append("cp.triage IS NULL")
    if state is not None:
        clauses.append("cp.state = ?")
        params.append(state)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return [dict(row) for row in conn.execute(
        _CP_SELECT + where + " ORDER BY r.started_at, cp.id", params).fetchall()]


def get_change_point(conn: sqlite3.Connection, cp_id: int) -> dict[str, Any] | None:
    row = conn.execute(_CP_SELECT + " WHERE cp.id = ?", (int(cp_id),)).fetchone()
    return dict(row) if row is not None else None


def save_analysis(conn: sqlite3.Connection, run_id: str, machine_fingerprint: str,
                  findings: list[dict[str, Any]], new_points: list[dict[str, Any]],
                  updates: list[tuple[int, dict[str, Any]]]) -> list[int]:
    """Store one run's analysis in one transaction: insert ``new_points`` (series identity plus
    CHANGE_POINT_STATS, with ``found_in_run`` = ``run_id``), apply ``updates`` ((id, columns))
    to stored change points, and replace the run's findings (``save_findings``). A finding whose
    ``change_point_id`` is ``("new", i)`` gets the id of ``new_points[i]``. The new ids."""
    with write_txn(conn):
        if scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None:
            raise StoreError(f"run {run_id} is not in history DB {db_label_of(conn)}: "
                             "ingest it before storing its analysis")
        machine = scalar(conn, "SELECT id FROM machines WHERE fingerprint = ?",
                         (machine_fingerprint,))
        if machine is None:
            raise StoreError(f"machine {machine_fingerprint} is not in history DB "
                             f"{db_label_of(conn)}: ingest its runs first")
        # re-analysing a run replaces what it found: drop its change points that it did not
        # find again, unless triaged or reported by another run
        kept = sorted({int(cp_id) for cp_id, _ in updates})
        # (no "IN ()" for none kept: SQLite takes an empty list, PostgreSQL does not)
        conn.execute("DELETE FROM change_points WHERE found_in_run = ? AND triage IS NULL "
                     "AND id NOT IN (SELECT change_point_id FROM findings WHERE run_id != ? "
                     "AND change_point_id IS NOT NULL)"
                     + (f" AND id NOT IN ({', '.join('?' for _ in kept)})" if kept else ""),
                     (run_id, run_id, *kept))
        ids = []
        now = time.time()
        for p in new_points:
            # a triage a new change point takes over (changes.carried_triage), if any
            marks = tuple(c for c in _TRIAGE_COLUMNS if p.get(c) is not None)
            columns = ("machine_id", "case_id", "impl", "world_size", "timing", "op",
                       "found_in_run", "updated_at", *CHANGE_POINT_STATS, *marks)
            values = (machine, p["case_id"], p["impl"], int(p["world_size"]), p["timing"],
                      p.get("op"), run_id, now, *(p.get(c) for c in (*CHANGE_POINT_STATS,
                                                                     *marks)))
            ids.append(insert_id(conn, f"INSERT INTO change_points ({', '.join(columns)}) "
                                       f"VALUES ({', '.join('?' for _ in columns)})", values))
        for cp_id, fields in updates:
            fields = {**fields, "updated_at": now}
            conn.execute(f"UPDATE change_points SET {', '.join(f'{k} = ?' for k in fields)} "
                         "WHERE id = ?", (*fields.values(), int(cp_id)))
        resolved = []
        for f in findings:
            ref = f.get("change_point_id")
            resolved.append({**f, "change_point_id": ids[ref[1]]}
                            if isinstance(ref, (tuple, list)) else f)
        _replace_findings(conn, run_id, resolved, now)
    return ids


def triage_change_point(conn: sqlite3.Connection, cp_id: int, triage: str | None, *,
                        note: str | None = None, by: str | None = None,
                        at: float | None = None) -> dict[str, Any]:
    """Mark a change point (``triage`` one of TRIAGE_STATES, or None to clear the mark); the
    updated change point. StoreError, one line, for an unknown id or state."""
    return triage_change_points(conn, [cp_id], triage, note=note, by=by, at=at)[0]


def triage_change_points(conn: sqlite3.Connection, cp_ids: Sequence[int], triage: str | None,
                         *, note: str | None = None, by: str | None = None,
                         at: float | None = None) -> list[dict[str, Any]]:
    """Mark several change points alike, in one transaction: all of them or, for an unknown
    id or state (StoreError, one line naming it), none. The updated change points, in the
    order given."""
    if triage is not None and triage not in TRIAGE_STATES:
        raise StoreError(f"unknown triage state {triage!r}: use one of "
                         f"{', '.join(TRIAGE_STATES)}")
    ids = list(dict.fromkeys(int(i) for i in cp_ids))
    with write_txn(conn):
        unknown = [i for i in ids
                   if scalar(conn, "SELECT 1 FROM change_points WHERE id = ?", (i,)) is None]
        if unknown:
            newest = [r[0] for r in conn.execute(
                "SELECT id FROM change_points ORDER BY id DESC LIMIT 3")]
            raise StoreError(
                f"no change point {', '.join(f'#{i}' for i in unknown)} in history DB "
                f"{db_label_of(conn)} (newest: {', '.join(f'#{i}' for i in newest) or 'none'}): "
                "list them with `harness triage`" + (" (none was marked)" if len(ids) > 1
                                                     else ""))
        stamp = (time.time() if at is None else at) if triage else None
        for i in ids:
            conn.execute("UPDATE change_points SET triage = ?, triage_note = ?, triage_by = ?, "
                         "triaged_at = ? WHERE id = ?", (triage, note, by, stamp, i))
    points = [get_change_point(conn, i) for i in ids]
    return [p for p in points if p is not None]


def where_it_began(cp: Mapping[str, Any]) -> str:
    """Where a stored change point (or its columns) began, in words: its first run and commit,
    and, where the runs leave it open, the first and the last run it may have begun at: the
    range to bisect."""
    def run(run_id: str, commit: str | None) -> str:
        return f"run {run_id[:8]}" + (f" (commit {commit[:10]})" if commit else "")

    text = f"from {run(cp['run_id'], cp.get('git_commit'))}"
    if cp.get("earliest_run_id"):
        text += f", or as early as {run(cp['earliest_run_id'], cp.get('earliest_commit'))}"
    if cp.get("latest_run_id"):
        text += f", or as late as {run(cp['latest_run_id'], cp.get('latest_commit'))}"
    if cp.get("earliest_run_id") or cp.get("latest_run_id"):
        text += (": the runs there cannot tell where it began (between the two levels, slow, "
                 "or without a time), bisect that range")
    return text
