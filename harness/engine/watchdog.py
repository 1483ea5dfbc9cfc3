"""Per-case deadline inside each rank, and where every rank was when it passed.

A daemon thread watches the case in progress. A moment before its deadline it writes every
thread's Python stack into the job's launch log (on the launcher's host straight into the
file: what went through the MPI launcher's forwarding just before an abort could be lost),
under a line naming the rank and the case. When the deadline passes, ``on_expire`` runs
(rank 0 records a ``timeout`` result) and the whole MPI job is aborted: a hung collective
cannot be cancelled, and the launcher relaunches with the cases not yet recorded. Between
cases the thread only writes the stacks, a moment before the launcher would stop the job as
stuck (``quiet``).

The other ranks' stacks must be in the log before the abort takes them down, and their own
clocks do not say when: a rank that began the case late would write its stacks late, and one
that failed its part has gone on to its next case. So rank 0, when it writes its stacks, asks
every rank for theirs on a ``StacksBoard`` (files in the run directory every rank sees), each
rank's watchdog thread answers within a second wherever the rank is, and rank 0 waits for the
answers (``STACKS_WAIT_S`` at most) before it aborts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.core.results import write_whole

#: the longest the rank whose deadline passed waits for the others' stacks before it aborts;
#: the other ranks' own deadlines are this much later than rank 0's (harness.pytest_plugin).
#: Ranks that answer end the wait early (within a look or two); the limit only costs where a
#: rank cannot answer, so it is set for a loaded machine three times slower than a fast one
STACKS_WAIT_S = 6.0
#: how often an idle watchdog thread looks at the board
_LOOK_S = 0.5


def log_to_append(log: str | None, launcher_host: str | None, host: str) -> str | None:
    """The job's log where this rank may append to it itself: on the launcher's host only.
    Another host sees it over a network file system, if at all, and O_APPEND is not atomic
    across NFS clients (open(2): "may lead to corrupted files"): its writes could land over
    srun's lines; there the rank's stacks go through stderr, as the launcher forwards them."""
    return log if log and launcher_host == host else None


def ahead(seconds: float) -> float:
    """When, before an alarm ``seconds`` away, the stacks are written: a second, or a tenth of
    a short one, early."""
    return seconds - min(1.0, seconds / 10)


class StacksBoard:
    """One rank's view of its job's requests for stacks: ``request`` holds the last one (the
    job, who asked, for which case), ``answers[r]`` the last request rank r answered."""

    def __init__(self, request: Path, answers: Sequence[Path], rank: int, job: str) -> None:
        self._request, self._answers = request, list(answers)
        self._rank, self._job = rank, job
        self._seen: tuple[int, int] | None = None  # the request file's inode and mtime
        self._answered = ""

    def ask(self, label: str) -> str:
        """Ask every rank for its stacks; the request's id, to wait for."""
        rid = f"{self._job}\n{self._rank}\n{time.time():.6f}\n{label}"
        try:
            write_whole(self._request, rid)
        except OSError:
            pass  # the others keep their own clocks; the wait ends at its limit
        self.answer(rid)  # the asker has just written its own
        return rid

    def asked(self) -> tuple[str, str] | None:
        """A request of this job not yet answered: (its id, "rank R's <case>"), else None."""
        try:
            st = os.stat(self._request)
            if (st.st_ino, st.st_mtime_ns) == self._seen:
                return None  # replaced atomically: a new request is a new inode
            self._seen = (st.st_ino, st.st_mtime_ns)
            rid = self._request.read_text()
        except OSError:
            return None
        parts = rid.split("\n", 3)
        if len(parts) != 4 or parts[0] != self._job or rid == self._answered:
            return None
        return rid, f"rank {parts[1]}'s {parts[3]}"

    def answer(self, rid: str) -> None:
        self._answered = rid
        try:
            write_whole(self._answers[self._rank], rid)
        except OSError:
            pass

    def missing(self, rid: str) -> list[int]:
        """The ranks that have not answered request ``rid``."""
        missing = []
        for rank, path in enumerate(self._answers):
            try:
                if path.read_text() == rid:
                    continue
            except OSError:
                pass
            missing.append(rank)
        return missing

    def wait(self, rid: str, seconds: float) -> list[int]:
        """Until every rank answered ``rid``, or ``seconds`` passed: the ranks still missing."""
        give_up = time.monotonic() + seconds
        while (missing := self.missing(rid)) and time.monotonic() < give_up:
            time.sleep(0.05)
        return missing


