"""End to end: the real `harness` command, real mpiexec ranks, real gloo, a real SQLite file.

Each test launches MPI jobs once per world size and runs all its cases inside them, so the
8-rank jobs stay affordable on a 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.device import shm

HELPERS = Path(__file__).parent / "helpers"
pytestmark = pytest.mark.mpi


def harness(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 900):
    """Run `python -m harness ...` in tmp_path with the test implementations importable."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HELPERS), os.environ.get("PYTHONPATH", "")]), "HARNESS_DB": str(tmp_path / "h.db")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def rows(db: Path, sql: str, *params):
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql, params)]


def planned_items(tmp_path: Path, *args: str) -> list[dict]:
    out = harness(tmp_path, "list", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_world_size_no_power_of_two_shows_a_collective_without_its_odd_rank_step(tmp_path):
    # recursive doubling with no step for the rank left over passes at 1, 4 and 8 (the
    # controls run); at 3 every case fails. The tensor- and expert-parallel cases whose
    # sizes do not split over 3 ranks are skips that say so, not errors
    # With them, a kernel wrong on one rank for unaligned inputs only: the ranks stay in step
    # through the calls after the misaligned one, and the verdict names that call
    out = harness(tmp_path, "run", "allreduce[*n=1031*]", "hopper_tasks.tp_mlp", "moe.layer_ep",
                  "--impl", "torch", "--impl", "doubling_pow2_only", "--world-sizes", "3",
                  "--impl", "harness_test_impls:unaligned_wrong_on_rank_1",
                  "--impl", "harness_test_impls:avg_premultiplied", "--no-bench")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    got = rows(tmp_path / "h.db", "SELECT op, impl, status, reason FROM results")
    by = {}
    for r in got:
        by.setdefault((r["op"], r["impl"]), []).append(r)
    assert {r["status"] for r in by[("allreduce", "doubling_pow2_only")]} == {"fail"}
    assert {r["status"] for r in by[("allreduce", "torch")]} == {"pass"}
    # NCCL's float avg, 1/3 rounded into every term: many ulps of a result whose terms cancel
    assert {r["status"] for r in by[("allreduce", "harness_test_impls:avg_premultiplied")]} \
        == {"pass"}
    unaligned = by[("allreduce", "harness_test_impls:unaligned_wrong_on_rank_1")]
    assert unaligned and all(r["status"] == "fail" and r["reason"].startswith(
        "on inputs off 16-byte alignment") for r in unaligned), unaligned
    for op, why in (("hopper_tasks.tp_mlp", "does not split over 3 ranks"),
                    ("moe.layer_ep", "do not split over 3 ranks")):
        assert by[(op, "torch")] and all(r["status"] == "skip" and why in r["reason"]
                                         for r in by[(op, "torch")]), by[(op, "torch")]


# the strided-copy stress tier on this machine (about 2 GiB of inputs per case, so one job
# per check and no timing): a transposed int8 view of more than 2**31 elements copies right,
# a storage offset beyond 2**31 exposes 32-bit index arithmetic, and a case too big for the
# free memory is skipped with a reason that says so, never silently
def _results(tmp_path):
    return rows(tmp_path / "h.db", "SELECT case_id, impl, status, reason FROM results")


@pytest.mark.heavy
def test_an_int8_view_of_more_than_2_31_elements_copies_right(tmp_path):
    out = harness(tmp_path, "run", "strided_copy[*view=numel_over_2_31*]", "--tier", "stress",
                  "--world-sizes", "1", "--no-bench", "--impl", "torch", timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = {r["case_id"].split("dtype=")[1][:3]: r for r in _results(tmp_path)}
    i8, f32 = got["i8,"], got["f32"]
    if i8["status"] == "skip":
        pytest.skip(f"this machine cannot hold the int8 case: {i8['reason']}")
    assert i8["status"] == "pass", i8
    # the float32 one needs ~43 GiB: it runs where that is free, else it says why not
    assert f32["status"] == "pass" or (f32["status"] == "skip" and "GiB free" in f32["reason"])
    if f32["status"] == "skip":  # and the skip is said, not only stored
        assert "SKIP w1 strided_copy[dtype=f32" in out.stdout and "needs" in out.stdout


@pytest.mark.heavy
def test_32_bit_index_arithmetic_fails_past_2_31(tmp_path):
    # one launch, one 2 GiB storage: torch's copy and its int32 control, and the Triton
    # kernel (interpreted) with its own int32 control
    out = harness(tmp_path, "run", "strided_copy[*view=offset_over_2_31*]", "--tier", "stress",
                  "--world-sizes", "1", "--no-bench", "--impl", "int32_index", "--impl", "torch",
                  "--impl", "triton", "--impl", "triton_int32_index", timeout=1500)
    results = {r["impl"]: r for r in _results(tmp_path)}
    if results["torch"]["status"] == "skip":
        pytest.skip(results["torch"]["reason"])
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert results["torch"]["status"] == "pass"
    assert results["int32_index"]["status"] == "fail"
    if importlib.util.find_spec("triton") is None:
        assert "pip install" in results["triton"]["reason"]
        return
    assert results["triton"]["status"] == "pass", results["triton"]["reason"]
    record = rows(tmp_path / "h.db", "SELECT record FROM results WHERE impl = 'triton'")
    assert json.loads(record[0]["record"])["interpreter"] == "triton"
    assert results["triton_int32_index"]["status"] == "fail"
    assert "not bitwise equal" in results["triton_int32_index"]["reason"]


# wrong reductions at three ranks (two add in one order whichever comes first), each on the
# cases made for its bug: sums in another order per rank (random mode), min and max folded
# into out (its poison must not be their identity), subnormals flushed (special mode), an
# aligned fast path's last vector left unreduced (the one count a vector width divides)
_EDGE_IMPLS = ("harness_test_impls:rank_rotated", "harness_test_impls:folded_into_out",
               "harness_test_impls:flushing_subnormals", "harness_test_impls:product_in_bf16",
               "harness_test_impls:vector_tail_unreduced")


def test_wrong_reductions_fail_the_cases_made_for_them(tmp_path):
    impls = [a for impl in _EDGE_IMPLS for a in ("--impl", impl)]
    out = harness(tmp_path, "run", "allreduce[*mode=random*]", "allreduce[*mode=special*]",
                  "allreduce[*mode=exact*op=prod*]",
                  "--world-sizes", "3", "--no-bench", "--impl", "torch", "--impl", "mpi",
                  "--impl", "tile", *impls, timeout=400)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    got = {(r["impl"].split(":")[-1], r["case_id"]): r for r in _results(tmp_path)}
    builtin = {r["status"] for (impl, _), r in got.items() if impl in ("torch", "mpi", "tile")}
    assert builtin == {"pass"}

    def failed(impl: str) -> dict[str, str]:
        return {c: r["reason"] for (i, c), r in got.items() if i == impl
                and r["status"] == "fail"}

    rotated = failed("rank_rotated")
    f32_random = "allreduce[dtype=f32,inplace=false,mode=random,n=4099,op=sum]"
    assert "hold other bits than rank 0" in rotated[f32_random]
    assert all("mode=random" in c for c in rotated)
    folded = failed("folded_into_out")
    assert set(folded) == {"allreduce[dtype=f32,inplace=false,mode=special,n=1031,op=max]",
                           "allreduce[dtype=bf16,inplace=false,mode=special,n=1031,op=min]"}
    flushed = failed("flushing_subnormals")
    assert {c for c in flushed if "op=max" in c or "op=min" in c} == set(folded)
    # exact products are powers of two: only random factors show a narrow accumulator
    assert set(failed("product_in_bf16")) == {
        "allreduce[dtype=f32,inplace=false,mode=random,n=1031,op=prod]"}
    # the other counts are odd: only the aligned one takes the fast path
    assert set(failed("vector_tail_unreduced")) == {
        "allreduce[dtype=f16,inplace=false,mode=special,n=1024,op=sum]"}


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped by init, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"


def _sleepers() -> list[int]:
    """Processes running with harness_test_impls.SLEEPER in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"harness-test-sleeper" in (entry / "cmdline"
                                                                    ).read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_processes_an_implementation_starts_stay_inside_its_rank(tmp_path):
    """A forked child that returns into the harness ends there (it would run the rank's cases
    as a second rank); a forked sleeper, a daemon in a session of its own and a double fork's
    grandchild are killed when the job ends (they held its output pipes open until the 300 s
    stall limit, and outlived the run); files written by relative path land in the ranks'
    work folder, not over the run's own results. Every result stays right."""
    impls = ("forks_and_returns", "forks_a_sleeper", "detaches_a_daemon", "writes_run_files",
             "double_forks_a_sleeper")
    args = [a for i in impls for a in ("--impl", f"harness_test_impls:{i}")]
    # a job held open waits for the stall limit (300 s), past this test's own timeout
    out = harness(tmp_path, "run", "allreduce[*dtype=f32*mode=exact*op=max*]", "--world-sizes",
                  "2", "--no-bench", "--impl", "torch", *args, timeout=280)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "did not end" not in out.stdout + out.stderr
    got = _results(tmp_path)
    assert {r["impl"].split(":")[-1] for r in got} == {"torch", *impls}
    assert {r["status"] for r in got} == {"pass"}
    assert not _sleepers()
    # the double fork's grandchildren (no exec, no mark): adopted by their rank, killed
    grandchildren = [int(p.read_text()) for p in tmp_path.glob("**/work/harness-test-*.pid")]
    assert grandchildren and not [p for p in grandchildren if _running(p)]
    logs = "".join(p.read_text() for p in tmp_path.glob("**/w2.launch*.log"))
    assert "killed" in logs and "its implementations started and left running" in logs
    assert any(p.name == "results.jsonl" for p in tmp_path.glob("**/work/*"))


# one launch for the faults and a wrong user callable: the hang's and the crash's
# implementations each fail the same case, every other case of theirs must still run (in a
# relaunched job) and pass; the wrong callable fails every case; the deadlock in every case
# costs two deadlines, not one per case; flush-to-zero left on by one rank, a process that exits
# cleanly, a sys.exit and a flood of output each cost one case
_FAULT_SELECTORS = ("allreduce[*op=min*]", "allreduce[*op=max*]")
_FAULT_IMPLS = ("harness_test_impls:raise_on_last_rank", "harness_test_impls:crash_on_rank_one",
                "harness_test_impls:off_by_one", "harness_test_impls:sticky_on_rank_one",
                "harness_test_impls:hang_every_case", "harness_test_impls:flush_on_rank_one",
                "harness_test_impls:exits_zero", "harness_test_impls:calls_sys_exit",
                "harness_test_impls:writes_input_on_rank_one",
                "harness_test_impls:connection_lost_on_rank_zero",
                "harness_test_impls:floods_its_log")
#: the most output a job of the faults run may write (the flood's stops there)
_FAULT_MAX_OUTPUT_MIB = 16
_FAULT_CASE = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=min]"


@pytest.fixture(scope="module")
def faults_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("faults")
    impls = [a for impl in _FAULT_IMPLS for a in ("--impl", impl)]
    # two ranks: the hung (or dead) one and one left waiting on it, each relaunch half the
    # cost of four ranks on two cores. A case here takes well under 0.1 s: 3 s is a deadline
    # a slow machine still meets, and each of the three timeouts costs it
    before = {path for path, _ in shm.leftovers()}
    out = harness(tmp_path, "run", *_FAULT_SELECTORS, "--world-sizes", "2", "--no-bench",
                  "--timeout", "3", "--grace", "20", "--max-output-mib",
                  str(_FAULT_MAX_OUTPUT_MIB), *impls, timeout=400)
    # MPI segments the run's killed jobs left that no process holds (none: the launcher
    # removed them before it returned); one that another test's killed job left for its own
    # launcher to remove is gone within seconds, a leak stays
    left = {path for path, _ in shm.leftovers()} - before
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left &= {path for path, _ in shm.leftovers()}
    results = rows(tmp_path / "h.db", "SELECT case_id, impl, status, reason FROM results "
                                      "ORDER BY started_at")
    planned = planned_items(tmp_path, *_FAULT_SELECTORS, "--world-sizes", "2", *impls)
    return out, results, planned, {"dir": tmp_path, "shm_left": left}


def _fault_statuses(faults_run, impl):
    out, results, planned, _ = faults_run
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    mine = [r for r in results if r["impl"] == impl]
    assert len(mine) == len(planned) // len(_FAULT_IMPLS)  # every case ran, after the fault too
    return {r["case_id"]: r for r in mine}


def test_a_rank_that_raises_leaves_a_timeout_naming_its_error_and_the_run_goes_on(faults_run):
    got = _fault_statuses(faults_run, "harness_test_impls:raise_on_last_rank")
    hung = got.pop(_FAULT_CASE)
    assert hung["status"] == "timeout" and "deadline" in hung["reason"]
    # rank 0 waits in the collective of the call its last rank never makes, and says why
    assert ("(rank 0 in the implementation's call); rank 1 had failed it: implementation "
            "raised ValueError: uneven splits are not supported;") in hung["reason"], hung
    assert {r["status"] for r in got.values()} == {"pass"}
    # rank 1 waits for the case's verdict from rank 0: its stacks are in the log before the
    # abort, written by its own clock or when rank 0 asked, whichever came first. Nothing is
    # read from the order of the last lines: the launcher forwards each rank's on its own time
    text = Path(hung["reason"].split("stacks at the deadline: ")[1]).read_text()
    label = f"w2:{_FAULT_CASE}@harness_test_impls:raise_on_last_rank near its deadline"
    assert (f"harness: rank 1's stacks, {label} (most recent" in text
            or f"harness: rank 1's stacks, rank 0's {label}, asked for" in text), text[-3000:]


def test_a_rank_that_dies_is_recorded_as_crash_and_the_run_goes_on(faults_run):
    got = _fault_statuses(faults_run, "harness_test_impls:crash_on_rank_one")
    assert got.pop(_FAULT_CASE)["status"] == "crash"
    assert got and {r["status"] for r in got.values()} == {"pass"}


def test_a_fault_that_leaves_the_process_unusable_costs_one_case(faults_run):
    """A sticky CUDA error (an illegal address) fails every later call in its process: the
    job ends after the case and the rest run in a new one (without that, every later case of
    the job would error)."""
    got = _fault_statuses(faults_run, "harness_test_impls:sticky_on_rank_one")
    faulted = got.pop(_FAULT_CASE)
    assert faulted["status"] == "error", faulted
    assert "illegal memory access" in faulted["reason"]
    assert "rank(s) 1 unusable" in faulted["reason"] and "ran in a new one" in faulted["reason"]
    assert got and {r["status"] for r in got.values()} == {"pass"}, got


def _costs_its_case_alone(faults_run, impl: str, status: str, *said: str) -> None:
    """The fault case of ``impl`` has ``status`` and a reason saying each of ``said``; every
    other case of it passes (in the job after the one the fault ended)."""
    got = _fault_statuses(faults_run, impl)
    faulted = got.pop(_FAULT_CASE)
    assert faulted["status"] == status and all(s in faulted["reason"] for s in said), faulted
    assert got and {r["status"] for r in got.values()} == {"pass"}, got


def test_broken_torch_distributed_connections_cost_one_case(faults_run):
    """A gloo pair never reconnects: every later case of the job, every implementation's,
    would error on it. The job ends after the case and the rest run in a new one."""
    _costs_its_case_alone(faults_run, "harness_test_impls:connection_lost_on_rank_zero",
                          "error", "left the torch.distributed connections of rank(s) 0 "
                          "unusable", "ran in a new one")


def test_a_case_that_floods_its_log_is_a_crash_and_the_log_is_cut(faults_run):
    """Output past --max-output-mib stops the job in the case that wrote it: a crash saying
    why, the log cut to its first and last 64 KiB, the other cases run in a new job."""
    _costs_its_case_alone(faults_run, "harness_test_impls:floods_its_log", "crash",
                          f"of output to its log during this case, past --max-output-mib "
                          f"{_FAULT_MAX_OUTPUT_MIB} (an implementation printing")
    reason = _fault_statuses(faults_run, "harness_test_impls:floods_its_log")[_FAULT_CASE][
        "reason"]
    wrote = int(re.search(r"ranks wrote (\d+) MiB", reason).group(1))
    assert wrote >= _FAULT_MAX_OUTPUT_MIB, reason
    log = Path(re.search(r"64 KiB: (\S+?\.log)", reason).group(1))
    assert log.stat().st_size < 130 << 10
    text = log.read_text()
    assert text.startswith("$ ") and re.search(r"^harness: \d+ bytes of the ranks' output "
                                               r"cut here$", text, re.M), text[:3000]


def test_jobs_that_were_stopped_or_crashed_leave_no_mpi_shared_memory(faults_run):
    """MPICH unlinks its /dev/shm segment in MPI_Finalize, which a killed job never reaches:
    each would keep 1-8 MiB of memory until reboot (harness.device.shm)."""
    *_, run = faults_run
    logs = "".join(p.read_text(errors="replace") for p in run["dir"].glob("runs/*/*.log"))
    removed = re.findall(r"^harness: removed (\S+) \(", logs, re.M)
    # the timeouts, the crash and the sticky fault each ended a job that left one
    assert len(removed) >= 4, logs[-3000:]
    assert not any(Path(p).exists() for p in removed)
    assert not run["shm_left"], run["shm_left"]


def test_an_implementation_that_deadlocks_in_every_case_is_given_up_after_two(faults_run):
    impl = "harness_test_impls:hang_every_case"
    got = _fault_statuses(faults_run, impl)
    statuses = [r["status"] for r in got.values()]  # in the order they were recorded
    assert len(statuses) > 3 and statuses[:2] == ["timeout", "timeout"], statuses
    first = next(iter(got.values()))["reason"]  # no rank failed: it names none
    said, log = first.split("; every rank's Python stacks at the deadline: ")
    assert said.endswith("deadline (rank 0 in the implementation's call); the job was aborted "
                         "and the remaining cases relaunched"), first
    # each of the two ranks wrote its stacks once a moment before the deadline (on its own
    # clock, or when rank 0 asked), the last one's in the implementation's loop it never
    # leaves; then the watchdog said why it aborted the job
    text = Path(log).read_text()
    for rank in (0, 1):
        assert len(re.findall(rf"^harness: rank {rank}'s stacks, (rank 0's )?w2:", text,
                              re.MULTILINE)) == 1, text[-3000:]
    assert "in hang_every_case" in text
    assert "harness watchdog: " in text and "passed its deadline; aborting the job" in text
    assert set(statuses[2:]) == {"skip"}
    assert {r["reason"] for r in got.values() if r["status"] == "skip"} == {
        f"not run: {impl} timed out in 2 cases of allreduce in a row at world size 2, a likely "
        "deadlock (--give-up-after 0 runs every case)"}


def test_a_check_that_fails_on_one_rank_alone_is_an_error_not_a_hang(faults_run):
    """Rank 1 alone finds its input written: it still makes the shifted call the other rank
    makes (whose collective would otherwise wait for it until the deadline)."""
    got = _fault_statuses(faults_run, "harness_test_impls:writes_input_on_rank_one")
    wrote = got.pop(_FAULT_CASE)
    assert wrote["status"] == "error", wrote
    assert wrote["reason"] == ("rank 1: input 'x' was modified, but this case may not write "
                               "it"), wrote
    assert got and {r["status"] for r in got.values()} == {"pass"}, got


def test_flush_to_zero_left_on_by_one_rank_fails_its_case_and_ends_the_job(faults_run):
    """Threads started while it was on keep it: without a new job, the special cases after it
    flushed their subnormals in every implementation, torch's too."""
    _costs_its_case_alone(faults_run, "harness_test_impls:flush_on_rank_one", "fail",
                          "(rank 1: flush denormals: False -> True); restored",
                          "the job ended after this case")


def test_a_process_that_ends_cleanly_mid_case_is_a_crash_of_that_case_alone(faults_run):
    """Exit code 0 from a job with a case in progress is no normal end of the job."""
    got = _fault_statuses(faults_run, "harness_test_impls:exits_zero")
    ended = got.pop(_FAULT_CASE)
    assert ended["status"] == "crash" and "exit code 0" in ended["reason"], ended
    assert got and {r["status"] for r in got.values()} == {"pass"}, got


def test_sys_exit_in_an_implementation_is_an_error_of_its_case(faults_run):
    got = _fault_statuses(faults_run, "harness_test_impls:calls_sys_exit")
    raised = got.pop(_FAULT_CASE)
    assert raised["status"] == "error" and "raised SystemExit" in raised["reason"], raised
    assert got and {r["status"] for r in got.values()} == {"pass"}, got


def test_a_wrong_user_callable_fails_every_case_with_exit_1(faults_run):
    got = _fault_statuses(faults_run, "harness_test_impls:off_by_one")
    assert got and {r["status"] for r in got.values()} == {"fail"}


@pytest.mark.parametrize("args, code, needle", [
    (["run", "no_such_op"], 2, "selector 'no_such_op' matches no suite, family"),
    (["run", "allreduce", "--impl", "nope"], 2, "unknown implementation 'nope'"),
    (["run", "--impl", "no_such_module:fn"], 2, "cannot import 'no_such_module'"),
    (["run", "--world-sizes", "1,x"], 2, "--world-sizes '1,x'"),
    (["run", "--world-sizes", "0"], 2, "--world-sizes '0'"),
    (["run", "--world-sizes", "99999999999999999999"], 2, "ranks is past the"),
    (["run", "--timeout", "nan"], 2, "--timeout nan must be a number of seconds"),
    (["run", "--timeout", "1e300"], 2, "--timeout 1e+300 must be a number of seconds"),
    (["run", "--grace", "inf"], 2, "--grace inf must be a number of seconds"),
    (["run", "--launcher-args", "'abc"], 2, "cannot be split as a shell would"),
    (["run", "--report", "/dev/null/site"], 2, "cannot make the --report folder"),
    (["run", "--launcher", "/nonexistent/mpiexec"], 4, "no MPI launcher found"),
    (["run", "allreduce", "--tier", "stress"], 2, "none of its ops has cases there"),
    (["run", "--device", "cuda"], 2, "no CUDA device"),
    (["demo", "--slow-night", "--nights", "7"], 2, "--slow-night needs --nights 8 or more"),
    # once exit 4 with ssh's and hydra's lines, read as a broken cluster
    (["run", "--hostfile", "hosts"], 2, "host 'no-such-host.invalid' (line 2) does not resolve"),
    (["run", "--hostfile", "no_hosts"], 2, "names no host: write one `host[:ranks]` per line"),
])
def test_bad_input_is_one_clear_line_and_a_documented_exit_code(tmp_path, args, code, needle):
    (tmp_path / "hosts").write_text("localhost:2\nno-such-host.invalid:2\n")
    (tmp_path / "no_hosts").write_text("# none yet\n\n")
    if args[-1] == "cuda":
        from harness.device import cuda

        if cuda.device_count():
            pytest.skip("a GPU is present")
    out = harness(tmp_path, *args, timeout=120)
    assert out.returncode == code, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "h.db").exists()


