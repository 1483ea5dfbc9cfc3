"""Export and ingest: real SQLite files, the real `harness` CLI, real pytest-benchmark runs and
its real `compare` command and loader (no mocks)."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_benchmark.logger import Logger
from pytest_benchmark.stats import Stats
from pytest_benchmark.storage.file import FileStorage

from harness.core import results as results_mod
from harness.core.results import CaseResult, RunInfo
from harness.history import exchange, store
from harness.history.exchange import ExchangeError

RUN_A = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
RUN_B = "a1b2ffff00000000000000000000beef"
SPREAD = (0.97, 0.99, 1.0, 1.0, 1.01, 1.03, 1.1, 0.98, 1.02)


def make_run(run_id: str = RUN_A, started_at: float = 1_700_000_000.0) -> RunInfo:
    return RunInfo(
        run_id=run_id, started_at=started_at, tier="smoke", world_sizes=[1, 4],
        machine={"fingerprint": "fp-cpu-2core", "hostname": "ci-runner-3", "name": "ci-runner-3",
                 "cpu_model": "AMD EPYC", "cpu_count": 2, "arch": "x86_64", "gpus": []},
        env={"torch": "2.4.0", "python": "3.11.9", "platform": "Linux-6.1-x86_64"},
        finished_at=started_at + 42.5, selectors=["allreduce"], impls=["torch"],
        argv=["run", "allreduce"], git_commit="0123456789abcdef0123456789abcdef01234567",
        status="complete",
    )  # fmt: skip


def make_result(run_id: str, n: int, impl: str, world_size: int, median: float | None,
                status: str = "pass") -> CaseResult:
    timing = None
    if median is not None:
        samples = [median * f for f in SPREAD]
        timing = {"median": statistics.median(samples), "p10": min(samples),
                  "p90": max(samples), "min": min(samples), "mean": statistics.mean(samples),
                  "std": statistics.stdev(samples), "n": len(samples), "samples": samples,
                  "mode": "perf_counter", "l2_flush": False}
    return CaseResult(
        run_id=run_id, case_id=f"allreduce[dtype=f32,n={n},op=sum]", op="allreduce",
        family="collectives", impl=impl, world_size=world_size,
        params={"dtype": "f32", "n": n, "op": "sum"}, status=status,
        reason="" if status == "pass" else "3 elements outside tolerance\nfirst bad index 7",
        outputs={"out": {"passed": status == "pass", "metrics": {"max_abs": math.inf}}},
        wrong=0 if status == "pass" else 3, timing=timing,
        derived={"gbps": n * 4 / median} if median else {}, peak_memory_bytes=4096,
        output_hash="abc123" if status == "pass" else None, started_at=1_700_000_001.0,
        duration_s=0.25, env_id="env-1",
    )  # fmt: skip


def make_results(run_id: str, scale: float = 1.0) -> list[CaseResult]:
    """Five timed passes over two impls and world sizes, plus a failure and a skip untimed."""
    return [
        make_result(run_id, 1031, "torch", 1, 12_500.0 * scale),
        make_result(run_id, 1031, "torch", 4, 40_000.0 * scale),
        make_result(run_id, 65536, "torch", 4, 310_000.0 * scale),
        make_result(run_id, 1031, "ring", 4, 45_000.0 * scale),
        make_result(run_id, 65536, "ring", 1, 200_000.0 * scale),
        make_result(run_id, 65536, "ring", 4, None, status="fail"),
        make_result(run_id, 4096, "torch", 1, None, status="skip"),
    ]


TIMED = 5


def build_db(path: Path, *runs: tuple[RunInfo, list[CaseResult]]) -> Path:
    conn = store.connect(path)
    try:
        for run, results in runs:
            store.ingest(conn, run, results)
    finally:
        conn.close()
    return path


def harness(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def db_rows(db: Path, sql: str, *params: object) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql, params)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_db(tmp_path / "history.db", (make_run(RUN_A), make_results(RUN_A)),
                    (make_run(RUN_B, 1_700_100_000.0), make_results(RUN_B, 1.25)))


# ------------------------------------------------------------------------------- json


def test_json_export_loads_back_to_equal_run_and_results(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json.export"
    proc = harness("export", RUN_A, "--format", "json", "--out", str(out), "--db", str(db),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["format"] == "kernel-harness-run" and doc["schema"] == 1
    [(run, results)] = exchange.load(out)
    assert run.to_dict() == make_run(RUN_A).to_dict()
    expected = sorted(make_results(RUN_A), key=lambda r: (r.world_size, r.case_id, r.impl))
    assert [r.to_dict() for r in results] == [r.to_dict() for r in expected]
    assert math.isinf(results[0].outputs["out"]["metrics"]["max_abs"])  # inf survives JSON


def test_json_export_ingests_into_another_db_unchanged(db: Path, tmp_path: Path) -> None:
    proc = harness("export", RUN_B[:6], "--db", str(db), cwd=tmp_path)  # prefix, to stdout
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "b.json").write_text(proc.stdout)
    other = tmp_path / "other.db"
    proc = harness("ingest", "b.json", "--db", str(other), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"{RUN_B}  7 results  new" in proc.stdout
    conn = store.connect(other)
    try:
        got = [r.to_dict() for r in store.results_for_run(conn, RUN_B)]
        run = store.get_run(conn, RUN_B)
    finally:
        conn.close()
    assert got == [r.to_dict() for r in sorted(
        make_results(RUN_B, 1.25), key=lambda r: (r.world_size, r.case_id, r.impl))]
    assert run is not None and run.to_dict() == make_run(RUN_B, 1_700_100_000.0).to_dict()


# -------------------------------------------------------------------------------- csv


def test_csv_has_one_row_per_result_with_times_in_ns(db: Path, tmp_path: Path) -> None:
    proc = harness("export", RUN_A, "--format", "csv", "--db", str(db), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(rows) == len(make_results(RUN_A))
    assert set(rows[0]) >= {"run_id", "world_size", "case_id", "op", "family", "impl",
                            "status", "wrong", "median_ns", "p10_ns", "p90_ns", "min_ns",
                            "mean_ns", "std_ns", "n", "tflops", "gbps", "busbw_gbps",
                            "peak_memory_bytes", "output_hash", "reason", "params"}
    by_key = {(r["case_id"], r["impl"], int(r["world_size"])): r for r in rows}
    timed = by_key[("allreduce[dtype=f32,n=65536,op=sum]", "torch", 4)]
    samples = [310_000.0 * f for f in SPREAD]
    assert float(timed["median_ns"]) == statistics.median(samples)
    assert float(timed["std_ns"]) == pytest.approx(statistics.stdev(samples))
    assert int(timed["n"]) == len(SPREAD) and timed["tflops"] == ""
    assert json.loads(timed["params"]) == {"dtype": "f32", "n": 65536, "op": "sum"}
    failed = by_key[("allreduce[dtype=f32,n=65536,op=sum]", "ring", 4)]
    assert (failed["status"], failed["wrong"], failed["median_ns"]) == ("fail", "3", "")
    assert failed["reason"] == "3 elements outside tolerance"  # first line only


# ------------------------------------------------------------------- pytest-benchmark


def test_pytest_benchmark_stats_equal_pytest_benchmarks_own(db: Path) -> None:
    run, results = make_run(RUN_A), make_results(RUN_A)
    doc = json.loads(exchange.export_run(run, results, "pytest-benchmark"))
    assert set(doc) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["commit_info"]["id"] == run.git_commit
    assert len(doc["benchmarks"]) == TIMED  # the failure and the skip are left out
    timed = {r.key: r for r in results if r.timing}
    for bench in doc["benchmarks"]:
        r = timed[bench["fullname"]]
        assert bench["group"] == "allreduce"
        assert bench["options"] == {"timer": "perf_counter", "l2_flush": False}
        assert bench["params"]["impl"] == r.impl and bench["params"]["n"] == r.params["n"]
        assert bench["param"] == f"dtype=f32,n={r.params['n']},op=sum"
        oracle = Stats()
        for ns in r.timing["samples"]:
            oracle.update(ns / 1e9)
        expected = oracle.as_dict()
        got = bench["stats"]
        for field in Stats.fields:
            if isinstance(expected[field], float):
                assert got[field] == pytest.approx(expected[field], rel=1e-12), field
            else:
                assert got[field] == expected[field], field
        assert got["data"] == pytest.approx([ns / 1e9 for ns in r.timing["samples"]])
        assert got["iterations"] == 1
    assert len({b["name"] for b in doc["benchmarks"]}) == TIMED


@pytest.mark.parametrize("n", range(1, 13))
def test_pytest_benchmark_stats_match_for_every_quartile_method(n: int) -> None:
    # n % 4 and parity pick different quartile formulas in pytest-benchmark
    data = [((i * 7919) % 13 + 1) * 1e-6 for i in range(n)]
    oracle = Stats()
    for x in data:
        oracle.update(x)
    got = exchange.pb_stats_from_seconds(data)
    assert {k: got[k] for k in Stats.fields} == oracle.as_dict()


def test_pytest_benchmark_loader_and_compare_accept_two_exports(db: Path,
                                                                tmp_path: Path) -> None:
    files = []
    for run_id in (RUN_A, RUN_B):
        out = tmp_path / f"{run_id[:8]}.json"
        proc = harness("export", run_id, "--format", "pytest-benchmark", "--out", str(out),
                       "--db", str(db), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "2 without timing left out" in proc.stdout
        files.append(out)
    names = {b["name"] for b in json.loads(files[0].read_text())["benchmarks"]}

    storage = FileStorage(tmp_path / ".benchmarks", logger=Logger(Logger.QUIET))
    loaded = list(storage.load_benchmarks(*map(str, files)))
    assert len(loaded) == 2 * TIMED and {b["name"] for b in loaded} == names

    work = tmp_path / "compare"
    work.mkdir()  # compare makes ./.benchmarks and reads ./conftest.py: keep it away from ours
    outputs = {}
    for extra in ((), ("--group-by", "param:impl", "--columns", "min,median,rounds"),
                  ("--group-by", "func,param:world_size", "--sort", "name")):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest_benchmark", "--verbose", "compare", *extra,
             *map(str, files)], cwd=work, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "Failed to load" not in proc.stdout + proc.stderr  # it only warns on bad files
        for name in names:
            assert proc.stdout.count(name) == 2, (name, extra)  # once per file
        outputs[extra] = proc.stdout
    assert "benchmark 'allreduce': 10 tests" in outputs[()]
    by_impl = outputs[("--group-by", "param:impl", "--columns", "min,median,rounds")]
    assert "benchmark 'impl=torch': 6 tests" in by_impl
    assert "benchmark 'impl=ring': 4 tests" in by_impl
    by_size = outputs[("--group-by", "func,param:world_size", "--sort", "name")]
    assert "benchmark 'allreduce world_size=4': 6 tests" in by_size


def test_pytest_benchmark_export_loads_back_with_the_same_medians(db: Path,
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "pb.json"
    path.write_text(exchange.export_run(make_run(RUN_A), make_results(RUN_A),
                                        "pytest-benchmark"))
    [(run, results)] = exchange.load(path)
    want = {r.key: statistics.median(r.timing["samples"])
            for r in make_results(RUN_A) if r.timing}
    assert {r.case_id: r.timing["median"] for r in results} == pytest.approx(want, rel=1e-12)
    assert {r.timing["n"] for r in results} == {len(SPREAD)}
    assert run.run_id != RUN_A and run.machine["hostname"] == "ci-runner-3"
    assert run.git_commit == make_run(RUN_A).git_commit


# ------------------------------------------------ a real pytest-benchmark run, ingested

BENCH_TESTS = '''
import pytest

@pytest.mark.parametrize("n", [10, 2000])
def test_sum(benchmark, n):
    benchmark(sum, range(n))

@pytest.mark.benchmark(group="sorting")
def test_sorted(benchmark):
    benchmark.pedantic(sorted, args=(list(range(50, 0, -1)),), rounds=7, iterations=3)
'''


@pytest.fixture(scope="module")
def real_pb_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pytest-benchmark JSON written by pytest-benchmark itself."""
    root = tmp_path_factory.mktemp("pbrun")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_tiny_bench.py").write_text(BENCH_TESTS)
    out = root / "bench.json"
    # pytest-benchmark turns itself off under pytest-xdist, whose worker variables this
    # process has when the suite runs in parallel
    env = {k: v for k, v in os.environ.items()
           if k != "PYTEST_ADDOPTS" and not k.startswith("PYTEST_XDIST")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini",
         "--rootdir", str(root), "test_tiny_bench.py", f"--benchmark-json={out}",
         "--benchmark-max-time=0.02", "--benchmark-min-rounds=5"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_real_pytest_benchmark_json_ingests_with_its_medians(real_pb_json: Path,
                                                             tmp_path: Path) -> None:
    data = json.loads(real_pb_json.read_text())
    h = tmp_path / "h.db"
    proc = harness("ingest", str(real_pb_json), "--db", str(h), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 results  new" in proc.stdout
    rows = {r["case_id"]: r for r in db_rows(h, "SELECT * FROM results")}
    assert set(rows) == {b["fullname"] for b in data["benchmarks"]}
    for bench in data["benchmarks"]:
        row = rows[bench["fullname"]]
        assert row["median_ns"] == pytest.approx(bench["stats"]["median"] * 1e9, rel=1e-12)
        assert row["min_ns"] == pytest.approx(bench["stats"]["min"] * 1e9, rel=1e-12)
        assert row["n_samples"] == bench["stats"]["rounds"]
        assert (row["family"], row["impl"], row["world_size"], row["status"]) == (
            "pytest-benchmark", "pytest-benchmark", 1, "pass")
    assert rows["test_tiny_bench.py::test_sorted"]["op"] == "sorting"
    assert rows["test_tiny_bench.py::test_sum[2000]"]["op"] == "test_sum"
    assert json.loads(rows["test_tiny_bench.py::test_sum[2000]"]["params"]) == {"n": 2000}
    [run] = db_rows(h, "SELECT r.*, m.hostname, m.fingerprint FROM runs r "
                       "JOIN machines m ON m.id = r.machine_id")
    assert run["hostname"] == data["machine_info"]["node"]
    assert run["git_commit"] is None  # tmp dir: pytest-benchmark wrote "unversioned"
    assert run["started_at"] == pytest.approx(
        __import__("datetime").datetime.fromisoformat(data["datetime"]).timestamp())

    again = harness("ingest", str(real_pb_json), "--db", str(h), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"{run['run_id']}  3 results  updated" in again.stdout
    assert len(db_rows(h, "SELECT run_id FROM runs")) == 1
    assert len(db_rows(h, "SELECT id FROM results")) == 3


def test_pytest_benchmark_identity_comes_from_content_and_machine_info(
        real_pb_json: Path, tmp_path: Path) -> None:
    data = json.loads(real_pb_json.read_text())
    reformatted = tmp_path / "same.json"
    reformatted.write_text(json.dumps(data, indent=None))
    [(run1, _)] = exchange.load(real_pb_json)
    [(run2, _)] = exchange.load(reformatted)
    assert (run1.run_id, run1.machine["fingerprint"]) == (run2.run_id,
                                                          run2.machine["fingerprint"])
    other = copy.deepcopy(data)
    other["machine_info"]["node"] = "another-host"
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(other))
    [(run3, _)] = exchange.load(moved)
    assert run3.run_id != run1.run_id
    # a new hostname alone is the same machine (CI containers get a new one every run) ...
    assert run3.machine["fingerprint"] == run1.machine["fingerprint"]
    assert run3.machine["hostname"] == "another-host"
    # ... another CPU is not
    other["machine_info"]["processor"] = "another-cpu"
    moved.write_text(json.dumps(other))
    [(run4, _)] = exchange.load(moved)
    assert run4.machine["fingerprint"] != run1.machine["fingerprint"]


def test_pytest_benchmark_file_without_data_uses_its_stats(real_pb_json: Path,
                                                          tmp_path: Path) -> None:
    data = json.loads(real_pb_json.read_text())
    for bench in data["benchmarks"]:
        del bench["stats"]["data"]  # what --benchmark-json writes with data saving off
    path = tmp_path / "nodata.json"
    path.write_text(json.dumps(data))
    [(run, results)] = exchange.load(path)
    stats = {b["fullname"]: b["stats"] for b in data["benchmarks"]}
    for r in results:
        assert r.timing["samples"] == []
        assert r.timing["n"] == stats[r.case_id]["rounds"]
        assert r.timing["median"] == pytest.approx(stats[r.case_id]["median"] * 1e9)
    # exported again, pytest-benchmark sees the very same statistics
    again = json.loads(exchange.export_run(run, results, "pytest-benchmark"))
    assert {b["fullname"]: b["stats"] for b in again["benchmarks"]} == {
        name: {**s, "data": []} for name, s in stats.items()}


def test_pytest_benchmark_ids_survive_a_trip_through_the_harness(real_pb_json: Path,
                                                                 tmp_path: Path) -> None:
    [(run, results)] = exchange.load(real_pb_json)
    out = tmp_path / "back.json"
    out.write_text(exchange.export_run(run, results, "pytest-benchmark"))
    original = json.loads(real_pb_json.read_text())
    back = json.loads(out.read_text())
    def ids(doc: dict) -> dict:
        return {b["fullname"]: (b["name"], b["param"], b["stats"]["rounds"])
                for b in doc["benchmarks"]}

    def medians(doc: dict) -> dict:
        return {b["fullname"]: b["stats"]["median"] for b in doc["benchmarks"]}

    assert ids(back) == ids(original)
    assert medians(back) == pytest.approx(medians(original))
    assert back["commit_info"] == original["commit_info"]
    [(run2, _)] = exchange.load(out)
    assert run2.machine["fingerprint"] == run.machine["fingerprint"]


# ----------------------------------------------------------------- bad input, exit 2


def test_bad_file_exits_2_with_one_line_and_the_others_are_ingested(
        db: Path, real_pb_json: Path, tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text(exchange.export_run(make_run(RUN_A), make_results(RUN_A), "json"))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json {")
    h = tmp_path / "fresh.db"
    proc = harness("ingest", str(good), str(garbage), str(real_pb_json), "--db", str(h),
                   cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(garbage) in lines[0] and "Traceback" not in proc.stderr
    assert "not a run directory, a run JSON" in lines[0]
    assert "1 file(s) skipped" in proc.stdout
    ids = {r["run_id"] for r in db_rows(h, "SELECT run_id FROM runs")}
    assert RUN_A in ids and len(ids) == 2  # before and after the bad file
    assert len(db_rows(h, "SELECT id FROM results WHERE run_id = ?", RUN_A)) == 7


@pytest.mark.parametrize("content, expected", [
    ('{"hello": "world"}', "is not a run directory, a run JSON"),
    ('[1, 2, 3]', "is not a run directory, a run JSON"),
    ('{"format": "kernel-harness-run", "schema": 99, "run": {}, "results": []}',
     "newer than this harness"),
    ('{"format": "kernel-harness-run", "schema": 1, "run": {"run_id": "x"}, "results": []}',
     "malformed run or result"),
    ('{"machine_info": {}, "datetime": "2024-01-01T00:00:00+00:00", '
     '"benchmarks": [{"name": "t", "stats": {"rounds": 3}}]}',
     "has no usable stats"),
    ('{"machine_info": {}, "benchmarks": [], "datetime": "yesterday"}',
     "is not an ISO 8601 time"),
    ('{"run_id": "x", "machine": {}, "tier": "smoke"}', "is a run.json alone"),
])
def test_unusable_files_are_one_line_errors_naming_them(tmp_path: Path, content: str,
                                                        expected: str) -> None:
    path = tmp_path / "input.json"
    path.write_text(content)
    with pytest.raises(ExchangeError) as err:
        exchange.load(path)
    assert expected in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_run_without_fingerprint_is_refused_before_the_db(tmp_path: Path) -> None:
    run = make_run()
    run.machine = {"hostname": "x"}
    path = tmp_path / "nofp.json"
    path.write_text(exchange.export_run(run, [], "json"))
    with pytest.raises(ExchangeError, match="no machine fingerprint"):
        exchange.load(path)


def test_a_result_line_is_its_dict_as_json_nested_dataclasses_included() -> None:
    from harness.core.compare import Metrics

    results = make_results("r1")
    nested = make_result("r1", 7, "torch", 1, 10.0)
    nested.golden = {"outputs": {"out": {"metrics": Metrics(numel=3, n_nan=1)}}}
    for r in [*results, nested]:
        line = r.to_json()
        assert line == json.dumps(r.to_dict(), sort_keys=True, allow_nan=True)
        assert CaseResult.from_dict(json.loads(line)).to_dict() == json.loads(line)
    assert json.loads(nested.to_json())["golden"]["outputs"]["out"]["metrics"]["n_nan"] == 1
    nested.derived = {"gbps": object()}
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        nested.to_json()


def test_run_directory_ingests_and_keeps_a_torn_last_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / RUN_A
    run_dir.mkdir(parents=True)
    make_run(RUN_A).write(run_dir / "run.json")
    for r in make_results(RUN_A)[:3]:
        results_mod.append(run_dir / "results.jsonl", r)
    with open(run_dir / "results.jsonl", "a") as fh:
        fh.write('{"run_id": "torn')  # the writer died mid-line
    h = tmp_path / "h.db"
    proc = harness("ingest", str(run_dir), str(tmp_path / "runs"), "--db", str(h),
                   cwd=tmp_path)
    assert proc.returncode == 2  # the parent folder is not a run directory
    assert f"{RUN_A}  3 results  new" in proc.stdout
    assert "directory without run.json" in proc.stderr
    assert len(db_rows(h, "SELECT id FROM results")) == 3


def test_export_names_runs_by_id_or_unique_prefix(db: Path, tmp_path: Path) -> None:
    ok = harness("export", RUN_A[:8], "--format", "csv", "--db", str(db), cwd=tmp_path)
    assert ok.returncode == 0 and RUN_A in ok.stdout and RUN_B not in ok.stdout
    for run, expected in ((RUN_A[:4], "matches 2 runs"), ("a1b", "at least 4 characters"),
                          ("ffffffff", "unknown run id 'ffffffff'")):
        proc = harness("export", run, "--db", str(db), cwd=tmp_path)
        assert proc.returncode == 2, (run, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (run, proc.stderr)
    missing = harness("export", RUN_A, "--db", str(tmp_path / "nope.db"), cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "nope.db").exists()  # export never creates an empty DB


# ------------------------------------------- malformed input: one line each, the rest stored


def run_dir_of(root: Path, run_id: str = RUN_A, started_at: float = 1_700_000_000.0) -> Path:
    """A run folder as `harness run` leaves it: run.json and results.jsonl."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    make_run(run_id, started_at).write(run_dir / "run.json")
    for r in make_results(run_id):
        results_mod.append(run_dir / "results.jsonl", r)
    return run_dir


def _set_line(run_dir: Path, lineno: int, text: str) -> None:
    path = run_dir / "results.jsonl"
    lines = path.read_text().splitlines()
    lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _edit_result(run_dir: Path, lineno: int, **fields: object) -> None:
    line = json.loads((run_dir / "results.jsonl").read_text().splitlines()[lineno - 1])
    _set_line(run_dir, lineno, json.dumps({**line, **fields}))


def _edit_run(run_dir: Path, **fields: object) -> None:
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, **fields}))


def _non_utf8(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"ci-runner-3", b"ci-r\xe9nner-3", 1)
                     .replace(b'"torch"', b'"t\xe9rch"', 1))


@pytest.mark.parametrize("damage, file, expected", [
    (lambda d: _set_line(d, 2, "[1, 2]"), "results.jsonl:2", "it is a list ([1, 2]), not a"),
    (lambda d: _non_utf8(d / "run.json"), "run.json", "not UTF-8 text"),
    (lambda d: _non_utf8(d / "results.jsonl"), "results.jsonl:1", "not UTF-8 text"),
    (lambda d: (d / "run.json").write_text("[1, 2]"), "run.json", "it is a list"),
    (lambda d: _edit_result(d, 3, world_size="four"), "results.jsonl:3",
     "field 'world_size' is 'four', not a positive integer"),
    (lambda d: _edit_result(d, 4, timing={"median": "fast"}), "results.jsonl:4",
     "field 'timing.median' is 'fast', not a number"),
    (lambda d: _set_line(d, 5, "[" * 100_000), "results.jsonl:5", "not JSON"),
], ids=["line-a-list", "run.json-not-utf8", "line-not-utf8", "run.json-a-list",
        "world_size-a-string", "median-a-string", "line-nested-too-deep"])
def test_each_malformed_run_folder_is_one_line_and_the_next_is_still_stored(
        tmp_path: Path, damage, file: str, expected: str) -> None:
    bad = run_dir_of(tmp_path / "bad")
    damage(bad)
    good = run_dir_of(tmp_path / "good", RUN_B)
    h = tmp_path / "h.db"
    proc = harness("ingest", "--db", str(h), str(bad), str(good), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{bad / file}: " in lines[0] and expected in lines[0], lines[0]
    assert f"{RUN_B}  7 results  new" in proc.stdout and "1 file(s) skipped" in proc.stdout
    assert [r["run_id"] for r in db_rows(h, "SELECT run_id FROM runs")] == [RUN_B]


@pytest.mark.parametrize("field, value, expected", [
    ("started_at", "yesterday", "'started_at' is 'yesterday', not a Unix time in seconds"),
    ("world_sizes", "abc", "'world_sizes' is 'abc', not a list of positive integers"),
    ("tier", 5, "'tier' is 5, not a string"),
    ("machine", {"fingerprint": ["fp"]}, "'machine.fingerprint' is ['fp'], not a non-empty"),
    ("argv", None, "'argv' is None, not a list of strings"),
])
def test_run_json_fields_of_the_wrong_kind_are_refused_before_the_db(
        tmp_path: Path, field: str, value: object, expected: str) -> None:
    bad = run_dir_of(tmp_path / "runs")
    _edit_run(bad, **{field: value})
    exported = tmp_path / "bad.json"
    doc = json.loads(exchange.export_run(make_run(RUN_B), make_results(RUN_B), "json"))
    doc["run"][field] = value
    exported.write_text(json.dumps(doc))
    h = tmp_path / "h.db"
    for path in (bad, exported):
        proc = harness("ingest", "--db", str(h), str(path), cwd=tmp_path)
        assert proc.returncode == 2, (path, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and expected in lines[0], lines
    assert db_rows(h, "SELECT run_id FROM runs") == []


def test_nulls_the_harness_allows_stay_accepted_and_later_commands_read_them(
        tmp_path: Path) -> None:
    run_dir = run_dir_of(tmp_path / "runs")
    _edit_run(run_dir, finished_at=None, git_commit=None)
    _edit_result(run_dir, 1, peak_memory_bytes=None, output_hash=None, backend=None,
                 golden=None, peak_memory_kind=None)
    _edit_result(run_dir, 2, timing={"median": None, "n": None, "samples": []})
    h = tmp_path / "h.db"
    proc = harness("ingest", "--db", str(h), str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for fmt in ("json", "csv", "pytest-benchmark"):
        out = harness("export", RUN_A, "--format", fmt, "--db", str(h), cwd=tmp_path)
        assert out.returncode == 0, (fmt, out.stderr)


def test_a_run_folder_written_by_harness_run_ingests(tmp_path: Path) -> None:
    runs, first = tmp_path / "runs", tmp_path / "first.db"
    proc = harness("run", "allreduce[dtype=f32,inplace=false,mode=exact,*op=sum]",
                   "--world-sizes", "1", "--no-bench", "--db", str(first), "--out-dir",
                   str(runs), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [run_dir] = [p for p in runs.iterdir() if (p / "run.json").is_file()]
    h = tmp_path / "h.db"
    ingested = harness("ingest", "--db", str(h), str(run_dir), cwd=tmp_path)
    assert ingested.returncode == 0, ingested.stderr
    assert f"{run_dir.name}  " in ingested.stdout and "  new  " in ingested.stdout
    out = harness("export", run_dir.name, "--format", "pytest-benchmark", "--db", str(h),
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------ export: whole or not at all


def test_export_on_a_full_disk_leaves_the_old_file_and_no_temporary(
        db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    from harness.cli.main import main

    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    out = out_dir / "run.json"
    out.write_text("the export of last week\n")
    real_open = Path.open

    class Full:
        """A file on a disk that fills up half-way through the write."""

        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_on_full_disk(self, mode="r", *args, **kwargs):
        fh = real_open(self, mode, *args, **kwargs)
        return Full(fh) if "w" in mode and self.parent == out_dir else fh

    monkeypatch.setattr(Path, "open", open_on_full_disk)
    with pytest.raises(SystemExit) as exc:
        main(["export", RUN_A, "--out", str(out), "--db", str(db)])
    err = capsys.readouterr().err
    assert exc.value.code == 4, err
    assert len(err.strip().splitlines()) == 1 and "full" in err and str(out) in err
    assert out.read_text() == "the export of last week\n"
    assert sorted(p.name for p in out_dir.iterdir()) == ["run.json"]

    monkeypatch.setattr(Path, "open", real_open)
    with pytest.raises(SystemExit) as exc:
        main(["export", RUN_A, "--out", str(out), "--db", str(db)])
    assert exc.value.code == 0
    assert json.loads(out.read_text())["run"]["run_id"] == RUN_A
    assert sorted(p.name for p in out_dir.iterdir()) == ["run.json"]
    new = out_dir / "new.csv"  # a new file gets the mode the umask allows, not mkstemp's 0600
    with pytest.raises(SystemExit) as exc:
        main(["export", RUN_A, "--format", "csv", "--out", str(new), "--db", str(db)])
    assert exc.value.code == 0 and new.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
