"""run_case: inputs -> implementation -> compare -> time -> CaseResult.

Every rank calls ``run_case`` for the same case in the same order. The verdict is reached
collectively (metrics of all ranks merged on rank 0 and broadcast), so every rank agrees on
pass or fail and pytest's ``-x`` stops all ranks at the same item. Only rank 0 returns the full
``CaseResult``; the others return one with the same status.

A case is checked up to three times, each check catching a class of bug the others miss:

1. ``call``: the implementation on fresh inputs, output buffers poisoned (an element it does
   not write stays NaN or a sentinel and fails).
2. ``shifted``: again on a fresh copy of the inputs in new memory at a shifted offset, after
   poisoning every buffer of the first call (catches caches keyed by address and reads of
   stale buffers). Its peak memory is the case's peak memory.
3. ``after_timing``: the timed repeats rotate over shifted copies of the inputs (as nccl-tests
   shifts its buffers between iterations); the last repeat's output is checked again, when the
   case does not write its inputs in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import itertools
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness.core import compare
from harness.core.buffers import (
    ALIGN_BYTES,
    flat_bytes,
    fresh_memory_poisoned,
    lies_within,
    nbytes,
    overlaps,
    poison_,
    relocate,
    same_bits,
    tensors,
)
from harness.core.golden import GoldenError, GoldenShelf, GoldenStore, check_output
from harness.core.results import CaseResult
from harness.core.spec import Case, OpSpec
from harness.core.timing import (
    TimingConfig,
    clock_tampering,
    derived,
    impossible,
    llc_bytes,
    percent_of_peak,
    time_call,
)
from harness.device import triton_impl
from harness.device.memory import NOT_MEASURED, PeakMemory
from harness.device.runtime import World


class CaseError(Exception):
    """The implementation broke a contract (raised, wrong output type, clobbered an input)."""


def normalize_outputs(value: Any, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """An implementation's return value as {output name: tensor}."""
    if isinstance(value, torch.Tensor):
        return {names[0]: value}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise CaseError(f"returned {len(value)} outputs, expected {len(names)} {names}")
        return dict(zip(names, value, strict=True))
    raise CaseError(f"returned a {type(value).__name__}; expected a tensor, tuple or dict")


#: the parameter that reseeds a case's inputs for the check after timing (CaseSetup.twin)
TWIN_PARAM = "twin"
#: how long a host thread gets to change an output after the call returned
SETTLE_S = 0.001

#: the name suffix of an output's float64 value before its rounding (OpSpec.exact)
EXACT_SUFFIX = ":exact"
#: the precision lens's default share of elements that may differ from the float64 value
#: rounded once: correct float32 orders move a fraction of a percent, a second rounding a quarter
#: (benchmarks/precision_lens.py)
EXACT_OFF = 0.02


def tolerances(case: Case, expected: Mapping[str, torch.Tensor]) -> dict[str, compare.Tolerance]:
    """The tolerance of each output: the spec's (fixed, per output, or a function of the case),
    else the dtype's default."""
    tol = case.spec.tolerance
    if callable(tol) and not isinstance(tol, compare.Tolerance):
        tol = tol(case.params, case.world_size)
    out = {}
    for name, exp in expected.items():
        if name.endswith(EXACT_SUFFIX):  # the precision lens (OpSpec.exact)
            given = tol.get(name) if isinstance(tol, Mapping) else None
            out[name] = given or compare.rounding(EXACT_OFF)
        elif isinstance(tol, compare.Tolerance):
            out[name] = tol
        elif isinstance(tol, Mapping) and name in tol:
            out[name] = tol[name]
        else:
            out[name] = compare.default_for(exp.dtype)
    return out


def _interpreted_lens(tols: Mapping[str, compare.Tolerance]) -> dict[str, compare.Tolerance]:
    """The precision lens for a kernel run by Triton's interpreter, which converts float32 to
    bf16 by truncation (suites/_triton/hopper.py): the share of elements off the value rounded
    once says nothing of the compiled kernel, so only an explicit ``ulps`` bound holds."""
    return {name: compare.rounding(1.0, t.ulps)
            if name.endswith(EXACT_SUFFIX) and t.kind == "rounding" else t
            for name, t in tols.items()}


