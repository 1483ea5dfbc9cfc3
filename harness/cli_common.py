"""What every ``harness`` subcommand shares: exit codes, consoles, one-line user errors."""

from __future__ import annotations

import sqlite3
import sys

from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REGRESSION, EXIT_INFRA = 0, 1, 2, 3, 4

# logs (CI, pipes) get wide lines so case ids are never folded; terminals keep their width
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False,
                      width=None if sys.stderr.isatty() else 200)


class HarnessExit(Exception):
    """A user-facing error: one line and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> None:
    raise HarnessExit(message, code)


def parse_world_sizes(text: str) -> list[int]:
    """``1,4,8`` -> [1, 4, 8]; anything else is a usage error."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        _fail(f"--world-sizes {text!r} is not a comma-separated list of positive integers "
              "(e.g. 1,4,8)", EXIT_USAGE)
    return sorted(dict.fromkeys(sizes))


def fmt_us(ns: float | None) -> str:
    """Nanoseconds as microseconds for tables; "-" when there is no time."""
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def open_history(db: str | None) -> sqlite3.Connection:
    """The history DB (``--db``, ``$HARNESS_DB`` or the default) for reading what runs stored;
    one line and exit 2 when it does not exist (reading never creates one)."""
    from harness import store

    path = store.resolve_db_path(db)
    if not path.is_file():
        raise HarnessExit(f"history DB {path} does not exist: run `harness run` first, or pass "
                          "--db (or set HARNESS_DB) to the DB that holds the runs", EXIT_USAGE)
    try:
        return store.connect(path)
    except store.StoreError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
