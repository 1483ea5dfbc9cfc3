"""Faults the harness survives, each injected for real (benchmarks/faults.py sums them up):
a PostgreSQL server restarted under a run's writes or down when it starts, a full disk under
the run folder, a damaged SQLite history, two golden writers at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.core import golden
from harness.history import store
from harness.history.sql import StoreError, Unreachable

ONE_CASE = ("allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]", "--world-sizes", "1",
            "--impl", "torch", "--no-bench")


def harness(*args: str, cwd: Path, **more_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DB"} | more_env
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def last_line(text: str) -> str:
    return [ln for ln in text.splitlines() if ln.strip() and "━" not in ln][-1]


# ---------------------------------------------------------------------------- PostgreSQL
def test_work_cut_by_a_server_restart_is_done_again_on_a_new_connection(postgres_server,
                                                                        postgres_url):
    calls = []

    def work(conn):
        calls.append(conn)
        if len(calls) == 1:  # the server restarts under this connection
            postgres_server.halt()
            postgres_server.start()
        return conn.execute("SELECT 41 + 1").fetchone()[0]

    assert store.reconnecting(postgres_url, work) == 42
    assert len(calls) == 2 and calls[0] is not calls[1]
    calls.clear()
    with pytest.raises(Unreachable, match="cannot be reached"):  # the control: no second try
        store.reconnecting(postgres_url, work, wait_s=0)


def test_a_server_down_from_the_start_is_reported_at_once(postgres_server, postgres_url):
    postgres_server.halt()
    try:
        with pytest.raises(Unreachable, match="cannot be reached"):
            store.reconnecting(postgres_url, lambda conn: None, wait_s=3600)
    finally:
        postgres_server.start()


def test_a_run_goes_on_without_its_server_and_is_ingested_later(tmp_path, postgres_server,
                                                                postgres_url):
    postgres_server.halt()
    try:
        out = harness("run", *ONE_CASE, "--db", postgres_url, "--out-dir", str(tmp_path),
                      cwd=tmp_path)
    finally:
        postgres_server.start()
    assert out.returncode == 4, out.stderr[-2000:]
    assert "the run goes on" in out.stderr
    assert "1 pass in" in out.stdout and "not stored" in out.stdout  # its results shown
    line = last_line(out.stderr)
    assert "cannot be reached" in line and "harness ingest" in line
    run_dir = next(p for p in tmp_path.iterdir() if (p / "results.jsonl").exists())
    later = harness("ingest", str(run_dir), "--db", postgres_url, cwd=tmp_path)
    assert later.returncode == 0, later.stderr[-2000:]
    conn = store.connect(postgres_url)
    try:
        rows = conn.execute("SELECT status FROM results WHERE run_id = ?",
                            (run_dir.name,)).fetchall()
        analysed = conn.execute("SELECT analyzed_at FROM runs").fetchone()[0]
    finally:
        conn.close()
    assert [r[0] for r in rows] == ["pass"] and analysed is not None


# ---------------------------------------------------------------------------- disk full
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                    reason="mounting a tmpfs needs root")
def test_a_full_disk_stops_the_run_in_one_line_and_resume_finishes_it(tmp_path):
    mnt, db = tmp_path / "mnt", tmp_path / "h.db"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mnt)], check=True)
    try:
        out = harness("run", "allreduce[*n=1031,op=sum*]", "--world-sizes", "1", "--impl",
                      "torch", "--no-bench", "--db", str(db), "--out-dir", str(mnt),
                      cwd=tmp_path)
        assert out.returncode == 4, out.stderr[-3000:]
        line = last_line(out.stderr)
        run_id = next(mnt.iterdir()).name
        assert "is full" in line and f"--resume {run_id}" in line and "Traceback" not in out.stderr
        assert not db.exists() or not store.run_ids(store.connect(db))  # nothing half stored
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
        again = harness("run", "--resume", run_id, "--db", str(db), "--out-dir", str(mnt),
                        cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        statuses = [json.loads(x)["status"]
                    for x in (mnt / run_id / "results.jsonl").read_text().splitlines()]
        assert statuses and set(statuses) == {"pass"}  # no case blamed for the disk
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                    reason="mounting a tmpfs needs root")
def test_a_history_db_on_a_full_disk_keeps_the_results_in_the_run_folder(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        db = mnt / "h.db"
        store.connect(db).close()
        with open(mnt / "filler", "wb", buffering=0) as fh:  # what is left of the disk, taken
            try:
                while True:
                    fh.write(b"x" * 4096)
            except OSError:
                pass
        out = harness("run", *ONE_CASE, "--db", str(db), "--out-dir", str(tmp_path),
                      cwd=tmp_path)
        assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
        line = last_line(out.stderr)
        assert "full" in line and "harness ingest" in line  # SQLite: "disk I/O error" or "full"
        assert "1 pass in" in out.stdout and "not stored" in out.stdout  # shown from the folder
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
        run_dir = next(p for p in tmp_path.iterdir() if (p / "results.jsonl").exists())
        later = harness("ingest", str(run_dir), "--db", str(db), cwd=tmp_path)
        assert later.returncode == 0, later.stderr[-2000:]
        assert run_dir.name in store.run_ids(store.connect(db))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---------------------------------------------------------------------------- SQLite damage
@pytest.fixture
def damaged_db(tmp_path) -> Path:
    db = tmp_path / "h.db"
    conn = store.connect(db)
    conn.execute("CREATE TABLE filler (x TEXT)")
    conn.executemany("INSERT INTO filler VALUES (?)", [("x" * 500,)] * 200)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'filler'").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    data[(root - 1) * size:(root - 1) * size + 200] = b"\x5a" * 200  # the table's first page
    db.write_bytes(bytes(data))
    return db


def test_a_damaged_sqlite_file_is_named_in_one_line_wherever_it_is_read(damaged_db):
    conn = store.connect(damaged_db)
    try:
        with pytest.raises(StoreError, match=f"history DB {damaged_db} is corrupt") as exc:
            store.check_integrity(conn)
        assert "\n" not in str(exc.value)
        with pytest.raises(StoreError, match="is corrupt"):  # met by a plain read, not a check
            conn.execute("SELECT * FROM filler").fetchall()
    finally:
        conn.close()


def test_commands_that_write_refuse_a_damaged_file_and_leave_it_as_it_was(tmp_path, damaged_db):
    before = damaged_db.read_bytes()
    run = harness("run", *ONE_CASE, "--db", str(damaged_db), cwd=tmp_path)
    assert run.returncode == 2 and "is corrupt" in last_line(run.stderr)
    assert "Traceback" not in run.stderr and not (tmp_path / "runs").exists()  # nothing ran
    ingest = harness("ingest", str(tmp_path), "--db", str(damaged_db), cwd=tmp_path)
    assert ingest.returncode == 2 and "is corrupt" in last_line(ingest.stderr)
    assert damaged_db.read_bytes() == before


# ---------------------------------------------------------------------------- goldens
def _write(store_: golden.GoldenStore, key: str) -> None:
    store_.write(key, f"op/{key}.safetensors", {"r0/out": torch.arange(4.0)},
                 {"case_id": key, "outputs": {}})


def test_two_writers_of_one_golden_dir_each_keep_their_entries(tmp_path):
    first, second = golden.GoldenStore(tmp_path), golden.GoldenStore(tmp_path)
    first.manifest, second.manifest  # noqa: B018 - both read the (empty) manifest first
    _write(first, "w1:a")
    _write(second, "w1:b")
    first.save_manifest()
    second.save_manifest()  # before, this wrote its view alone: w1:a was lost
    entries = json.loads((tmp_path / "manifest.json").read_text())["entries"]
    assert sorted(entries) == ["w1:a", "w1:b"]
    assert not list(tmp_path.rglob("*.tmp"))  # no scratch file left


def test_a_golden_file_the_manifest_lost_is_an_error_not_an_absent_golden(tmp_path):
    store_ = golden.GoldenStore(tmp_path)
    rel = golden.relative_file("fam", "op", "op[n=1]", 1)
    store_.write("w1:op[n=1]", rel, {"r0/out": torch.arange(4.0)}, {"outputs": {}})
    store_.save_manifest()
    assert golden.GoldenStore(tmp_path).lost_entry("op[n=1]", 1) is None  # listed: not lost
    (tmp_path / "manifest.json").unlink()
    lost = golden.GoldenStore(tmp_path).lost_entry("op[n=1]", 1)
    assert lost and Path(rel).name in lost and "manifest" in lost
    assert golden.GoldenStore(tmp_path).lost_entry("op[n=2]", 1) is None  # never had one


# ---------------------------------------------------------------------------- the user's set-up
def test_a_file_that_shadows_torch_is_named_in_one_line(tmp_path):
    (tmp_path / "torch.py").write_text("# scratch\n")  # in the folder the command runs from
    out = harness("run", *ONE_CASE, "--db", str(tmp_path / "h.db"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    line = last_line(out.stderr)
    assert f"`torch` is imported from {tmp_path / 'torch.py'}" in line
    assert "rename it or fix PYTHONPATH" in line and "Traceback" not in out.stderr
    (tmp_path / "torch.py").unlink()
    (tmp_path / "elsewhere" / "torch").mkdir(parents=True)  # a package on PYTHONPATH
    (tmp_path / "elsewhere" / "torch" / "__init__.py").write_text("")
    out = harness("run", *ONE_CASE, "--db", str(tmp_path / "h.db"), cwd=tmp_path,
                  PYTHONPATH=str(tmp_path / "elsewhere"))
    assert out.returncode == 2 and "shadows it" in last_line(out.stderr), out.stderr[-2000:]


def test_an_out_dir_that_cannot_be_made_is_a_usage_error(tmp_path):
    out = harness("run", *ONE_CASE, "--db", str(tmp_path / "h.db"), "--out-dir",
                  "/proc/harness-runs", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert last_line(out.stderr).endswith(
        "cannot use /proc/harness-runs (No such file or directory): pass a path that exists or "
        "can be made")


def test_an_invalid_mpich_setting_is_named_when_mpi_init_fails(tmp_path):
    """MPICH's error stack for it names no variable (a real MPI_Init, the mpich wheel's)."""
    out = harness("run", *ONE_CASE, "--db", str(tmp_path / "h.db"), cwd=tmp_path,
                  MPIR_CVAR_ENABLE_HEAVY_YIELD="notabool")
    assert out.returncode == 4, out.stderr[-2000:]
    hint = next(ln for ln in out.stderr.splitlines() if "MPI_Init failed in the ranks" in ln)
    assert "MPIR_CVAR_ENABLE_HEAVY_YIELD=notabool" in hint and "check or unset them" in hint
