"""The in-rank watchdog (harness.engine.watchdog), in processes of their own since its expiry
ends the process: a moment before the deadline the rank's stacks go to stderr under a line
naming it, then the job is aborted; between cases it only writes the stacks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.engine.watchdog import ahead

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
        dog.arm("w4:a@mine", 2.0)  # its stacks 1.8 s on: long after the disarm below
        assert dog.disarm()
        time.sleep(2.5)  # past them: a disarm that left them armed shows here
    """)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "went on\n"


@pytest.mark.parametrize("seconds, early", [(60.0, 1.0), (3.0, 0.3), (0.5, 0.05)])
def test_the_stacks_come_a_second_early_or_a_tenth_of_a_short_alarm(seconds, early):
    assert ahead(seconds) == pytest.approx(seconds - early)
