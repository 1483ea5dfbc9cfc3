"""Give up on an implementation that keeps ending its job at one world size.

A kernel that deadlocks tends to deadlock in every case, and each case costs its whole
deadline (a minute for a collective): an hour over one tier. One that crashes, or leaves its
process unusable (a sticky CUDA error), tends to do so in every case too, and each costs a new
job: its ranks' imports, CUDA's and NCCL's start, tens of seconds on a GPU node. After
``limit`` such cases in a row of one op's implementation at one world size (no result of it
in between), or ``2 * limit`` in all, its cases not yet run there are recorded as ``skip``,
with the reason; the failures themselves stay failures. ``limit`` 0 runs every case whatever
happens.
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
    """The cases of each (op, implementation) at one world size that ended their job, each as
    a ``timeout``, a ``crash`` or a ``fault``: those in a row, and all of them. An
    implementation is given up after ``limit`` in a row, or ``2 * limit`` in all (one that
    deadlocks on every large case and passes every small one ends every other job)."""

    def __init__(self, limit: int = GIVE_UP_AFTER) -> None:
        self.limit = limit
        self._streak: dict[tuple[str, str], list[str]] = {}
        self._ended: dict[tuple[str, str], list[str]] = {}
        self._cases: dict[tuple[str, str], int] = {}

    def ran(self, items: Iterable[PlannedItem]) -> None:
        """These items got a result of their own and their job went on: no streak there."""
        for item in items:
            key = _series(item)
            self._streak.pop(key, None)
            self._cases[key] = self._cases.get(key, 0) + 1

    def ended_job(self, item: PlannedItem, how: str) -> bool:
        """Count ``item``'s case, which ended its job (``how``: a key of ``_SAID``); True
        when its implementation has now reached a limit."""
        key = _series(item)
        self._streak.setdefault(key, []).append(how)
        self._ended.setdefault(key, []).append(how)
        self._cases[key] = self._cases.get(key, 0) + 1
        return self.limit > 0 and (len(self._streak[key]) >= self.limit
                                   or len(self._ended[key]) >= 2 * self.limit)

    def abandoned(self, item: PlannedItem, pending: Iterable[PlannedItem]
                  ) -> tuple[list[PlannedItem], str]:
        """The items of ``pending`` given up with ``item``'s implementation, and the reason
        each is recorded with."""
        key = _series(item)
        given_up = [p for p in pending if _series(p) == key]
        streak, ended = self._streak.get(key, []), self._ended.get(key, [])
        in_a_row = len(streak) >= self.limit
        kinds = sorted(set(streak if in_a_row else ended))
        what = _SAID[kinds[0]] if len(kinds) == 1 else f"ended its job ({', '.join(kinds)})"
        where = (f"{len(streak)} cases of {key[0]} in a row" if in_a_row else
                 f"{len(ended)} of its {self._cases.get(key, 0)} cases of {key[0]} so far")
        likely = ", a likely deadlock" if kinds == ["timeout"] else ""
        reason = (f"not run: {item.impl} {what} in {where} at world size "
                  f"{item.case.world_size}{likely} (--give-up-after 0 runs every case)")
        return given_up, reason