@pytest.mark.parametrize("source, impl, needle", [
    ('raise RuntimeError("boom")\n', "mod:f", "importing 'mod' failed (RuntimeError: boom (at "),
    ("def f(:\n", "mod:f", "importing 'mod' failed (SyntaxError"),
    ("import sys\nsys.exit(3)\n", "mod:f", "it called sys.exit(3) while being imported"),
    ("import sys\nsys.exit(3)\n", "mod.py:f", "it called sys.exit(3) while being imported"),
])
def test_a_user_module_that_fails_at_import_is_one_line_and_exit_2(tmp_path, source, impl,
                                                                    needle):
    # once exit 4 with a generic line, or harness ending with the module's own code (3 reads
    # as "regression") and no word
    (tmp_path / "mod.py").write_text(source)
    out = harness(tmp_path, "run", "allreduce", "--world-sizes", "1", "--impl", impl,
                  timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    if "boom" in source:  # where it was raised
        assert f"{tmp_path / 'mod.py'}, line 1)" in lines[0]


@pytest.mark.parametrize("args", [
    ["run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1,op=sum]", "--world-sizes", "1",
     "--out-dir", "/dev/null/runs"],
    ["new-op", "a" * 300],
])
def test_a_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, args):
    # once exit 4, "infrastructure error", with a bare OSError
    out = harness(tmp_path, *args, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "cannot write" in lines[0], out.stderr


@pytest.mark.heavy  # every harness run launches this very command; 10 s of the everyday budget
def test_pytest_by_hand_under_mpiexec(tmp_path):
    """DESIGN.md: `mpiexec -n 4 python -m pytest --pyargs suites -p harness.pytest_plugin -k ...`
    is a valid way to run by hand: from the project's root too, whose pyproject adds `-n auto`
    (every rank would start pytest-xdist workers), into a run folder not made yet."""
    from harness.device.envinfo import find_launcher

    run_dir = tmp_path / "by-hand"
    cmd = [find_launcher(), "-n", "4", sys.executable, "-m", "pytest", "--pyargs", "suites",
           "-p", "harness.pytest_plugin", "-p", "no:cacheprovider", "-k", "allreduce and tile",
           "--harness-set", "bench=false", "--harness-run-dir", str(run_dir),
           "--junitxml", str(tmp_path / "j.xml")]
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    n = len([i for i in planned_items(tmp_path, "allreduce", "--world-sizes", "4")
             if i["impl"] == "tile"])
    assert f"{n} passed" in out.stdout
    assert out.stdout.count("passed") == 1  # rank 0 alone reports
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert len(lines) == n and all(json.loads(ln)["world_size"] == 4 for ln in lines)
    assert (tmp_path / "j.xml").exists()


def test_an_implementation_on_the_default_process_group_runs_first_in_its_job(tmp_path):
    """`dist.all_reduce(t)` without `group=`: the default group exists before the first call,
    not only once an implementation has read world.group (alone, it was an error)."""
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
                  "--world-sizes", "2", "--no-bench", "--impl",
                  "harness_test_impls:default_group_allreduce")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["status"] for r in _results(tmp_path)] == ["pass"]


