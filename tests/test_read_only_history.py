"""A history DB this process cannot write (a read-only mount, another user's file) is read by
the commands that only read it, untouched; a command that writes says so in one line."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.history import schema, store
from tests.test_cli_changes import cli
from tests.test_regress import DEMO_NIGHTS, T0, night_samples, put, replay, result


@contextlib.contextmanager
def read_only(folder: Path, view: Path) -> Iterator[Path]:
    """``folder`` as this process sees a read-only mount of it: the folder itself with its
    write bits off for a user, a read-only bind mount at ``view`` for root (which writes past
    permission bits)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield folder
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    view.mkdir()
    for args in (["mount", "--bind", str(folder), str(view)],
                 ["mount", "-o", "remount,bind,ro", str(view)]):
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode:
            subprocess.run(["umount", str(view)], capture_output=True)
            pytest.skip(f"a read-only mount cannot be made here ({done.stderr.strip()})")
    try:
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_a_db_that_cannot_be_written_is_read_by_every_reading_command(tmp_path, capsys):
    folder = tmp_path / "db"
    folder.mkdir()
    conn = store.connect(folder / "h.db")
    try:
        replay(conn, DEMO_NIGHTS["step"])  # analysed: one change point
        put(conn, "n7", T0 + 6 * 86400,  # stored, never analysed
            [result("n7", samples=night_samples(2250000.0, 2150000, 7))])
    finally:
        conn.close()
    before = digest(folder)
    with read_only(folder, tmp_path / "view") as view:
        db = str(view / "h.db")
        code, out, err = cli(capsys, "triage", "--db", db)
        assert code == 0 and "from run n5" in out, out + err
        code, out, err = cli(capsys, "export", "n7", "--db", db)
        assert code == 0 and '"run_id": "n7"' in out, out + err
        code, out, err = cli(capsys, "detect", db)
        assert code == 0 and "1 change point(s)" in out, out + err
        code, out, err = cli(capsys, "report", "--db", db, "--out", str(tmp_path / "site"))
        assert code == 0 and (tmp_path / "site" / "index.html").is_file(), out + err
        assert "1 run(s) stored without findings are shown without their regressions" in err
        # a command that writes: one line, exit 2, nothing lost
        code, out, err = cli(capsys, "triage", "1", "invalid", "--db", db)
        assert code == 2 and "is read-only here" in err and "writes to it" in err, err
    assert digest(folder) == before


def _leave_pending_write(db: Path) -> None:
    """A writer that died before its WAL was checkpointed: a row only the -wal file holds."""
    code = ("import os, sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA wal_autocheckpoint = 0')\n"
            "c.execute(\"UPDATE runs SET status = 'pending' WHERE run_id = 'r0'\")\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(db)], check=True)


def test_writes_only_a_wal_file_holds_are_read_or_refused(tmp_path, capsys):
    folder = tmp_path / "db"
    folder.mkdir()
    conn = store.connect(folder / "h.db")
    put(conn, "r0", T0, [result("r0", samples=[1.0, 1.1, 1.2])])
    conn.close()
    _leave_pending_write(folder / "h.db")
    assert (folder / "h.db-wal").stat().st_size > 0
    with read_only(folder, tmp_path / "view") as view:
        # with its -shm file beside it, SQLite reads the pending row
        conn = store.connect(view / "h.db", read_only=True)
        try:
            assert conn.execute("SELECT status FROM runs").fetchone()[0] == "pending"
        finally:
            conn.close()
    (folder / "h.db-shm").unlink()
    with read_only(folder, tmp_path / "view2") as view:
        # without it the row cannot be read, and the DB read without it would be stale
        code, _, err = cli(capsys, "triage", "--db", str(view / "h.db"))
        assert code == 2 and "h.db-wal beside it holds writes not yet in the DB" in err, err


def test_a_db_of_an_older_schema_that_cannot_be_written_is_refused(tmp_path, capsys):
    folder = tmp_path / "db"
    folder.mkdir()
    store.connect(folder / "h.db", migrations=schema.MIGRATIONS[:-1]).close()
    with read_only(folder, tmp_path / "view") as view:
        code, _, err = cli(capsys, "triage", "--db", str(view / "h.db"))
    version = schema.SCHEMA_VERSION
    assert code == 2 and f"has schema v{version - 1}, not this harness's v{version}" in err, err
