"""Run-history database: SQLite (stdlib sqlite3) or PostgreSQL, safe for several writers.

Every runner ingests its runs here; regression analysis and reports read it back. ``--db``
is a file (SQLite, the default) or a ``postgresql://`` URL (``harness.history.pg``: one schema, the
same SQL and migrations, for the many runners of a team that cannot share one SQLite file on
a network file system). Design points, for SQLite:

- WAL journal plus a 30 s busy timeout, and every write is one ``BEGIN IMMEDIATE``
  transaction, so several runners (or ``harness ingest`` jobs) can write the same file at once:
  they queue on the write lock instead of failing, and readers never block writers.
- The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]`` upgrades version ``i``
  to ``i + 1``; each runs in its own transaction together with the version bump, so a crash
  or a concurrent migrator never leaves a half-migrated file.
- Ingest is idempotent by run id: the results files stay the source of truth, and re-ingesting
  a run directory (after a crash, or from several hosts' copies) never duplicates rows.

On PostgreSQL every write is one transaction too (row locks and ``ON CONFLICT`` make
concurrent ingests safe), the schema version lives in the table ``harness_schema``, and
migrations take a transaction-scoped advisory lock.

Connections returned by :func:`connect` are in autocommit mode (``isolation_level=None``):
single statements commit on their own and multi-statement writes use explicit transactions.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import results as results_mod
from harness.core.results import CaseResult, ResultsError, RunInfo
from harness.history import pg

DEFAULT_DB = Path("harness-results/history.db")
ENV_VAR = "HARNESS_DB"
SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 30.0

Migration = Callable[[sqlite3.Connection], None]


class StoreError(Exception):
    """A problem with the history DB that the user can fix; the message is one line."""


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


def is_postgres(conn: Any) -> bool:
    return isinstance(conn, pg.Connection)


# --------------------------------------------------------------------------- schema


def _execute_all(conn: sqlite3.Connection, statements: list[str]) -> None:
    for sql in statements:
        conn.execute(sql)


def _create_v1(conn: sqlite3.Connection) -> None:
    # One execute per statement: executescript() would COMMIT the migration transaction.
    statements = [
        """
        CREATE TABLE machines (
            id INTEGER PRIMARY KEY,
            fingerprint TEXT UNIQUE NOT NULL,
            hostname TEXT,
            details TEXT
        )
        """,
        # `machine` keeps the run's own machine dict: runners with identical hardware share a
        # fingerprint (and so one machines row) but differ in hostname, which must not be lost.
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            machine_id INTEGER NOT NULL REFERENCES machines(id),
            started_at REAL,
            finished_at REAL,
            tier TEXT,
            world_sizes TEXT,
            selectors TEXT,
            impls TEXT,
            argv TEXT,
            git_commit TEXT,
            env TEXT,
            status TEXT,
            machine TEXT
        )
        """,
        """
        CREATE TABLE results (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            case_id TEXT NOT NULL,
            op TEXT,
            family TEXT,
            impl TEXT NOT NULL,
            world_size INTEGER NOT NULL,
            params TEXT,
            status TEXT,
            reason TEXT,
            wrong INTEGER,
            median_ns REAL,
            p10_ns REAL,
            p90_ns REAL,
            min_ns REAL,
            mean_ns REAL,
            std_ns REAL,
            n_samples INTEGER,
            tflops REAL,
            gbps REAL,
            busbw_gbps REAL,
            peak_memory_bytes INTEGER,
            peak_memory_kind TEXT,
            output_hash TEXT,
            device TEXT,
            backend TEXT,
            started_at REAL,
            duration_s REAL,
            env_id TEXT,
            record TEXT NOT NULL,
            UNIQUE (run_id, case_id, impl, world_size)
        )
        """,
        """
        CREATE TABLE annotations (
            id INTEGER PRIMARY KEY,
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            case_id TEXT,
            impl TEXT,
            world_size INTEGER,
            created_at REAL,
            author TEXT,
            kind TEXT,
            text TEXT
        )
        """,
        "CREATE INDEX results_series ON results(case_id, impl, world_size)",
        "CREATE INDEX results_run ON results(run_id)",
        "CREATE INDEX runs_machine_started ON runs(machine_id, started_at)",
    ]
    _execute_all(conn, statements)


