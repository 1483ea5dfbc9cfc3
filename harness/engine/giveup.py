"""Give up on an implementation that keeps ending its job at one world size.

A kernel that deadlocks tends to deadlock in every case, and each case costs its whole
deadline (a minute for a collective): an hour over one tier. One that crashes, or leaves its
process unusable (a sticky CUDA error), tends to do so in every case too, and each costs a new
job: its ranks' imports, CUDA's and NCCL's start, tens of seconds on a GPU node. After
``limit`` such cases in a row of one op's implementation at one world size (no result of it
in between), its cases not yet run there are recorded as ``skip``, with the reason; the
failures themselves stay failures. ``limit`` 0 runs every case whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.core.spec import PlannedItem

#: cases in a row that ended their job after which an implementation's remaining cases are
#: not run (default)
GIVE_UP_AFTER = 2

#: how each way a case ends its job is said: its status ``timeout`` or ``crash``, or a
#: ``fault`` (its job ended after it was recorded, the process unusable)
_SAID = {"timeout": "timed out", "crash": "crashed its job", "fault": "left its process unusable"}


def _series(item: PlannedItem) -> tuple[str, str]:
    # "torch" of allreduce and "torch" of broadcast are different callables
    return item.case.spec.name, item.impl


class JobEndingStreaks:
    """The cases in a row of each (op, implementation) at one world size that ended their
    job, each as a ``timeout``, a ``crash`` or a ``fault``."""

    def __init__(self, limit: int = GIVE_UP_AFTER) -> None:
        self.limit = limit
        self._streak: dict[tuple[str, str], list[str]] = {}

    def ran(self, items: Iterable[PlannedItem]) -> None:
        """These items got a result of their own and their job went on: no streak there."""
        for item in items:
            self._streak.pop(_series(item), None)

    def ended_job(self, item: PlannedItem, how: str) -> bool:
        """Count ``item``'s case, which ended its job (``how``: a key of ``_SAID``); True
        when its implementation has now reached the limit."""
        streak = self._streak.setdefault(_series(item), [])
        streak.append(how)
        return self.limit > 0 and len(streak) >= self.limit

    def abandoned(self, item: PlannedItem, pending: Iterable[PlannedItem]
                  ) -> tuple[list[PlannedItem], str]:
        """The items of ``pending`` given up with ``item``'s implementation, and the reason
        each is recorded with."""
        key = _series(item)
        given_up = [p for p in pending if _series(p) == key]
        streak = self._streak.get(key, [])
        kinds = sorted(set(streak))
        what = _SAID[kinds[0]] if len(kinds) == 1 else f"ended its job ({', '.join(kinds)})"
        likely = ", a likely deadlock" if kinds == ["timeout"] else ""
        reason = (f"not run: {item.impl} {what} in {len(streak)} cases of {key[0]} in a row "
                  f"at world size {item.case.world_size}{likely} (--give-up-after 0 runs "
                  "every case)")
        return given_up, reason