def expected_outputs(case: Case, rank: int) -> dict[str, torch.Tensor]:
    spec = case.spec
    if spec.expected is not None:
        value = spec.expected(case.params, rank, case.world_size)
    else:
        value = spec.reference(**spec.make_inputs(case.params, rank, case.world_size))
    return normalize_outputs(value, spec.outputs)


#: a case's pristine inputs are kept for its next implementation up to this size; bigger ones
#: (the stress tier) are generated again, as a copy would double their memory
SETUP_CACHE_CAP_BYTES = 256 << 20


class CaseSetup:
    """One rank's inputs and reference outputs of one case, made once for all of the case's
    implementations (they run back to back): each call gets a fresh copy of the pristine
    inputs, in new memory, bit for bit what generating them again would give. Inputs over
    ``SETUP_CACHE_CAP_BYTES`` are not kept; each copy is then generated afresh."""

    def __init__(self, case: Case, rank: int, *, lens: bool = True) -> None:
        spec = case.spec
        self.case, self.rank = case, rank
        made = spec.make_inputs(case.params, rank, case.world_size)
        self.pristine: dict[str, Any] | None = (
            made if nbytes(made) <= SETUP_CACHE_CAP_BYTES else None)
        if spec.expected is None and self.pristine is not None:
            # the reference gets its own copy of the kept inputs: it may write them
            self.expected = normalize_outputs(spec.reference(**relocate(made)), spec.outputs)
        else:
            self.expected = expected_outputs(case, rank)
        #: per output, what a chunk equal to the reference adds to the metrics (compare.measure)
        self.memos: dict[str, dict[Any, Any]] = {}
        #: per output, each element's magnitude (``OpSpec.magnitude``), or nothing
        self.magnitudes: dict[str, torch.Tensor] = (
            dict(spec.magnitude(**made)) if spec.magnitude else {})
        if spec.exact is not None and lens:
            # a second reference per output: the float64 value before its one rounding
            for name, value in spec.exact(**made).items():
                self.expected[f"{name}{EXACT_SUFFIX}"] = value
        self._first: dict[str, Any] | None = made if self.pristine is None else None
        self._twin: CaseSetup | None = None

    def twin(self) -> CaseSetup:
        """The same case with other input values (``TWIN_PARAM`` in its params reseeds every
        input keyed on them) and their reference: what an implementation is checked on, in
        buffers it has seen, after its timing. Made once for all the case's implementations."""
        if self._twin is None:
            twin = Case(self.case.spec, {**self.case.params, TWIN_PARAM: 1}, self.case.world_size)
            self._twin = CaseSetup(twin, self.rank, lens=False)  # staleness, not precision
        return self._twin

    def inputs(self, device: torch.device, shift_bytes: int = 0) -> dict[str, Any]:
        """A fresh set of inputs on ``device``, ``shift_bytes`` into new memory."""
        if self.pristine is not None:
            return relocate(self.pristine, shift_bytes=shift_bytes, device=device)
        made, self._first = self._first, None
        if made is None:  # not kept: generate again
            made = self.case.spec.make_inputs(self.case.params, self.rank, self.case.world_size)
        return _place(made, device, shift_bytes)


class SetupCache:
    """The ``CaseSetup`` of the last case a rank ran. A case whose inputs are over the cap
    keeps it too: its inputs are made afresh per call, but its reference outputs and
    magnitudes, the costly part of a stress case, are made once for all its
    implementations."""

    def __init__(self) -> None:
        self._last: CaseSetup | None = None

    def get(self, case: Case, rank: int) -> CaseSetup:
        last = self._last
        if last is None or last.case.spec is not case.spec or last.case.id != case.id or \
                last.rank != rank or last.case.world_size != case.world_size:
            self._last = None  # free the last case's tensors before making the next
            last = self._last = CaseSetup(case, rank)
        return last


