"""`harness run --resume`: a run killed half-way is finished, not started over
(harness/engine/resume.py), with a real SIGKILL of a real `harness run` and its MPI ranks."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.core.results import RunInfo
from harness.engine import resume
from harness.history import store

HELPERS = Path(__file__).parent / "helpers"
# slow enough that the kill lands mid-way, fast enough for the test budget: one world size
# of 2 ranks, so that the killed harness leaves a real MPI job running behind it
SELECTION = ("allreduce[*op=sum*]", "--world-sizes", "2", "--no-bench",
             "--impl", "harness_test_impls:sleepy")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def _env(db: str) -> dict[str, str]:
    return {**os.environ, "HARNESS_DB": db, "HARNESS_TEST_DELAY_S": "0.05",
            "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# the PostgreSQL variant with the heavy tests: the resume is the same, and the everyday suite
# stays inside its 10 minutes
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.heavy)])
def test_a_run_killed_with_sigkill_is_finished_by_resume_once(request, tmp_path, capsys,
                                                              backend):
    db = (str(tmp_path / "h.db") if backend == "sqlite"
          else request.getfixturevalue("postgres_url"))
    runs = store.runs_root(db) if backend == "postgres" else tmp_path / "runs"
    env = _env(db)
    code, planned, _ = cli(capsys, "list", "--json", *SELECTION[:3], *SELECTION[4:])
    planned = json.loads(planned)
    expected = {(p["case_id"], p["impl"], p["world_size"]) for p in planned}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", *SELECTION], cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    results = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / runs).glob("*/results.jsonl"))
        if found and _lines(found[0]) >= 3:  # the job is under way
            results = found[0]
            break
        time.sleep(0.05)
    assert results is not None and proc.poll() is None, "the run ended before it was killed"
    # resumed while it still runs: refused, and its ranks are left alone (they were killed,
    # a passing case recorded as a crash, two processes appending to one file)
    early = subprocess.run([sys.executable, "-m", "harness", "run", "--resume",
                            results.parent.name], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert early.returncode == 2 and "is still running" in early.stderr, early.stderr[-2000:]
    assert f"kill {proc.pid}" in early.stderr and proc.poll() is None
    proc.send_signal(signal.SIGKILL)  # the harness alone: its job's ranks go on without it
    proc.wait()
    killed_at = _lines(results)
    assert killed_at < len(expected)
    run_id = results.parent.name
    # the killed job's MPI shared memory, named by its rank 0 (harness.engine.shm_sweep)
    record = results.parent / "w2.shm.json"
    left = json.loads(record.read_text())["shm"] if record.exists() else []
    # killed before its end: nothing of it is in the DB yet, its directory holds it all
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", run_id[:10]],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"resuming run {run_id}" in out.stderr
    assert not [p for p in left if Path(p).exists()], left
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    keys = collections.Counter((d["case_id"], d["impl"], d["world_size"]) for d in lines)
    assert set(keys) == expected and max(keys.values()) == 1  # nothing lost, nothing twice
    conn = store.connect(db)
    try:
        stored = [tuple(r) for r in conn.execute(
            "SELECT case_id, impl, world_size, status FROM results WHERE run_id = ?",
            (run_id,)).fetchall()]
        in_db = [tuple(r) for r in conn.execute("SELECT run_id, status FROM runs").fetchall()]
        analysed = conn.execute("SELECT analyzed_at FROM runs").fetchone()[0]
    finally:
        conn.close()
    assert {(c, i, w) for c, i, w, _ in stored} == expected and len(stored) == len(expected)
    assert {s for *_, s in stored} == {"pass"} and in_db == [(run_id, "complete")]
    assert analysed is not None  # its findings were computed, once it was whole
    if backend == "sqlite":  # and resumed again, a finished run runs nothing, stays as it was
        again = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", run_id],
                               cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0 and _lines(results) == len(expected), again.stderr[-2000:]


def _run_dir(tmp_path: Path, run_id: str, **changes) -> Path:
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    from harness.device import envinfo

    fields = dict(run_id=run_id, started_at=1.0, tier="smoke", world_sizes=[1],
                  machine=envinfo.machine(), env={}, git_commit=None,
                  options={"selectors": ["allreduce[*n=1031,op=sum*]"], "tier": "smoke",
                           "world_sizes": "1", "impls": ["torch"], "device": "cpu",
                           "bench": False, "golden_dir": None, "use_golden": True,
                           "timing_mode": "events", "l2_flush": False})
    fields.update(changes)
    RunInfo(**fields).write(run_dir / "run.json")
    return run_dir


@pytest.mark.parametrize("args, needle", [
    (("allreduce",), "drop SELECTORS"),
    (("--tier", "nightly", "--world-sizes", "4"), "drop --tier, --world-sizes"),
    (("--impl", "torch"), "drop --impl"),
])
def test_resume_keeps_the_runs_selection(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.setenv("HARNESS_DB", str(tmp_path / "h.db"))
    code, _, err = cli(capsys, "run", "--resume", "abc", *args)
    assert code == 2 and needle in err and "--resume finishes a run" in err


def test_resume_says_which_run_it_cannot_find_or_tell_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_DB", str(tmp_path / "h.db"))
    _run_dir(tmp_path, "abc123")
    _run_dir(tmp_path, "abd456")
    code, _, err = cli(capsys, "run", "--resume", "zzz")
    assert code == 2 and "no run 'zzz' in" in err and "--db (or --out-dir)" in err
    code, _, err = cli(capsys, "run", "--resume", "ab")
    assert code == 2 and "ambiguous" in err and "abc123" in err and "abd456" in err


def test_resume_refuses_another_machine_another_commit_and_an_unrecorded_run(tmp_path):
    from harness.device import envinfo

    here = envinfo.machine()
    elsewhere = _run_dir(tmp_path, "r1", machine={**here, "fingerprint": "f0", "hostname": "n7"})
    info = RunInfo.read(elsewhere / "run.json")
    with pytest.raises(resume.ResumeError, match="started on machine n7 .* resume it there"):
        resume.check_same_machine(info, here)
    resume.check_same_machine(RunInfo.read(_run_dir(tmp_path, "r2") / "run.json"), here)
    older = RunInfo.read(_run_dir(tmp_path, "r3", git_commit="a" * 40) / "run.json")
    with pytest.raises(resume.ResumeError, match="started at commit aaaaaaaaaaaa, this "
                                                 "checkout is at bbbbbbbbbbbb"):
        resume.check_same_commit(older, "b" * 40)
    resume.check_same_commit(older, None)  # not in a git checkout: nothing to compare
    bare = RunInfo.read(_run_dir(tmp_path, "r4", options={}) / "run.json")
    with pytest.raises(resume.ResumeError, match="does not record the options"):
        resume.options_of(bare)


def test_a_corrupt_result_line_is_refused_before_any_case_runs(tmp_path, monkeypatch, capsys):
    # once every missing case ran first, then the run was refused at the store, pointing at an
    # ingest that failed on the same line
    monkeypatch.setenv("HARNESS_DB", str(tmp_path / "h.db"))
    run_dir = _run_dir(tmp_path, "bad123")
    (run_dir / "results.jsonl").write_text('[1, 2]\n{"case_id": "x"}\n')
    code, _, err = cli(capsys, "run", "--resume", "bad123")
    assert code == 2 and "results.jsonl:1" in err and "cannot be stored" in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == ["harness.lock", "results.jsonl",
                                                        "run.json"]


def test_a_half_written_last_line_is_cut_before_more_are_appended(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert resume.cut_torn_line(path) == len(b'{"c": ')
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert resume.cut_torn_line(path) == 0 and resume.cut_torn_line(tmp_path / "none") == 0


def test_leftover_processes_of_a_run_are_stopped_and_no_others(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    mine = subprocess.Popen(sleeper, env={**os.environ, "HARNESS_RUN_ID": "run-x"})
    other = subprocess.Popen(sleeper, env={**os.environ, "HARNESS_RUN_ID": "run-y"})
    try:
        time.sleep(0.2)
        assert resume.stop_leftovers("run-x") == [mine.pid]
        assert mine.wait(timeout=10) == -signal.SIGKILL and other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


_SUITE = '''
import torch
from harness.api import OpSpec, case_tensor


def make_inputs(params, rank, world_size):
    return {"x": case_tensor("mine.double", params, "x", (params["n"],), torch.float32)}


def reference(x):
    return x * 2


SPECS = [OpSpec(name="mine.double", family="mine", reference=reference,
                make_inputs=make_inputs, grid={"smoke": [{"n": 5}, {"n": 7}]},
                implementations={"torch": lambda x: x + x},
                negative_controls={"plus_one": lambda x: x * 2 + 1})]
'''


def test_a_run_of_a_suite_of_ones_own_resumes_with_that_suite(tmp_path):
    """The harness that resumes plans with the run's own suites, as its ranks load them:
    without them a run of a --suite op alone came back as every built-in case."""
    suite = tmp_path / "mine.py"
    suite.write_text(_SUITE)
    run_dir = _run_dir(tmp_path, "feedc0de" * 4, options={
        "selectors": [], "tier": "smoke", "world_sizes": [1], "impls": ["torch"],
        "device": "cpu", "bench": False, "suite_sources": [str(suite)]})
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DB"}
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", "feedc0de",
                          "--db", str(tmp_path / "h.db")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(d["case_id"] for d in lines) == ["mine.double[n=5]", "mine.double[n=7]"]
    assert {d["status"] for d in lines} == {"pass"}


def test_a_run_folder_without_its_run_json_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_DB", str(tmp_path / "h.db"))
    run_dir = _run_dir(tmp_path, "cafe" * 8)
    (run_dir / "run.json").unlink()
    code, _, err = cli(capsys, "run", "--resume", "cafe")
    assert code == 2 and f"run folder {run_dir} has no run.json" in err
    assert "pass the --db" not in err  # the --db was right
