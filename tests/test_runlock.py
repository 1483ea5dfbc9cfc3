"""The run directory's lock: a live run is never resumed under it, by flock or, where the file
system keeps no locks, by the holder the lock file names."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import sys

import pytest

from harness.engine import runlock

HOLD = ("import sys, time\nfrom harness.engine import runlock\nrunlock.hold(sys.argv[1])\n"
        "print('held', flush=True)\ntime.sleep(120)\n")


@pytest.fixture
def holder(tmp_path):
    """A live process of this host holding ``tmp_path``'s lock."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _no_locks(monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", flock)


def test_a_live_holder_is_refused_by_flock(tmp_path, holder):
    with pytest.raises(runlock.RunBusy) as info:
        runlock.hold(tmp_path)
    assert info.value.pid == holder.pid


def test_without_locks_a_live_holder_of_this_host_is_refused_all_the_same(
        tmp_path, holder, monkeypatch):
    _no_locks(monkeypatch)  # an NFS mount with nolock: every flock fails
    with pytest.raises(runlock.RunBusy) as info:
        runlock.hold(tmp_path)
    assert info.value.pid == holder.pid
    holder.kill()
    holder.wait()
    try:  # its holder gone (killed: nothing cleared the file), the lock is this process's
        runlock.hold(tmp_path)
        assert (tmp_path / runlock.LOCK_NAME).read_text() == runlock.identity(os.getpid())
    finally:
        runlock.release(tmp_path)
    assert (tmp_path / runlock.LOCK_NAME).read_text() == ""  # ended: no holder named


def test_a_flock_taken_while_a_named_holder_lives_is_refused(tmp_path, holder):
    # the lock file replaced under a live run (its flock is on the old file): the name counts
    (tmp_path / runlock.LOCK_NAME).unlink()
    (tmp_path / runlock.LOCK_NAME).write_text(runlock.identity(holder.pid))
    with pytest.raises(runlock.RunBusy):
        runlock.hold(tmp_path)


@pytest.mark.parametrize("forged", ["pid reused", "other host", "other boot", "old format"])
def test_a_name_that_is_not_a_live_process_of_this_host_holds_nothing(tmp_path, monkeypatch,
                                                                      forged):
    _no_locks(monkeypatch)
    pid, start, host, boot = runlock.identity(os.getppid()).split()
    text = {"pid reused": f"{pid} {int(start) + 1} {host} {boot}",
            "other host": f"{pid} {start} not-{socket.gethostname()} {boot}",
            "other boot": f"{pid} {start} {host} 0000",
            "old format": pid}[forged]
    (tmp_path / runlock.LOCK_NAME).write_text(text)
    try:
        runlock.hold(tmp_path)
    finally:
        runlock.release(tmp_path)
    # the control: the same name, true, is refused
    (tmp_path / runlock.LOCK_NAME).write_text(runlock.identity(os.getppid()))
    with pytest.raises(runlock.RunBusy):
        runlock.hold(tmp_path)
