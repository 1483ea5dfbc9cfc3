"""The SQL both history DB engines share, and where they differ: SQLite (stdlib sqlite3) or
PostgreSQL (``harness.history.pg``). The one-line StoreError of a failure a user can fix, the
write transaction (BEGIN IMMEDIATE on SQLite), a new row's id, and the LIMIT clause."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.history import pg

BUSY_TIMEOUT_S = 30.0


class StoreError(Exception):
    """A problem with the history DB that the user can fix; the message is one line."""


class Unavailable(StoreError):
    """The DB cannot take writes now, through no fault of what is written (its server is
    unreachable, its disk full): nothing was committed, and the same work may be done later.
    An infrastructure failure (exit 4)."""


class Unreachable(Unavailable):
    """The PostgreSQL server cannot be reached, or the connection to it was lost (a restart)."""


def is_postgres(conn: Any) -> bool:
    return isinstance(conn, pg.Connection)


def db_label_of(conn: Any) -> str:
    """Where ``conn`` reads and writes, fit to print."""
    if is_postgres(conn):
        return pg.label(conn.url)
    for row in conn.execute("PRAGMA database_list").fetchall():
        if row[1] == "main":
            return row[2] or ":memory:"
    return "<unknown>"


def scalar(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    # fetchall() finishes the statement so no read snapshot lingers into a later write lock.
    rows = conn.execute(sql, params).fetchall()
    return rows[0][0] if rows else None


#: what SQLite says, by kind: (its result-code name's prefix, a phrase of its message)
_SQLITE_KINDS = {
    "not_a_db": ("SQLITE_NOTADB", "file is not a database"),
    "corrupt": ("SQLITE_CORRUPT", "malformed"),
    "locked": (("SQLITE_BUSY", "SQLITE_LOCKED"), "database is locked"),
    "cannot_open": ("SQLITE_CANTOPEN", "unable to open database"),
    "read_only": ("SQLITE_READONLY", "readonly database"),
    "io_error": ("SQLITE_IOERR", "disk I/O error"),  # a full disk, met by the WAL
    "full": ("SQLITE_FULL", "database or disk is full"),
}
#: the kinds that say the file itself cannot be used now (damaged, or its disk full)
SQLITE_DAMAGE = frozenset({"not_a_db", "corrupt", "io_error", "full"})


def sqlite_kind(exc: sqlite3.Error) -> str | None:
    """Which of ``_SQLITE_KINDS`` an SQLite failure is, None for any other."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    msg = str(exc)
    for kind, (prefix, phrase) in _SQLITE_KINDS.items():
        if (name and name.startswith(prefix)) or phrase in msg:
            return kind
    return None


def corrupt(label: str, found: str) -> StoreError:
    """The one line of a damaged SQLite history DB, with what SQLite ``found``."""
    return StoreError(f"history DB {label} is corrupt ({found}): move it away and re-ingest "
                      "the run directories with `harness ingest`, or pass another --db")


def translate_sqlite(label: str, exc: sqlite3.Error) -> StoreError | None:
    """A one-line StoreError for SQLite failures a user can cause, None for anything else."""
    kind, msg = sqlite_kind(exc), str(exc)
    if kind == "not_a_db":
        return StoreError(
            f"history DB {label} is not an SQLite database: move it away or pass another --db"
        )
    if kind == "corrupt":
        return corrupt(label, msg)
    if kind == "locked":  # nothing wrong with what is written: it can be written later
        return Unavailable(
            f"history DB {label} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s: "
            "retry when the other run has finished ingesting"
        )
    if kind == "cannot_open":
        return StoreError(
            f"history DB {label} cannot be opened: check the path and its permissions "
            "or pass another --db"
        )
    if kind == "read_only":
        return StoreError(
            f"history DB {label} is read-only: make it (and its directory) writable "
            "or pass another --db"
        )
    if kind == "io_error":
        return Unavailable(f"history DB {label}: disk I/O error ({msg}): its disk may be full "
                           "or failing: free space (or fix the disk) and retry")
    if kind == "full":
        return Unavailable(f"history DB {label}: the disk is full: free space and retry")
    return None


def translate_pg(label: str, exc: Exception) -> StoreError | None:
    """A one-line StoreError for PostgreSQL failures a user can cause (the server gone or
    unreachable, refused credentials, no such database, no permission), None otherwise."""
    import psycopg

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return StoreError(f"history DB {label}: permission denied ({first}): grant the user "
                          "CREATE and write rights on the database, or pass another --db")
    if isinstance(exc, psycopg.OperationalError):
        return Unreachable(f"history DB {label} cannot be reached ({first}): check the URL, "
                          "that the server runs and accepts this user, or pass another --db")
    return None


def error_of(conn: Any, exc: BaseException, label: str | None = None) -> StoreError | None:
    """The one-line StoreError for a failure of ``conn``'s engine a user can cause, or None
    (``label``: where the DB is, when asking ``conn`` could fail too)."""
    if is_postgres(conn):
        import psycopg

        if isinstance(exc, psycopg.Error) and not isinstance(exc, psycopg.IntegrityError):
            return translate_pg(label or db_label_of(conn), exc)
        return None
    if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
        return translate_sqlite(label or db_label_of(conn), exc)
    return None


def translate_any(exc: BaseException, label: str = "(the one in use)") -> StoreError | None:
    """The one-line StoreError of a DB failure met where nothing translated it, or None."""
    if isinstance(exc, sqlite3.Error):
        return translate_sqlite(label, exc)
    if type(exc).__module__.startswith("psycopg"):
        return translate_pg(label, exc)  # type: ignore[arg-type]
    return None


@contextmanager
def write_txn(conn: sqlite3.Connection) -> Iterator[None]:
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
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - a lost connection rolled back on the server's side
            pass
        err = error_of(conn, exc)
        if err is not None:
            raise err from exc
        raise


def insert_id(conn: Any, sql: str, params: tuple[Any, ...]) -> int:
    """Run an INSERT into a table with an ``id`` key and return the new row's id."""
    if is_postgres(conn):
        return int(conn.execute(sql + " RETURNING id", params).fetchone()[0])
    return int(conn.execute(sql, params).lastrowid or 0)


def limit_clause(params: list[Any], limit: int | None) -> str:
    """`` LIMIT ?`` with ``limit`` appended to ``params``, or nothing for no limit (SQLite's
    "no limit", -1, is an error on PostgreSQL)."""
    if limit is None:
        return ""
    params.append(limit)
    return " LIMIT ?"
