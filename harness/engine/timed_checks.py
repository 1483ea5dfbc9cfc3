"""The checks around an implementation's timed calls (``runner._time_and_recheck``).

The timed repeats run on the checked call's values. ``RepeatWatch`` compares each repeat's
outputs with the checked call's bits on the device, outside the clock, then poisons the
buffers it wrote: a result that changes from call to call (a window of autotuning
candidates, a stale or shared buffer) and a call that skips its work because nothing changed
since the last one (its outputs stay poison) both show. One call more after them
(``one_more``) is checked as the first one was: outputs poisoned before and read the moment it
returns, written into the buffers given, no memory shared with a read-only input, which
stays untouched (``untouched``: in every slot the timed calls used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.core.buffers import (
    BytesOutside,
    Redzones,
    flat_bytes,
    lies_within,
    poison_,
    same_value,
)
from harness.core.spec import Case, OpSpec
from harness.engine.case_setup import CaseError, normalize_outputs
from harness.engine.checked_calls import check_contract, output_hashes


class RepeatWatch:
    """After each timed repeat: its outputs against ``bits`` (the checked call's; empty: no
    check), one device flag per repeat, read once at the end; then the outputs poisoned
    where they are the case's output buffers or memory of the implementation's own."""

    def __init__(self, spec: OpSpec, bits: Mapping[str, torch.Tensor],
                 slots: list[dict[str, Any]], out_names: set[str]) -> None:
        self.spec, self.bits = spec, dict(bits)
        # input tensors a poisoned output may not lie in: any but the output buffers
        self.kept = [t for slot in slots for name, t in slot.items()
                     if isinstance(t, torch.Tensor) and name not in out_names]
        self.flags: list[torch.Tensor] = []
        self.error = ""

    def __call__(self, value: Any) -> None:
        if not self.bits or self.error:
            return
        try:
            outputs = normalize_outputs(value, self.spec.outputs, implementation=True)
        except CaseError as exc:
            self.error = f"timed call {len(self.flags) + 1}: {exc}"
            return
        differs = None
        for name, want in self.bits.items():
            got = outputs.get(name)
            if (isinstance(got, torch.Tensor) and got.shape == want.shape
                    and got.dtype == want.dtype and got.device == want.device):
                d = (flat_bytes(got) != flat_bytes(want)).any()
            else:
                d = torch.ones((), dtype=torch.bool, device=want.device)
            differs = d if differs is None else differs | d
        if differs is not None:
            self.flags.append(differs)
        for t in outputs.values():
            if isinstance(t, torch.Tensor) and not any(lies_within(t, k) for k in self.kept):
                poison_behind(t)

    def verdict(self) -> str:
        """Why a timed repeat was not the checked call ("" when every one was)."""
        if self.error or not self.flags:
            return self.error
        differing = torch.stack(self.flags).cpu().nonzero()
        if not len(differing):
            return ""
        return (f"timed call {int(differing[0]) + 1} of {len(self.flags)} (warm-up included) "
                "gave other bits than the checked call on the same inputs, its outputs "
                "poisoned before it (a result that changes from call to call: a window of "
                "autotuning candidates, a stale or shared buffer, or work skipped because "
                "nothing changed)")


def poison_upcoming(rotation: Any, slots: list[dict[str, Any]], out_names: set[str]
                    ) -> dict[str, Any]:
    """The slot the next call takes (``rotation`` cycled once round, so its position is
    kept), its output buffers poisoned."""
    upcoming = [next(rotation) for _ in slots]
    for name in out_names:
        buf = upcoming[0].get(name)
        if isinstance(buf, torch.Tensor):
            poison_behind(buf)
    return upcoming[0]


def poison_behind(t: torch.Tensor) -> None:
    """Poison ``t`` through an alias of its memory that torch's version counter does not see,
    as another kernel writing through the pointer would: an implementation that skips its work
    while ``t._version`` has not moved ("the output already holds it") returns the poison."""
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    poison_(alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride()))


def snapshot(value: Any) -> Any:
    """A copy of what a call returned, its tensors cloned (the next call may reuse them)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def repeat_differs(before: Any, outputs: Mapping[str, Any], digest: str, spec: OpSpec,
                   untimed: bool) -> str:
    """Why the token call (``before``, untimed) or the call right after the repeats
    (``outputs``) is not the checked call's bits (``digest``), or ""."""
    if before is not None and output_hashes(
            normalize_outputs(before, spec.outputs, implementation=True))[0] != digest:
        return ("the third call (the first one's values again) gave other bits than the "
                "checked call on the same inputs")
    if output_hashes(outputs)[0] != digest:
        last = "the third call" if untimed else "the timed repeats"
        return (f"one more call right after {last}, on the same inputs, gave other bits than "
                "the checked call (calls that alternate)")
    return ""


def contract_broken(case: Case, args: Mapping[str, Any], outputs: Mapping[str, Any],
                    guards: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """Why the call after the repeats broke the call contract on its slot ``args`` (outputs
    in the buffers given, of their own memory, dense; read-only inputs untouched where
    ``guards`` holds their copies), or ""."""
    plain = {k: v for k, v in guards.items() if not isinstance(v, BytesOutside)}
    try:
        check_contract(case, args, outputs, plain, Redzones(), expected)
    except CaseError as exc:
        return f"on the call right after the timed repeats: {exc}"
    return ""


def untouched(slots: list[dict[str, Any]], guards: Mapping[str, Any]) -> str:
    """Why a read-only input of a slot the timed calls used no longer holds its values
    (``guards``: copies made before the timing), or ""."""
    for slot in slots:
        for name, before in guards.items():
            if isinstance(before, BytesOutside) or name not in slot:
                continue
            if not same_value(slot[name], before):
                return (f"input {name!r} was modified by a timed call, but this case may not "
                        "write it")
    return ""
