"""The checks around an implementation's calls after the checked ones (``runner``).

Those calls, the timed repeats or the token call, run on the checked call's values.
``RepeatWatch`` compares each one's outputs with the checked call's bits on the device,
outside the clock, keeps a copy of them as the call returned them, then poisons the buffers it
wrote: a result that changes from call to call (calls that alternate, a window of autotuning
candidates, a stale or shared buffer) and a call that skips its work because nothing changed
since the last one (its outputs stay poison) both show. The last of them is checked for its
contract as the first call is (``contract_broken``: outputs written into the buffers given,
of their own memory), and the read-only inputs of every slot they used must still hold their
values (``untouched``).
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
    poison_behind,
    same_value,
)
from harness.core.spec import Case, OpSpec
from harness.engine.case_setup import CaseError, normalize_outputs
from harness.engine.checked_calls import check_contract

#: a lone call after the checked ones (untimed, or a token timing) gets one more right after
#: it, so that calls that alternate show (one call has one parity: calls 1, 3, 5 alike and
#: 2, 4 not, or wrong on odd calls from the third on, each hides from one of them; past one
#: rank only where the lone call has the first call's parity: ``paired``); up to this
#: world size (past it a kernel's call-to-call state is the one at 4, and at 8 oversubscribed
#: ranks the call cost the smoke tier 15% of its 8-rank time)
CONSECUTIVE_MAX_WORLD = 4


def paired(made: int, world_size: int, interpreter: str | None = None) -> bool:
    """Whether a lone call after the ``made`` checked calls (``Calls.made``, a refused one
    too) gets a second right after it, so that calls that alternate show, from the first
    call or after a warm-up (one call has one parity). Past one rank, where an
    oversubscribed machine makes a token timing of every case, only where the lone call has
    the first call's parity (calls 1, 3, 5 alike hide there): the pair on every case cost
    the smoke tier 2 s of its 90 at 4 ranks. Never for an ``interpreter``'s calls, each
    worth a thousand compiled ones (the pair cost the interpreted Triton kernels a third of
    their time); a compiled run pairs them."""
    if world_size > CONSECUTIVE_MAX_WORLD or interpreter:
        return False
    return made % 2 == 0 or world_size == 1


class RepeatWatch:
    """After each call on the checked call's values (``__call__``): its outputs against
    ``bits`` (the checked call's; empty for an op whose bits may vary: no compare), one
    device flag per call, read once at the end; a copy of them as the call left them
    (``last``: what the check after the calls measures); then the outputs poisoned where they
    are the case's output buffers or memory of the implementation's own."""

    def __init__(self, spec: OpSpec, bits: Mapping[str, torch.Tensor],
                 slots: list[dict[str, Any]], out_names: set[str], active: bool = True) -> None:
        self.spec, self.bits, self.active = spec, dict(bits), active
        self.count = 0  # the calls watched (or, inactive, seen)
        # input tensors a poisoned output may not lie in: any but the output buffers
        self.kept = [t for slot in slots for name, t in slot.items()
                     if isinstance(t, torch.Tensor) and name not in out_names]
        self.flags: list[torch.Tensor] = []
        self.last: dict[str, Any] | None = None
        self.error = ""

    def __call__(self, value: Any) -> None:
        self.count += 1
        if self.error or not self.active:
            return
        try:
            outputs = normalize_outputs(value, self.spec.outputs, implementation=True)
        except CaseError as exc:
            self.error = f"repeat {len(self.flags) + 1}: {exc}"
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
        self.last = snapshot(outputs)
        for t in outputs.values():
            if isinstance(t, torch.Tensor) and not any(lies_within(t, k) for k in self.kept):
                poison_behind(t)

    def verdict(self) -> str:
        """Why a call was not the checked call's bits ("" when every one was)."""
        if self.error or not self.flags:
            return self.error
        differing = torch.stack(self.flags).cpu().nonzero()
        if not len(differing):
            return ""
        return (f"repeat {int(differing[0]) + 1} of {len(self.flags)} on the checked call's "
                "inputs (warm-up included) gave other bits than the checked call, its outputs "
                "poisoned before it (a result that changes from call to call: calls that "
                "alternate, a window of autotuning candidates, a stale or shared buffer, or "
                "work skipped because nothing changed)")


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


def snapshot(value: Any) -> Any:
    """A copy of what a call returned, its tensors cloned (the next call may reuse them)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def contract_broken(case: Case, args: Mapping[str, Any], outputs: Mapping[str, Any],
                    guards: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """Why the last call after the checked ones broke the call contract on its slot ``args``
    (outputs in the buffers given, of their own memory, dense; read-only inputs untouched
    where ``guards`` holds their copies), or ""."""
    plain = {k: v for k, v in guards.items() if not isinstance(v, BytesOutside)}
    try:
        check_contract(case, args, outputs, plain, Redzones(), expected)
    except CaseError as exc:
        return f"on the last call on the checked call's inputs: {exc}"
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