def _hash(outputs: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(outputs):
        t = outputs[name]
        if isinstance(t, torch.Tensor):
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(flat_bytes(t).cpu().numpy().data)  # hashed in place, not copied
    return h.hexdigest()


#: the second check moves inputs this far into fresh memory
SHIFT_BYTES = ALIGN_BYTES
#: inputs bigger than this are not copied for the shifted check
RELOCATE_CAP_BYTES = 1 << 30
#: at most this many shifted input sets rotate between timed repeats, within this budget
TIMING_SLOTS, TIMING_SLOT_BUDGET_BYTES = 4, 256 << 20

_STAGE_PREFIX = {
    "call": "",
    "shifted": "with the inputs moved to fresh shifted memory and the old buffers poisoned: ",
    "after_timing": "after the timed repeats (on shifted buffer copies): ",
    "reused_buffers": ("on new input values written into buffers it had seen while timed "
                       "(a result cached by buffer or by call?): "),
    "settled": ("its outputs changed after the call returned (work left running on another "
                "thread or stream, outside the timed interval): "),
}


def _writable(case: Case, inputs: Mapping[str, Any]) -> set[str]:
    """Inputs an implementation may write: the output buffers, the in-place inputs of an
    in-place case, and every input that overlaps one of them (x as a slice of out)."""
    spec = case.spec
    roots = set(spec.out_buffers.values()) | set(spec.readwrite_inputs)
    if case.params.get("inplace"):
        roots |= set(spec.inplace_inputs)
    root_tensors = [inputs[r] for r in roots if isinstance(inputs.get(r), torch.Tensor)]
    return {k for k, v in inputs.items() if isinstance(v, torch.Tensor)
            and (k in roots or any(overlaps(v, t) for t in root_tensors))}


def _call(world: World, case: Case, impl: Callable[..., Any], inputs: Mapping[str, Any],
          fresh_poison: bool = False) -> dict[str, torch.Tensor]:
    """One checked call; ``fresh_poison``: what it allocates starts as poison (the first call
    of a case: a later one reuses the blocks of an earlier one's outputs, which the first
    call's check has already judged)."""
    try:
        with (fresh_memory_poisoned(world.device, nbytes(inputs)) if fresh_poison
              else contextlib.nullcontext()):
            raw = impl(world, **inputs) if case.spec.distributed else impl(**inputs)
            world.synchronize()
    except Exception as exc:
        raise CaseError(f"implementation raised {type(exc).__name__}: {exc}") from exc
    return normalize_outputs(raw, case.spec.outputs)


def _check_contract(case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                    guards: Mapping[str, torch.Tensor]) -> None:
    """Untouched read-only inputs, outputs in the buffers provided, in-place outputs aliased."""
    spec = case.spec
    for k, before in guards.items():
        if not same_bits(inputs[k], before):
            raise CaseError(f"input {k!r} was modified, but this case may not write it")
    for out_name, in_name in spec.out_buffers.items():
        buf, got = inputs[in_name], outputs.get(out_name)
        if buf is None:  # this case has no such output (bf16 data has no fp8 scales)
            continue
        if not (isinstance(got, torch.Tensor) and got.data_ptr() == buf.data_ptr()
                and got.shape == buf.shape and got.dtype == buf.dtype):
            raise CaseError(f"output {out_name!r} must be written into the buffer passed as "
                            f"{in_name!r} and returned, not into a new tensor")
    if case.params.get("inplace") and spec.inplace_inputs:
        first_in = inputs[spec.inplace_inputs[0]]
        first_out = outputs.get(spec.outputs[0])
        if not (isinstance(first_out, torch.Tensor) and lies_within(first_out, first_in)):
            raise CaseError(f"in-place case: output {spec.outputs[0]!r} does not alias input "
                            f"{spec.inplace_inputs[0]!r}")


def _measure(outputs: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
             tols: Mapping[str, compare.Tolerance], rank: int,
             memos: dict[str, dict[Any, Any]] | None = None,
             magnitudes: Mapping[str, torch.Tensor] | None = None
             ) -> dict[str, dict[str, Any]]:
    # an expected entry "out:label" is a second reference for output "out" (an FP8 GEMM is
    # compared with the dequantized product and with the unquantized one)
    missing = {name.split(":")[0] for name in expected} - set(outputs)
    if missing:
        raise CaseError(f"missing outputs {sorted(missing)}")
    memos = {} if memos is None else memos
    return {name: {"metrics": compare.measure(outputs[name.split(":")[0]], expected[name], tol,
                                              rank=rank, memo=memos.setdefault(name, {}),
                                              dtype=_required_dtype(name, expected[name]),
                                              magnitude=(magnitudes or {}).get(name)
                                              ).to_dict(),
                   "tolerance": tol.to_dict()}
            for name, tol in tols.items()}


def _required_dtype(name: str, expected: torch.Tensor) -> torch.dtype | None:
    """The dtype an output must have: its reference's, except against a float64 reference
    (kept wider than any output on purpose) or a second reference (``out:label``)."""
    if ":" in name or expected.dtype == torch.float64:
        return None
    return expected.dtype


def _place(values: Mapping[str, Any], device: torch.device, shift_bytes: int = 0
           ) -> dict[str, Any]:
    """Inputs on the device (aliasing kept); shifted into fresh memory when asked."""
    if device.type == "cpu" and shift_bytes == 0:
        return dict(values)
    return relocate(values, shift_bytes=shift_bytes, device=device)


def _agree(world: World, local: Any, judge: Callable[[list[Any]], Any]) -> Any:
    """Every rank's ``local`` judged on rank 0, the verdict broadcast so all ranks agree."""
    gathered = world.comm.gather(local, root=0) if world.size > 1 else [local]
    verdict = judge(gathered) if world.rank == 0 else None
    if world.size > 1:
        verdict = world.comm.bcast(verdict, root=0)
    assert verdict is not None
    return verdict


def _gather_verdict(world: World, case: Case, local_error: str,
                    stages: dict[str, dict[str, Any]]) -> tuple[str, str, dict[str, Any], int]:
    return _agree(world, (local_error, stages), lambda gathered: _judge(gathered, case))


def _gather_peak(world: World, peak: int | None, kind: str) -> tuple[int | None, str]:
    if world.size == 1:
        return peak, kind
    everyone = world.comm.gather((peak, kind), root=0)
    if world.rank != 0:
        return peak, kind
    if any(p is None for p, _ in everyone):
        return None, NOT_MEASURED
    return max(p for p, _ in everyone), kind


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
    except Exception as exc:
        local = ("error", f"asking whether the case can run raised {type(exc).__name__}: "
                          f"{exc}")
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
) -> CaseResult:
    """Run, check and time one implementation on one case, on every rank.

    With a ``golden`` store the first call's outputs are also compared with the stored golden
    (when the case has one); a mismatch fails the case with the golden's file named. With
    ``setups`` the inputs and reference of a case are made once for all its implementations.
    """
    spec = case.spec
    started = time.time()
    t0 = time.perf_counter()
    result = CaseResult(
        run_id=run_id, case_id=case.id, op=spec.name, family=spec.family, impl=impl_name,
        world_size=case.world_size, params=dict(case.params), status="pass",
        device=str(world.device), backend=world.backend if spec.distributed else None,
        started_at=started, env_id=env_id,
    )
    local_error = ""
    stages: dict[str, dict[str, Any]] = {}
    digest = ""
    golden_local: dict[str, Any] | None = None
    inputs: dict[str, Any] = {}
    expected: dict[str, torch.Tensor] = {}
    tols: dict[str, compare.Tolerance] = {}
    writable: set[str] = set()
    status, why = _skip_or_error(world, case, impl)
    if status:
        result.status, result.reason = status, why
        result.duration_s = time.perf_counter() - t0
        return result
    # the same on every rank: the same implementation on the same kind of device
    result.interpreter = triton_impl.interpreter_of(impl, world.device.type)
    mem = PeakMemory(world.device)
    checks = ["poisoned_outputs"] if spec.out_buffers else []
    clock_tampering()  # an untimed implementation before this one may have left a patch
    try:
        setup = (setups or SetupCache()).get(case, world.rank)
        inputs = setup.inputs(world.device)
        writable = _writable(case, inputs)
        guards = {k: v.clone() for k, v in inputs.items()
                  if isinstance(v, torch.Tensor) and k not in writable}
        expected = setup.expected
        tols = tolerances(case, expected)
        if result.interpreter:
            tols = _interpreted_lens(tols)
        with mem:
            outputs = _call(world, case, impl, inputs, fresh_poison=True)
        _check_contract(case, inputs, outputs, guards)
        stages["call"] = _measure(outputs, expected, tols, world.rank, setup.memos,
                                  setup.magnitudes)
        digest = _hash(outputs)
        if golden is not None:
            golden_local = _golden_check(golden, case, outputs, tols, world.rank,
                                         setup.magnitudes)
        if spec.shift_buffers and nbytes(inputs) <= RELOCATE_CAP_BYTES:
            shifted = setup.inputs(world.device, SHIFT_BYTES)
            for _, t in tensors(inputs):
                poison_(t)
            del outputs
            inputs = shifted
            mem = PeakMemory(world.device)
            with mem:
                outputs = _call(world, case, impl, inputs)
            _check_contract(case, inputs, outputs, guards)
            stages["shifted"] = _measure(outputs, expected, tols, world.rank, setup.memos,
                                         setup.magnitudes)
            checks.append("shifted_buffers")
    except CaseError as exc:
        local_error = str(exc)
    except Exception as exc:  # a bug in the spec or harness: say where
        local_error = f"harness error {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"

    result.status, result.reason, result.outputs, result.wrong = _gather_verdict(
        world, case, local_error, stages)
    if golden is not None:
        result.golden, status, reason = _agree(world, golden_local, _judge_golden)
        if result.status == "pass" and status != "pass":
            result.status, result.reason = status, reason

    # ---- output hash of every rank's first-call outputs, in rank order
    if result.status in ("pass", "fail") and digest:
        digests = world.comm.gather(digest, root=0) if world.size > 1 else [digest]
        if world.rank == 0:
            result.output_hash = hashlib.sha256("".join(digests).encode()).hexdigest()

    # ---- timing, only of implementations that are correct
    if bench and result.status == "pass":
        cfg = timing or TimingConfig()
        if result.interpreter:
            cfg = cfg.interpreted(result.interpreter)
        _time_and_recheck(world, case, impl, inputs, writable, expected, tols, result,
                          cfg, checks, calibration, setup.memos, setup.magnitudes, setup)
    result.checks = checks
    result.peak_memory_bytes, result.peak_memory_kind = _gather_peak(world, mem.bytes, mem.kind)
    result.duration_s = time.perf_counter() - t0
    return result


