"""Run-history database: SQLite (stdlib sqlite3) or PostgreSQL, safe for several writers.

Every runner ingests its runs here; regression analysis and reports read it back. ``--db``
is a file (SQLite, the default) or a ``postgresql://`` URL (``harness.history.pg``: one schema, the
same SQL and migrations, for the many runners of a team that cannot share one SQLite file on
a network file system). Design points, for SQLite:

- WAL journal plus a 30 s busy timeout, and every write is one ``BEGIN IMMEDIATE``
  transaction, so several runners (or ``harness ingest`` jobs) can write the same file at once:
  they queue on the write lock instead of failing, and readers never block writers.
- The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]``
  (``harness.history.schema``) upgrades version ``i`` to ``i + 1``; each runs in its own
  transaction together with the version bump, so a crash or a concurrent migrator never leaves
  a half-migrated file.
- Ingest is idempotent by run id: the results files stay the source of truth, and re-ingesting
  a run directory (after a crash, or from several hosts' copies) never duplicates rows.

On PostgreSQL every write is one transaction too (row locks and ``ON CONFLICT`` make
concurrent ingests safe), the schema version lives in the table ``harness_schema``, and
migrations take a transaction-scoped advisory lock.

Connections returned by :func:`connect` are in autocommit mode (``isolation_level=None``):
single statements commit on their own and multi-statement writes use explicit transactions.

Here: connecting, ingesting runs and calibrations, and reading one run back. The dialects and
StoreError are in ``harness.history.sql``, the tables in ``harness.history.schema``, lookups
across runs and annotations in ``harness.history.reads``, and each run's findings, change points
and their triage in ``harness.history.triage``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import results as results_mod
from harness.core.results import CaseResult, ResultsError, RunInfo
from harness.history import pg
from harness.history.schema import MIGRATIONS, Migration, migrate, refuse_foreign
from harness.history.sql import (
    BUSY_TIMEOUT_S,
    SQLITE_DAMAGE,
    StoreError,
    Unreachable,
    corrupt,
    error_of,
    insert_id,
    is_postgres,
    limit_clause,
    scalar,
    sqlite_kind,
    translate_any,
    translate_pg,
    translate_sqlite,
    write_txn,
)

DEFAULT_DB = Path("harness-results/history.db")
ENV_VAR = "HARNESS_DB"


@dataclass(frozen=True)
class IngestSummary:
    """What one :func:`ingest` call did."""

    run_id: str
    #: results written (inserted or updated) by this call
    n_results: int
    #: True when the run was not in the DB before this call
    new_run: bool


def resolve_db_path(cli_value: str | None) -> Path | str:
    """History DB: the ``--db`` value if given, else ``$HARNESS_DB``, else DEFAULT_DB; a
    file's path, or a ``postgresql://`` URL as it is."""
    value = cli_value or os.environ.get(ENV_VAR)
    if not value:
        return DEFAULT_DB
    return value if pg.is_url(value) else Path(value).expanduser()


def runs_root(db: Path | str, out_dir: str | None = None) -> Path:
    """Where run folders go: ``out_dir``, else beside an SQLite file, else (a PostgreSQL DB
    has no folder) beside DEFAULT_DB."""
    if out_dir:
        return Path(out_dir)
    return (DEFAULT_DB if pg.is_url(db) else Path(db)).parent / "runs"


