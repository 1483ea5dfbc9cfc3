"""The in-rank watchdog (harness.engine.watchdog), in processes of their own since its expiry
ends the process: a moment before the deadline the rank's stacks go to stderr under a line
naming it, then the job is aborted; between cases it only writes the stacks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.engine.watchdog import StacksBoard, ahead, log_to_append

_SCRIPT = """
import sys, time
from harness.engine.watchdog import Watchdog

def stuck_in_the_kernel():
    time.sleep(30)

dog = Watchdog(abort=lambda code: print(f"abort({{code}})", file=sys.stderr, flush=True),
               who="rank 3")
{body}
print("went on", file=sys.stderr, flush=True)
"""


def _run(body: str) -> subprocess.CompletedProcess:
    script = _SCRIPT.format(body=textwrap.dedent(body))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)


def test_a_deadline_writes_the_ranks_stacks_then_aborts():
    out = _run("""
        dog.arm("w4:allreduce[n=1]@mine", 0.6, stacks_after=0.3)
        stuck_in_the_kernel()
    """)
    assert out.returncode == 124, out.stderr
    err = out.stderr
    header = ("harness: rank 3's stacks, w4:allreduce[n=1]@mine near its deadline (most "
              "recent call last):\n")
    said = "harness watchdog: w4:allreduce[n=1]@mine passed its deadline; aborting the job"
    assert header in err and said in err and "abort(124)" in err, err
    stacks = err[err.index(header):err.index(said)]
    # every thread: the main one where it was stuck, and the watchdog's own
    assert "in stuck_in_the_kernel\n" in stacks, stacks
    assert "Thread MainThread:" in stacks and "Thread harness-watchdog (the watchdog):" in stacks
    assert "went on" not in err


def test_between_cases_it_writes_the_stacks_and_aborts_nothing():
    out = _run("""
        dog.quiet("no case begun since w4:a@mine", 0.5)
        # until the watchdog has taken its alarm (a slow machine's thread may come late);
        # it writes at once after
        give_up = time.monotonic() + 30
        while dog._stacks_at is not None and time.monotonic() < give_up:
            time.sleep(0.05)
        time.sleep(0.5)
    """)
    assert out.returncode == 0, out.stderr
    assert "harness: rank 3's stacks, no case begun since w4:a@mine (most recent call last)" \
        in out.stderr
    assert "aborting" not in out.stderr and "went on" in out.stderr


def test_a_case_done_in_time_writes_nothing():
    out = _run("""
        dog.quiet("never", 0)
        dog.arm("w4:a@mine", 1.0)  # its stacks 0.9 s on: long after the disarm below
        assert dog.disarm()
        time.sleep(1.2)  # past them: a disarm that left them armed shows here
    """)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "went on\n"


@pytest.mark.parametrize("reachable", [True, False], ids=["its-log", "a-log-it-cannot-open"])
def test_the_stacks_and_the_abort_go_straight_into_the_jobs_log(tmp_path, reachable):
    """Not through the MPI launcher's forwarding, which an abort cuts short; where the log
    cannot be opened (a node that does not see it), they stay on stderr."""
    log = tmp_path / ("w4.launch-1.log" if reachable else "gone/w4.launch-1.log")
    if reachable:
        log.write_text("$ mpiexec ...\n")
    out = _run(f"""
        dog = Watchdog(abort=lambda code: print(f"abort({{code}})", file=sys.stderr,
                                                   flush=True), who="rank 3", log={str(log)!r})
        print("said before", file=sys.stderr, flush=True)
        dog.arm("w4:a@mine", 0.6, stacks_after=0.3)
        stuck_in_the_kernel()
    """)
    assert out.returncode == 124, out.stderr
    header = "harness: rank 3's stacks, w4:a@mine near its deadline (most recent call last):"
    said = "harness watchdog: w4:a@mine passed its deadline; aborting the job"
    text = log.read_text() if reachable else out.stderr
    assert header in text and "in stuck_in_the_kernel\n" in text and said in text, text
    assert text.index(header) < text.index(said), text
    if reachable:
        assert text.startswith("$ mpiexec ...\n" + header), text
        assert out.stderr == "said before\nabort(124)\n"


def test_only_a_rank_on_the_launchers_host_appends_to_the_log_itself():
    """Elsewhere the log is seen over a network file system, where O_APPEND is not atomic."""
    assert log_to_append("/runs/r/w4.launch-1.log", "login1", "login1") \
        == "/runs/r/w4.launch-1.log"
    assert log_to_append("/runs/r/w4.launch-1.log", "login1", "node7") is None
    assert log_to_append("/runs/r/w4.launch-1.log", None, "node7") is None  # not told
    assert log_to_append(None, "login1", "login1") is None  # run by hand


@pytest.mark.parametrize("seconds, early", [(60.0, 1.0), (3.0, 0.3), (0.5, 0.05)])
def test_the_stacks_come_a_second_early_or_a_tenth_of_a_short_alarm(seconds, early):
    assert ahead(seconds) == pytest.approx(seconds - early)



_TWO_RANKS = """
import sys, threading, time
from pathlib import Path
from harness.engine import watchdog
from harness.engine.watchdog import StacksBoard, Watchdog

