"""A job stuck outside any case is stopped (harness.engine.stall): its clock, then the launcher
driving stand-in launchers (shell scripts in place of mpiexec) through each place a job can
be stuck, and one that is slow but never stuck."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import stand_ins

from harness.core.results import CaseResult
from harness.engine.launch import LaunchConfig, RecordedKeys, run_world_size
from harness.engine.options import RunOptions
from harness.engine.stall import StallClock

PLANNED = {"w4:a@torch", "w4:b@torch"}


@pytest.fixture
def alive(tmp_path):
    return tmp_path / "w4.alive"


def test_the_clock_waits_for_the_ranks_to_be_up(alive):
    clock = StallClock(10, alive, PLANNED, started=1000.0)
    # srun still queued: no rank up, however long it takes
    assert clock.poll(set(), None, now=5000.0) is None
    alive.touch()
    up = alive.stat().st_mtime
    assert clock.poll(set(), None, now=up + 5) is None
    stall = clock.poll(set(), None, now=up + 11)
    assert stall is not None and stall.where == "start" and stall.quiet_s == pytest.approx(11)


def test_a_case_in_progress_is_its_deadlines_business_and_each_step_restarts_the_clock(alive):
    alive.touch()
    clock = StallClock(10, alive, PLANNED, started=0.0)
    t = alive.stat().st_mtime
    assert clock.poll(set(), "w4:a@torch", now=t + 1) is None  # a case began
    assert clock.poll(set(), "w4:a@torch", now=t + 500) is None  # in it, however long
    assert clock.poll({"w4:a@torch"}, "w4:a@torch", now=t + 501) is None  # recorded: quiet
    assert clock.poll({"w4:a@torch"}, "w4:a@torch", now=t + 511) is None
    stall = clock.poll({"w4:a@torch"}, "w4:a@torch", now=t + 512)
    assert stall.where == "between" and stall.quiet_s == pytest.approx(11)
    assert clock.poll(PLANNED, "w4:b@torch", now=t + 513) is None  # the next one, recorded
    assert clock.poll(PLANNED, "w4:b@torch", now=t + 524).where == "end"
    assert StallClock(0, alive, PLANNED, started=0.0).poll(set(), None, now=t + 1e6) is None


def test_a_warm_jobs_clock_starts_when_it_is_let_go(alive):
    alive.touch()  # its ranks came up while the run was planned
    go = alive.stat().st_mtime + 100
    clock = StallClock(10, alive, PLANNED, started=go)
    assert clock.poll(set(), None, now=go + 9) is None
    assert clock.poll(set(), None, now=go + 11).where == "start"


# stand-ins for mpiexec, run in the run folder with the ranks' environment
_UP = 'touch "$HARNESS_ALIVE_FILE"\n'
_CASE = """printf '{"key": "%s", "started": %s, "deadline_s": 600, "pid": 1}' "$1" \
  "$(date +%s)" > w4.progress.json
