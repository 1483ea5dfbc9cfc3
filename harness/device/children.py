"""Processes an implementation starts, kept inside the rank that started them.

An implementation may start processes: a compiler, a worker pool, a daemon that detaches into
a session of its own (``start_new_session``), or a bare ``os.fork()``. A forked child that
returns from the implementation would go on running the rank's cases as a second copy of the
rank (its collectives meeting the wrong peers); one that lives on holds the launcher's output
pipes open, so the job cannot end until the stall limit stops it, and outlives the run.

``mark`` puts this rank's pid in its environment, which every descendant inherits whatever
its session, and makes the rank its descendants' subreaper, so that a process whose parent
exits (a daemon's double fork, which without exec keeps the rank's environment as it was at
the rank's start) is the rank's child, not init's; ``leave_if_forked`` ends a forked child
the moment it is back in the harness; ``end_leftovers``, at the job's end, kills the marked
processes still running and names them. Linux only (``/proc``, ``prctl``); elsewhere nothing
is found.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

#: the environment variable holding the pid of the rank a process descends from
MARK_ENV = "HARNESS_RANK_PID"

_RANK_PID = os.getpid()


#: prctl's PR_SET_CHILD_SUBREAPER (linux/prctl.h, Linux 3.4)
_PR_SET_CHILD_SUBREAPER = 36


def mark() -> None:
    """Mark this process as a rank: its descendants carry its pid in their environment, and
    those orphaned are adopted by it (``prctl(PR_SET_CHILD_SUBREAPER)``)."""
    global _RANK_PID
    _RANK_PID = os.getpid()
    os.environ[MARK_ENV] = str(_RANK_PID)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the environment mark alone
        pass


def leave_if_forked() -> None:
    """End this process at once if it is a child forked by an implementation (os.fork
    without exec) that has come back into the harness: the rank is its parent."""
    if os.environ.get(MARK_ENV) == str(_RANK_PID) and os.getpid() != _RANK_PID:
        os._exit(0)


def _parent(stat: bytes) -> int:
    """The parent pid in a /proc/PID/stat line (the field after the command's closing
    parenthesis and the state; the command may hold spaces and parentheses)."""
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def zombie(stat: bytes) -> bool:
    """Whether a /proc/PID/stat line is an exited process not yet reaped (state Z): nothing
    runs and no pipe is held; an orphan the rank adopted stays so until the rank ends."""
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"


def marked(proc: Path = Path("/proc")) -> list[int]:
    """The pids of the running processes, other than this one, that descend from this rank,
    of this user: its children's tree (a forked child, whose /proc environ is still the
    rank's own as it was at exec, and an orphan the rank adopted), and every process whose
    environment carries the rank's mark (one that detached and was adopted by init, once it
    exec'd). Zombies are left out."""
    me = os.getpid()
    needle = f"{MARK_ENV}={_RANK_PID}".encode()
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit() and int(e.name) != me]
    except OSError:
        return []
    parents: dict[int, int] = {}
    found = set()
    for entry in entries:
        try:
            stat = (entry / "stat").read_bytes()
            if zombie(stat):
                continue
            parents[int(entry.name)] = _parent(stat)
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone, or another user's
            continue
    tree, grew = {me}, True
    while grew:
        new = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return sorted((found | tree) - {me})


def end_leftovers(proc: Path = Path("/proc")) -> list[int]:
    """Kill (SIGKILL) the processes this rank's implementations left running, and return
    their pids."""
    pids = marked(proc)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return pids
