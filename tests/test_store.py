"""Tests of the run-history store on real SQLite files (no mocks)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core import results as results_mod
from harness.core.results import CaseResult, RunInfo
from harness.history import reads, schema, store, triage
from harness.history.sql import StoreError

TABLES = {"machines", "runs", "results", "annotations", "calibrations"}


def make_run(run_id: str = "run-0001", *, started_at: float = 1_700_000_000.0, **kw) -> RunInfo:
    fields = dict(
        run_id=run_id,
        started_at=started_at,
        tier="smoke",
        world_sizes=[1, 4],
        machine={"fingerprint": "fp-cpu-2core", "hostname": "ci-runner-3", "cpus": 2},
        env={"torch": "2.4.0", "python": "3.11.9", "mpi": "mpich 4.2"},
        finished_at=None,
        selectors=["allreduce"],
        impls=["torch"],
        argv=["harness", "run", "allreduce", "--world-sizes", "1,4"],
        git_commit="0123456789abcdef0123456789abcdef01234567",
        status="running",
    )
    fields.update(kw)
    return RunInfo(**fields)


def make_result(
    run_id: str = "run-0001",
    n: int = 1031,
    *,
    impl: str = "torch",
    world_size: int = 4,
    median: float = 12_500.0,
    status: str = "pass",
) -> CaseResult:
    samples = [median * f for f in (0.97, 0.99, 1.0, 1.0, 1.01, 1.03, 1.1)]
    return CaseResult(
        run_id=run_id,
        case_id=f"allreduce[dtype=f32,n={n},op=sum]",
        op="allreduce",
        family="collectives",
        impl=impl,
        world_size=world_size,
        params={"dtype": "f32", "n": n, "op": "sum"},
        status=status,
        reason="" if status == "pass" else "3 elements outside tolerance",
        outputs={"out": {"max_abs": 1.2e-7, "tolerance": "atol=1e-5,rtol=1e-5", "passed": True}},
        wrong=0 if status == "pass" else 3,
        timing={
            "median": median,
            "p10": samples[1],
            "p90": samples[5],
            "min": samples[0],
            "mean": sum(samples) / len(samples),
            "std": 450.0,
            "n": len(samples),
            "samples": samples,
        },
        derived={"gbps": 0.33, "busbw_gbps": 0.495},
        peak_memory_bytes=1 << 20,
        peak_memory_kind="cpu_process_maxrss",
        output_hash="sha256:4f2a",
        device="cpu",
        backend="gloo",
        started_at=1_700_000_010.0 + n,
        duration_s=0.42,
        env_id="e3b0c442",
    )


def some_results(run_id: str = "run-0001") -> list[CaseResult]:
    return [
        make_result(run_id, 1031),
        make_result(run_id, 65536, median=80_000.0),
        make_result(run_id, 1031, impl="ring"),
        make_result(run_id, 1031, world_size=1, status="fail"),
    ]


def dump(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    """Every row of every table, in a fixed order: on SQLite and on PostgreSQL."""
    names = (*sorted(TABLES), "findings", "change_points")
    return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()]
            for t in names}


def user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


def count(conn: sqlite3.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A fresh history DB: an SQLite file, and a database on a real PostgreSQL server."""
    target = (tmp_path / "history.db" if request.param == "sqlite"
              else request.getfixturevalue("postgres_url"))
    conn = store.connect(target)
    yield conn
    conn.close()


# --------------------------------------------------------------------------- schema


def test_fresh_db_has_the_current_schema_and_all_tables(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "history.db"  # parent directories are created
    conn = store.connect(path)
    assert path.is_file()
    assert user_version(conn) == schema.SCHEMA_VERSION == len(schema.MIGRATIONS) == 6
    assert TABLES | {"findings", "change_points"} <= tables(conn)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"results_series", "results_run", "runs_machine_started",
            "calibrations_machine_device", "findings_run", "findings_series",
            "change_points_series"} <= indexes
    conn.close()


def test_reopen_does_not_rerun_migrations_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = store.connect(path)
    store.ingest(conn, make_run(), some_results())
    conn.close()

    calls: list[int] = []

    def counting(i: int):
        def run(c: sqlite3.Connection) -> None:
            calls.append(i)
            schema.MIGRATIONS[i](c)

        return run

    conn = store.connect(path, migrations=[counting(i) for i in range(len(schema.MIGRATIONS))])
    assert calls == []
    assert user_version(conn) == schema.SCHEMA_VERSION
    assert count(conn, "results") == 4
    assert store.run_ids(conn) == ["run-0001"]
    conn.close()