"""
_STUCK_AT_START = "#!/bin/sh\n" + _UP + "exec sleep 60\n"
# (each writes what it records before it says it is up: a slow machine's pause between the
# two would otherwise be quiet time, and the job stopped before it recorded)
_QUEUED_THEN_RUNS = "#!/bin/sh\nsleep 1.2\n" + """
printf '%s\\n' "$FAKE_A" "$FAKE_B" >> results.jsonl
""" + _UP
_STUCK_AT_END = "#!/bin/sh\n" + """
printf '%s\\n' "$FAKE_A" "$FAKE_B" >> results.jsonl
""" + _UP + "exec sleep 60\n"
# the first job records one case and hangs before the next; the second runs the other
_STUCK_BETWEEN = "#!/bin/sh\n" + """
if [ -s results.jsonl ]; then printf '%s\\n' "$FAKE_B" >> results.jsonl; exit 0; fi
printf '%s\\n' "$FAKE_A" >> results.jsonl
""" + _UP + "exec sleep 60\n"
# a case longer than the stall limit: its own deadline (600 s) rules
_SLOW_CASE = "#!/bin/sh\nset -- \"$FAKE_A_KEY\"\n" + _CASE + _UP + """
sleep 1.2
printf '%s\\n' "$FAKE_A" "$FAKE_B" >> results.jsonl
"""


def _world(tmp_path: Path, monkeypatch, script: str, limit: float = 0.6):
    items, launcher = stand_ins.two_items(), stand_ins.launcher(tmp_path, script)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, item in zip("AB", items, strict=True):
        monkeypatch.setenv(f"FAKE_{name}", json.dumps(CaseResult(
            run_id="r", case_id=item.case.id, op="allreduce", family="collectives",
            impl=item.impl, world_size=4, params={}, status="pass").to_dict()))
        monkeypatch.setenv(f"FAKE_{name}_KEY", item.key)
    config = LaunchConfig(launcher=str(launcher), run_dir=run_dir, run_id="r",
                          options=RunOptions(device="cpu", stall_timeout=limit))
    t0 = time.monotonic()
    outcome = run_world_size(config, 4, items)
    return outcome, time.monotonic() - t0, RecordedKeys(config.results_path, 4).update(), items


def test_a_job_stuck_before_its_first_case_is_tried_again_then_is_an_infra_error(
        tmp_path, monkeypatch):
    outcome, took, recorded, _ = _world(tmp_path, monkeypatch, _STUCK_AT_START)
    assert took < 30  # not sleep's 60 s, twice
    assert outcome.launches == 2 and recorded == set()
    said = outcome.infra_error
    assert said.startswith("world size 4: the MPI job was stopped: its ranks started but "
                           "began no case within 0.6 s, 2 jobs in a row (stuck in MPI's "
                           "wire-up, the ranks' imports or their placement; --stall-timeout "
                           "changes the limit); every rank's Python stacks then: "), said
    assert said.endswith(str(outcome.logs[-1]))
    for log in outcome.logs:
        assert log.read_text().splitlines()[-1].startswith("harness: the MPI job was stopped")


@pytest.mark.parametrize("script, launches, said", [
    (_STUCK_AT_END, 1, "it recorded every case but did not end within 0.6 s (stuck ending: "
                       "MPI_Finalize"),
    (_STUCK_BETWEEN, 2, "it recorded a case but began no next one within 0.6 s (stuck "
                        "between two cases"),
], ids=["after-its-last-case", "between-cases"])
def test_a_job_stuck_after_a_case_keeps_its_results_runs_the_rest_and_warns(
        tmp_path, monkeypatch, script, launches, said):
    outcome, took, recorded, items = _world(tmp_path, monkeypatch, script)
    assert took < 30
    assert outcome.infra_error is None and outcome.launches == launches
    assert recorded == {item.key for item in items}
    (note,) = outcome.notes
    assert note.startswith(f"the MPI job was stopped: {said}"), note
    assert note.endswith(f"; every rank's Python stacks then: {outcome.logs[0]}")


@pytest.mark.parametrize("script", [_QUEUED_THEN_RUNS, _SLOW_CASE],
                         ids=["queued-before-its-ranks-start", "a-case-longer-than-the-limit"])
def test_a_job_that_is_slow_but_never_stuck_is_left_alone(tmp_path, monkeypatch, script):
    outcome, took, recorded, items = _world(tmp_path, monkeypatch, script)
    assert took >= 1.2  # past the limit, and let be
    assert outcome.infra_error is None and outcome.launches == 1 and not outcome.notes
    assert recorded == {item.key for item in items}


# a "rank" in a session of its own, which stopping the launcher's process group does not
# reach (as ranks under a proxy stopped with SIGSTOP outlive their mpiexec)
_LEAVES_A_RANK = "#!/bin/sh\nsetsid sleep 60 &\n" + _UP + "exec sleep 60\n"


def test_what_outlives_a_stopped_job_is_found_by_its_mark_and_killed(tmp_path, monkeypatch):
    from harness.engine import strays
    from harness.engine.options import LAUNCH_LOG_ENV

    outcome, took, _, _ = _world(tmp_path, monkeypatch, _LEAVES_A_RANK)
    assert took < 30 and outcome.launches == 2
    for log in outcome.logs:
        assert strays.pids_with(LAUNCH_LOG_ENV, str(log)) == []
        assert "harness: killed 1 process(es) of the job that outlived its launcher" in \
            log.read_text()


# each job records a result the run never planned (as a job whose results vanish does): new
# lines every time, never a case of the run
_RECORDS_ELSEWHERE = ("#!/bin/sh\nprintf '{\"case_id\": \"allreduce[n=%s]\", \"impl\": "
                      "\"torch\", \"world_size\": 4, \"status\": \"pass\"}\\n' \"$$\" "
                      ">> results.jsonl\n" + _UP + "exit 0\n")


def test_jobs_that_never_record_the_runs_cases_stop_at_a_bound(tmp_path, monkeypatch):
    """Each job records a case of the run or counts as fruitless: past (cases + 1) x 2 jobs
    the world size is an infrastructure error, not an endless loop."""
    outcome, took, recorded, items = _world(tmp_path, monkeypatch, _RECORDS_ELSEWHERE)
    assert outcome.launches == (len(items) + 1) * 2 + 1 and took < 60
    assert outcome.infra_error.startswith(
        f"world size 4: {outcome.launches} jobs for 2 cases, 2 never recorded: see ")
