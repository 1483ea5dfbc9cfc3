"""Per-case deadline inside each rank.

A daemon thread watches the case in progress. When its deadline passes, ``on_expire`` runs
(rank 0 records a ``timeout`` result) and the whole MPI job is aborted: a hung collective
cannot be cancelled, and the launcher relaunches with the cases not yet recorded.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable


class Watchdog:
    """Arm before a case, disarm after it; expiry records and aborts the job."""

    def __init__(self, abort: Callable[[int], None], exit_code: int = 124) -> None:
        self._abort = abort
        self._exit_code = exit_code
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._label = ""
        self._on_expire: Callable[[], None] | None = None
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, seconds: float, on_expire: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._deadline = time.monotonic() + seconds
            self._label = label
            self._on_expire = on_expire
        self._wake.set()

    def disarm(self) -> bool:
        """Stop watching; False if the deadline already fired (the case must not be recorded
        a second time)."""
        with self._lock:
            fired = self._deadline is None and self._label == "<fired>"
            self._deadline = None
            return not fired

    def _run(self) -> None:
        while True:
            with self._lock:
                deadline = self._deadline
            if deadline is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            remaining = deadline - time.monotonic()
            if remaining > 0:
                self._wake.wait(min(remaining, 1.0))
                self._wake.clear()
                continue
            with self._lock:
                if self._deadline is None:  # disarmed meanwhile
                    continue
                label, on_expire = self._label, self._on_expire
                self._deadline, self._label = None, "<fired>"
            sys.stderr.write(f"harness watchdog: {label} passed its deadline; aborting the job\n")
            sys.stderr.flush()
            try:
                if on_expire is not None:
                    on_expire()
            finally:
                self._abort(self._exit_code)
                os._exit(self._exit_code)