watchdog.STACKS_WAIT_S = {wait}
folder = Path(sys.argv[1])
answers = [folder / "w2.rank0.stacks", folder / "w2.rank1.stacks"]

def board(rank, job="launch-1"):
    return StacksBoard(folder / "w2.stacks-request", answers, rank, job) if {boards} else None

def abort(code):
    print(f"abort({{code}})", file=sys.stderr, flush=True)

rank0_expired = threading.Event()
rank0 = Watchdog(abort=abort, who="rank 0", board=board(0))
{rank1}
rank0.arm("w2:a@mine", 0.5, on_expire=rank0_expired.set, stacks_after=0.1, ask_others=True)
{then}
time.sleep(60)
"""


def _two_ranks(tmp_path, rank1: str, then: str = "", wait: float = 60.0,
               boards: bool = True) -> str:
    script = _TWO_RANKS.format(wait=wait, boards=boards, rank1=rank1, then=then)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 124, out.stderr
    return out.stderr


_ABORTING = "harness watchdog: w2:a@mine passed its deadline; aborting the job"
_RANK1 = 'rank1 = Watchdog(abort=abort, who="rank 1", board=board(1))'
# rank 1 begins the case after rank 0's deadline passed, whatever this machine's speed: its
# own clock would write its stacks 5 s later
_LATE = 'rank0_expired.wait(30); rank1.arm("w2:a@mine", 10.0, stacks_after=5.0)'


def test_a_rank_that_began_late_writes_its_stacks_before_the_abort_when_asked(tmp_path):
    err = _two_ranks(tmp_path, _RANK1, then=_LATE)
    # why the job ends is said first, before the wait for the stacks: a launcher that
    # forwards a rank's last lines late loses those written just before the abort
    said = err.index(_ABORTING + " once every rank's stacks are in (up to 60 s)\n")
    aborted = err.index("abort(124)")
    assert err.index("harness: rank 0's stacks, w2:a@mine near its deadline (most recent") \
        < said < aborted, err
    # asked before its case began or after (its watchdog thread looks twice a second)
    asked = ("harness: rank 1's stacks, rank 0's w2:a@mine near its deadline, asked for "
             "(this rank: ")
    assert err.index(asked) < aborted, err
    assert err[err.index(asked) + len(asked):].startswith(
        ("before its first case, between cases)", "w2:a@mine)")), err


def test_a_rank_that_went_on_to_its_next_case_says_which_when_asked(tmp_path):
    """A rank that failed its part of the case does not wait in it: it is in its next one."""
    err = _two_ranks(tmp_path, _RANK1 + '\nrank1.arm("w2:b@mine", 10.0, stacks_after=5.0)')
    assert err.index("harness: rank 1's stacks, rank 0's w2:a@mine near its deadline, asked "
                     "for (this rank: w2:b@mine)") < err.index("abort(124)"), err


def test_without_the_board_a_late_rank_loses_its_stacks(tmp_path):
    """The control: each rank's own clock alone."""
    err = _two_ranks(tmp_path, _RANK1, then=_LATE, boards=False)
    assert "harness: rank 0's stacks" in err and "harness: rank 1's stacks" not in err, err


def test_a_rank_that_never_answers_is_named_and_waited_for_no_longer(tmp_path):
    # rank 1 holds Python's lock in C code: its watchdog thread never runs. Rank 0 aborts
    # after its wait (a wait without end leaves the process asleep, and it exits 0)
    err = _two_ranks(tmp_path, "", wait=0.5)
    assert ("harness watchdog: no stacks from rank(s) 1 within 0.5 s: stuck in C code that "
            "holds Python's lock?\nabort(124)") in err, err


def test_stacks_already_written_for_the_case_are_not_written_again_when_asked(tmp_path):
    out = _run(f"""
        from pathlib import Path
        from harness.engine.watchdog import StacksBoard
        folder = Path({str(tmp_path)!r})
        answers = [folder / "r0", folder / "r1"]
        dog = Watchdog(abort=lambda code: None, who="rank 1",
                       board=StacksBoard(folder / "req", answers, 1, "launch-1"))
        dog.arm("w2:a@mine", 30.0, stacks_after=0.1)
        asker = StacksBoard(folder / "req", answers, 0, "launch-1")
        give_up = time.monotonic() + 30
        while not dog._dumped and time.monotonic() < give_up:  # its own clock's
            time.sleep(0.05)
        assert asker.wait(asker.ask("w2:a@mine"), 30) == []
        assert dog.disarm()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("harness: rank 1's stacks") == 1, out.stderr


def test_a_request_of_another_job_or_one_answered_is_not_answered(tmp_path):
    answers = [tmp_path / "r0", tmp_path / "r1"]
    old = StacksBoard(tmp_path / "req", answers, 0, "launch-1")
    new = StacksBoard(tmp_path / "req", answers, 1, "launch-2")
    old.ask("w2:a@mine")
    assert new.asked() is None
    rid = StacksBoard(tmp_path / "req", answers, 0, "launch-2").ask("w2:a@mine")
    assert new.asked() == (rid, "rank 0's w2:a@mine")
    new.answer(rid)
    assert new.asked() is None
    assert StacksBoard(tmp_path / "req", answers, 0, "launch-2").missing(rid) == []
