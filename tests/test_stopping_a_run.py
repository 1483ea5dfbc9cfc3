"""A `harness run` that is stopped takes its MPI job with it.

The launcher runs in a session of its own, so a signal to harness's process group does not
reach the ranks. Before, a SIGTERM (a CI time limit) or SIGKILL to harness left the job
running; on an H200 an orphaned stress-tier job kept the machine busy for the tests after it.
Now SIGTERM stops the job on harness's way out (exit 143) and a killed harness takes it
along (the launcher gets SIGTERM when harness exits: prctl PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")]

SLOW = '''
import time


def slow(world, x, **kw):
    time.sleep(120)
    return x
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGKILL, -9)],
                         ids=["sigterm", "sigkill"])
def test_stopping_harness_stops_its_mpi_job(tmp_path, sig, code):
    impl = tmp_path / "slow_impl.py"
    impl.write_text(SLOW)
    env = {**os.environ, "HARNESS_DB": str(tmp_path / "h.db")}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "allreduce[*n=1*]",
                             "--world-sizes", "2", "--impl", f"{impl}:slow", "--no-bench",
                             "--timeout", "300"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    progress = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and progress is None:
            time.sleep(0.3)
            for path in tmp_path.glob("runs/*/w2.progress.json"):
                try:
                    progress = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    pass
        assert progress, "the slow case never started"
        rank = int(progress["pid"])
        assert _alive(rank)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == code, out[-2000:] + err[-2000:]
        if sig == signal.SIGTERM:
            assert "stopped (SIGTERM)" in err
        gone = time.time() + 30
        while _alive(rank) and time.time() < gone:
            time.sleep(0.2)
        assert not _alive(rank), "the rank outlived harness"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if progress and _alive(int(progress["pid"])):  # a failed test leaves no job behind
            os.kill(int(progress["pid"]), signal.SIGKILL)
        # nor MPI's shared memory: a harness killed outright cannot sweep it (its --resume
        # does, harness.engine.resume), so the test does
        from harness.engine import shm_sweep

        for record in tmp_path.glob("runs/*/w2.shm.json"):
            shm_sweep.sweep(record)