def test_entry_point_implementations_are_discovered(tmp_path):
    dist = tmp_path / "site" / "extimpl-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extimpl\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[harness.implementations]\nvendor_ar = harness_test_impls:ENTRY\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(HELPERS)])}
    out = harness(tmp_path, "run", "allreduce[*op=sum*]", "--world-sizes", "1", "--no-bench",
                  "--impl", "vendor_ar", env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    impls = rows(tmp_path / "h.db", "SELECT DISTINCT impl FROM results")
    assert impls == [{"impl": "vendor_ar"}]


def test_a_module_beside_the_user_is_importable_in_the_ranks(tmp_path):
    # `python -m harness` imports from where it was started; the ranks run in the run's work
    # folder and once failed every case of `--impl mine:fn` with mine.py in that directory
    (tmp_path / "mine.py").write_text(
        "from suites._collectives.allreduce import allreduce_torch as fn  # noqa: F401\n")
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1,op=sum]",
                  "--world-sizes", "1", "--no-bench", "--impl", "mine:fn", timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert rows(tmp_path / "h.db", "SELECT impl, status FROM results") == [
        {"impl": "mine:fn", "status": "pass"}]


def test_an_implementation_the_ranks_cannot_import_is_one_line_and_exit_2(tmp_path):
    # the launcher imports it; the ranks (another node's environment, here PMI_RANK) do not
    (tmp_path / "here_only.py").write_text(
        "import os\n"
        "if 'PMI_RANK' in os.environ:\n"
        "    raise ImportError('not installed on this node')\n"
        "from suites._collectives.allreduce import allreduce_torch as fn  # noqa: F401\n")
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1,op=sum]",
                  "--world-sizes", "1", "--no-bench", "--impl", "here_only:fn", timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "INTERNALERROR" not in out.stdout + out.stderr
    assert "cannot import 'here_only' (not installed on this node)" in out.stderr