def _golden_check(store: GoldenStore | GoldenShelf, case: Case,
                  outputs: Mapping[str, torch.Tensor], tols: Mapping[str, compare.Tolerance],
                  rank: int, magnitudes: Mapping[str, torch.Tensor] | None = None
                  ) -> dict[str, Any]:
    """This rank's outputs against the stored golden: {"file", "outputs"}, {"error"} or
    {"absent"} when the case has no golden."""
    try:
        if isinstance(store, GoldenShelf):
            store = store.for_op(case.spec.name)
        if store.entry(case.id, case.world_size) is None:
            return {"absent": True}
        path, stored = store.load(case.id, case.world_size, rank)
    except GoldenError as exc:
        return {"error": str(exc)}
    tols = {k: t for k, t in tols.items() if not k.endswith(EXACT_SUFFIX)}  # not stored
    if set(stored) != set(tols):
        return {"error": f"golden {path} holds outputs {sorted(stored)} but the op produces "
                         f"{sorted(tols)}: regenerate it with `harness golden generate --accept`"}
    report = {}
    for name, value in stored.items():
        actual = outputs.get(name.split(":")[0])
        if not isinstance(actual, torch.Tensor):
            return {"error": f"output {name!r} is missing, but golden {path} has it"}
        report[name] = check_output(actual, value, tols[name], rank,
                                    (magnitudes or {}).get(name)).to_dict()
    return {"file": str(path), "outputs": report}


