"""The launcher's plain decisions: how ranks wait when they outnumber the CPUs, whether a job
stays on this host, srun's PMI, the ranks' check of their MPI world, and the incremental read
of the results file it polls."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import stand_ins

from harness.core.results import CaseResult, append
from harness.engine.launch import (
    LaunchConfig,
    RecordedKeys,
    _fruitless,
    _JobEnd,
    build_command,
    one_node,
    run_world_size,
)
from harness.engine.options import RunOptions
from harness.engine.rank_env import HEAVY_YIELD, wait_environment
from harness.engine.srun import PMI1_CUT_ADVICE, srun_args


def cfg(tmp_path: Path, **options) -> LaunchConfig:
    return LaunchConfig(launcher=options.pop("launcher", "/venv/bin/mpiexec"), run_dir=tmp_path,
                        run_id="r", options=RunOptions.from_mapping(options))


@pytest.mark.parametrize("world,cpus,expected", [
    (1, 2, {}), (2, 2, {}), (4, 2, {HEAVY_YIELD: "1"}), (8, 2, {HEAVY_YIELD: "1"}),
    (8, 16, {}),
])
def test_ranks_wait_politely_only_where_they_outnumber_the_cpus(world, cpus, expected):
    assert wait_environment(world, cpus, single_node=True) == expected


def test_ranks_on_other_hosts_are_not_judged_by_this_hosts_cpus():
    assert wait_environment(8, 2, single_node=False) == {}


def test_a_job_stays_on_this_host_unless_told_otherwise(tmp_path):
    assert one_node(cfg(tmp_path), {})
    assert one_node(cfg(tmp_path), {"SLURM_JOB_NUM_NODES": "1"})
    assert not one_node(cfg(tmp_path), {"SLURM_JOB_NUM_NODES": "2"})
    assert not one_node(cfg(tmp_path, hostfile="hosts"), {})
    assert not one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {})
    assert one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {"SLURM_JOB_NUM_NODES": "1"})
    assert not one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {"SLURM_NNODES": "2"})
    assert not one_node(cfg(tmp_path, launcher_args=["-hosts", "a,b"]), {})
    assert not one_node(cfg(tmp_path, launcher_args=["--hostfile=h"]), {})
    assert one_node(cfg(tmp_path, launcher_args=["-bind-to", "core"]), {})


def test_srun_serves_the_ranks_pmi2_unless_told_which_mpi(tmp_path):
    assert srun_args([]) == ["--mpi=pmi2"]
    assert srun_args(["--exclusive"]) == ["--mpi=pmi2", "--exclusive"]
    assert srun_args(["--mpi=pmix"]) == ["--mpi=pmix"]
    assert srun_args(["--mpi", "none"]) == ["--mpi", "none"]
    cmd = build_command(cfg(tmp_path, launcher="/usr/bin/srun"), 4, 1)
    assert cmd[:4] == ["/usr/bin/srun", "--mpi=pmi2", "-n", "4"]
    cmd = build_command(cfg(tmp_path, launcher_args=["-bind-to", "core"]), 4, 1)
    assert cmd[:5] == ["/venv/bin/mpiexec", "-bind-to", "core", "-n", "4"]  # mpiexec as given
    assert cmd[cmd.index("--harness-world-size") + 1] == "4"


def test_a_world_size_that_never_wired_up_for_another_reason_names_no_pmi_cut(tmp_path):
    """The PMI cut's advice is for logs with slurmstepd's lines (a job with them is stopped
    at once: test_a_job_whose_pmi_requests_srun_cut_is_stopped_at_once_in_one_line)."""
    log = tmp_path / "w4.launch-2.log"
    log.write_text("$ srun --mpi=pmi2 -n 4 python -m pytest\nsrun: error: task 3: Killed\n")
    assert "1024" not in _fruitless(4, _JobEnd(137, None, None, log), 2, 60.0)


def test_a_rank_whose_mpi_world_is_not_the_job_started_says_why():
    from harness.device.runtime import world_mismatch

    assert world_mismatch(4, 4) is None and world_mismatch(None, 1) is None
    why = world_mismatch(4, 1)
    assert "started 4 processes but this one sees an MPI world of 1" in why
    assert "--mpi=pmi2" in why


def _result(case: str, world: int) -> CaseResult:
    return CaseResult(run_id="r", case_id=case, op="op", family="f", impl="torch",
                      world_size=world, params={}, status="pass")


def test_recorded_keys_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "results.jsonl"
    keys = RecordedKeys(path, 4)
    assert keys.update() == set()  # no file yet
    append(path, _result("a", 4))
    append(path, _result("b", 1))  # another world size
    assert keys.update() == {"w4:a@torch"}
    first_offset = keys.offset
    with open(path, "a") as fh:  # a line still being written
        fh.write(json.dumps(_result("c", 4).to_dict())[:40])
    assert keys.update() == {"w4:a@torch"} and keys.offset == first_offset
    with open(path, "a") as fh:
        fh.write(json.dumps(_result("c", 4).to_dict())[40:] + "\n")
    append(path, _result("d", 4))
    assert keys.update() == {"w4:a@torch", "w4:c@torch", "w4:d@torch"}
    assert keys.offset == path.stat().st_size


def test_recorded_keys_skips_a_torn_line_the_next_launch_wrote_past(tmp_path):
    path = tmp_path / "results.jsonl"
    with open(path, "w") as fh:
        fh.write('{"case_id": "torn", "imp')  # the writer died mid-line
    append(path, _result("e", 8))  # glued to the torn line by the next launch
    append(path, _result("f", 8))
    assert RecordedKeys(path, 8).update() == {"w8:f@torch"}


def test_a_results_file_that_shrinks_under_the_launcher_stops_it_in_one_line(tmp_path):
    """Results appended after a truncation land where the launcher never reads again: an
    implementation that truncated ../results.jsonl in every job made it relaunch forever."""
    from harness.engine.launch import LauncherError

    path = tmp_path / "results.jsonl"
    keys = RecordedKeys(path, 4)
    append(path, _result("a", 4))
    append(path, _result("b", 4))
    assert keys.update() == {"w4:a@torch", "w4:b@torch"}
    with open(path, "r+") as fh:
        fh.truncate(100)
    with pytest.raises(LauncherError, match="shrank from .* to 100 bytes"):
        keys.update()


def test_a_dead_case_is_recorded_on_the_device_its_ranks_ran_on():
    from harness.engine.launch import dead_case_device

    gpu = {"backend": "gloo", "devices": ["cuda:0", "cuda:0", "cuda:0", "cuda:0"]}
    assert dead_case_device(gpu, "cuda") == "cuda:0"  # was "cpu" on the H200
    assert dead_case_device(None, "cuda") == "cuda"  # the job died before its placement
    assert dead_case_device({"devices": []}, "auto") == "cpu"
    assert dead_case_device(None, "cpu") == "cpu"


# srun on a cluster that loses a node: it says so, then waits for the lost node's tasks
# forever; the first case was recorded by then, the second was in progress
_LOSING_SRUN = """#!/bin/sh
printf '%s' "$FAKE_PROGRESS" > w4.progress.json
echo "srun: error: Node failure on n2"
echo "slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED DUE TO NODE FAILURE ***"
exec sleep 60
"""
# srun on the healthy cluster: the remaining case recorded
_HEALTHY_SRUN = """#!/bin/sh
printf '%s\\n' "$FAKE_RESULT" >> results.jsonl
"""


def test_a_node_srun_reports_lost_ends_the_world_size_at_once_in_one_line(tmp_path,
                                                                          monkeypatch):
    import time

    from harness.engine.launch import NodeLost

    first, second = stand_ins.two_items()
    srun = stand_ins.launcher(tmp_path, _LOSING_SRUN, "srun")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = LaunchConfig(launcher=str(srun), run_dir=run_dir, run_id="r",
                          options=RunOptions(device="cpu"))
    append(config.results_path, CaseResult(
        run_id="r", case_id=first.case.id, op="allreduce", family="collectives", impl="torch",
        world_size=4, params={}, status="pass"))
    monkeypatch.setenv("FAKE_PROGRESS", json.dumps({
        "key": second.key, "started": time.time(), "deadline_s": 600, "pid": 1}))
    t0 = time.monotonic()
    with pytest.raises(NodeLost) as lost:
        run_world_size(config, 4, [first, second])
    assert time.monotonic() - t0 < 10  # not the case's deadline: srun would wait forever
    said = str(lost.value)
    assert "\n" not in said
    assert said.startswith(f"world size 4: SLURM lost node n2 during {second.case.id}@mpi")
    assert "1 of 2 case(s) at this size were recorded" in said
    assert "`harness run --resume r`" in said
    # the case in progress is not the case's failure: nothing recorded for it
    assert RecordedKeys(config.results_path, 4).update() == {first.key}
    # the resumed launch numbers its log after the lost one's, which keeps srun's line
    stand_ins.launcher(tmp_path, _HEALTHY_SRUN, "srun")
    monkeypatch.setenv("FAKE_RESULT", json.dumps(CaseResult(
        run_id="r", case_id=second.case.id, op="allreduce", family="collectives", impl="mpi",
        world_size=4, params={}, status="pass").to_dict()))
    outcome = run_world_size(config, 4, [first, second])
    assert outcome.infra_error is None and outcome.logs == [run_dir / "w4.launch-2.log"]
    assert "Node failure on n2" in (run_dir / "w4.launch-1.log").read_text()



_WRITES_BESIDE_ITS_LAUNCHER = """#!/bin/sh
printf 'before, on %s\\n' "$HARNESS_LAUNCH_HOST"
printf 'a rank wrote this into the log itself\\n' >> "$HARNESS_LAUNCH_LOG"
printf 'after: the launcher forwarded this at its own offset\\n'
printf '%s\\n' "$FAKE_RESULT" >> results.jsonl
"""


def test_what_a_rank_writes_into_its_jobs_log_itself_is_kept(tmp_path, monkeypatch):
    """A rank's watchdog writes its stacks and its last words straight into the log (the MPI
    launcher's forwarding lost lines said just before an abort); the launcher's own output
    then lands after them, not over them."""
    first, _ = stand_ins.two_items()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = LaunchConfig(launcher=str(stand_ins.launcher(tmp_path, _WRITES_BESIDE_ITS_LAUNCHER)),
                          run_dir=run_dir, run_id="r", options=RunOptions(device="cpu"))
    monkeypatch.setenv("FAKE_RESULT", json.dumps(CaseResult(
        run_id="r", case_id=first.case.id, op="allreduce", family="collectives", impl="torch",
        world_size=4, params={}, status="pass").to_dict()))
    outcome = run_world_size(config, 4, [first])
    assert outcome.infra_error is None
    lines = outcome.logs[0].read_text().splitlines()
    assert lines[1:] == [f"before, on {socket.gethostname()}",
                         "a rank wrote this into the log itself",
                         "after: the launcher forwarded this at its own offset"], lines



# srun whose pmi2 plugin read a rank's PMI-1 put in part (a business card's line past 1024
# bytes): slurmstepd says so, and the ranks never wire up (one aborts, the others wait)
_CUTTING_SRUN = """#!/bin/sh
echo "slurmstepd-n1: error: mpi/pmi2: value not properly terminated in client request"
echo "slurmstepd-n1: error: mpi/pmi2: request not begin with 'cmd='"
echo "slurmstepd-n1: error: mpi/pmi2: invalid client request"
exec sleep 600
"""


def test_a_job_whose_pmi_requests_srun_cut_is_stopped_at_once_in_one_line(tmp_path):
    """Not left to wait for the stall limit (300 s by default), nor launched again: the next
    job would start in the same environment, whose business cards were cut."""
    import time

    from harness.engine.launch import LauncherError

    first, second = stand_ins.two_items()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = LaunchConfig(launcher=str(stand_ins.launcher(tmp_path, _CUTTING_SRUN, "srun")),
                          run_dir=run_dir, run_id="r",
                          options=RunOptions(device="cpu", stall_timeout=0))
    t0 = time.monotonic()
    with pytest.raises(LauncherError) as stopped:
        run_world_size(config, 4, [first, second])
    assert time.monotonic() - t0 < 300  # the stand-in's sleep: never stopped without the line
    assert sorted(p.name for p in run_dir.glob("w4.launch-*.log")) == ["w4.launch-1.log"]
    said = str(stopped.value)
    assert said == (f"world size 4: the MPI job was stopped as its ranks wired up: "
                    f"{PMI1_CUT_ADVICE}; log: {run_dir / 'w4.launch-1.log'}"), said
    assert "1024 bytes" in said and "--launcher mpiexec" in said and "--mpi=pmix" in said
    assert "\n" not in said and "--launcher mpiexec" in said


@pytest.mark.parametrize("log, rc, said", [
    ("YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n", 9,
     "a rank killed by SIGKILL (the kernel's OOM killer"),
    ("... EXIT STRING: Segmentation fault (signal 11)\n", 139, "a rank killed by SIGSEGV"),
    ("", -9, "the launcher killed by SIGKILL"),
    ("some output\n", 3, "exit code 3"),
])
def test_a_dead_job_is_put_down_to_the_signal_its_launcher_names(tmp_path, log, rc, said):
    from harness.engine.joblog import death

    path = tmp_path / "w2.launch-1.log"
    path.write_text(log)
    assert death(rc, path).startswith(said)


def _items(op: str, impl: str, n: int, world_size: int = 4) -> list:
    from types import SimpleNamespace

    from harness.core.spec import Case, PlannedItem

    spec = SimpleNamespace(name=op, family="f")
    return [PlannedItem(Case(spec, {"n": i}, world_size), impl, lambda: None) for i in range(n)]


def test_an_implementation_is_given_up_after_its_limit_of_timeouts_in_a_row():
    from harness.engine.giveup import JobEndingStreaks

    hung, other_op, other_impl = (_items("allreduce", "mine", 5), _items("broadcast", "mine", 2),
                                  _items("allreduce", "torch", 2))
    streaks = JobEndingStreaks(2)
    assert not streaks.ended_job(hung[0], "timeout")
    streaks.ran([hung[1]])  # a result of its own in between: no deadlock there
    assert not streaks.ended_job(hung[2], "timeout")
    streaks.ran(other_op + other_impl)  # other ops' and implementations' results do not reset it
    assert streaks.ended_job(hung[3], "timeout")
    given_up, why = streaks.abandoned(hung[3], hung[4:] + other_op + other_impl)
    assert given_up == hung[4:]
    assert why == ("not run: mine timed out in 2 cases of allreduce in a row at world size 4, a "
                   "likely deadlock (--give-up-after 0 runs every case)")


@pytest.mark.parametrize("statuses, said", [
    (["crash", "crash", "crash"], "mine crashed its job in 3 cases of allreduce in a row at "
                                  "world size 4 (--give-up-after"),
    (["fault", "fault", "fault"], "mine left its process unusable in 3 cases of allreduce in a "
                                  "row at world size 4 (--give-up-after"),
    (["timeout", "crash", "fault"], "mine ended its job (crash, fault, timeout) in 3 cases of "
                                    "allreduce in a row at world size 4 (--give-up-after"),
])
def test_crashes_and_faults_that_end_their_job_count_as_timeouts_do(statuses, said):
    from harness.engine.giveup import JobEndingStreaks

    items = _items("allreduce", "mine", 4)
    streaks = JobEndingStreaks(3)
    assert [streaks.ended_job(i, s) for i, s in zip(items[:3], statuses, strict=True)] == [
        False, False, True]
    _, why = streaks.abandoned(items[2], items[3:])
    assert why.startswith(f"not run: {said}"), why


def test_an_implementation_that_ends_every_other_job_is_given_up_after_twice_its_limit():
    """A kernel that deadlocks on every large case and passes every small one."""
    from harness.engine.giveup import JobEndingStreaks

    items, other = _items("allreduce", "mine", 9), _items("allreduce", "torch", 4)
    streaks = JobEndingStreaks(2)
    for i in range(3):
        assert not streaks.ended_job(items[2 * i], "timeout")
        streaks.ran([items[2 * i + 1]])
    streaks.ran(other)  # another implementation's cases are not its own
    assert streaks.ended_job(items[6], "timeout")
    given_up, why = streaks.abandoned(items[6], items[7:])
    assert given_up == items[7:]
    assert why == ("not run: mine timed out in 4 of its 7 cases of allreduce so far at world "
                   "size 4, a likely deadlock (--give-up-after 0 runs every case)")


def test_limit_zero_never_gives_up():
    from harness.engine.giveup import JobEndingStreaks

    streaks, items = JobEndingStreaks(0), _items("allreduce", "mine", 20)
    assert not any(streaks.ended_job(item, "crash") for item in items)


def test_job_ending_results_give_up_the_implementation_and_nothing_else(tmp_path):
    """The watchdog's timeouts reach the launcher through the results file, as any result; a
    plain error does not end a job, one its job ended after (``ended_by``) does."""
    from harness.engine.giveup import JobEndingStreaks
    from harness.engine.launch import _give_up

    c = cfg(tmp_path)
    mine, torch_, faulty = (_items("allreduce", "mine", 4), _items("allreduce", "torch", 5),
                            _items("allreduce", "faulty", 4))
    by_key = {item.key: item for item in mine + torch_ + faulty}
    recorded, streaks = RecordedKeys(c.results_path, 4), JobEndingStreaks(2)

    def record(item, status, ended_by=None):
        append(c.results_path, CaseResult(
            run_id="r", case_id=item.case.id, op="allreduce", family="f", impl=item.impl,
            world_size=4, params={}, status=status))
        recorded.update()
        return _give_up(c, streaks, recorded, by_key, None, ended_by)

    def skipped():
        recorded.update()
        return {k for k, status in recorded.drain() if status == "skip"}

    assert not record(mine[0], "timeout") and not record(torch_[0], "pass")
    assert record(mine[1], "crash")
    assert skipped() == {mine[2].key, mine[3].key}
    assert not record(torch_[1], "timeout") and not record(torch_[2], "fail")
    assert not record(torch_[3], "crash")  # a result between them: no streak
    assert not record(torch_[4], "error")  # an error its job went on after ends nothing
    assert not record(faulty[0], "error", ended_by=faulty[0].key)
    assert record(faulty[1], "error", ended_by=faulty[1].key)
    assert skipped() == {faulty[2].key, faulty[3].key}


def test_a_timeout_names_the_ranks_that_failed_its_case_and_no_others(tmp_path):
    from harness.engine.options import RunDir

    files = RunDir(tmp_path)
    files.note_failure(4, 3, "w4:a@mine", "implementation raised ValueError: odd\nTraceback")
    files.note_failure(4, 1, "w4:a@mine", "implementation raised KeyError: 'x'")
    files.note_failure(4, 2, "w4:b@mine", "an earlier case's failure")
    files.note_failure(8, 0, "w4:a@mine", "another world size")
    assert files.failed_first(4, "w4:a@mine") == (
        "; rank 1 had failed it: implementation raised KeyError: 'x'"
        "; rank 3 had failed it: implementation raised ValueError: odd")
    assert files.failed_first(4, "w4:c@mine") == ""


# a stand-in for mpiexec whose implementation ends its job in every case: it runs the first
# case not yet recorded (the launcher's skip file) and crashes in it, or records its error
# and exits as a rank whose process a fault left unusable does
_ENDS_EVERY_JOB = """#!{python}
import json, os, sys, time
skip = set(open("w4.skip").read().split()) if os.path.exists("w4.skip") else set()
key, result = next((k, r) for k, r in json.loads(os.environ["FAKE_ITEMS"]) if k not in skip)
if os.environ["FAKE_MODE"] == "crash":
    with open("w4.progress.json", "w") as fh:
        json.dump({{"key": key, "started": time.time(), "deadline_s": 600, "pid": 1}}, fh)
    sys.exit(13)