def db_label(db: Path | str) -> str:
    """``db`` fit to print (a URL's password hidden)."""
    return pg.label(str(db)) if pg.is_url(db) else str(db)


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (persistent per file; a no-op after the first open).

    Readers then never block writers. The switch needs the exclusive lock, and when several
    processes open a new file at once SQLite returns SQLITE_BUSY at once instead of calling
    the busy handler, since waiting could deadlock (sqlite.org/c3ref/busy_handler.html: "If
    SQLite determines that invoking the busy handler could result in a deadlock, it will go
    ahead and return SQLITE_BUSY"). So retry here, with backoff, up to the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def connect(
    path: str | os.PathLike[str], *, migrations: list[Migration] = MIGRATIONS,
    read_only: bool = False,
) -> sqlite3.Connection:
    """Open (creating if needed) the history DB at ``path`` and bring its schema up to date.

    The connection is in autocommit mode with WAL, foreign keys on, a 30 s busy timeout and
    ``sqlite3.Row`` rows; a ``postgresql://`` URL opens that database (``harness.history.pg``).
    ``read_only``: for a caller that only reads, an SQLite file that cannot be written (a
    read-only mount, another user's file) is opened as it is (``_open_read_only``).
    Raises StoreError for files or databases that cannot serve as a history DB.
    """
    if pg.is_url(path):
        return _connect_postgres(str(path), migrations)
    label = str(path)
    if label != ":memory:" and Path(path).is_file() and not (
            os.access(path, os.W_OK) and os.access(Path(path).parent, os.W_OK)):
        if read_only:
            return _open_read_only(Path(path), len(migrations))
        raise StoreError(f"history DB {label} is read-only here (a read-only mount, or "
                         "another user's file or folder) and this command writes to it: make "
                         "it and its folder writable, or pass another --db")
    if label != ":memory:":
        parent = Path(path).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create directory {parent} for history DB {label} ({exc.strerror}): "
                "pass another --db"
            ) from exc
    try:
        conn = sqlite3.connect(label, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               factory=_Connection)
        conn.label = label
    except sqlite3.Error as exc:
        raise translate_sqlite(label, exc) or StoreError(
            f"history DB {label} cannot be opened ({exc}): pass another --db"
        ) from exc

    def setup() -> None:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        refuse_foreign(conn)  # before WAL, which rewrites the file's header
        _enable_wal(conn)
        migrate(conn, migrations)

    return _set_up(conn, setup, label)


def is_read_only(conn: Any) -> bool:
    """Whether ``conn`` was opened to read a DB this process cannot write."""
    return bool(getattr(conn, "read_only", False))


def _open_read_only(path: Path, version: int) -> sqlite3.Connection:
    """The SQLite history DB at ``path``, which this process cannot write, opened to read.
    A WAL reader needs the DB's shared-memory file (``-shm``), which a read-only directory
    cannot hold: there, where no ``-wal`` file holds writes not yet in the DB itself, the
    file is opened as immutable (sqlite.org/uri.html: no locks, no -shm), which reads it
    whole. Its schema must be this harness's: nothing can migrate it."""
    label = str(path)

    def open_with(query: str) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(f"{path.absolute().as_uri()}?{query}", uri=True,
                                   timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   factory=_Connection)
        except sqlite3.Error as exc:
            raise translate_sqlite(label, exc) or StoreError(
                f"history DB {label} cannot be opened ({exc}): pass another --db") from exc
        conn.label = label
        conn.row_factory = sqlite3.Row
        return conn

    conn = open_with("mode=ro")
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreError(
                f"history DB {label} is read-only here and {wal.name} beside it holds writes "
                f"not yet in the DB, which a reader cannot see without a -shm file in "
                f"{path.parent}: open it once where it can be written, or copy the DB with "
                "its -wal file somewhere writable") from exc
        conn = open_with("immutable=1")

    def setup() -> None:
        refuse_foreign(conn)
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if current != version:
            raise StoreError(
                f"history DB {label} is read-only here and has schema v{current}, not this "
                f"harness's v{version}: open it once where it can be written (any harness "
                "command brings it up to date), or use a harness of its version")

    conn.read_only = True
    return _set_up(conn, setup, label)


def _damage(label: str, exc: sqlite3.Error) -> StoreError | None:
    """The one-line StoreError of a damaged or full DB file, None for any other failure (a
    locked DB is retried where it is met, a constraint is the caller's)."""
    return translate_sqlite(label, exc) if sqlite_kind(exc) in SQLITE_DAMAGE else None