def _judge_golden(gathered: list[dict[str, Any] | None]
                  ) -> tuple[dict[str, Any] | None, str, str]:
    """Every rank's golden report merged into (summary, status, reason)."""
    if all(g is None for g in gathered):  # the case broke before its outputs existed
        return None, "pass", ""
    for rank, g in enumerate(gathered):
        if g is not None and "error" in g:
            return {"status": "error", "reason": g["error"]}, "error", f"rank {rank}: {g['error']}"
    if any(g is not None and g.get("absent") for g in gathered):
        return {"status": "absent"}, "pass", ""
    reports = [g for g in gathered if g is not None]
    outputs: dict[str, Any] = {}
    failed: list[str] = []
    for name in reports[0]["outputs"]:
        parts = [r["outputs"][name] for r in reports]
        tol_dict = parts[0]["tolerance"]
        merged = compare.Metrics.merge([compare.Metrics.from_dict(p["metrics"]) for p in parts])
        ok, why = compare.verdict(merged, compare.Tolerance.from_dict(tol_dict))
        sums = next((f"rank {r}: {p['sums_error']}" for r, p in enumerate(parts)
                     if p["sums_error"]), "")
        if ok and sums:
            ok, why = False, sums
        outputs[name] = {"kind": parts[0]["kind"], "metrics": merged.to_dict(),
                         "tolerance": tol_dict, "passed": ok}
        if not ok:
            failed.append(f"{name}: {why}")
    status = "fail" if failed else "pass"
    summary = {"status": status, "file": reports[0]["file"], "outputs": outputs}
    reason = f"against the golden {reports[0]['file']}: " + "; ".join(failed) if failed else ""
    return summary, status, reason