class Watchdog:
    """Arm before a case, disarm after it; expiry records and aborts the job. ``who`` names
    this rank in the stacks' header ("rank 3"); ``board``, where its rank asks the others for
    their stacks and answers their asking; ``log``, the job's log, which the stacks and the
    watchdog's words go straight into (else stderr): see ``_write``."""

    def __init__(self, abort: Callable[[int], None], exit_code: int = 124, who: str = "",
                 board: StacksBoard | None = None, log: str | None = None) -> None:
        self._abort = abort
        self._exit_code = exit_code
        self._who = who
        self._board = board
        self._log = log
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._stacks_at: float | None = None  # when to write the stacks, once
        self._label = ""
        self._on_expire: Callable[[], None] | None = None
        self._asks = False  # this rank asks the others for theirs at its stacks time
        self._dumped = False  # this rank's stacks are written for the case in progress
        self._asked = ""  # the request this rank made for the case in progress
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, seconds: float, on_expire: Callable[[], None] | None = None,
            stacks_after: float | None = None, ask_others: bool = False) -> None:
        """Abort after ``seconds``; write the stacks after ``stacks_after`` (default: a
        moment before the abort), and then ask the other ranks for theirs if ``ask_others``."""
        now = time.monotonic()
        with self._lock:
            self._deadline = now + seconds
            self._stacks_at = now + (ahead(seconds) if stacks_after is None else stacks_after)
            self._label = label
            self._on_expire = on_expire
            self._asks, self._dumped, self._asked = ask_others, False, ""
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
            self._dumped = False
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
        self._write("".join(parts))

    def _write(self, text: str) -> None:
        """``text`` in one write, into the job's log where it has one: the MPI launcher
        forwards a rank's stderr on its own time, and an abort right after lost the lines not
        yet forwarded (2 aborts in 30 on an idle 2-core VM lost the line said just before).
        A write to the file is in it when it returns (the launcher opens the log appending,
        so its own later writes do not overwrite it). Elsewhere, or where the log cannot be
        opened (a node that does not see it), stderr."""
        data = text.encode(errors="replace")
        sys.stderr.flush()  # what the rank said before comes before, where it is on stderr
        fd = -1
        if self._log:
            try:
                fd = os.open(self._log, os.O_WRONLY | os.O_APPEND)
            except OSError:
                pass
        try:
            while data:
                data = data[os.write(fd if fd >= 0 else sys.stderr.fileno(), data):]
        finally:
            if fd >= 0:
                os.close(fd)

    def _answer(self) -> None:
        """Another rank asked for this rank's stacks: write them (unless this case's are
        written already) and say so."""
        asked = self._board.asked() if self._board is not None else None
        if asked is None:
            return
        rid, whose = asked
        with self._lock:
            label, armed, dumped = self._label, self._deadline is not None, self._dumped
            self._dumped = self._dumped or armed
        if not (armed and dumped):
            where = label if armed else f"{label or 'before its first case'}, between cases"
            self._write_stacks(f"{whose} near its deadline, asked for (this rank: {where})")
        self._board.answer(rid)

    def _run(self) -> None:
        while True:
            self._answer()
            with self._lock:
                deadline, stacks_at, label = self._deadline, self._stacks_at, self._label
            due = [t for t in (deadline, stacks_at) if t is not None]
            remaining = min(due) - time.monotonic() if due else _LOOK_S
            if remaining > 0:
                self._wake.wait(min(remaining, _LOOK_S))
                self._wake.clear()
                continue
            if stacks_at is not None and time.monotonic() >= stacks_at:
                with self._lock:
                    if self._stacks_at != stacks_at:  # re-armed meanwhile
                        continue
                    self._stacks_at = None
                    dumped, self._dumped = self._dumped, True
                if deadline is None:
                    self._write_stacks(label)
                    continue
                if not dumped:
                    self._write_stacks(f"{label} near its deadline")
                if self._asks and self._board is not None:
                    asked = self._board.ask(label)
                    with self._lock:
                        self._asked = asked if self._label == label else ""
                continue
            with self._lock:
                if self._deadline != deadline:  # disarmed or re-armed meanwhile
                    continue
                label, on_expire, asked = self._label, self._on_expire, self._asked
                self._deadline, self._stacks_at, self._label = None, None, "<fired>"
            self._expire(label, on_expire, asked)

    def _expire(self, label: str, on_expire: Callable[[], None] | None, asked: str) -> None:
        """Record, wait for the stacks asked for (a rank whose deadline passed without asking
        asks now), then abort the job."""
        late: list[int] = []
        try:
            if on_expire is not None:
                on_expire()
            # said before the wait for the stacks, not after: where it goes to stderr (no
            # log), the launcher forwards a rank's last lines on its own time, and an abort
            # right after them lost them
            self._say(f"{label} passed its deadline; aborting the job"
                      + (f" once every rank's stacks are in (up to {STACKS_WAIT_S:g} s)"
                         if self._board is not None else ""))
            if self._board is not None:
                late = self._board.wait(asked or self._board.ask(label), STACKS_WAIT_S)
        finally:
            if late:
                self._say(f"no stacks from rank(s) {', '.join(map(str, late))} within "
                          f"{STACKS_WAIT_S:g} s: stuck in C code that holds Python's lock?")
            self._abort(self._exit_code)
            os._exit(self._exit_code)

    def _say(self, text: str) -> None:
        self._write(f"harness watchdog: {text}\n")