def test_a_pytest_plugin_the_user_has_installed_does_not_reach_the_ranks(tmp_path):
    # a plugin that reorders the items (as pytest-randomly does, with a seed of its own in
    # every process): loaded in the ranks, they would run their cases in different orders and
    # meet in the wrong collectives. The ranks load only the harness's plugin
    site = tmp_path / "site"
    dist = site / "reorder_items-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: reorder-items\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nreorder_items = reorder_items\n")
    (site / "reorder_items.py").write_text(
        "import os, random\n"
        "import pytest\n"
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_collection_modifyitems(items):\n"
        "    random.Random(os.getpid()).shuffle(items)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(HELPERS)])}
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,*]",
                  "--world-sizes", "2", "--no-bench", "--impl", "torch", "--timeout", "10",
                  "--grace", "5", env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    statuses = {r["status"] for r in rows(tmp_path / "h.db", "SELECT status FROM results")}
    assert statuses == {"pass"}


def test_env_reports_without_initialising_cuda(tmp_path):
    out = harness(tmp_path, "env", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("torch", "mpi_library", "launcher", "cuda_devices", "machine", "nccl", "nvrtc"):
        assert key in data
    assert data["torch"].startswith("2.") and "MPICH" in data["mpi_library"]
    check = subprocess.run([sys.executable, "-c", (
        "import sys, harness, harness.cli.main, harness.device.envinfo as e, torch\n"
        "assert 'mpi4py.MPI' not in sys.modules\n"
        "e.environment(e.find_launcher()); e.machine()\n"
        "assert not torch.cuda.is_initialized()\n"
        "import mpi4py.MPI as M; assert not M.Is_initialized()\n")],
        capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    # a machine name with a terminal escape is printed as text, not obeyed
    shown = harness(tmp_path, "env", env={"HARNESS_MACHINE": "box\x1b[31mred"}, timeout=120)
    assert "\x1b" not in shown.stdout and "box\\x1b[31mred" in shown.stdout, shown.stdout


def test_a_launcher_that_runs_nothing_is_an_infrastructure_error_not_a_pass(tmp_path):
    # `false` exits 1 at once, like an MPI that cannot start its ranks: nothing ran, so the
    # run must not pass (found by the nightly pipeline's tests: it used to exit 0)
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
                  "--world-sizes", "1", "--no-bench", "--launcher", shutil.which("false"),
                  timeout=120)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "exited with code 1 and no case ran" in out.stderr
    assert rows(tmp_path / "h.db", "SELECT status FROM runs") == [{"status": "infra_error"}]
    assert rows(tmp_path / "h.db", "SELECT count(*) AS n FROM results") == [{"n": 0}]


def test_ranks_that_find_no_placement_stop_the_run_with_one_line_and_exit_2(tmp_path):
    # a launcher whose ranks refuse their placement (what a CPU-only torch beside bound GPUs,
    # or ranks sharing an exclusive-process GPU, make them do): rank 0's report is the error
    fake = tmp_path / "fake-mpiexec"
    fake.write_text("#!/bin/sh\n"
                    "while [ $# -gt 0 ]; do\n"
                    '  if [ "$1" = --harness-run-dir ]; then\n'
                    "    printf '{\"error\": \"4 GPU(s) visible but torch 2.13.0+cpu is a "
                    "CPU-only build\"}' > \"$2/w1.placement.json\"; fi\n"
                    "  shift\n"
                    "done\n"
                    "exit 4\n")
    fake.chmod(0o755)
    out = harness(tmp_path, "run", "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
                  "--world-sizes", "1", "--no-bench", "--launcher", str(fake), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "world size 1: 4 GPU(s) visible but torch 2.13.0+cpu" in \
        errors[0], out.stderr
    assert "Traceback" not in out.stderr
    assert rows(tmp_path / "h.db", "SELECT status FROM runs") == [{"status": "config_error"}]


def test_env_check_prints_the_bring_up_checklist(tmp_path):
    out = harness(tmp_path, "env", "--check", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr  # no blocker on a CPU machine
    lines = out.stdout.splitlines()
    assert any(ln.startswith("OK      MPI launcher:") for ln in lines), out.stdout
    assert any(ln.split()[0] in ("NOTE", "OK") and "torch" in ln for ln in lines)
    data = json.loads(harness(tmp_path, "env", "--json", timeout=120).stdout)
    assert {c["name"] for c in data["checks"]} >= {"torch", "CUDA driver", "MPI launcher"}