def _time_and_recheck(world: World, case: Case, impl: Callable[..., Any],
                      inputs: dict[str, Any], writable: set[str],
                      expected: Mapping[str, torch.Tensor],
                      tols: Mapping[str, compare.Tolerance], result: CaseResult,
                      cfg: TimingConfig, checks: list[str],
                      calibration: Mapping[str, Any] | None = None,
                      memos: dict[str, dict[Any, Any]] | None = None,
                      magnitudes: Mapping[str, torch.Tensor] | None = None,
                      setup: CaseSetup | None = None) -> None:
    """Time over rotating shifted copies of the inputs, then check the last output again;
    then, where the timing was real, check that the time could be honest: not below the
    calibrated limits, no clock replaced, right on new values in buffers seen before (a
    cache), and outputs that stay put after the call returns (work left running)."""
    spec = case.spec
    out_names = set(spec.out_buffers.values()) - set(spec.readwrite_inputs)
    # in-place cases change their inputs on every repeat: their last output is not checkable
    recheck = writable <= out_names | set(spec.readwrite_inputs)
    slots = [inputs]
    if spec.shift_buffers:
        size = max(nbytes(inputs), 1)
        # no more copies than calls: a token timing makes one
        calls = cfg.warmup + cfg.max_repeats
        count = max(1, min(TIMING_SLOTS, TIMING_SLOT_BUDGET_BYTES // size, calls + 1))
        slots += [relocate(inputs, shift_bytes=SHIFT_BYTES * (j + 1)) for j in range(1, count)]
    if recheck:
        for slot in slots:
            for name in out_names:
                if slot[name] is not None:
                    poison_(slot[name])
    # the first call takes a new copy (the inputs of the shifted check have been used)
    rotation = itertools.cycle(slots[1:] + slots[:1])
    last: dict[str, Any] = {}

    def call() -> None:
        args = next(rotation)
        last["value"] = impl(world, **args) if spec.distributed else impl(**args)

    local_error = ""
    tampered = clock_tampering()  # replaced by its calls so far (restored; so are the next)
    try:
        result.timing = time_call(call, world, spec.distributed, cfg)
    except Exception as exc:
        local_error = f"failed while timing: {type(exc).__name__}: {exc}"
    tampered += clock_tampering()
    real = bool(result.timing) and not cfg.minimal and not cfg.interpreter
    impossible_why = ""
    if result.timing and spec.work is not None and not cfg.interpreter:
        # (an interpreter's time gives no bandwidth or FLOP rate of the kernel)
        work = spec.work(case.params, case.world_size)
        result.derived = derived(work, result.timing.get("median"))
        result.derived.update(percent_of_peak(result.derived, calibration, work.flops_dtype))
        if real:
            impossible_why = impossible(work, result.derived, calibration,
                                        llc_bytes(world.device), cfg.l2_flush)
    # every rank takes part in this verdict, so a timing error on one rank reaches them all
    stages: dict[str, dict[str, Any]] = {}
    if recheck and not local_error:
        try:
            outputs = normalize_outputs(last["value"], spec.outputs)
            stages["after_timing"] = _measure(outputs, expected, tols, world.rank, memos,
                                              magnitudes)
            checks.append("after_timing")
            if real and setup is not None and nbytes(inputs) <= RELOCATE_CAP_BYTES:
                _recheck_in_seen_buffers(world, case, impl, slots[0], setup.twin(), stages)
                checks += ["reused_buffers", "settled"]
                tampered += clock_tampering()
        except Exception as exc:
            local_error = f"after timing: {type(exc).__name__}: {exc}"
    status, reason, outputs_report, wrong = _gather_verdict(world, case, local_error, stages)
    if status != "pass":
        result.status, result.reason = status, reason
        result.outputs, result.wrong = outputs_report, wrong
        return
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


def _recheck_in_seen_buffers(world: World, case: Case, impl: Callable[..., Any],
                             slot: dict[str, Any], twin: CaseSetup,
                             stages: dict[str, dict[str, Any]]) -> None:
    """One more call, on the twin case's values copied into ``slot`` (buffers the timed calls
    used): its outputs, read the moment it returns, must match the twin's reference (a result
    kept by buffer address or call count is stale), and must still be what they were after the
    device is synchronised and a moment has passed (work finishing later)."""
    spec = case.spec
    fresh = twin.inputs(world.device)
    written = set(spec.out_buffers.values()) - set(spec.readwrite_inputs)
    for name, new in fresh.items():
        old = slot.get(name)
        if (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)
                and old.shape == new.shape and old.dtype == new.dtype):
            if name in written:
                poison_(old)
            else:
                old.copy_(new)
        else:  # a count or a shape that the new values change: take it as it is
            slot[name] = poison_(new) if name in written and new is not None else new
    value = impl(world, **slot) if spec.distributed else impl(**slot)
    outputs = normalize_outputs(value, spec.outputs)
    seen = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
    # work still running on the device finishes at the synchronise; a host thread gets a
    # moment. Either way a late writer is caught: here if it finished, by the reference if not
    world.synchronize()
    time.sleep(SETTLE_S)
    world.synchronize()
    twin_tols = tolerances(twin.case, twin.expected)
    stages["reused_buffers"] = _measure(seen, twin.expected, twin_tols, world.rank, twin.memos,
                                        twin.magnitudes)
    snapshot = {k: v for k, v in seen.items() if isinstance(v, torch.Tensor)}
    stages["settled"] = _measure(outputs, snapshot, {k: compare.exact() for k in snapshot},
                                 world.rank)


def _judge(gathered: list[tuple[str, dict[str, Any]]], case: Case
           ) -> tuple[str, str, dict[str, Any], int]:
    """Merge every rank's metrics into (status, reason, outputs, #wrong): the first stage that
    fails decides, else the last stage's metrics are reported."""
    errors = [(r, e) for r, (e, _) in enumerate(gathered) if e]
    if errors:
        rank, msg = errors[0]
        more = f" (and {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
        return "error", f"rank {rank}: {msg}{more}", {}, 0
    verdict: tuple[str, str, dict[str, Any], int] = ("pass", "", {}, 0)
    for stage in gathered[0][1]:
        verdict = _judge_stage([stages[stage] for _, stages in gathered], stage, case.spec)
        if verdict[0] != "pass":
            break
    return verdict


def _judge_stage(per_rank: list[dict[str, Any]], stage: str, spec: OpSpec
                 ) -> tuple[str, str, dict[str, Any], int]:
    outputs: dict[str, Any] = {}
    failed: list[tuple[str, str]] = []  # (output, why), in pipeline order
    wrong = 0
    order = {name: i for i, name in enumerate(spec.outputs)}
    for name in sorted(per_rank[0], key=lambda n: order.get(n.split(":")[0], len(order))):
        tol_dict = per_rank[0][name]["tolerance"]
        tol = compare.Tolerance.from_dict(tol_dict)
        merged = compare.Metrics.merge(
            [compare.Metrics.from_dict(m[name]["metrics"]) for m in per_rank])
        ok, why = compare.verdict(merged, tol)
        wrong += merged.n_mismatch
        outputs[name] = {"metrics": merged.to_dict(), "tolerance": tol_dict, "passed": ok}
        if not ok:
            failed.append((name, why))
    if not failed:
        return "pass", "", outputs, wrong
    text = "; ".join(f"{name}: {why}" for name, why in failed)
    if spec.pipeline:
        (first, why), later = failed[0], [name for name, _ in failed[1:]]
        text = f"first divergence at stage {first!r}: {why}"
        if later:
            text += f"; later stages diverging too: {', '.join(later)}"
    return "fail", _STAGE_PREFIX.get(stage, "") + text, outputs, wrong
