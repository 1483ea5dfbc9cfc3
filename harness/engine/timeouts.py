"""Give up on an implementation that keeps timing out at one world size.

A kernel that deadlocks tends to deadlock in every case, and each case costs its whole
deadline (a minute for a collective): an hour over one tier. After ``limit`` timeouts in a row
of one op's implementation at one world size (no result of it in between), its cases not yet
run there are recorded as ``skip``, with the reason; the timeouts themselves stay failures.
``limit`` 0 runs every case whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.core.spec import PlannedItem

#: timeouts in a row after which an implementation's remaining cases are not run (default)
MAX_TIMEOUTS = 2


def _series(item: PlannedItem) -> tuple[str, str]:
    # "torch" of allreduce and "torch" of broadcast are different callables
    return item.case.spec.name, item.impl


class TimeoutStreaks:
    """The timeouts in a row of each (op, implementation) at one world size."""

    def __init__(self, limit: int = MAX_TIMEOUTS) -> None:
        self.limit = limit
        self._streak: dict[tuple[str, str], int] = {}

    def ran(self, items: Iterable[PlannedItem]) -> None:
        """These items got a result of their own (the job recorded them): no deadlock there."""
        for item in items:
            self._streak.pop(_series(item), None)

    def timed_out(self, item: PlannedItem) -> bool:
        """Count ``item``'s timeout; True when its implementation has now reached the limit."""
        key = _series(item)
        self._streak[key] = self._streak.get(key, 0) + 1
        return self.limit > 0 and self._streak[key] >= self.limit

    def abandoned(self, item: PlannedItem, pending: Iterable[PlannedItem]
                  ) -> tuple[list[PlannedItem], str]:
        """The items of ``pending`` given up with ``item``'s implementation, and the reason
        each is recorded with."""
        key = _series(item)
        given_up = [p for p in pending if _series(p) == key]
        reason = (f"not run: {item.impl} timed out in {self._streak.get(key, 0)} cases of "
                  f"{key[0]} in a row at world size {item.case.world_size}, a likely deadlock "
                  f"(--max-timeouts 0 runs every case)")
        return given_up, reason
