"""The lock a ``harness run`` holds on its run directory while it runs.

``harness run --resume`` stops what a killed run left running before it starts; a run that is
still going would have its ranks killed (a passing case recorded as a crash) and two processes
appending to one results file. A run holds an exclusive ``flock`` on ``harness.lock`` in its
directory from start to end (the kernel drops it when the process dies, however it dies), and
a resume that cannot take it refuses. The file also names its holder (pid, the start time the
kernel gives that process, host, boot): where the file system keeps no locks (an NFS mount
with ``nolock``, where each host's ``flock`` is its own), a resume on the same host still sees
a holder that is alive and refuses. A holder on another host of such a mount is not seen.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = "harness.lock"
#: run directory -> the descriptor this process holds its lock by
_held: dict[Path, int] = {}


class RunBusy(Exception):
    """Another process holds the run directory: ``pid`` (None where it left no pid)."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def started(pid: int) -> str | None:
    """When process ``pid`` started, in the kernel's clock ticks since boot (None: no such
    process, or no /proc): with the boot, what tells a process from a later one given its
    pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name, in parentheses, may hold spaces: fields count from after it
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def identity(pid: int) -> str:
    """How the lock file names process ``pid`` of this host: pid, start, host, boot."""
    return f"{pid} {started(pid) or '-'} {socket.gethostname()} {_boot_id() or '-'}\n"


def holder(text: str) -> int | None:
    """The pid a lock file's ``text`` names where that process is alive on this host (the
    same boot, the same start time), else None."""
    words = text.split()
    if len(words) != 4 or not words[0].isdigit():
        return None
    pid, start, host, boot = int(words[0]), words[1], words[2], words[3]
    here = host == socket.gethostname() and boot == (_boot_id() or "-")
    if not here or pid == os.getpid() or start == "-":
        return None
    return pid if started(pid) == start else None


def hold(run_dir: Path) -> None:
    """Take the lock of ``run_dir`` for this process (again: nothing), or raise RunBusy."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    try:
        fd = os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return  # no lock file can be made: nothing to go by
    locked = True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 256, 0).decode(errors="replace").split()
        os.close(fd)
        raise RunBusy(int(text[0]) if text and text[0].isdigit() else None) from None
    except OSError:  # no locks on this file system: the recorded holder alone
        locked = False
    alive = holder(os.pread(fd, 256, 0).decode(errors="replace"))
    if alive is not None:
        # held by flock's lights, yet its holder lives: the locks are not shared here
        os.close(fd)
        raise RunBusy(alive)
    os.ftruncate(fd, 0)
    os.pwrite(fd, identity(os.getpid()).encode(), 0)
    if not locked:
        os.fsync(fd)  # the holder's name is all a resume on a lockless mount goes by
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Drop this process's lock of ``run_dir`` (none held: nothing)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        try:
            os.ftruncate(fd, 0)  # no holder named: the run ended
        except OSError:
            pass
        os.close(fd)


def release_all() -> None:
    """Drop every lock this process holds."""
    for run_dir in list(_held):
        release(run_dir)