class _Cursor(sqlite3.Cursor):
    """A cursor whose damaged-file errors are the one-line StoreError, wherever they are met:
    SQLite reads a page when a query first touches it, which may be in a fetch."""

    def _guard(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except sqlite3.DatabaseError as exc:
            err = _damage(getattr(self.connection, "label", "?"), exc)
            if err is None:
                raise
            raise err from exc

    def execute(self, *args: Any) -> Any:  # type: ignore[override]
        return self._guard(super().execute, *args)

    def executemany(self, *args: Any) -> Any:  # type: ignore[override]
        return self._guard(super().executemany, *args)

    def fetchone(self) -> Any:
        return self._guard(super().fetchone)

    def fetchmany(self, *args: Any) -> Any:
        return self._guard(super().fetchmany, *args)

    def fetchall(self) -> Any:
        return self._guard(super().fetchall)

    def __next__(self) -> Any:
        return self._guard(super().__next__)


class _Connection(sqlite3.Connection):
    """sqlite3's connection whose queries run on ``_Cursor``s (``Connection.execute`` in C
    makes a plain cursor without calling ``self.cursor``, so it is overridden too)."""

    label = "?"
    #: opened to read a DB this process cannot write (``_open_read_only``)
    read_only = False

    def cursor(self, factory: Any = _Cursor) -> Any:  # type: ignore[override]
        return super().cursor(factory)

    def execute(self, sql: str, params: Any = ()) -> Any:  # type: ignore[override]
        return self.cursor().execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:  # type: ignore[override]
        return self.cursor().executemany(sql, rows)


def check_integrity(conn: Any) -> None:
    """StoreError when an SQLite history DB's structure is damaged (``PRAGMA quick_check``: every
    page and index entry readable, O(size of the file)); PostgreSQL keeps its own. Run before
    a run or an ingest writes, so that a damaged file is named and never written to."""
    if is_postgres(conn):
        return
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
    if problems != ["ok"]:
        found = " ".join("; ".join(problems).split())[:200]  # one line: SQLite's has breaks
        raise corrupt(conn.label, found)


#: how long work on a PostgreSQL history DB whose connection was lost (a server restart) is
#: tried again before the loss is reported
RECONNECT_S = 60.0


def reconnecting(db: Path | str, work: Callable[[Any], Any], wait_s: float = RECONNECT_S
                 ) -> Any:
    """``work(conn)`` on a connection to ``db``; where a PostgreSQL connection is lost after it
    was made (the server restarted), a new one is opened and ``work`` done again, for up to
    ``wait_s``. ``work`` must be safe to redo: each write transaction commits whole or not at
    all, and ingest and analysis replace what they wrote. A server that cannot be reached at
    the first try is reported at once."""
    deadline = time.monotonic() + wait_s
    pause, connected = 0.25, False
    while True:
        try:
            conn = connect(db)
            connected = True
            try:
                return work(conn)
            finally:
                conn.close()
        except Exception as exc:  # noqa: BLE001 - sorted below; anything else goes on up
            err = exc if isinstance(exc, StoreError) else translate_any(exc, db_label(db))
            if not isinstance(err, Unreachable) or not connected or \
                    time.monotonic() + pause > deadline:
                if err is None or err is exc:
                    raise
                raise err from exc
        time.sleep(pause)
        pause = min(pause * 2, 4.0)


def _set_up(conn: Any, setup: Callable[[], None], label: str) -> Any:
    """``conn`` once ``setup`` ran on it; on a failure, closed, and the one-line StoreError of
    what a user can fix raised (any other error as it is)."""
    try:
        setup()
    except Exception as exc:
        conn.close()
        err = error_of(conn, exc, label)
        if err is None:
            raise
        raise err from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_postgres(url: str, migrations: list[Migration]) -> Any:
    label = pg.label(url)
    try:
        conn = pg.connect(url)
    except pg.MissingDriver as exc:
        raise StoreError(str(exc)) from exc
    except Exception as exc:
        raise translate_pg(label, exc) or StoreError(
            f"history DB {label} cannot be opened ({exc}): pass another --db") from exc
    return _set_up(conn, lambda: migrate(conn, migrations), label)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _upsert_machine(conn: sqlite3.Connection, run: RunInfo) -> int:
    if not (run.machine or {}).get("fingerprint"):
        raise StoreError(
            f"run {run.run_id} has no machine fingerprint in its run.json: "
            "re-run it with a current kernel-harness"
        )
    return _upsert_machine_dict(conn, run.machine)


def _upsert_machine_dict(conn: sqlite3.Connection, machine: dict[str, Any]) -> int:
    """The id of the machines row of ``machine`` (which has a fingerprint), made or updated."""
    fingerprint = machine["fingerprint"]
    # Latest ingest wins for hostname/details; each run keeps its own copy in runs.machine.
    conn.execute(
        """
        INSERT INTO machines (fingerprint, hostname, details) VALUES (?, ?, ?)
        ON CONFLICT (fingerprint) DO UPDATE SET
            hostname = COALESCE(excluded.hostname, machines.hostname),
            details = excluded.details
        """,
        (fingerprint, machine.get("hostname"), _json(machine)),
    )
    return int(scalar(conn, "SELECT id FROM machines WHERE fingerprint = ?", (fingerprint,)))


def _upsert_run(conn: sqlite3.Connection, run: RunInfo, machine_id: int) -> bool:
    existing = conn.execute(
        "SELECT r.machine_id, m.fingerprint FROM runs r JOIN machines m ON m.id = r.machine_id "
        "WHERE r.run_id = ?",
        (run.run_id,),
    ).fetchall()
    if existing and existing[0]["machine_id"] != machine_id:
        raise StoreError(
            f"run {run.run_id} is already stored for machine {existing[0]['fingerprint']}, "
            f"but this copy says machine {run.machine.get('fingerprint')}: run ids must be "
            "unique; check that the right run directory was ingested"
        )
    conn.execute(
        """
        INSERT INTO runs (run_id, machine_id, started_at, finished_at, tier, world_sizes,
                          selectors, impls, argv, git_commit, env, status, machine)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (run_id) DO UPDATE SET
            started_at = excluded.started_at,
            finished_at = COALESCE(excluded.finished_at, runs.finished_at),
            tier = excluded.tier,
            world_sizes = excluded.world_sizes,
            selectors = excluded.selectors,
            impls = excluded.impls,
            argv = excluded.argv,
            git_commit = excluded.git_commit,
            env = excluded.env,
            status = excluded.status,
            machine = excluded.machine
        """,
        (
            run.run_id,
            machine_id,
            run.started_at,
            run.finished_at,
            run.tier,
            _json(run.world_sizes),
            _json(run.selectors),
            _json(run.impls),
            _json(run.argv),
            run.git_commit,
            _json(run.env),
            run.status,
            _json(run.machine),
        ),
    )
    return not existing


_RESULT_COLUMNS = (
    "run_id", "case_id", "op", "family", "impl", "world_size", "params", "status", "reason",
    "wrong", "median_ns", "p10_ns", "p90_ns", "min_ns", "mean_ns", "std_ns", "n_samples",
    "tflops", "gbps", "busbw_gbps", "peak_memory_bytes", "peak_memory_kind", "output_hash",
    "device", "backend", "started_at", "duration_s", "env_id", "record",
)  # fmt: skip
_KEY_COLUMNS = ("run_id", "case_id", "impl", "world_size")
_UPSERT_RESULT = (
    f"INSERT INTO results ({', '.join(_RESULT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _RESULT_COLUMNS)}) "
    f"ON CONFLICT ({', '.join(_KEY_COLUMNS)}) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _RESULT_COLUMNS if c not in _KEY_COLUMNS)
)


def _result_row(r: CaseResult) -> tuple[Any, ...]:
    timing = r.timing or {}
    derived = r.derived or {}
    return (
        r.run_id, r.case_id, r.op, r.family, r.impl, int(r.world_size), _json(r.params),
        r.status, r.reason, r.wrong,
        timing.get("median"), timing.get("p10"), timing.get("p90"), timing.get("min"),
        timing.get("mean"), timing.get("std"), timing.get("n"),
        derived.get("tflops"), derived.get("gbps"), derived.get("busbw_gbps"),
        r.peak_memory_bytes, r.peak_memory_kind, r.output_hash, r.device, r.backend,
        r.started_at, r.duration_s, r.env_id, r.to_json(),
    )  # fmt: skip


def ingest(conn: sqlite3.Connection, run: RunInfo, results: Iterable[CaseResult]) -> IngestSummary:
    """Store one run and its results in a single transaction; idempotent by run id.

    Re-ingesting updates the run row (finished_at, status, ...) and upserts each result by
    (run_id, case_id, impl, world_size); results already stored but absent from ``results``
    are kept, so partial files merge. On any error nothing of this call is written.
    """
    n = 0
    with write_txn(conn):
        machine_id = _upsert_machine(conn, run)
        new_run = _upsert_run(conn, run, machine_id)
        for result in results:
            if result.run_id != run.run_id:
                raise StoreError(
                    f"result {result.key} belongs to run {result.run_id}, not {run.run_id}: "
                    "ingest each run directory on its own"
                )
            conn.execute(_UPSERT_RESULT, _result_row(result))
            n += 1
    return IngestSummary(run_id=run.run_id, n_results=n, new_run=new_run)


def ingest_dir(conn: sqlite3.Connection, run_dir: str | os.PathLike[str]) -> IngestSummary:
    """Ingest a run directory: its ``run.json`` and ``results.jsonl`` (torn last line skipped)."""
    try:
        run, results = results_mod.read_run_dir(run_dir)
    except ResultsError as exc:
        raise StoreError(str(exc)) from exc
    return ingest(conn, run, results)


def save_calibration(conn: sqlite3.Connection, machine: dict[str, Any],
                     calibration: dict[str, Any]) -> int:
    """Store one ``calibrate.measure`` result for ``machine`` (``envinfo.machine()``) in one
    transaction, making or updating the machine's row; returns the calibration's id."""
    if not machine.get("fingerprint"):
        raise StoreError("the machine has no fingerprint: pass envinfo.machine()'s dict")
    if not calibration.get("device"):
        raise StoreError("the calibration names no device: pass calibrate.measure()'s dict")
    details = dict(calibration.get("details") or {})
    details["device_name"] = calibration.get("device_name")
    with write_txn(conn):
        machine_id = _upsert_machine_dict(conn, machine)
        return insert_id(
            conn,
            "INSERT INTO calibrations (machine_id, device, created_at, copy_gbps, matmul, "
            "details) VALUES (?, ?, ?, ?, ?, ?)",
            (
                machine_id, calibration["device"],
                calibration.get("created_at") or time.time(), calibration.get("copy_gbps"),
                _json(calibration.get("matmul_tflops") or {}), _json(details),
            ),
        )  # fmt: skip


def latest_calibration(conn: sqlite3.Connection, machine_fingerprint: str,
                       device: str) -> dict[str, Any] | None:
    """The newest calibration of ``device`` (``calibrate.device_key``) on the machine, shaped
    like ``calibrate.measure``'s result plus ``id`` and ``machine_fingerprint``; or None."""
    rows = conn.execute(
        "SELECT c.*, m.fingerprint FROM calibrations c JOIN machines m ON m.id = c.machine_id "
        "WHERE m.fingerprint = ? AND c.device = ? ORDER BY c.created_at DESC, c.id DESC LIMIT 1",
        (machine_fingerprint, device),
    ).fetchall()
    if not rows:
        return None
    row = rows[0]
    details = json.loads(row["details"] or "{}")
    return {
        "id": row["id"],
        "machine_fingerprint": row["fingerprint"],
        "device": row["device"],
        "device_name": details.pop("device_name", None),
        "copy_gbps": row["copy_gbps"],
        "matmul_tflops": json.loads(row["matmul"] or "{}"),
        "created_at": row["created_at"],
        "details": details,
    }


def latest_calibrations(conn: sqlite3.Connection, machine_fingerprint: str
                        ) -> dict[str, dict[str, Any]]:
    """The newest calibration of every device of the machine, by device key."""
    devices = [row[0] for row in conn.execute(
        "SELECT DISTINCT c.device FROM calibrations c JOIN machines m ON m.id = c.machine_id "
        "WHERE m.fingerprint = ?", (machine_fingerprint,)).fetchall()]
    found = {d: latest_calibration(conn, machine_fingerprint, d) for d in devices}
    return {d: c for d, c in found.items() if c is not None}


def run_ids(
    conn: sqlite3.Connection, machine_fingerprint: str | None = None, limit: int | None = None
) -> list[str]:
    """Run ids, newest (by start time) first, optionally of one machine only."""
    sql = "SELECT r.run_id FROM runs r JOIN machines m ON m.id = r.machine_id"
    params: list[Any] = []
    if machine_fingerprint is not None:
        sql += " WHERE m.fingerprint = ?"
        params.append(machine_fingerprint)
    sql += " ORDER BY r.started_at DESC, r.run_id DESC" + limit_clause(params, limit)
    return [row[0] for row in conn.execute(sql, params).fetchall()]


def get_run(conn: sqlite3.Connection, run_id: str) -> RunInfo | None:
    """The stored metadata of ``run_id``, or None if it is not in the DB."""
    rows = conn.execute(
        "SELECT r.*, m.details FROM runs r JOIN machines m ON m.id = r.machine_id "
        "WHERE r.run_id = ?",
        (run_id,),
    ).fetchall()
    if not rows:
        return None
    row = rows[0]
    return RunInfo(
        run_id=row["run_id"],
        started_at=row["started_at"],
        tier=row["tier"],
        world_sizes=json.loads(row["world_sizes"]),
        machine=json.loads(row["machine"] or row["details"] or "{}"),
        env=json.loads(row["env"]),
        finished_at=row["finished_at"],
        selectors=json.loads(row["selectors"]),
        impls=json.loads(row["impls"]),
        argv=json.loads(row["argv"]),
        git_commit=row["git_commit"],
        status=row["status"],
    )


def results_for_run(conn: sqlite3.Connection, run_id: str) -> list[CaseResult]:
    """All results of a run as CaseResult objects, ordered by world size, case id, impl."""
    rows = conn.execute(
        "SELECT record FROM results WHERE run_id = ? ORDER BY world_size, case_id, impl",
        (run_id,),
    ).fetchall()
    return [CaseResult.from_dict(json.loads(row[0])) for row in rows]
