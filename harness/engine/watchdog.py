"""Per-case deadline inside each rank, and where the rank was when it passed.

A daemon thread watches the case in progress. A moment before its deadline it writes every
thread's Python stack to stderr (the job's launch log), under a line naming the rank and the
case: every rank does, the hung one and those waiting for it, before rank 0's abort takes
them down. When the deadline passes, ``on_expire`` runs (rank 0 records a ``timeout`` result)
and the whole MPI job is aborted: a hung collective cannot be cancelled, and the launcher
relaunches with the cases not yet recorded. Between cases the thread only writes the stacks,
a moment before the launcher would stop the job as stuck (``quiet``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable


def ahead(seconds: float) -> float:
    """When, before an alarm ``seconds`` away, the stacks are written: a second, or a tenth of
    a short one, early."""
    return seconds - min(1.0, seconds / 10)


class Watchdog:
    """Arm before a case, disarm after it; expiry records and aborts the job. ``who`` names
    this rank in the stacks' header ("rank 3")."""

    def __init__(self, abort: Callable[[int], None], exit_code: int = 124, who: str = "") -> None:
        self._abort = abort
        self._exit_code = exit_code
        self._who = who
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._stacks_at: float | None = None  # when to write the stacks, once
        self._label = ""
        self._on_expire: Callable[[], None] | None = None
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, seconds: float, on_expire: Callable[[], None] | None = None,
            stacks_after: float | None = None) -> None:
        """Abort after ``seconds``; write the stacks after ``stacks_after`` (default: a
        moment before the abort)."""
        now = time.monotonic()
        with self._lock:
            self._deadline = now + seconds
            self._stacks_at = now + (ahead(seconds) if stacks_after is None else stacks_after)
            self._label = label
            self._on_expire = on_expire
        self._wake.set()

    def disarm(self) -> bool:
        """Stop watching; False if the deadline already fired (the case must not be recorded
        a second time)."""
        with self._lock:
            fired = self._deadline is None and self._label == "<fired>"
            self._deadline = self._stacks_at = None
            return not fired

    def quiet(self, label: str, seconds: float) -> None:
        """No case in progress: write the stacks a moment before ``seconds`` pass (0: never),
        abort nothing."""
        with self._lock:
            self._deadline = None
            self._stacks_at = time.monotonic() + ahead(seconds) if seconds > 0 else None
            self._label = label
        self._wake.set()

    def _write_stacks(self, label: str) -> None:
        """Every thread's stack, in one write: the ranks of a job write theirs at the same
        moment into one log, and faulthandler's many small writes came out interleaved."""
        names = {t.ident: t.name for t in threading.enumerate()}
        parts = [f"harness: {self._who or 'this rank'}'s stacks, {label} (most recent call "
                 "last):\n"]
        for ident, frame in sys._current_frames().items():
            mine = " (the watchdog)" if ident == threading.get_ident() else ""
            parts.append(f"Thread {names.get(ident, hex(ident))}{mine}:\n")
            parts.append("".join(traceback.format_stack(frame)))
        data = "".join(parts).encode(errors="replace")
        sys.stderr.flush()
        while data:
            data = data[os.write(sys.stderr.fileno(), data):]

    def _run(self) -> None:
        while True:
            with self._lock:
                deadline, stacks_at, label = self._deadline, self._stacks_at, self._label
            due = [t for t in (deadline, stacks_at) if t is not None]
            if not due:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            remaining = min(due) - time.monotonic()
            if remaining > 0:
                self._wake.wait(min(remaining, 1.0))
                self._wake.clear()
                continue
            if stacks_at is not None and time.monotonic() >= stacks_at:
                with self._lock:
                    if self._stacks_at != stacks_at:  # re-armed meanwhile
                        continue
                    self._stacks_at = None
                what = f"{label} near its deadline" if deadline is not None else label
                self._write_stacks(what)
                continue
            with self._lock:
                if self._deadline != deadline:  # disarmed or re-armed meanwhile
                    continue
                label, on_expire = self._label, self._on_expire
                self._deadline, self._stacks_at, self._label = None, None, "<fired>"
            sys.stderr.write(f"harness watchdog: {label} passed its deadline; aborting the job\n")
            sys.stderr.flush()
            try:
                if on_expire is not None:
                    on_expire()
            finally:
                self._abort(self._exit_code)
                os._exit(self._exit_code)
