"""Stop a job that is stuck outside any case.

A case's deadline covers the case; nothing else did. A job can hang before its first case
(MPI's wire-up through a PMI server, a rank's imports on a stuck file system) or after its
last (``MPI_Finalize`` waiting on a peer), and the night never ends. The clock here runs while
the job's ranks are up and no case is in progress: from the ranks' first sign of life (each
process touches ``wN.alive``, harness.engine.alive, before it imports torch or initialises
MPI: a job still queued by srun has none, and waits as long as the queue does), and from each
result or case start after that. Past ``limit_s`` of quiet the launcher stops the job: one
stuck before its first case is relaunched (``LaunchConfig.max_fruitless`` tries), one stuck
between or after its cases has its remaining cases relaunched, and the world size warns,
naming where the job stopped.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

#: seconds a job's ranks may be up with no case in progress before it is stopped (default)
STALL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Stall:
    """Where a stopped job was stuck: ``"start"`` (before its first case), ``"between"`` (a
    case recorded, the next not begun) or ``"end"`` (every case recorded); and for how long."""

    where: str
    quiet_s: float

    def describe(self, limit_s: float, jobs: int = 1) -> str:
        """One line for the launch log and the world size's warning or error; ``jobs``: how
        many in a row were stopped so."""
        what = {"start": "its ranks started but began no case",
                "between": "it recorded a case but began no next one",
                "end": "it recorded every case but did not end"}[self.where]
        times = f", {jobs} jobs in a row" if jobs > 1 else ""
        return (f"the MPI job was stopped: {what} within {limit_s:g} s{times} (stuck "
                f"{_HINTS[self.where]}; --stall-timeout changes the limit)")


_HINTS = {"start": "in MPI's wire-up, the ranks' imports or their placement",
          "between": "between two cases, outside any deadline",
          "end": "ending: MPI_Finalize or the launcher waiting on a rank"}


class StallClock:
    """The quiet time of one job at a world size whose cases are ``planned`` (their result
    keys; ``already`` recorded before the job), fed by the launcher's polls. ``limit_s`` 0
    never stops a job."""

    def __init__(self, limit_s: float, alive: Path, planned: Collection[str],
                 already: Collection[str] = (), started: float | None = None) -> None:
        self.limit_s, self.alive, self.planned = limit_s, alive, frozenset(planned)
        self.already = len(already)  # results recorded before this job
        self.started = time.time() if started is None else started
        self._since: float | None = None  # when the quiet began, once the ranks are up
        self._seen: tuple[int, str | None] = (0, None)  # (results, case begun) then

    def _ranks_up(self) -> float | None:
        try:
            return max(self.alive.stat().st_mtime, self.started)
        except OSError:
            return None

    def poll(self, recorded: Collection[str], in_progress: str | None,
             now: float | None = None) -> Stall | None:
        """A Stall once the job has been quiet past the limit. ``recorded``: the world size's
        result keys so far; ``in_progress``: the key of the last case the job began (None
        before its first), whose own deadline rules while it is unrecorded."""
        now = time.time() if now is None else now
        seen = (len(recorded), in_progress)
        if self._since is None:
            up = self._ranks_up()
            if up is None:
                return None
            self._since, self._seen = up, seen
        elif seen != self._seen:
            self._since, self._seen = now, seen
        in_case = in_progress is not None and in_progress not in recorded
        if in_case or self.limit_s <= 0 or now - self._since <= self.limit_s:
            return None
        ran = in_progress is not None or len(recorded) > self.already
        where = "end" if self.planned <= set(recorded) else "between" if ran else "start"
        return Stall(where, now - self._since)