def test_empty_db_with_user_version_0_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    raw = sqlite3.connect(path)  # a valid SQLite file with a header, version 0, no tables
    raw.execute("CREATE TABLE scratch (x)")
    raw.execute("DROP TABLE scratch")
    raw.commit()
    raw.close()
    assert path.stat().st_size > 0
    conn = store.connect(path)
    assert user_version(conn) == schema.SCHEMA_VERSION
    assert TABLES <= tables(conn)
    conn.close()


def test_zero_byte_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"")
    conn = store.connect(path)
    assert user_version(conn) == schema.SCHEMA_VERSION
    conn.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(StoreError) as info:
        store.connect(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert "history.db" in msg
    assert f"schema v99, newer than this harness (v{schema.SCHEMA_VERSION})" in msg
    assert "upgrade kernel-harness or pass another --db" in msg


def test_non_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_text("case,impl,median\n" * 200)
    with pytest.raises(StoreError) as info:
        store.connect(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert "not an SQLite database" in msg
    assert "pass another --db" in msg
    assert path.read_text() == "case,impl,median\n" * 200  # left untouched


def test_foreign_sqlite_db_without_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE todo (id INTEGER PRIMARY KEY, what TEXT)")
    raw.execute("INSERT INTO todo (what) VALUES ('buy milk')")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="some other database"):
        store.connect(path)
    assert path.read_bytes() == before  # not a byte written (WAL rewrote its header once)
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT what FROM todo").fetchall() == [("buy milk",)]
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    raw.close()


def test_directory_in_place_of_db_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.mkdir()
    with pytest.raises(StoreError, match="cannot be opened"):
        store.connect(path)


def _next_add_notes(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE results ADD COLUMN triage TEXT")
    conn.execute("CREATE TABLE baselines (case_id TEXT, impl TEXT, run_id TEXT)")


def test_forward_migration_keeps_existing_data(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = store.connect(path)
    store.ingest(conn, make_run(), some_results())
    reads.add_annotation(conn, "driver 550 regression", run_id="run-0001", author="ana")
    before_results = store.results_for_run(conn, "run-0001")
    before_run = store.get_run(conn, "run-0001")
    conn.close()

    conn = store.connect(path, migrations=[*schema.MIGRATIONS, _next_add_notes])
    assert user_version(conn) == schema.SCHEMA_VERSION + 1
    assert "baselines" in tables(conn)
    columns = {r["name"] for r in conn.execute("PRAGMA table_info(results)")}
    assert "triage" in columns
    assert store.results_for_run(conn, "run-0001") == before_results
    assert store.get_run(conn, "run-0001") == before_run
    assert count(conn, "annotations") == 1
    # the new column is usable and ingest keeps working on the newer schema
    conn.execute("UPDATE results SET triage = 'flaky' WHERE impl = 'ring'")
    store.ingest(conn, make_run("run-0002", started_at=1_700_100_000.0), some_results("run-0002"))
    assert count(conn, "results") == 8
    conn.close()

    # and this harness now refuses the newer file instead of corrupting it
    with pytest.raises(StoreError, match=f"schema v{schema.SCHEMA_VERSION + 1}, newer than "
                                          "this harness"):
        store.connect(path)


def test_v1_file_migrates_to_v2_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = store.connect(path, migrations=schema.MIGRATIONS[:1])  # what v1 harnesses wrote
    assert user_version(conn) == 1
    assert "calibrations" not in tables(conn)
    store.ingest(conn, make_run(), some_results())
    reads.add_annotation(conn, "baseline", run_id="run-0001")
    before = list(conn.iterdump())
    conn.close()

    conn = store.connect(path, migrations=schema.MIGRATIONS[:2])
    assert user_version(conn) == 2
    assert "calibrations" in tables(conn)
    after = list(conn.iterdump())
    # every v1 row survives; the dump only gains the calibrations table and its index
    assert [line for line in after if "calibrations" not in line] == before
    by_key = sorted(store.results_for_run(conn, "run-0001"), key=lambda r: r.key)
    assert by_key == sorted(some_results(), key=lambda r: r.key)
    # a calibration of the machine that made the run lands on that machine's row
    cal_id = store.save_calibration(conn, {"fingerprint": "fp-cpu-2core", "hostname": "h"},
                                    make_calibration())
    assert count(conn, "machines") == 1
    assert store.latest_calibration(conn, "fp-cpu-2core", "cpu")["id"] == cal_id
    conn.close()


def _finding(kind: str = "regression", **kw):
    d = {"kind": kind, "case_id": "allreduce[n=8]", "op": "allreduce", "impl": "ring",
         "world_size": 4, "metric": "median_ns", "baseline": 100.0, "current": 130.0,
         "ratio": 1.3, "p_value": 1e-4, "baseline_run": "run-0000", "detail": "x1.300"}
    return {**d, **kw}


def test_v2_file_migrates_to_v3_and_its_runs_count_as_never_analysed(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = store.connect(path, migrations=schema.MIGRATIONS[:2])  # what v2 harnesses wrote
    store.ingest(conn, make_run(), some_results())
    before_results = store.results_for_run(conn, "run-0001")
    before_run = store.get_run(conn, "run-0001")
    conn.close()

    conn = store.connect(path)  # v2 -> v3 -> v4
    assert user_version(conn) == schema.SCHEMA_VERSION
    assert store.results_for_run(conn, "run-0001") == before_results
    assert store.get_run(conn, "run-0001") == before_run
    assert triage.unanalyzed_runs(conn) == ["run-0001"]
    assert triage.stored_findings(conn) == []
    conn.close()


def test_v3_file_migrates_to_v4_and_its_history_gets_change_points(tmp_path: Path) -> None:
    # a v3 history: 6 runs at one level, 2 at a slower one, analysed with v3's rule (whose
    # findings are replaced: v4 re-analyses every run, oldest first)
    from harness.history import regress

    path = tmp_path / "history.db"
    conn = store.connect(path, migrations=schema.MIGRATIONS[:3])
    for i in range(8):
        run_id = f"run-{i:04d}"
        r = make_result(run_id, 1031, median=100_000.0 * (1.3 if i >= 6 else 1.0))
        r.timing["samples"] = [r.timing["median"] * (1 + 0.01 * k) for k in (-2, -1, 0, 1, 2)]
        store.ingest(conn, make_run(run_id, started_at=1_700_000_000.0 + i), [r])
        if i >= 6:  # what v3's save_findings wrote
            conn.execute("INSERT INTO findings (run_id, kind, case_id, impl, world_size, detail) "
                         "VALUES (?, 'regression', 'allreduce[n=1031]', 'ring', 4, 'x1.3')",
                         (run_id,))
        conn.execute("UPDATE runs SET analyzed_at = 1 WHERE run_id = ?", (run_id,))
    before = store.results_for_run(conn, "run-0007")
    conn.close()

    conn = store.connect(path)
    assert user_version(conn) == schema.SCHEMA_VERSION
    assert store.results_for_run(conn, "run-0007") == before
    assert len(triage.unanalyzed_runs(conn)) == 8 and triage.change_points(conn) == []
    assert regress.analyze_ingested(conn, triage.unanalyzed_runs(conn))[-1] == "run-0007"
    (point,) = triage.change_points(conn)
    assert (point["run_id"], point["found_in_run"], point["direction"]) == (
        "run-0006", "run-0007", "up")
    assert [(f["run_id"], f["kind"], f["change_point_id"]) for f in triage.stored_findings(conn)
            ] == [("run-0006", "suspicious", None), ("run-0007", "regression", point["id"])]
    conn.close()


def test_findings_round_trip_replace_and_mark_the_run_analysed(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "history.db")
    store.ingest(conn, make_run("run-0002", started_at=1_700_100_000.0),
                 some_results("run-0002"))
    store.ingest(conn, make_run(), some_results())
    assert triage.unanalyzed_runs(conn) == ["run-0001", "run-0002"]  # oldest first

    assert triage.save_findings(conn, "run-0002", [_finding(), _finding("drift", ratio=None,
                                                                         metric="out")]) == 2
    got = triage.stored_findings(conn, "run-0002")
    assert [f["kind"] for f in got] == ["regression", "drift"]
    assert got[0] == {"run_id": "run-0002", **_finding(), "change_point_id": None, "triage": None}
    assert got[1]["ratio"] is None
    assert triage.unanalyzed_runs(conn) == ["run-0001"]
    # an analysed run with nothing to report is analysed all the same
    assert triage.save_findings(conn, "run-0001", []) == 0
    assert triage.unanalyzed_runs(conn) == []
    # analysing again replaces, never appends
    triage.save_findings(conn, "run-0002", [_finding("bits_changed")])
    assert [f["kind"] for f in triage.stored_findings(conn)] == ["bits_changed"]
    with pytest.raises(StoreError, match="run-9999 is not in history DB"):
        triage.save_findings(conn, "run-9999", [_finding()])
    # findings go with their run
    conn.execute("DELETE FROM runs WHERE run_id = 'run-0002'")
    assert count(conn, "findings") == 0
    conn.close()


def test_migration_failure_rolls_back_that_step(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    store.connect(path).close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE results ADD COLUMN half_done TEXT")
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError, match="migration bug"):
        store.connect(path, migrations=[*schema.MIGRATIONS, broken])
    conn = store.connect(path)
    assert user_version(conn) == schema.SCHEMA_VERSION
    assert "half_done" not in {r["name"] for r in conn.execute("PRAGMA table_info(results)")}
    conn.close()


# --------------------------------------------------------------------------- ingest


def test_ingest_twice_is_identical(db: sqlite3.Connection) -> None:
    run, res = make_run(), some_results()
    first = store.ingest(db, run, res)
    assert first == store.IngestSummary(run_id="run-0001", n_results=4, new_run=True)
    snapshot = dump(db)
    counts = {t: count(db, t) for t in TABLES}
    assert counts == {"machines": 1, "runs": 1, "results": 4, "annotations": 0,
                      "calibrations": 0}

    second = store.ingest(db, run, res)
    assert second == store.IngestSummary(run_id="run-0001", n_results=4, new_run=False)
    assert {t: count(db, t) for t in TABLES} == counts
    assert dump(db) == snapshot


def test_reingest_updates_run_and_adds_new_results(db: sqlite3.Connection) -> None:
    res = some_results()
    store.ingest(db, make_run(), res[:3])
    assert count(db, "results") == 3

    finished = make_run(finished_at=1_700_000_900.0, status="complete")
    summary = store.ingest(db, finished, res)
    assert summary.n_results == 4 and not summary.new_run
    assert count(db, "results") == 4 and count(db, "runs") == 1
    assert store.get_run(db, "run-0001") == finished
    assert store.results_for_run(db, "run-0001") == sorted(
        res, key=lambda r: (r.world_size, r.case_id, r.impl)
    )

    # a changed result (relaunch after a crash) replaces the stored one, same key
    redone = make_result(median=99_000.0)
    store.ingest(db, finished, [redone])
    row = db.execute(
        "SELECT median_ns FROM results WHERE case_id = ? AND impl = 'torch' AND world_size = 4",
        (redone.case_id,),
    ).fetchone()
    assert row[0] == 99_000.0
    assert count(db, "results") == 4


def test_results_round_trip_and_columns(db: sqlite3.Connection) -> None:
    res = some_results()
    bare = make_result(n=7, impl="naive")
    bare.timing = None
    bare.derived = {}
    bare.peak_memory_bytes = None
    bare.peak_memory_kind = None
    res.append(bare)
    store.ingest(db, make_run(), res)

    got = store.results_for_run(db, "run-0001")
    assert got == sorted(res, key=lambda r: (r.world_size, r.case_id, r.impl))
    assert all(isinstance(r, CaseResult) for r in got)

    row = db.execute(
        "SELECT * FROM results WHERE case_id = 'allreduce[dtype=f32,n=1031,op=sum]' "
        "AND impl = 'torch' AND world_size = 4"
    ).fetchone()
    ref = res[0]
    assert row["median_ns"] == ref.timing["median"]
    assert row["p10_ns"] == ref.timing["p10"] and row["p90_ns"] == ref.timing["p90"]
    assert row["n_samples"] == 7
    assert row["gbps"] == 0.33 and row["busbw_gbps"] == 0.495
    assert row["tflops"] is None  # missing derived figure -> NULL
    assert row["op"] == "allreduce" and row["family"] == "collectives"
    assert row["peak_memory_bytes"] == 1 << 20

    row = db.execute("SELECT * FROM results WHERE impl = 'naive'").fetchone()
    assert row["median_ns"] is None and row["n_samples"] is None and row["gbps"] is None

    assert store.get_run(db, "run-0001") == make_run()
    assert store.get_run(db, "no-such-run") is None
    assert store.results_for_run(db, "no-such-run") == []


def test_ingest_is_atomic(db: sqlite3.Connection) -> None:
    store.ingest(db, make_run("run-0000", started_at=1_699_000_000.0), some_results("run-0000"))
    before = dump(db)

    def exploding() -> Iterator[CaseResult]:
        yield make_result("run-0001", 1)
        yield make_result("run-0001", 2)
        raise OSError("results.jsonl vanished")

    with pytest.raises(OSError, match="vanished"):
        store.ingest(db, make_run("run-0001"), exploding())
    assert not db.in_transaction
    assert dump(db) == before
    assert db.execute("SELECT count(*) FROM results WHERE run_id = 'run-0001'").fetchone()[0] == 0
    assert store.get_run(db, "run-0001") is None
    # the connection is still usable afterwards
    store.ingest(db, make_run("run-0001"), some_results("run-0001"))
    assert count(db, "results") == 8


def test_result_of_another_run_is_refused_atomically(db: sqlite3.Connection) -> None:
    res = [make_result("run-0001"), make_result("run-9999", 2)]
    with pytest.raises(StoreError, match="belongs to run run-9999, not run-0001"):
        store.ingest(db, make_run("run-0001"), res)
    assert count(db, "runs") == 0 and count(db, "results") == 0


def test_run_id_reused_by_another_machine_is_refused(db: sqlite3.Connection) -> None:
    store.ingest(db, make_run(), some_results())
    other = make_run(machine={"fingerprint": "fp-h100", "hostname": "gpu-7"})
    with pytest.raises(StoreError, match="run ids must be unique"):
        store.ingest(db, other, [])
    assert count(db, "machines") == 1  # the rolled-back upsert left nothing behind


def test_missing_fingerprint_is_refused(db: sqlite3.Connection) -> None:
    with pytest.raises(StoreError, match="no machine fingerprint"):
        store.ingest(db, make_run(machine={"hostname": "x"}), [])


# --------------------------------------------------------------------------- concurrency


def test_many_connections_opening_a_new_file_at_once(tmp_path: Path) -> None:
    """The first opens race to switch the new file to WAL; SQLite answers some of them busy
    at once (no busy handler, it could deadlock), and connect must wait those out, not fail.
    Threads, not processes: SQLite's locks contend the same across connections in one
    process, and 60 rounds of 8 take under a second (about 5 of the 60 failed before)."""
    failures: list[BaseException] = []

    def opener(path: Path, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            store.connect(path).close()
        except BaseException as exc:  # collected: a thread's exception would vanish
            failures.append(exc)

    for round_ in range(60):
        path = tmp_path / f"history-{round_}.db"
        barrier = threading.Barrier(8)
        threads = [threading.Thread(target=opener, args=(path, barrier)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert failures == []


def _ingest_worker(target: str, worker: int, n_runs: int, start: object) -> None:
    """Ingest ``n_runs`` runs of 40 results; worker 0 and worker -1 ingest the same runs."""
    start.wait(30)  # type: ignore[attr-defined]
    conn = store.connect(target)  # concurrent first open: WAL switch + migration race too
    mine = max(worker, 0)
    for i in range(n_runs):
        run_id = f"w{mine}-run{i:03d}"
        run = make_run(
            run_id,
            started_at=1_700_000_000.0 + mine * 1000 + i,
            machine={"fingerprint": f"fp-runner-{mine}", "hostname": f"runner-{mine}"},
        )
        results = [make_result(run_id, n) for n in range(1, 41)]
        store.ingest(conn, run, results)
    conn.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_concurrent_ingest_from_processes(request, tmp_path: Path, backend: str) -> None:
    """8 processes ingest different runs at once and 2 more the same runs as one of them,
    into a DB none has created yet: every run is there once, nothing is lost, the DB is
    whole."""
    target = (str(tmp_path / "history.db") if backend == "sqlite"
              else request.getfixturevalue("postgres_url"))
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    n_runs, workers = 4, [*range(8), -1, -1]  # -1: worker 0's runs, twice more
    procs = [ctx.Process(target=_ingest_worker, args=(target, w, n_runs, start))
             for w in workers]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * len(workers)

    conn = store.connect(target)
    assert schema._schema_version(conn) == schema.SCHEMA_VERSION
    assert count(conn, "runs") == 8 * n_runs and count(conn, "machines") == 8
    assert count(conn, "results") == 8 * n_runs * 40
    keys = conn.execute("SELECT count(DISTINCT run_id || case_id || impl || world_size) "
                        "FROM results").fetchone()[0]
    assert keys == 8 * n_runs * 40
    for w in range(8):
        assert len(store.run_ids(conn, machine_fingerprint=f"fp-runner-{w}")) == n_runs
    assert len(store.results_for_run(conn, "w0-run003")) == 40
    if backend == "sqlite":
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    else:  # PostgreSQL checks its own pages; its catalog must agree with the data
        assert conn.execute("SELECT count(*) FROM results r LEFT JOIN runs u "
                            "ON u.run_id = r.run_id WHERE u.run_id IS NULL").fetchone()[0] == 0
    conn.close()


def test_concurrent_migration_is_done_once(tmp_path: Path) -> None:
    """A process that read version 0, then waited on the lock, must not migrate again."""
    path = tmp_path / "history.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("BEGIN IMMEDIATE")  # "the other process", mid-migration

    calls: list[int] = []

    def counting(c: sqlite3.Connection) -> None:
        calls.append(0)
        schema.MIGRATIONS[0](c)

    outcome: list[object] = []

    def opener() -> None:
        try:
            conn = store.connect(path, migrations=[counting])
            outcome.append(user_version(conn))
            conn.close()
        except BaseException as exc:  # reported to the main thread below
            outcome.append(exc)

    thread = threading.Thread(target=opener)
    thread.start()
    time.sleep(1.0)  # the opener reads version 0 (WAL snapshot) and queues on the lock
    schema.MIGRATIONS[0](holder)
    holder.execute("PRAGMA user_version = 1")
    holder.execute("COMMIT")
    thread.join(60)
    holder.close()
    assert outcome == [1]
    assert calls == []


def test_writer_waits_for_the_lock_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = store.connect(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO machines (fingerprint) VALUES ('fp-other')")
    started = time.monotonic()  # before the timer: the wait is >= 1 s however slow the start
    timer = threading.Timer(1.0, lambda: other.execute("COMMIT"))
    timer.start()
    summary = store.ingest(conn, make_run(), some_results())  # blocks until the COMMIT
    waited = time.monotonic() - started
    timer.join()
    other.close()
    assert summary.n_results == 4
    assert waited >= 1.0
    assert count(conn, "machines") == 2
    conn.close()


# --------------------------------------------------------------------------- ingest_dir


def test_ingest_dir_with_torn_last_line(tmp_path: Path, db: sqlite3.Connection) -> None:
    run_dir = tmp_path / "runs" / "run-0001"
    run_dir.mkdir(parents=True)
    run = make_run(finished_at=1_700_000_500.0, status="partial")
    run.write(run_dir / "run.json")
    res = some_results()
    for r in res:
        results_mod.append(run_dir / "results.jsonl", r)
    with open(run_dir / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write(make_result(n=4096).to_json()[:57])  # the writer died mid-line

    summary = store.ingest_dir(db, run_dir)
    assert summary == store.IngestSummary(run_id="run-0001", n_results=4, new_run=True)
    assert store.get_run(db, "run-0001") == run
    assert store.results_for_run(db, "run-0001") == sorted(
        res, key=lambda r: (r.world_size, r.case_id, r.impl)
    )
    snapshot = dump(db)
    assert store.ingest_dir(db, str(run_dir)).new_run is False
    assert dump(db) == snapshot


def test_ingest_dir_without_run_json(tmp_path: Path, db: sqlite3.Connection) -> None:
    (tmp_path / "results.jsonl").write_text(make_result().to_json() + "\n")
    with pytest.raises(StoreError) as info:
        store.ingest_dir(db, tmp_path)
    assert str(tmp_path / "run.json") in str(info.value)
    assert count(db, "runs") == 0


def test_ingest_dir_with_corrupt_middle_line(tmp_path: Path, db: sqlite3.Connection) -> None:
    make_run().write(tmp_path / "run.json")
    lines = [make_result().to_json(), "{garbage", make_result(n=2).to_json()]
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(StoreError, match=r"results.jsonl:2: not a JSON result line"):
        store.ingest_dir(db, tmp_path)
    assert count(db, "runs") == 0 and count(db, "results") == 0


# --------------------------------------------------------------------------- queries


def test_run_ids_history_and_annotations(db: sqlite3.Connection) -> None:
    other_machine = {"fingerprint": "fp-h100", "hostname": "gpu-7"}
    for i, median in enumerate([10_000.0, 11_000.0, 12_000.0]):
        run_id = f"run-{i}"
        store.ingest(
            db, make_run(run_id, started_at=1000.0 + i), [make_result(run_id, median=median)]
        )
    store.ingest(
        db,
        make_run("gpu-run", started_at=5000.0, machine=other_machine),
        [make_result("gpu-run", median=500.0)],
    )

    assert store.run_ids(db) == ["gpu-run", "run-2", "run-1", "run-0"]
    assert store.run_ids(db, machine_fingerprint="fp-cpu-2core") == ["run-2", "run-1", "run-0"]
    assert store.run_ids(db, limit=2) == ["gpu-run", "run-2"]

    case = "allreduce[dtype=f32,n=1031,op=sum]"
    rows = reads.history(db, case, "torch", 4, machine_fingerprint="fp-cpu-2core")
    assert [r["run_id"] for r in rows] == ["run-2", "run-1", "run-0"]
    assert [r["median_ns"] for r in rows] == [12_000.0, 11_000.0, 10_000.0]
    assert rows[0]["run_started_at"] == 1002.0
    assert rows[0]["machine_fingerprint"] == "fp-cpu-2core"
    assert rows[0]["status"] == "pass" and rows[0]["run_status"] == "running"
    assert len(reads.history(db, case, "torch", 4)) == 4
    assert len(reads.history(db, case, "torch", 4, limit=1)) == 1
    assert reads.history(db, case, "torch", 8) == []

    note = reads.add_annotation(
        db, "known slow: gloo on 2 cores", run_id="run-1", case_id=case, author="ana"
    )
    reads.add_annotation(db, "op retuned", case_id=case, kind="change", created_at=1.0)
    assert isinstance(note, int)
    assert [a["text"] for a in reads.annotations(db, run_id="run-1", case_id=case)] == [
        "op retuned",
        "known slow: gloo on 2 cores",
    ]
    assert [a["text"] for a in reads.annotations(db, run_id="run-2")] == ["op retuned"]
    with pytest.raises(StoreError, match="run nope is not in history DB"):
        reads.add_annotation(db, "x", run_id="nope")

    # deleting a run takes its results and annotations with it
    db.execute("DELETE FROM runs WHERE run_id = 'run-1'")
    assert db.execute("SELECT count(*) FROM results WHERE run_id = 'run-1'").fetchone()[0] == 0
    assert [a["text"] for a in reads.annotations(db)] == ["op retuned"]


def test_shared_fingerprint_keeps_each_runs_hostname(db: sqlite3.Connection) -> None:
    a = make_run("a", machine={"fingerprint": "fp-h100x8", "hostname": "node-1"})
    b = make_run("b", started_at=1_700_000_100.0,
                 machine={"fingerprint": "fp-h100x8", "hostname": "node-2"})  # fmt: skip
    store.ingest(db, a, [])
    store.ingest(db, b, [])
    assert count(db, "machines") == 1
    assert store.get_run(db, "a") == a and store.get_run(db, "b") == b


# --------------------------------------------------------------------------- calibrations


def make_calibration(device: str = "cpu", created_at: float = 1_700_000_000.0,
                     copy: float = 9.5) -> dict:
    return {
        "device": device,
        "device_name": "AMD EPYC 9R14" if device == "cpu" else device[5:],
        "copy_gbps": copy,
        "matmul_tflops": {"fp32": 0.05, "bf16": 0.12},
        "created_at": created_at,
        "details": {"copy_bytes": 268435456, "matmul_n": 2048, "repeats": 5, "quick": False},
    }


MACHINE = {"fingerprint": "fp-cpu-2core", "hostname": "ci-runner-3", "cpu_count": 2}


def test_calibration_round_trip(db: sqlite3.Connection) -> None:
    cal = make_calibration()
    cal_id = store.save_calibration(db, MACHINE, cal)
    got = store.latest_calibration(db, "fp-cpu-2core", "cpu")
    assert got == {
        "id": cal_id,
        "machine_fingerprint": "fp-cpu-2core",
        "device": "cpu",
        "device_name": "AMD EPYC 9R14",
        "copy_gbps": 9.5,
        "matmul_tflops": {"fp32": 0.05, "bf16": 0.12},
        "created_at": 1_700_000_000.0,
        "details": {"copy_bytes": 268435456, "matmul_n": 2048, "repeats": 5, "quick": False},
    }
    row = db.execute("SELECT hostname, details FROM machines").fetchone()
    assert row["hostname"] == "ci-runner-3" and '"cpu_count": 2' in row["details"]


def test_latest_calibration_is_newest_of_that_machine_and_device(db: sqlite3.Connection) -> None:
    # stored out of time order: "latest" means measured last, not inserted last
    store.save_calibration(db, MACHINE, make_calibration(created_at=2000.0, copy=20.0))
    store.save_calibration(db, MACHINE, make_calibration(created_at=1000.0, copy=10.0))
    store.save_calibration(db, MACHINE, make_calibration("cuda:NVIDIA H100", 3000.0, 3000.0))
    other = {"fingerprint": "fp-other", "hostname": "x"}
    store.save_calibration(db, other, make_calibration(created_at=9000.0, copy=99.0))

    assert store.latest_calibration(db, "fp-cpu-2core", "cpu")["copy_gbps"] == 20.0
    assert store.latest_calibration(db, "fp-cpu-2core", "cuda:NVIDIA H100")["copy_gbps"] == 3000.0
    assert store.latest_calibration(db, "fp-other", "cpu")["copy_gbps"] == 99.0
    assert store.latest_calibration(db, "fp-other", "cuda:NVIDIA H100") is None
    assert store.latest_calibration(db, "fp-unknown", "cpu") is None
    assert count(db, "calibrations") == 4
    assert count(db, "machines") == 2


def test_save_calibration_is_one_transaction(db: sqlite3.Connection) -> None:
    bad = make_calibration()
    bad["details"] = {"torch": object()}  # not JSON: fails after the machine row was written
    with pytest.raises(TypeError):
        store.save_calibration(db, MACHINE, bad)
    assert count(db, "machines") == 0
    assert count(db, "calibrations") == 0
    with pytest.raises(StoreError, match="no fingerprint"):
        store.save_calibration(db, {"hostname": "x"}, make_calibration())
    with pytest.raises(StoreError, match="names no device"):
        store.save_calibration(db, MACHINE, {**make_calibration(), "device": ""})
    assert count(db, "machines") == 0


# --------------------------------------------------------------------------- paths


def test_resolve_db_path_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HARNESS_DB", raising=False)
    assert store.resolve_db_path(None) == store.DEFAULT_DB == Path("harness-results/history.db")
    env_db = tmp_path / "env.db"
    monkeypatch.setenv("HARNESS_DB", str(env_db))
    assert store.resolve_db_path(None) == env_db
    assert store.resolve_db_path("cli.db") == Path("cli.db")
    monkeypatch.setenv("HARNESS_DB", "")
    assert store.resolve_db_path(None) == store.DEFAULT_DB


def test_previous_comparable_run_is_the_newest_earlier_run_with_a_shared_series(
        tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "history.db")
    t = 1_700_000_000.0
    store.ingest(conn, make_run("a", started_at=t), some_results("a"))
    other = [r for r in some_results("b") if r.impl != "ring"]
    store.ingest(conn, make_run("b", started_at=t + 1), [
        dataclasses.replace(r, case_id="other[n=1]") for r in other])
    store.ingest(conn, make_run("c", started_at=t + 2), some_results("c"))
    assert reads.previous_comparable_run(conn, "c") == "a"  # b ran nothing c ran
    assert reads.previous_comparable_run(conn, "b") == "a"  # nothing shared: the newest
    assert reads.previous_comparable_run(conn, "a") is None  # the machine's first run
    assert reads.previous_comparable_run(conn, "c", search=1) == "b"  # searched too little
    with pytest.raises(StoreError, match="nope is not in history DB"):
        reads.previous_comparable_run(conn, "nope")
    conn.close()


def test_a_db_another_process_keeps_locked_is_unavailable_not_a_mistake(tmp_path, monkeypatch):
    """What the run wrote is sound; the DB just cannot take it now: the run keeps its results
    in its folder and exits 4 with the `harness ingest` that stores them (not 2, which says
    the user's input was wrong)."""
    from harness.history import sql

    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.3)
    db = tmp_path / "h.db"
    store.connect(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sql.Unavailable, match="stayed locked by another process"):
            store.reconnecting(db, lambda conn: store.ingest(conn, make_run(), [make_result()]))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