def _add_calibrations_v2(conn: sqlite3.Connection) -> None:
    # Peaks measured by `harness calibrate`, per machine and device model; a new measurement
    # is a new row, so percentages of peak stay reproducible from the row they used.
    statements = [
        """
        CREATE TABLE calibrations (
            id INTEGER PRIMARY KEY,
            machine_id INTEGER NOT NULL REFERENCES machines(id),
            device TEXT NOT NULL,
            created_at REAL NOT NULL,
            copy_gbps REAL,
            matmul TEXT,
            details TEXT
        )
        """,
        "CREATE INDEX calibrations_machine_device ON calibrations(machine_id, device, created_at)",
    ]
    _execute_all(conn, statements)


def _add_findings_v3(conn: sqlite3.Connection) -> None:
    # What regress.analyze_run found for each run, kept so that reports read it instead of
    # re-deriving every run's history on every render; `analyzed_at` tells an analysed run
    # with no findings from one never analysed (runs stored before v3).
    statements = [
        "ALTER TABLE runs ADD COLUMN analyzed_at REAL",
        """
        CREATE TABLE findings (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            kind TEXT NOT NULL,
            case_id TEXT NOT NULL,
            op TEXT,
            impl TEXT NOT NULL,
            world_size INTEGER NOT NULL,
            metric TEXT,
            baseline REAL,
            current REAL,
            ratio REAL,
            p_value REAL,
            baseline_run TEXT,
            detail TEXT
        )
        """,
        "CREATE INDEX findings_run ON findings(run_id)",
        "CREATE INDEX findings_series ON findings(case_id, impl, world_size)",
    ]
    _execute_all(conn, statements)


def _add_change_points_v4(conn: sqlite3.Connection) -> None:
    # Change points of each timing series (changes.py), found once and kept with their triage;
    # a finding names the change point it reports. Every run is marked for re-analysis: the
    # findings of v3 came from a lagging-median rule that re-flagged a step on every later run,
    # and the change points of an existing history only exist once it is analysed again.
    statements = [
        """
        CREATE TABLE change_points (
            id INTEGER PRIMARY KEY,
            machine_id INTEGER NOT NULL REFERENCES machines(id),
            case_id TEXT NOT NULL,
            impl TEXT NOT NULL,
            world_size INTEGER NOT NULL,
            timing TEXT NOT NULL DEFAULT '',
            op TEXT,
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            git_commit TEXT,
            found_in_run TEXT NOT NULL,
            direction TEXT NOT NULL,
            before REAL,
            after REAL,
            change_pct REAL,
            p_value REAL,
            n_before INTEGER,
            n_after INTEGER,
            state TEXT NOT NULL DEFAULT 'open',
            triage TEXT,
            triage_note TEXT,
            triage_by TEXT,
            triaged_at REAL,
            updated_at REAL
        )
        """,
        "CREATE INDEX change_points_series ON change_points(case_id, impl, world_size)",
        "ALTER TABLE findings ADD COLUMN change_point_id INTEGER",
        "CREATE INDEX findings_change_point ON findings(change_point_id)",
        "UPDATE runs SET analyzed_at = NULL",
    ]
    _execute_all(conn, statements)


#: MIGRATIONS[i] upgrades schema version i to i + 1; append, never edit a released one.
MIGRATIONS: list[Migration] = [_create_v1, _add_calibrations_v2, _add_findings_v3,
                               _add_change_points_v4]
assert len(MIGRATIONS) == SCHEMA_VERSION


# --------------------------------------------------------------------------- connections


