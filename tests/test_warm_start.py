"""A run's first job started before the run is planned (harness.engine.warm): which runs start
warm, that the job is let go and finishes the run, that a refused run kills it and leaves no
folder behind, and that a first world size with nothing to run costs nothing but its job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.engine import warm
from harness.engine.options import RunOptions


@pytest.mark.parametrize("launcher,changes,starts", [
    ("/usr/bin/mpiexec", {}, True),
    ("/opt/mpi/bin/mpirun", {}, True),
    (None, {}, False),                                # no launcher: the run says so later
    ("/usr/bin/srun", {}, False),                     # a step inside an allocation
    ("/usr/bin/mpiexec", {"sanitize": True}, False),  # compute-sanitizer comes after the plan
    ("/usr/bin/mpiexec", {"world_sizes": ()}, False),
])
def test_which_runs_start_warm(launcher, changes, starts):
    options = RunOptions.from_mapping({"world_sizes": (1, 4), **changes})
    assert warm.eligible(options, launcher) is starts


def test_a_cancelled_run_removes_only_the_folders_it_made(tmp_path):
    (tmp_path / "db").mkdir()
    run_dir = tmp_path / "db" / "out" / "runs" / "abc"
    made = warm.first_missing(run_dir)
    assert made == (tmp_path / "db" / "out").resolve()
    run_dir.mkdir(parents=True)
    (run_dir / "w1.launch-1.log").write_text("$ mpiexec\n")
    other = tmp_path / "db" / "out" / "runs" / "def"  # another run's, made meanwhile
    other.mkdir()
    warm._remove(run_dir.resolve(), made)
    assert not run_dir.exists() and other.is_dir()
    other.rmdir()
    run_dir.mkdir()
    warm._remove(run_dir.resolve(), made)
    assert not (tmp_path / "db" / "out").exists() and (tmp_path / "db").is_dir()


def _harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "run", *args, "--db",
                           str(cwd / "fresh" / "h.db"), "--no-bench"], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HARNESS_DB": ""})


def _harness_processes(under: Path) -> list[str]:
    """Command lines of running warm ranks of this test's runs (their go file ``under`` its
    folder: other tests' runs may be going on beside it)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if "--harness-wait-for" in cmd and str(under) in cmd:
            found.append(cmd)
    return found


def test_the_warm_job_runs_the_first_world_size_and_is_let_go(tmp_path):
    out = _harness(tmp_path, "hopper_tasks.rmsnorm[*]", "--world-sizes", "4,1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run_dir,) = (tmp_path / "fresh" / "runs").iterdir()
    logs = sorted(p.name for p in run_dir.glob("*.launch-*.log"))
    # the op runs at one rank only: the warm job of 4 was killed and its log removed
    assert logs == ["w1.launch-1.log"], logs
    # the first launch at 1 was not warm (4 was first), so it has no wait; run one that is
    out = _harness(tmp_path, "hopper_tasks.rmsnorm[*]", "--world-sizes", "1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    newest = max((tmp_path / "fresh" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert "--harness-wait-for" in (newest / "w1.launch-1.log").read_text().splitlines()[0]
    assert not list(newest.glob("*.go")) and "6 pass" in out.stdout


def test_a_refused_run_kills_its_warm_job_and_leaves_no_folder(tmp_path):
    out = _harness(tmp_path, "no_such_op", "--world-sizes", "4")
    assert out.returncode == 2 and "matches no" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "fresh").exists()
    # the launcher was waited for; its ranks go as soon as their launcher tells them
    deadline = time.monotonic() + 60
    while _harness_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _harness_processes(tmp_path)


def test_a_cancelled_warm_job_leaves_no_mpi_shared_memory(tmp_path):
    """Its ranks wired up MPI, whose segment in /dev/shm only MPI_Finalize unlinks, and wait
    for a go file that never comes: the kill leaves the segment unless the harness removes
    it (harness.engine.shm_sweep)."""
    from harness.device.envinfo import find_launcher

    job = warm.start(RunOptions.from_mapping({"world_sizes": (2,)}), find_launcher(None),
                     tmp_path / "runs", "cancelled")
    record = job.cfg.files.of(2, "shm.json")
    deadline = time.monotonic() + 120
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    named = json.loads(record.read_text())["shm"]
    assert named and all(Path(p).exists() for p in named)
    job.cancel()
    assert not any(Path(p).exists() for p in named)
    assert not (tmp_path / "runs").exists()


def test_the_warm_job_starts_before_harness_imports_torch(tmp_path):
    """Importing torch takes the harness most of a second: what runs before the warm job
    starts (the CLI, option parsing, the suites' discovery, the spec checks) must not import
    it, or every run waits for it before its ranks even start."""
    code = f"""
import sys
import harness.engine.warm as warm
seen, start = [], warm.start
def watched(*args, **kwargs):
    seen.append("torch" in sys.modules)
    return start(*args, **kwargs)
warm.start = watched
from harness.cli.main import main
try:
    main(["run", "allreduce[*n=1031*op=sum*]", "--world-sizes", "1", "--no-bench",
          "--db", {str(tmp_path / "h.db")!r}])
except SystemExit:
    pass
print("torch imported at the warm start:", seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert "torch imported at the warm start: [False]" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("option", [{"timeout": float("nan")}, {"grace": float("inf")},
                                    {"stall_timeout": 1e300}])
def test_a_limit_that_is_no_number_of_seconds_is_refused_before_any_job_starts(
        tmp_path, monkeypatch, option):
    """Nothing to plan or start for an option a glance refuses: no warm job, no suite."""
    from harness.engine import session

    def started(*args, **kwargs):
        raise AssertionError("a job started for a run that was refused")

    monkeypatch.setattr(warm, "start", started)
    monkeypatch.setattr(session, "plan", started)
    options = RunOptions(db=str(tmp_path / "h.db"), **option)
    with pytest.raises(session.RunRefused, match="must be a number of seconds"):
        session.execute(options, reporter=None)
    assert not (tmp_path / "h.db").exists()
