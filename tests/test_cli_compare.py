"""`harness compare` through the real CLI (subprocess) on real SQLite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.core.results import CaseResult, RunInfo
from harness.device import envinfo
from harness.history import store

T0 = 1_700_000_000.0
MACHINE = "compare-test-box"  # HARNESS_MACHINE: a fingerprint of our choosing
RUN_BASE = "aaaa1111" + "0" * 24
RUN_SAME = "bbbb2222" + "0" * 24
RUN_SLOW = "bbbb3333" + "0" * 24
RUN_OTHER = "cccc4444" + "0" * 24


def draw(seed: int, level: float = 1.0, n: int = 30) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(rng.normal(50_000.0 * level, 1_000.0 * level, n))


def result(run_id: str, n: int, samples: list[float] | None, status: str = "pass",
           reason: str = "") -> CaseResult:
    timing = None if samples is None else {
        "median": float(np.median(samples)), "n": len(samples), "samples": samples}
    return CaseResult(
        run_id=run_id, case_id=f"vendor.scale[n={n}]", op="vendor.scale", family="vendor",
        impl="fast", world_size=1, params={"n": n}, status=status, reason=reason,
        outputs={"out": {"metrics": {"max_abs": 1e-7}, "passed": status == "pass",
                         "tolerance": {"kind": "allclose", "text": "allclose"}}},
        timing=timing, output_hash="h0")


def fingerprint_of(name: str) -> str:
    old = os.environ.get("HARNESS_MACHINE")
    os.environ["HARNESS_MACHINE"] = name
    try:
        return envinfo.machine()["fingerprint"]
    finally:
        if old is None:
            del os.environ["HARNESS_MACHINE"]
        else:
            os.environ["HARNESS_MACHINE"] = old


def add_run(conn, run_id: str, started_at: float, results: list[CaseResult],
            fingerprint: str) -> None:
    info = RunInfo(run_id=run_id, started_at=started_at, tier="smoke", world_sizes=[1],
                   machine={"fingerprint": fingerprint}, env={}, status="complete")
    store.ingest(conn, info, results)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """Base run; a run from the same distribution; a run with case n=2 planted 30% slower and
    case n=3 failing; a newer run of another machine."""
    path = tmp_path_factory.mktemp("compare") / "history.db"
    mine = fingerprint_of(MACHINE)
    conn = store.connect(path)
    try:
        add_run(conn, RUN_BASE, T0, [result(RUN_BASE, 1, draw(1)), result(RUN_BASE, 2, draw(2)),
                                     result(RUN_BASE, 3, draw(3))], mine)
        add_run(conn, RUN_SAME, T0 + 100, [result(RUN_SAME, 1, draw(11)),
                                           result(RUN_SAME, 2, draw(12)),
                                           result(RUN_SAME, 3, draw(13))], mine)
        add_run(conn, RUN_SLOW, T0 + 200, [
            result(RUN_SLOW, 1, draw(21)), result(RUN_SLOW, 2, draw(22, 1.3)),
            result(RUN_SLOW, 3, None, "fail", "7 elements outside tolerance")], mine)
        add_run(conn, RUN_OTHER, T0 + 300, [result(RUN_OTHER, 1, draw(31, 3.0))],
                fingerprint_of("some-other-box"))
    finally:
        conn.close()
    return path


def harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HARNESS_MACHINE": MACHINE, **(env or {})}
    full_env.pop("HARNESS_DB", None)
    return subprocess.run([sys.executable, "-m", "harness", "compare", *args],
                          capture_output=True, text=True, env=full_env, timeout=300)


def test_planted_slowdown_and_a_new_failure_exit_1_the_failure_first(db):
    out = harness(RUN_SAME, RUN_SLOW, "--db", str(db), "--fail-on", "regression")
    assert out.returncode == 1, out.stdout + out.stderr  # correctness first, as `harness run`
    slow_row = next(ln for ln in out.stdout.splitlines() if "vendor.scale[n=2]" in ln)
    assert "slower" in slow_row
    same_row = next(ln for ln in out.stdout.splitlines() if "vendor.scale[n=1]" in ln)
    assert "same" in same_row and "slower" not in same_row
    assert "NEW_FAILURE w1 vendor.scale[n=3]@fast: pass -> fail" in out.stdout
    assert "1 slower" in out.stdout and "1 new failure" in out.stdout
    # without --fail-on the same findings are a report, not a failure
    assert harness(RUN_SAME, RUN_SLOW, "--db", str(db)).returncode == 0


def test_a_planted_slowdown_alone_exits_3(tmp_path):
    path, mine = tmp_path / "history.db", fingerprint_of(MACHINE)
    conn = store.connect(path)
    try:
        add_run(conn, RUN_SAME, T0, [result(RUN_SAME, 2, draw(12))], mine)
        add_run(conn, RUN_SLOW, T0 + 100, [result(RUN_SLOW, 2, draw(22, 1.3))], mine)
    finally:
        conn.close()
    out = harness("--db", str(path), "--fail-on", "regression")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "1 slower" in out.stdout and "0 new failure" in out.stdout


def test_same_distribution_passes(db):
    out = harness(RUN_BASE, RUN_SAME, "--db", str(db), "--fail-on", "regression")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "slower" not in out.stdout.replace("0 slower", "")
    assert "3 same" in out.stdout


def test_json_output_and_prefixes(db):
    out = harness("aaaa", "bbbb3", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["run_a"], data["run_b"]) == (RUN_BASE, RUN_SLOW)
    verdicts = {row["case_id"]: row["verdict"] for row in data["rows"]}
    assert verdicts == {"vendor.scale[n=1]": "same", "vendor.scale[n=2]": "slower",
                        "vendor.scale[n=3]": "pass -> fail"}
    kinds = sorted(f["kind"] for f in data["findings"])
    assert kinds == ["new_failure", "regression"]
    slow = next(r for r in data["rows"] if r["verdict"] == "slower")
    assert 1.2 < slow["ratio"] < 1.4 and slow["p_value"] < 0.01


def test_default_runs_are_the_last_two_of_this_machine(db):
    # the other machine's run is the newest in the DB, and must not be picked
    data = json.loads(harness("--db", str(db), "--json").stdout)
    assert (data["run_a"], data["run_b"]) == (RUN_SAME, RUN_SLOW)
    data = json.loads(harness(RUN_SAME[:6], "--db", str(db), "--json").stdout)
    assert (data["run_a"], data["run_b"]) == (RUN_BASE, RUN_SAME)


@pytest.mark.parametrize("args, words", [
    (("deadbeef", RUN_SAME), ["unknown run id 'deadbeef'"]),
    (("bbbb", RUN_BASE), ["prefix 'bbbb' matches 2 runs", "more characters"]),
    (("aaa", RUN_SAME), ["at least 4 characters"]),
    ((RUN_BASE,), ["first run of machine", "name a second run"]),
    ((RUN_BASE, RUN_BASE), ["same run"]),
])
def test_user_errors_exit_2_with_one_line(db, args, words):
    out = harness(*args, "--db", str(db))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in out.stderr


def test_machine_with_too_few_runs_and_missing_db(db, tmp_path):
    out = harness("--db", str(db), env={"HARNESS_MACHINE": "never-ran-here"})
    assert out.returncode == 2 and "need two" in out.stderr
    missing = tmp_path / "nothing.db"
    out = harness("--db", str(missing))
    assert out.returncode == 2 and "does not exist" in out.stderr
    assert not missing.exists()
