"""Processes of a job or of a run, found by what the launcher put in their environment, and
killed.

Stopping a job's launcher normally takes its ranks with it: mpiexec's proxies end them when
it goes. A proxy that cannot act (stopped with SIGSTOP, stuck in the kernel) leaves them
running, holding their CPUs and MPI's shared memory, however long the run lasts. The launcher
gives every job's environment the run's id (``HARNESS_RUN_ID``) and the job's log
(``HARNESS_LAUNCH_LOG``), which every process it starts inherits, so what is left of a job,
or of a killed run, is found by those (this user's processes alone: another's environment
cannot be read). Linux only (``/proc``); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.device import children


def _env_value(pid: int, name: str) -> str | None:
    """``name`` in a process's environment (None where it has none or cannot be read)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = name.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode(errors="replace")
    return None


def _pids() -> Iterable[int]:
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs: nothing can be found, nothing is stopped
        return []
    return (int(n) for n in names if n.isdigit())


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return not children.zombie(stat)


def pids_with(name: str, value: str) -> list[int]:
    """The running processes (not this one) whose environment holds ``name=value``."""
    me = os.getpid()
    return [p for p in _pids() if p != me and _env_value(p, name) == value and alive(p)]


def kill(pids: Sequence[int], wait_s: float) -> list[int]:
    """SIGKILL ``pids`` (a stopped process too) and wait up to ``wait_s`` for them to go;
    returns those still running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]
