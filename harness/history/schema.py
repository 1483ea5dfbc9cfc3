"""The history DB's schema: its tables at each version (``MIGRATIONS[i]`` upgrades version
``i`` to ``i + 1``) and ``migrate``, which brings a DB up to date. The version lives in
``PRAGMA user_version`` on SQLite and in the table ``harness_schema`` on PostgreSQL; each
step runs in its own transaction together with the version bump (on PostgreSQL under an
advisory lock), so a crash or a concurrent migrator never leaves a half-migrated DB."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from harness.history.sql import StoreError, db_label_of, is_postgres, scalar, write_txn

SCHEMA_VERSION = 6

Migration = Callable[[sqlite3.Connection], None]


def _execute_all(conn: sqlite3.Connection, statements: list[str]) -> None:
    for sql in statements:
        conn.execute(sql)


#: the tables and indexes of schema version 1 (one execute per statement: executescript()
#: would COMMIT the migration transaction)
_V1_STATEMENTS = [
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


def _create_v1(conn: sqlite3.Connection) -> None:
    _execute_all(conn, _V1_STATEMENTS)


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


def _add_change_point_ranges_v5(conn: sqlite3.Connection) -> None:
    # The first run a change point may have begun at, where runs between its two levels leave
    # it open (changepoints.ChangePoint.earliest): with run_id, the range a user bisects. NULL
    # where run_id is where it began (every change point stored before this version).
    _execute_all(conn, ["ALTER TABLE change_points ADD COLUMN earliest_run_id TEXT",
                        "ALTER TABLE change_points ADD COLUMN earliest_commit TEXT"])


def _add_change_point_latest_v6(conn: sqlite3.Connection) -> None:
    # The last run a change point may have begun at, where slow runs set aside from run_id on
    # leave it open (changepoints.ChangePoint.latest): with earliest_run_id (or run_id), the
    # range a user bisects. NULL where run_id is the last (every change point stored before).
    _execute_all(conn, ["ALTER TABLE change_points ADD COLUMN latest_run_id TEXT",
                        "ALTER TABLE change_points ADD COLUMN latest_commit TEXT"])


#: MIGRATIONS[i] upgrades schema version i to i + 1; append, never edit a released one.
MIGRATIONS: list[Migration] = [_create_v1, _add_calibrations_v2, _add_findings_v3,
                               _add_change_points_v4, _add_change_point_ranges_v5,
                               _add_change_point_latest_v6]
assert len(MIGRATIONS) == SCHEMA_VERSION

#: the advisory lock key that serialises migrations of one PostgreSQL database ("harness")
_PG_MIGRATION_LOCK = 0x68_61_72_6E_65_73_73


def _schema_version(conn: Any) -> int:
    if not is_postgres(conn):
        return int(scalar(conn, "PRAGMA user_version"))
    # a catalog query, not to_regclass(): that reads the relation cache, which can still
    # miss a table another process committed while this one waited on the migration lock
    if not scalar(conn, "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = "
                        "current_schema() AND tablename = 'harness_schema'"):
        return 0
    return int(scalar(conn, "SELECT version FROM harness_schema") or 0)


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
        with write_txn(conn):
            if is_postgres(conn):
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_PG_MIGRATION_LOCK,))
            current = _schema_version(conn)
            _check_not_newer(label, current, target)
            if current >= target:
                break  # another process finished the job while we waited for the lock
            if current == 0 and _has_user_tables(conn):
                raise _foreign(label)
            migrations[current](conn)
            current += 1
            _set_schema_version(conn, current)
    return current


def _foreign(label: str) -> StoreError:
    return StoreError(f"history DB {label} holds tables but no kernel-harness schema version: "
                      "it is some other database; move it away or pass another --db")


def refuse_foreign(conn: Any) -> None:
    """Raise StoreError for a database that holds tables and no kernel-harness schema: before
    anything is written to it (switching a SQLite file to WAL rewrites its header)."""
    # tables first, then the version: a migration commits its tables with its version, so a
    # version read after seeing them is theirs (the other order raced one opening the file)
    if _has_user_tables(conn) and _schema_version(conn) == 0:
        raise _foreign(db_label_of(conn))


def _check_not_newer(label: str, current: int, target: int) -> None:
    if current > target:
        raise StoreError(
            f"history DB {label} has schema v{current}, newer than this harness (v{target}): "
            "upgrade kernel-harness or pass another --db"
        )


def _has_user_tables(conn: sqlite3.Connection) -> bool:
    if is_postgres(conn):
        return bool(scalar(conn, "SELECT count(*) FROM information_schema.tables WHERE "
                                 "table_schema = current_schema() AND table_name <> "
                                 "'harness_schema'"))
    n = scalar(
        conn, "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
    )
    return bool(n)
