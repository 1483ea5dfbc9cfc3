"""run_case: inputs -> implementation -> compare -> time -> CaseResult.

Every rank calls ``run_case`` for the same case in the same order. The verdict is reached
collectively (metrics of all ranks merged on rank 0 and broadcast), so every rank agrees on
pass or fail and pytest's ``-x`` stops all ranks at the same item. Only rank 0 returns the full
``CaseResult``; the others return one with the same status.

A case is checked on several calls, each catching a class of bug the others miss: the
checked calls before any timing (``harness.engine.checked_calls``: fresh inputs with poisoned
outputs, then a second call on shifted memory, on other values where no real timing follows),
then ``after_timing``: the timed repeats rotate over shifted copies of the inputs (as
nccl-tests shifts its buffers between iterations); where the case does not write its inputs in
place, each of them (or untimed, the one call after the checked ones) is compared with the
checked call's bits and the last is checked again, for its values and its contract
(``harness.engine.timed_checks``); a real timing ends with a call on other values in buffers
the timed calls used, and the checks that its time could be honest.

A case's inputs, reference and tolerances are ``harness.engine.case_setup``'s; merging every
rank's checks into one verdict is ``harness.engine.verdict``'s.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness.core import compare, timing
from harness.core.buffers import nbytes, poison_, relocate, same_bits
from harness.core.golden import GoldenShelf, GoldenStore
from harness.core.results import CaseResult
from harness.core.spec import IMPL_RAISES, Case, OpSpec, SpecError, raised
from harness.core.timing import (
    TimingConfig,
    clock_tampering,
    derived,
    impossible,
    llc_bytes,
    percent_of_peak,
    time_call,
)
from harness.device import children, process_state, triton_impl
from harness.device.runtime import World
from harness.engine.case_setup import (
    CaseError,
    CaseSetup,
    SetupCache,
    interpreted_lens,
    normalize_outputs,
    tolerances,
)
from harness.engine.checked_calls import (
    RELOCATE_CAP_BYTES,
    SHIFT_BYTES,
    Calls,
    changed_since,
    checked_calls,
    guards_for,
    measure,
    own_memory,
)
from harness.engine.timed_checks import (
    RepeatWatch,
    contract_broken,
    paired,
    poison_upcoming,
    untouched,
)
from harness.engine.verdict import (
    RankNotes,
    Verdict,
    agree,
    fails_here,
    gather_verdict,
    judge_golden,
)

#: how long a host thread gets to change an output after the call returned
SETTLE_S = 0.001
#: what a case is doing, as a timeout's reason names it (``run_case``'s ``phase`` callback)
PHASES = {
    "setup": "while making its inputs and reference (the op's make_inputs and reference, "
             "not the implementation)",
    "call": "in the implementation's call",
    "check": "while checking its outputs",
    "timing": "while timing the implementation and checking it again",
}


#: at most this many shifted input sets rotate between timed repeats, within this budget
TIMING_SLOTS, TIMING_SLOT_BUDGET_BYTES = 4, 256 << 20


def _ask(question: Callable[..., str | None], world: World, case: Case) -> str:
    """A skip question's answer; one that takes ``backend`` is told the job's."""
    if "backend" in inspect.signature(question).parameters:
        return question(case.params, case.world_size, world.device,
                        backend=world.backend) or ""
    return question(case.params, case.world_size, world.device) or ""


def _local_skip_reason(world: World, case: Case, impl: Callable[..., Any]) -> str:
    why = ""
    if case.spec.requires is not None:
        why = _ask(case.spec.requires, world, case)
    impl_reason = getattr(impl, "skip_reason", None)
    if not why and callable(impl_reason):
        why = _ask(impl_reason, world, case)
    return why


def _skip_or_error(world: World, case: Case, impl: Callable[..., Any]) -> tuple[str, str]:
    """(status, reason) agreed by every rank before the case starts: ("skip", why) when it
    cannot run here (the op's ``requires``, such as memory, or the implementation's
    ``skip_reason``: device, kernel limits), ("error", what raised) when asking raised (a
    sticky CUDA error makes ``mem_get_info`` raise), else ("", ""). Every rank takes part in
    exactly one gather whatever happened, so the ranks' collectives stay paired case by
    case."""
    try:
        local = ("skip", _local_skip_reason(world, case, impl))
    except KeyboardInterrupt:
        raise
    except IMPL_RAISES as exc:
        local = ("error", f"asking whether the case can run raised {raised(exc)}")
    everyone = world.comm.allgather(local) if world.size > 1 else [local]
    for rank, (kind, why) in enumerate(everyone):
        if kind == "error":
            return "error", f"rank {rank}: {why}"
    return next((("skip", why) for _, why in everyone if why), ("", ""))


def run_case(
    world: World,
    case: Case,
    impl_name: str,
    impl: Callable[..., Any],
    *,
    run_id: str = "",
    bench: bool = True,
    timing: TimingConfig | None = None,
    env_id: str = "",
    golden: GoldenStore | GoldenShelf | None = None,
    calibration: Mapping[str, Any] | None = None,
    setups: SetupCache | None = None,
    phase: Callable[[str], None] = lambda name: None,
    on_failure: Callable[[str], None] = lambda why: None,
) -> CaseResult:
    """Run, check and time one implementation on one case, on every rank.

    With a ``golden`` store the first call's outputs are also compared with the stored golden
    (when the case has one); a mismatch fails the case with the golden's file named. With
    ``setups`` the inputs and reference of a case are made once for all its implementations.
    ``phase`` is told each of ``PHASES`` as the case enters it (a timeout names the last);
    ``on_failure`` why this rank's part failed, before the ranks exchange their verdicts (a
    rank that raised goes on while the others may wait for it in a collective: the timeout
    that follows names the cause).
    """
    started = time.time()
    t0 = time.perf_counter()
    result = _new_result(world, case, impl_name, run_id, env_id, started)
    status, why = _skip_or_error(world, case, impl)
    if not status and case.spec.distributed:
        world.default_group()  # dist.all_reduce(t) without group= finds it, whatever ran before
    if status:
        result.status, result.reason = status, why
        result.duration_s = time.perf_counter() - t0
        return result
    # the same on every rank: the same implementation on the same kind of device
    result.interpreter = triton_impl.interpreter_of(impl, world.device.type)
    checks = ["poisoned_outputs"] if case.spec.out_buffers else []
    clock_tampering()  # an untimed implementation before this one may have left a patch
    settings = process_state.snapshot()
    cfg = timing or TimingConfig()
    if result.interpreter:
        cfg = cfg.interpreted(result.interpreter)
    # a real timing ends with a call on other values (in buffers the timed calls used);
    # without one, the checked calls make it (a result kept by shape or call count is stale)
    calls = checked_calls(world, case, impl, result.interpreter, setups or SetupCache(),
                          golden, checks, phase, other_values=not (bench and cfg.full))
    if case.spec.replicated and world.size > 1:
        checks.append("replicated")
    checks.append("process_settings")
    if calls.error:
        on_failure(calls.error)
    verdict = gather_verdict(world, case, calls.error, calls.stages, RankNotes(
        calls.replicas, process_state.changed(settings), process_state.tainted(),
        calls.mem.bytes, calls.mem.kind, calls.digest, calls.repeat))
    _take(result, verdict)
    result.peak_memory_bytes, result.peak_memory_kind = verdict.peak, verdict.peak_kind
    result.output_hash = verdict.output_hash if world.rank == 0 else None
    if golden is not None:
        result.golden, status, reason = agree(world, calls.golden, judge_golden)
        if result.status == "pass" and status != "pass":
            result.status, result.reason = status, reason
            if status not in ("pass", "fail"):
                result.output_hash = None

    # ---- timing, only of implementations that are correct
    if bench and result.status == "pass" and calls.setup is not None:
        phase("timing")
        _time_and_recheck(world, case, impl, calls, result, cfg, checks, calibration,
                          settings, on_failure)
    elif result.status == "pass" and calls.values is not calls.setup:
        # untimed, the second call took the twin's values: one more, as a token timing's,
        # on the case's values in its buffers (a result kept by address; other bits)
        phase("call")
        _time_and_recheck(world, case, impl, calls, result, replace(cfg, minimal=True),
                          checks, calibration, settings, on_failure, untimed=True)
    result.checks = checks
    result.duration_s = time.perf_counter() - t0
    return result


def _new_result(world: World, case: Case, impl_name: str, run_id: str, env_id: str,
                started: float) -> CaseResult:
    """The result of ``impl_name`` on ``case`` as it starts: a pass until a check says not."""
    spec = case.spec
    return CaseResult(
        run_id=run_id, case_id=case.id, op=spec.name, family=spec.family, impl=impl_name,
        world_size=case.world_size, params=dict(case.params), status="pass",
        device=str(world.device), backend=world.backend if spec.distributed else None,
        started_at=started, env_id=env_id,
    )


def _take(result: CaseResult, verdict: Verdict) -> None:
    """The agreed verdict into ``result``; a tainted process ends its job after the case."""
    result.status, result.reason = verdict.status, verdict.reason
    result.outputs, result.wrong = verdict.outputs, verdict.wrong
    if verdict.tainted:
        process_state.taint()  # on every rank, so that the job ends together (pytest_plugin)


def _time_and_recheck(world: World, case: Case, impl: Callable[..., Any], calls: Calls,
                      result: CaseResult, cfg: TimingConfig, checks: list[str],
                      calibration: Mapping[str, Any] | None = None,
                      settings: dict[str, Any] | None = None,
                      on_failure: Callable[[str], None] = lambda why: None,
                      untimed: bool = False) -> None:
    """Time over rotating shifted copies of the last checked call's inputs, then check the
    last output again; then, where the timing was real, check that the time could be honest:
    not below the calibrated limits, no clock replaced, right on new values in buffers seen
    before (a cache), the first call's outputs untouched by them (a workspace it returns),
    and outputs that stay put after the call returns (work left running)."""
    inputs, spec = calls.inputs, case.spec
    out_names = set(spec.out_buffers.values()) - set(spec.readwrite_inputs)
    # in-place cases change their inputs on every repeat: their last output is not checkable
    recheck = calls.writable <= out_names | set(spec.readwrite_inputs)
    slots, values, tols, after = _timed_inputs(world, case, calls, cfg, recheck, out_names)
    # every call after the checked ones must give the checked call's bits (RepeatWatch)
    small = nbytes(inputs) <= RELOCATE_CAP_BYTES
    watch = RepeatWatch(spec, calls.bits, slots, out_names, active=recheck and small)
    pair = bool(watch.bits) and watch.active and paired(calls.made, world.size, cfg.interpreter)
    guards = guards_for(case, slots[0], calls.writable) if watch.active else {}
    tampered = clock_tampering()  # replaced by its calls so far (restored; so are the next)
    last, local_error = _timed_calls(world, spec, impl, cfg, slots, out_names, watch, pair,
                                     untimed, result)
    tampered += clock_tampering()
    real = bool(result.timing) and cfg.full
    impossible_why = _rates(world, case, result, cfg, calibration, real)
    # every rank takes part in this verdict, so a timing error on one rank reaches them all
    stages: dict[str, dict[str, Any]] = {}
    repeat = ""
    # an in-place case's repeats rewrote its inputs: its last output is not checked, but the
    # calls on new values written into its buffers are
    if (recheck or real) and not local_error:
        try:
            if recheck:
                outputs = normalize_outputs(last["value"], spec.outputs, implementation=True)
                # the last call's outputs as it returned them (the watch poisoned them since)
                seen = watch.last if watch.last is not None else outputs
                stages[after] = measure(seen, values.expected, tols, world.rank,
                                        values.memos, values.magnitudes)
                checks.append(after)
                if watch.active:
                    checks += ["same_bits"] * bool(watch.bits) + ["timed_contract"]
                    local_error = (contract_broken(case, last["args"], outputs, guards,
                                                   values.expected)
                                   or untouched(slots, guards))
                    repeat = watch.verdict()
            if after == "reused_buffers":
                local_error = local_error or changed_since(calls.held)
            later: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # the case's last call's
            if real and small:  # on every rank (its collectives), whatever this one found
                tampered += _on_new_values(world, case, impl, slots[0], values, stages, checks,
                                           later)
                local_error = local_error or changed_since(calls.held)
            elif recheck and small:  # the token call's, on the case's values
                later = own_memory(outputs, last["args"])
                # let go of them here: a storage still alive is one the implementation holds
                outputs = seen = last["value"] = None
            if recheck and not local_error and not fails_here(stages, spec):
                local_error = _ring_check(world, case, impl, calls, slots[0], later, real, cfg)
        except KeyboardInterrupt:
            raise
        except IMPL_RAISES as exc:
            local_error = f"after timing: {raised(exc)}"
    changed = process_state.changed(settings) if settings is not None else []
    if local_error:
        on_failure(local_error)
    verdict = gather_verdict(world, case, local_error, stages,
                             RankNotes(changed=changed, tainted=process_state.tainted(),
                                       repeat=repeat))
    if verdict.status != "pass":
        _take(result, verdict)
        return
    _judge_honesty(world, result, tampered, impossible_why)


def _ring_check(world: World, case: Case, impl: Callable[..., Any], calls: Calls,
                slot: dict[str, Any], later: dict[str, tuple[torch.Tensor, torch.Tensor]],
                real: bool, cfg: TimingConfig) -> str:
    """``_reused_later`` on the first call's outputs and the case's last call's (``later``:
    the twin call's after a real timing, else the token call's, on the case's values). Not
    for a distributed op (its outputs pass through its communicator's work objects, which
    NCCL's watchdog thread lets go of on its own time), nor interpreted (Triton's interpreter
    keeps every launch's arguments in reference cycles: a collection per case, 60 ms)."""
    if case.spec.distributed or cfg.interpreter or not (calls.held or later):
        return ""
    twin = calls.setup.twin()  # type: ignore[union-attr]  (set: the case passed)
    return _reused_later(world, impl, slot, [
        ("the first call", calls.held, twin),
        ("the call after the timing" if real else "the last call of the case", later,
         calls.setup if real else twin)])


def _timed_calls(world: World, spec: OpSpec, impl: Callable[..., Any], cfg: TimingConfig,
                 slots: list[dict[str, Any]], out_names: set[str], watch: RepeatWatch,
                 pair: bool, untimed: bool, result: CaseResult) -> tuple[dict[str, Any], str]:
    """The timed repeats (one token call ``untimed``) rotating over ``slots``, each watched,
    and with ``pair`` one call more after a lone one, its outputs poisoned before. What the
    last call left (``args``, ``value``), and why a call raised ("" if none)."""
    # the first call takes a new copy (the inputs of the shifted check have been used)
    rotation = itertools.cycle(slots[1:] + slots[:1])
    last: dict[str, Any] = {}

    def call() -> None:
        args = last["args"] = next(rotation)
        try:
            last["value"] = impl(world, **args) if spec.distributed else impl(**args)
        finally:
            children.leave_if_forked()

    try:
        if untimed:
            call()
            watch(last["value"])
        else:
            result.timing = time_call(call, world, spec.distributed, cfg,
                                      after_each=lambda: watch(last["value"]))
        if pair and watch.count == 1:
            poison_upcoming(rotation, slots, out_names)
            call()
            watch(last["value"])
    except KeyboardInterrupt:
        raise
    except IMPL_RAISES as exc:
        return last, f"failed while timing: {raised(exc)}"
    return last, ""


def _timed_inputs(world: World, case: Case, calls: Calls, cfg: TimingConfig, recheck: bool,
                  out_names: set[str]
                  ) -> tuple[list[dict[str, Any]], CaseSetup, dict[str, compare.Tolerance],
                             str]:
    """The input slots the timed calls rotate over, whose values they hold (the first call's,
    always, where the last call is checked), their tolerances, and the stage that check
    is."""
    values = calls.values  # whose values the last call's inputs hold
    assert values is not None and calls.setup is not None
    if not cfg.full and recheck and values is not calls.setup:
        # a token call (one, untimed in effect): it takes the case's own values written into
        # the buffers of the last checked call, which held the twin's, so that a result kept
        # by buffer address is the twin's and fails, as the real timing's last call shows
        tols = tolerances(case, calls.setup.expected)
        return ([_refill(calls.inputs, calls.setup, case.spec, world.device)], calls.setup,
                interpreted_lens(tols) if cfg.interpreter else tols, "reused_buffers")
    slots = _timing_slots(calls.inputs, case.spec, cfg, out_names if recheck else set())
    return slots, values, calls.tols, "after_timing"


def _timing_slots(inputs: dict[str, Any], spec: OpSpec, cfg: TimingConfig,
                  poisoned: set[str]) -> list[dict[str, Any]]:
    """The input sets the timed repeats rotate over: ``inputs`` and, where the case shifts its
    buffers, up to TIMING_SLOTS - 1 shifted copies within the budget; the outputs ``poisoned``
    poisoned in each, so that the last output can be checked again."""
    slots = [inputs]
    if spec.shift_buffers:
        size = max(nbytes(inputs), 1)
        # no more copies than calls: a token timing makes one
        calls = cfg.warmup + cfg.max_repeats
        count = max(1, min(TIMING_SLOTS, TIMING_SLOT_BUDGET_BYTES // size, calls + 1))
        slots += [relocate(inputs, shift_bytes=SHIFT_BYTES * (j + 1)) for j in range(1, count)]
    for slot in slots:
        for name in poisoned:
            if slot[name] is not None:
                poison_(slot[name])
    return slots


def _rates(world: World, case: Case, result: CaseResult, cfg: TimingConfig,
           calibration: Mapping[str, Any] | None, real: bool) -> str:
    """The bandwidth and FLOP rates of a timed result (``result.derived``), and for a ``real``
    timing why its time is impossible ("" when it is not). An interpreter's time gives no rate
    of the kernel."""
    spec = case.spec
    if not (result.timing and spec.work is not None and not cfg.interpreter):
        return ""
    work = spec.work(case.params, case.world_size)
    result.derived = derived(work, result.timing.get("median"))
    result.derived.update(percent_of_peak(result.derived, calibration, work.flops_dtype))
    if not real:
        return ""
    return impossible(work, result.derived, calibration, llc_bytes(world.device), cfg.l2_flush)


def _judge_honesty(world: World, result: CaseResult, tampered: list[str],
                   impossible_why: str) -> None:
    """Fail a timed result whose clock was replaced, or whose time is impossible."""
    # the same on every rank: the clock check is per rank, the times are every rank's maximum
    tampered_anywhere = world.allreduce_max(1.0 if tampered else 0.0) > 0 if world.size > 1 \
        else bool(tampered)
    if tampered_anywhere:
        names = ", ".join(sorted(set(tampered))) or "on another rank"
        result.timing["tampered"] = tampered
        result.status = "fail"
        result.reason = (f"a clock was replaced while the call was timed ({names}): an "
                         "implementation may not patch the timer; restored for later cases")
    elif impossible_why:
        result.timing["impossible"] = impossible_why
        result.status, result.reason = "fail", impossible_why


def _refill(slot: dict[str, Any], values: CaseSetup, spec: OpSpec, device: torch.device
            ) -> dict[str, Any]:
    """``slot`` (input buffers a call used) holding ``values``'s inputs, copied into the same
    memory, the output buffers poisoned."""
    written = set(spec.out_buffers.values()) - set(spec.readwrite_inputs)
    fresh = values.inputs(device)
    # the output buffers first: an in-place case's output is its input, which then takes
    # its values
    for name, new in sorted(fresh.items(), key=lambda item: item[0] not in written):
        old = slot.get(name)
        if (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)
                and old.shape == new.shape and old.dtype == new.dtype):
            if name in written:
                poison_(old)
            else:
                old.copy_(new)
        else:  # a count or a shape that the new values change: take it as it is
            slot[name] = poison_(new) if name in written and new is not None else new
    return slot


def _near(world: World, values: CaseSetup) -> CaseSetup | None:
    """The near twin of ``values`` where its call can show something: made on every rank
    (the op's code refuses no nudged value: a make_inputs rejecting duplicate keys is the
    spec's choice, no implementation's fault) and its reference not the case's bit for bit
    on some rank. The same answer on every rank."""
    try:
        near: CaseSetup | None = values.near()
        local = int(near.differs_from(values))
    except (SpecError, CaseError):
        near, local = None, -1
    everyone = world.comm.allgather(local) if world.size > 1 else [local]
    return near if min(everyone) >= 0 and max(everyone) == 1 else None


def _call(world: World, case: Case, impl: Callable[..., Any], slot: dict[str, Any],
          setup: CaseSetup) -> dict[str, Any]:
    """The outputs of one call on ``setup``'s values copied into ``slot`` (buffers the timed
    calls used), as it returned them."""
    spec = case.spec
    _refill(slot, setup, spec, world.device)
    try:
        value = impl(world, **slot) if spec.distributed else impl(**slot)
    finally:
        children.leave_if_forked()
    return normalize_outputs(value, spec.outputs, implementation=True)


def _on_near_values(world: World, case: Case, impl: Callable[..., Any], slot: dict[str, Any],
                    near: CaseSetup) -> dict[str, Any]:
    """One call on the near twin's values (the case's but a few elements per tensor) in
    ``slot``, measured against its reference: a result kept by a sample of the inputs (a
    fingerprint), filled by the timed calls on the case's values, is the case's and fails."""
    outputs = _call(world, case, impl, slot, near)
    return measure(outputs, near.expected, tolerances(near.case, near.expected), world.rank,
                   near.memos, near.magnitudes)


#: calls on other values after a case whose implementation still holds memory it returned:
#: a ring of output buffers up to this long overwrites the first call's output within them
RING_CALLS = 256


def _still_held(held: dict[str, tuple[torch.Tensor, torch.Tensor]]
                ) -> dict[str, tuple[torch.UntypedStorage, tuple[Any, ...]]]:
    """Let go of ``held`` (outputs, each with a copy of its bits); what the implementation
    still holds after that: each output's storage and where its bits lay, and those bits.
    Memory torch did not allocate (``from_numpy``, ``from_dlpack``: a storage that cannot be
    resized) is wrapped anew per call, so its storage dies while the memory may live on in
    the implementation: such an output is kept."""
    foreign = {name: (t.untyped_storage(), (t.storage_offset(), t.shape, t.stride(), t.dtype,
                                            t.device, was))
               for name, (t, was) in held.items() if not t.untyped_storage().resizable()}
    # torch/multiprocessing/reductions.py and torch/storage.py (read in 2.11 and 2.13): a
    # weak reference to the StorageImpl, and a strong one made from it while it lives
    layout = {name: (StorageWeakRef(t.untyped_storage()), (t.storage_offset(), t.shape,
                                                           t.stride(), t.dtype, t.device, was))
              for name, (t, was) in held.items() if name not in foreign}
    held.clear()
    if any(not ref.expired() for ref, _ in layout.values()):
        gc.collect()  # a reference cycle holds it until then
    return {**{name: (torch.UntypedStorage._new_with_weak_ptr(ref.cdata), rest)
               for name, (ref, rest) in layout.items() if not ref.expired()}, **foreign}


def _reused_later(world: World, impl: Callable[..., Any], slot: dict[str, Any],
                  watched: list[tuple[str, dict[str, tuple[torch.Tensor, torch.Tensor]],
                                      CaseSetup]]) -> str:
    """Let go of the outputs of each call ``watched`` names (its outputs, each with a copy,
    and values other than those it was made on): the first call's and the case's last call's,
    which a ring that starts after the first call holds; where the implementation still holds
    the memory of one (``_still_held``: a ring of outputs, an arena, a list), make
    ``RING_CALLS`` more calls, shared among those held, each on its call's other values, and
    name the output they overwrote ("" if none). A ring longer than a case's 20-odd calls
    passes ``changed_since``, yet its next turn rewrites what a caller holds; an arena or a
    list that never writes it again passes."""
    rounds = [(which, _still_held(held), values) for which, held, values in watched]
    rounds = [(which, kept, values) for which, kept, values in rounds if kept]
    made = 0
    for which, kept, values in rounds:
        for _ in range(RING_CALLS // len(rounds)):
            _call(world, values.case, impl, slot, values)
        made += RING_CALLS // len(rounds)
        for name, (storage, (offset, shape, stride, dtype, device, was)) in kept.items():
            now = torch.empty(0, dtype=dtype, device=device).set_(storage, offset, shape,
                                                                  stride)
            if not same_bits(now, was):
                return (f"output {name!r} of {which} was overwritten by one of {made} later "
                        "calls on other values: the implementation keeps memory it returned "
                        "and reuses it (a ring of output buffers) under its caller's feet; "
                        "return memory of its own per call")
    return ""


def _on_new_values(world: World, case: Case, impl: Callable[..., Any], slot: dict[str, Any],
                   values: CaseSetup, stages: dict[str, dict[str, Any]], checks: list[str],
                   later: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[str]:
    """After a real timing, the calls on new values in buffers the timed calls used: the
    near twin's where it can show something, then the twin's (its outputs of their own
    memory into ``later``). The clocks replaced meanwhile (restored)."""
    near = _near(world, values)
    if near is not None:
        stages["near_values"] = _on_near_values(world, case, impl, slot, near)
        checks.append("near_values")
    later.update(_recheck_in_seen_buffers(world, case, impl, slot, values.twin(), stages))
    checks += ["reused_buffers", "settled"]
    return clock_tampering()


def _recheck_in_seen_buffers(world: World, case: Case, impl: Callable[..., Any],
                             slot: dict[str, Any], twin: CaseSetup,
                             stages: dict[str, dict[str, Any]]
                             ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One more call, on the twin case's values copied into ``slot`` (buffers the timed calls
    used): its outputs, read the moment it returns, must match the twin's reference (a result
    kept by buffer address or call count is stale), and must still be what they were after the
    device is synchronised and a moment has passed (work finishing later). Its outputs of
    their own memory, each with a copy (``own_memory``)."""
    outputs = _call(world, case, impl, slot, twin)
    seen = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
    # work still running on the device finishes at the synchronise; a host thread gets a
    # moment. Output still being written when the call returned fails the reference (``seen``
    # was read then); one that changes within the moment fails ``settled``; the first
    # call's outputs are compared once more after all this (``changed_since``), which sees a
    # thread that wrote them during the timing. One later still is not seen
    world.synchronize()
    time.sleep(SETTLE_S)
    world.synchronize()
    twin_tols = tolerances(twin.case, twin.expected)
    stages["reused_buffers"] = measure(seen, twin.expected, twin_tols, world.rank, twin.memos,
                                       twin.magnitudes)
    snapshot = {k: v for k, v in seen.items() if isinstance(v, torch.Tensor)}
    stages["settled"] = measure(outputs, snapshot, {k: compare.exact() for k in snapshot},
                                world.rank)
    return own_memory(outputs, slot)


# the runner's own names for the timing's functions count as its clock too
timing.watch(sys.modules[__name__])