def db_label_of(conn: Any) -> str:
    """Where ``conn`` reads and writes, fit to print."""
    if is_postgres(conn):
        return pg.label(conn.url)
    for row in conn.execute("PRAGMA database_list").fetchall():
        if row[1] == "main":
            return row[2] or ":memory:"
    return "<unknown>"


def _scalar(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    # fetchall() finishes the statement so no read snapshot lingers into a later write lock.
    rows = conn.execute(sql, params).fetchall()
    return rows[0][0] if rows else None


def _translate(label: str, exc: sqlite3.Error) -> StoreError | None:
    """A one-line StoreError for SQLite failures a user can cause, None for anything else."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    msg = str(exc)
    if name == "SQLITE_NOTADB" or "file is not a database" in msg:
        return StoreError(
            f"history DB {label} is not an SQLite database: move it away or pass another --db"
        )
    if name.startswith("SQLITE_CORRUPT") or "malformed" in msg:
        return StoreError(
            f"history DB {label} is corrupt ({msg}): move it away and re-ingest the run "
            "directories with `harness ingest`, or pass another --db"
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in msg:
        return StoreError(
            f"history DB {label} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s: "
            "retry when the other run has finished ingesting"
        )
    if name.startswith("SQLITE_CANTOPEN") or "unable to open database" in msg:
        return StoreError(
            f"history DB {label} cannot be opened: check the path and its permissions "
            "or pass another --db"
        )
    if name.startswith("SQLITE_READONLY") or "readonly database" in msg:
        return StoreError(
            f"history DB {label} is read-only: make it (and its directory) writable "
            "or pass another --db"
        )
    if name == "SQLITE_FULL" or "database or disk is full" in msg:
        return StoreError(f"history DB {label}: the disk is full: free space and retry")
    return None


def _translate_pg(label: str, exc: Exception) -> StoreError | None:
    """A one-line StoreError for PostgreSQL failures a user can cause (the server gone or
    unreachable, refused credentials, no such database, no permission), None otherwise."""
    import psycopg

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return StoreError(f"history DB {label}: permission denied ({first}): grant the user "
                          "CREATE and write rights on the database, or pass another --db")
    if isinstance(exc, psycopg.OperationalError):
        return StoreError(f"history DB {label} cannot be reached ({first}): check the URL, "
                          "that the server runs and accepts this user, or pass another --db")
    return None


def error_of(conn: Any, exc: BaseException, label: str | None = None) -> StoreError | None:
    """The one-line StoreError for a failure of ``conn``'s engine a user can cause, or None
    (``label``: where the DB is, when asking ``conn`` could fail too)."""
    if is_postgres(conn):
        import psycopg

        if isinstance(exc, psycopg.Error) and not isinstance(exc, psycopg.IntegrityError):
            return _translate_pg(label or db_label_of(conn), exc)
        return None
    if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
        return _translate(label or db_label_of(conn), exc)
    return None


@contextmanager
def _write_txn(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction; on SQLite IMMEDIATE takes the write lock up front.

    Taking the lock at BEGIN (not at the first write) matters under WAL: a deferred
    transaction that read first cannot upgrade once another process committed, and fails
    at once instead of waiting for the busy timeout. PostgreSQL locks rows as it writes them.
    """
    try:
        conn.execute("BEGIN" if is_postgres(conn) else "BEGIN IMMEDIATE")
    except Exception as exc:
        err = error_of(conn, exc)
        if err is None:
            raise
        raise err from exc
    try:
        yield
        conn.execute("COMMIT")  # inside the try: a failed COMMIT (disk full) rolls back too
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        err = error_of(conn, exc)
        if err is not None:
            raise err from exc
        raise


def _insert_id(conn: Any, sql: str, params: tuple[Any, ...]) -> int:
    """Run an INSERT into a table with an ``id`` key and return the new row's id."""
    if is_postgres(conn):
        return int(conn.execute(sql + " RETURNING id", params).fetchone()[0])
    return int(conn.execute(sql, params).lastrowid or 0)


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
    path: str | os.PathLike[str], *, migrations: list[Migration] = MIGRATIONS
) -> sqlite3.Connection:
    """Open (creating if needed) the history DB at ``path`` and bring its schema up to date.

    The connection is in autocommit mode with WAL, foreign keys on, a 30 s busy timeout and
    ``sqlite3.Row`` rows; a ``postgresql://`` URL opens that database (``harness.history.pg``).
    Raises StoreError for files or databases that cannot serve as a history DB.
    """
    if pg.is_url(path):
        return _connect_postgres(str(path), migrations)
    label = str(path)
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
        conn = sqlite3.connect(label, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise _translate(label, exc) or StoreError(
            f"history DB {label} cannot be opened ({exc}): pass another --db"
        ) from exc

    def setup() -> None:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        _enable_wal(conn)
        migrate(conn, migrations)

    return _set_up(conn, setup, label)


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
        raise _translate_pg(label, exc) or StoreError(
            f"history DB {label} cannot be opened ({exc}): pass another --db") from exc
    return _set_up(conn, lambda: migrate(conn, migrations), label)


#: the advisory lock key that serialises migrations of one PostgreSQL database ("harness")
_PG_MIGRATION_LOCK = 0x68_61_72_6E_65_73_73


def _schema_version(conn: Any) -> int:
    if not is_postgres(conn):
        return int(_scalar(conn, "PRAGMA user_version"))
    # a catalog query, not to_regclass(): that reads the relation cache, which can still
    # miss a table another process committed while this one waited on the migration lock
    if not _scalar(conn, "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = "
                         "current_schema() AND tablename = 'harness_schema'"):
        return 0
    return int(_scalar(conn, "SELECT version FROM harness_schema") or 0)


def _set_schema_version(conn: Any, version: int) -> None:
    if not is_postgres(conn):
        # PRAGMA takes no bound parameters; `version` is an int we computed.
        conn.execute(f"PRAGMA user_version = {int(version)}")
        return
    conn.execute("CREATE TABLE IF NOT EXISTS harness_schema (version INTEGER NOT NULL)")
    conn.execute("DELETE FROM harness_schema")
    conn.execute("INSERT INTO harness_schema (version) VALUES (?)", (int(version),))


def migrate(conn: sqlite3.Connection, migrations: list[Migration] = MIGRATIONS) -> int:
    """Apply the migrations the DB lacks, in order; return the resulting schema version.

    Each step runs in its own transaction (IMMEDIATE on SQLite; on PostgreSQL under an
    advisory lock) with its version bump, and the version is re-read under the lock, so two
    processes migrating at once do each step once.
    """
    target = len(migrations)
    label = db_label_of(conn)
    current = _schema_version(conn)
    # Check before locking so that an up-to-date DB opens without taking the write lock.
    _check_not_newer(label, current, target)
    while current < target:
        with _write_txn(conn):
            if is_postgres(conn):
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_PG_MIGRATION_LOCK,))
            current = _schema_version(conn)
            _check_not_newer(label, current, target)
            if current >= target:
                break  # another process finished the job while we waited for the lock
            if current == 0 and _has_user_tables(conn):
                raise StoreError(
                    f"history DB {label} holds tables but no kernel-harness schema version: "
                    "it is some other database; move it away or pass another --db"
                )
            migrations[current](conn)
            current += 1
            _set_schema_version(conn, current)
    return current