with open("results.jsonl", "a") as fh:
    fh.write(json.dumps(result) + "\\n")
sys.exit(86)
"""


@pytest.mark.parametrize("mode, status, said", [
    ("crash", "crash", "crashed its job in 2 cases"),
    ("fault", "error", "left its process unusable in 2 cases"),
    ("fault-fail", "fail", "left its process unusable in 2 cases"),  # a setting leaked (FTZ)
])
def test_an_implementation_that_ends_every_job_costs_two_jobs(tmp_path, monkeypatch, mode,
                                                               status, said):
    import sys


    items = _items("allreduce", "faulty", 5)
    monkeypatch.setenv("FAKE_MODE", mode)
    monkeypatch.setenv("FAKE_ITEMS", json.dumps([[i.key, CaseResult(
        run_id="r", case_id=i.case.id, op="allreduce", family="f", impl=i.impl, world_size=4,
        params={}, status=status, reason="the job ended after this case").to_dict()]
        for i in items]))
    launcher = stand_ins.launcher(tmp_path, _ENDS_EVERY_JOB.format(python=sys.executable))
    config = cfg(tmp_path, device="cpu", launcher=str(launcher))
    outcome = run_world_size(config, 4, items)
    assert outcome.launches == 2 and outcome.infra_error is None
    lines = [json.loads(line) for line in config.results_path.read_text().splitlines()]
    assert [d["status"] for d in lines] == [status, status, "skip", "skip", "skip"]
    assert {d["reason"] for d in lines[2:]} == {
        f"not run: faulty {said} of allreduce in a row at world size 4 (--give-up-after 0 runs "
        "every case)"}


def test_a_host_file_is_read_as_mpich_and_open_mpi_write_it(tmp_path):
    from harness.engine import hostfile

    text = ("# the cluster\nnode1:4\n\nnode2 slots=8 max_slots=8\n  node3  # spare\n"
            "[fe80::1]:2\nfe80::2\n")
    assert hostfile.hosts(text) == [(2, "node1"), (4, "node2"), (5, "node3"), (6, "fe80::1"),
                                    (7, "fe80::2")]
    good = tmp_path / "good"
    good.write_text("localhost:2\n127.0.0.1 slots=2\n")
    assert hostfile.problem(str(good)) is None
    bad = tmp_path / "bad"
    bad.write_text("localhost:2\nnode-that-is-not.invalid:2\n")
    assert "'node-that-is-not.invalid' (line 2) does not resolve" in hostfile.problem(str(bad))


def test_a_job_log_past_100_mib_is_named(tmp_path):
    """A log an implementation filled (under --max-output-mib) is said after its world size
    (a sparse file: its size is what counts)."""
    from harness.engine.joblog import BIG_LOG_BYTES, big_logs

    small, big = tmp_path / "w1.launch-1.log", tmp_path / "w1.launch-2.log"
    small.write_text("$ mpiexec -n 1 python -m pytest\n")
    with open(big, "wb") as fh:
        fh.truncate(BIG_LOG_BYTES + (5 << 20))
    notes = big_logs([small, big, tmp_path / "gone.log"])
    assert notes == [f"the job's log {big} holds 105 MiB of its ranks' output (an "
                     "implementation printing in every call?): mind the run folder's disk"]


# a stand-in for mpiexec killed from outside in its first case (a user's kill -9, a
# reaper's): it writes its progress there and SIGKILLs itself; with FAKE_KILLS=2 it does
# so in its first two jobs, else it records every case that is left
_KILLED_FROM_OUTSIDE = """#!{python}
import json, os, signal, sys, time
skip = set(open("w4.skip").read().split()) if os.path.exists("w4.skip") else set()
items = [(k, r) for k, r in json.loads(os.environ["FAKE_ITEMS"]) if k not in skip]
jobs = len([name for name in os.listdir(".") if name.startswith("w4.launch-")])
if jobs <= int(os.environ["FAKE_KILLS"]):
    with open("w4.progress.json", "w") as fh:
        json.dump({{"key": items[0][0], "started": time.time(), "deadline_s": 600, "pid": 1}}, fh)
    os.kill(os.getpid(), signal.SIGKILL)
