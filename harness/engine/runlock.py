"""The lock a ``harness run`` holds on its run directory while it runs.

``harness run --resume`` stops what a killed run left running before it starts; a run that is
still going would have its ranks killed (a passing case recorded as a crash) and two processes
appending to one results file. A run holds an exclusive ``flock`` on ``harness.lock`` in its
directory from start to end (the kernel drops it when the process dies, however it dies), and
a resume that cannot take it refuses. Where the file system has no locks (some network
mounts), nothing is held and nothing refused.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "harness.lock"
#: run directory -> the descriptor this process holds its lock by
_held: dict[Path, int] = {}


class RunBusy(Exception):
    """Another process holds the run directory: ``pid`` (None where it left no pid)."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


def hold(run_dir: Path) -> None:
    """Take the lock of ``run_dir`` for this process (again: nothing), or raise RunBusy."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    try:
        fd = os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return  # no lock file can be made: nothing to go by
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RunBusy(int(text) if text.isdigit() else None) from None
    except OSError:  # no locks on this file system
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Drop this process's lock of ``run_dir`` (none held: nothing)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    """Drop every lock this process holds."""
    for run_dir in list(_held):
        release(run_dir)