def _check_not_newer(label: str, current: int, target: int) -> None:
    if current > target:
        raise StoreError(
            f"history DB {label} has schema v{current}, newer than this harness (v{target}): "
            "upgrade kernel-harness or pass another --db"
        )


def _has_user_tables(conn: sqlite3.Connection) -> bool:
    if is_postgres(conn):
        return bool(_scalar(conn, "SELECT count(*) FROM information_schema.tables WHERE "
                                  "table_schema = current_schema() AND table_name <> "
                                  "'harness_schema'"))
    n = _scalar(
        conn, "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
    )
    return bool(n)


# --------------------------------------------------------------------------- ingest


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
    return int(_scalar(conn, "SELECT id FROM machines WHERE fingerprint = ?", (fingerprint,)))


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
    with _write_txn(conn):
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


# --------------------------------------------------------------------------- calibrations


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
    with _write_txn(conn):
        machine_id = _upsert_machine_dict(conn, machine)
        return _insert_id(
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


# --------------------------------------------------------------------------- findings

_FINDING_COLUMNS = ("kind", "case_id", "op", "impl", "world_size", "metric", "baseline",
                    "current", "ratio", "p_value", "baseline_run", "detail", "change_point_id")


def save_findings(conn: sqlite3.Connection, run_id: str, findings: Iterable[dict[str, Any]],
                  analyzed_at: float | None = None) -> int:
    """Replace the stored findings of ``run_id`` (``regress.Finding.to_dict()`` dicts) and mark
    the run analysed, in one transaction; returns how many were stored."""
    with _write_txn(conn):
        return _replace_findings(conn, run_id, list(findings),
                                 time.time() if analyzed_at is None else analyzed_at)


def _replace_findings(conn: sqlite3.Connection, run_id: str, findings: list[dict[str, Any]],
                      analyzed_at: float) -> int:
    if _scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None:
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


# --------------------------------------------------------------------------- queries


def _limit(params: list[Any], limit: int | None) -> str:
    """`` LIMIT ?`` with ``limit`` appended to ``params``, or nothing for no limit (SQLite's
    "no limit", -1, is an error on PostgreSQL)."""
    if limit is None:
        return ""
    params.append(limit)
    return " LIMIT ?"


def run_ids(
    conn: sqlite3.Connection, machine_fingerprint: str | None = None, limit: int | None = None
) -> list[str]:
    """Run ids, newest (by start time) first, optionally of one machine only."""
    sql = "SELECT r.run_id FROM runs r JOIN machines m ON m.id = r.machine_id"
    params: list[Any] = []
    if machine_fingerprint is not None:
        sql += " WHERE m.fingerprint = ?"
        params.append(machine_fingerprint)
    sql += " ORDER BY r.started_at DESC, r.run_id DESC" + _limit(params, limit)
    return [row[0] for row in conn.execute(sql, params).fetchall()]


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
    sql += " ORDER BY r.started_at DESC, r.run_id DESC" + _limit(params, limit)
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
    with _write_txn(conn):
        if (
            run_id is not None
            and _scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None
        ):
            raise StoreError(
                f"run {run_id} is not in history DB {db_label_of(conn)}: "
                "check the run id, or ingest that run first"
            )
        return _insert_id(
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


# --------------------------------------------------------------------------- change points

#: what a person (or the harness, for "fixed") can say about a change point
TRIAGE_STATES = ("acknowledged", "expected", "invalid", "fixed")
#: the columns a change point's analysis writes (the rest is its identity and its triage)
CHANGE_POINT_STATS = ("run_id", "git_commit", "direction", "before", "after", "change_pct",
                      "p_value", "n_before", "n_after", "state")
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
    with _write_txn(conn):
        if _scalar(conn, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)) is None:
            raise StoreError(f"run {run_id} is not in history DB {db_label_of(conn)}: "
                             "ingest it before storing its analysis")
        machine = _scalar(conn, "SELECT id FROM machines WHERE fingerprint = ?",
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
            ids.append(_insert_id(conn, f"INSERT INTO change_points ({', '.join(columns)}) "
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
    with _write_txn(conn):
        unknown = [i for i in ids
                   if _scalar(conn, "SELECT 1 FROM change_points WHERE id = ?", (i,)) is None]
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