with open("results.jsonl", "a") as fh:
    fh.writelines(json.dumps(r) + "\\n" for k, r in items)
"""


@pytest.mark.parametrize("kills", [1, 2])
def test_a_launcher_killed_from_outside_costs_its_case_nothing_once(tmp_path, monkeypatch,
                                                                     kills):
    """The launcher alone killed by a signal is no rank's death: the case in progress runs
    again in a new job, with a note; killed in the same case again, the case is charged."""
    import sys


    items = _items("allreduce", "torch", 3)
    monkeypatch.setenv("FAKE_KILLS", str(kills))
    monkeypatch.setenv("FAKE_ITEMS", json.dumps([[i.key, CaseResult(
        run_id="r", case_id=i.case.id, op="allreduce", family="f", impl=i.impl, world_size=4,
        params={}, status="pass").to_dict()] for i in items]))
    launcher = stand_ins.launcher(tmp_path, _KILLED_FROM_OUTSIDE.format(python=sys.executable))
    config = cfg(tmp_path, device="cpu", launcher=str(launcher))
    outcome = run_world_size(config, 4, items)
    lines = [json.loads(line) for line in config.results_path.read_text().splitlines()]
    first = f"{items[0].case.id}@torch"
    assert outcome.infra_error is None and outcome.launches == kills + 1
    assert outcome.notes == [
        f"the launcher was killed by SIGKILL from outside the job during "
        f"{first}; the case ran again in a new job (log: {outcome.logs[0]})"]
    if kills == 1:
        assert [d["status"] for d in lines] == ["pass"] * 3
    else:
        assert [d["status"] for d in lines] == ["crash", "pass", "pass"]
        assert lines[0]["case_id"] == items[0].case.id
        assert "the launcher killed by SIGKILL" in lines[0]["reason"]
        assert "a second time in this case (it ran again after the first)" in lines[0]["reason"]


def test_a_flooded_log_is_cut_to_its_start_and_end_and_read_a_piece_at_a_time(tmp_path):
    from harness.engine import joblog

    log = tmp_path / "w2.launch-1.log"
    head, end = b"$ mpiexec -n 2 python -m pytest\n", b"srun: error: Node failure on n2\n"
    body = b"x" * (joblog.READ_BYTES + 10)  # one line longer than a read: skipped, not stuck
    log.write_bytes(head + body + b"\n" + end)
    assert joblog.flooded(log, 0) is None and joblog.flooded(log, 1024) is None
    assert joblog.flooded(log, 4) == log.stat().st_size
    slurm = joblog.SlurmLines(log)
    for _ in range(3):
        slurm.update()
    assert slurm.nodes == ["n2"] and not slurm.pmi_cut
    both = joblog.start_and_end(log, 100)
    assert both.startswith(head.decode()) and both.endswith(end.decode()) and len(both) == 200
    assert joblog.tail(log, 1) == end.decode().strip()
    joblog.cut(log, keep=1000)
    text = log.read_text()
    gone = len(head + body + end) + 1 - 2000
    assert text.startswith(head.decode()) and text.endswith(end.decode())
    assert f"\nharness: {gone} bytes of the ranks' output cut here\n" in text
    assert len(text) < 2100
    joblog.cut(log, keep=len(text) // 2)  # short enough already: left as it is
    assert log.read_text() == text


def test_a_job_that_floods_its_log_outside_any_case_is_named(tmp_path):
    log = tmp_path / "w1.launch-2.log"
    log.write_text("$ mpiexec -n 1 python -m pytest\nxxxx\n")
    why = _fruitless(1, _JobEnd(-15, {"flood": 20 << 20}, None, log), 2, 60.0, 16)
    assert why.startswith("world size 1: 2 job(s) in a row ran no case; the last: the job was "
                          "stopped: its ranks wrote 20 MiB of output to its log outside any "
                          "case, past --max-output-mib 16"), why
