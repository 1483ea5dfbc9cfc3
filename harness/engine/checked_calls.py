"""The checked calls of one implementation on one case, before any timing.

1. ``call``: the implementation on fresh inputs, output buffers poisoned (an element it does
   not write stays NaN or a sentinel and fails), what it allocates poisoned too; checked
   against the reference and the golden, and for its contract: nothing written outside the
   buffers given (redzones), read-only inputs untouched, outputs in the buffers passed and of
   their own memory.
1b. Where the op takes inputs at any address (``OpSpec.any_alignment``), a call on the same
   values moved off 16-byte alignment by one, two or four elements, by case (a vectorised
   kernel's paths for unaligned inputs; it may refuse them by raising).
1c. A call on the same values with the read-only inputs as rows of wider buffers
   (``OpSpec.fixed_layout_inputs``: a kernel that ignores an input's strides; it may refuse
   them by raising).
2. The second call, on a new set of inputs: shifted into fresh memory after every buffer of
   the first call was poisoned (caches keyed by address, reads of stale buffers), and where
   no real timing follows on the twin case's values (results kept by shape or call count).
   Its peak memory is the case's.

A distributed case keeps its ranks in step: a rank whose check failed still makes the second
call, so that the others' collectives are answered, then reports what it found.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import reprlib
import traceback
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core import compare
from harness.core.buffers import (
    ALIGN_BYTES,
    BytesOutside,
    Redzones,
    flat_bytes,
    fresh_memory_poisoned,
    lies_within,
    nbytes,
    overlaps,
    poison_,
    same_bits,
    same_value,
    tensors,
)
from harness.core.golden import GoldenShelf, GoldenStore
from harness.core.spec import IMPL_RAISES, Case, SpecError, raised
from harness.device import children
from harness.device.memory import PeakMemory
from harness.device.runtime import World, broken_context
from harness.engine.case_setup import (
    CaseError,
    CaseSetup,
    SetupCache,
    interpreted_lens,
    normalize_outputs,
    tolerances,
)
from harness.engine.verdict import STAGE_PREFIX, golden_check

#: the second check moves inputs this far into fresh memory
SHIFT_BYTES = ALIGN_BYTES
#: inputs bigger than this are not copied for the shifted check
RELOCATE_CAP_BYTES = 1 << 30
#: the misaligned call runs on every case up to this world size; past it on one case in
#: ``MISALIGNED_SHARE`` (by case id): a library may take another path at 8 ranks (NVLS, a
#: tree) with an unaligned fallback of its own, but on every case at 8 oversubscribed ranks
#: the call cost the smoke tier 3 s of its 90
MISALIGNED_MAX_WORLD = 4
MISALIGNED_SHARE = 4


def misaligned_here(case: Case, world_size: int) -> bool:
    """Whether ``case`` at ``world_size`` makes the misaligned call (``OpSpec.any_alignment``)."""
    if not case.spec.any_alignment:
        return False
    return (world_size <= MISALIGNED_MAX_WORLD
            or zlib.crc32(f"misaligned:{case.id}".encode()) % MISALIGNED_SHARE == 0)


def padded_here(case: Case, world_size: int) -> bool:
    """Whether ``case`` at ``world_size`` makes the padded call: every case as far as the
    misaligned call makes it on every case, one in ``MISALIGNED_SHARE`` past that; a
    distributed op's at one rank alone. Its ranks' shards differ (one empty, another a
    row), so one rank may refuse its padded inputs where another goes into the collective,
    which then pairs with the next call's: at one rank the same code reads the layouts."""
    if case.spec.fixed_layout_inputs == ("*",) or (case.spec.distributed and world_size > 1):
        return False
    return (world_size <= MISALIGNED_MAX_WORLD
            or zlib.crc32(f"padded:{case.id}".encode()) % MISALIGNED_SHARE == 0)


def paddable(case: Case, inputs: Mapping[str, Any], writable: Collection[str]) -> list[str]:
    """The inputs the padded call lays out anew: read-only tensors of two elements or more,
    contiguous, alone in their storage (a view of another input keeps its place in it), and
    not among the op's ``fixed_layout_inputs``."""
    every = list(tensors(inputs))
    storages = [(t.device, t.untyped_storage().data_ptr()) for _, t in every]
    return [name for (name, t), where in zip(every, storages, strict=True)
            if name in inputs and name not in writable
            and name not in case.spec.fixed_layout_inputs and t.numel() >= 2
            and t.is_contiguous() and storages.count(where) == 1]


def _roots(case: Case, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The buffers an implementation writes: the output buffers, the inputs every call
    updates, and the in-place inputs of an in-place case."""
    spec = case.spec
    roots = set(spec.out_buffers.values()) | set(spec.readwrite_inputs)
    if case.params.get("inplace"):
        roots |= set(spec.inplace_inputs)
    return {r: inputs[r] for r in roots if isinstance(inputs.get(r), torch.Tensor)}


def _writable(case: Case, inputs: Mapping[str, Any]) -> set[str]:
    """Inputs an implementation may write: the roots (``_roots``) and every input that
    overlaps one of them (x as a slice of out, or out as x's piece: there, only out's bytes,
    ``guards_for``)."""
    roots = _roots(case, inputs)
    return {k for k, v in inputs.items() if isinstance(v, torch.Tensor)
            and (k in roots or any(overlaps(v, t) for t in roots.values()))}


def guards_for(case: Case, inputs: Mapping[str, Any], writable: set[str]) -> dict[str, Any]:
    """A copy of each input the implementation may not write, to compare after: its tensors,
    and its lists, dicts and sets (the split sizes of an all-to-all, an MoE layer's tokens per
    expert: a kernel that rewrites them as offsets in place corrupts its caller's next use);
    and of a contiguous input that holds an output buffer (an in-place reduce_scatter's x,
    whose own-rank piece is out), the bytes outside it: NCCL's send buffer is const."""
    # containers copied as relocate copies them for each call
    guards: dict[str, Any] = {
        k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
        for k, v in inputs.items()
        if k not in writable and isinstance(v, (torch.Tensor, list, tuple, dict, set,
                                                bytearray))}
    roots = _roots(case, inputs)
    for k in writable - set(roots):
        v = inputs[k]
        inside = [t for t in roots.values() if lies_within(t, v) and not lies_within(v, t)]
        if inside and v.is_contiguous():
            guards[k] = BytesOutside(v, inside)
    return guards


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
    except KeyboardInterrupt:
        raise
    except IMPL_RAISES as exc:
        raise CaseError(f"implementation raised {raised(exc)}") from exc
    finally:
        children.leave_if_forked()
    return normalize_outputs(raw, case.spec.outputs, implementation=True)


def check_contract(case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                    guards: Mapping[str, Any], zones: Redzones,
                    expected: Mapping[str, Any]) -> None:
    """Nothing written outside the buffers given, untouched read-only inputs, outputs of
    their own memory and in a dense layout, outputs in the buffers provided, in-place outputs
    aliased."""
    spec = case.spec
    outside = zones.damage()
    if outside:
        raise CaseError(outside)
    for k, before in guards.items():
        if isinstance(before, BytesOutside):
            if before.changed():
                raise CaseError(f"input {k!r} was modified outside the output buffer it holds, "
                                "but an in-place call may write only that buffer (NCCL's "
                                "send buffer is const)")
            continue
        if not same_value(inputs[k], before):
            what = "" if isinstance(before, torch.Tensor) else (
                f" ({reprlib.repr(before)} -> {reprlib.repr(inputs[k])})")
            raise CaseError(f"input {k!r} was modified{what}, but this case may not write it")
    read_only = {k: inputs[k] for k, v in guards.items() if isinstance(v, torch.Tensor)}
    shared = "" if spec.outputs_may_alias else _shared_memory(outputs, read_only)
    if shared:
        raise CaseError(shared)
    # an output that may be its input (DTensor's redistribute) has that input's layout
    inputs_kept = list(read_only.values()) if spec.outputs_may_alias else []
    layout = "" if spec.any_output_layout else _layout(outputs, expected, inputs_kept)
    if layout:
        raise CaseError(layout)
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


def _layout(outputs: Mapping[str, Any], expected: Mapping[str, Any],
            inputs_kept: Collection[torch.Tensor] = ()) -> str:
    """An output neither contiguous nor laid out as its reference, named ("" when none):
    the values of a transposed, padded or column-major view compare equal, but a kernel that
    takes the output's pointer as dense rows (a GEMM's operand, a TMA descriptor) reads
    others. torch's ``assert_close`` ignores strides; a kernel's consumer does not. Strides
    of dims of size 1 are free; so are those of an output in ``inputs_kept``' memory."""
    for name, got in outputs.items():
        want = expected.get(name)
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) \
                or got.is_contiguous() or got.shape != want.shape \
                or any(overlaps(got, t) for t in inputs_kept):
            continue
        if any(a != b for a, b, n in zip(got.stride(), want.stride(), got.shape, strict=True)
               if n > 1):
            return (f"output {name!r} of shape {tuple(got.shape)} has strides "
                    f"{tuple(got.stride())}, neither contiguous nor the reference's "
                    f"{tuple(want.stride())}: a transposed or padded view, which a kernel "
                    "reading it as dense rows misreads; return it contiguous")
    return ""


def _shared_memory(outputs: Mapping[str, Any], read_only: Mapping[str, torch.Tensor]) -> str:
    """An output that shares memory with an input the case may not write, named ("" when
    none): the input returned, or a view of it, is no output of its own (a copy that copied
    nothing), and the caller's next write to either changes the other."""
    for name, got in outputs.items():
        if not isinstance(got, torch.Tensor):
            continue
        for in_name, t in read_only.items():
            if overlaps(got, t):
                return (f"output {name!r} shares memory with input {in_name!r}: an output "
                        "must be memory of its own (or the buffer the case passes for it); "
                        "return a copy")
    return ""


def measure(outputs: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
            tols: Mapping[str, compare.Tolerance], rank: int,
            memos: dict[str, dict[Any, Any]] | None = None,
            magnitudes: Mapping[str, torch.Tensor] | None = None) -> dict[str, dict[str, Any]]:
    """Each output's metrics under its tolerance, and the tolerance; a missing one is a
    CaseError."""
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


def output_hashes(outputs: Mapping[str, torch.Tensor], apart: Collection[str] = ()
                  ) -> tuple[str, dict[str, str]]:
    """The hash of all the outputs, and of each output named in ``apart`` on its own (what
    ``output_hashes({name: t})`` would give), each tensor's bytes brought to the host once."""
    h, each = hashlib.sha256(), {}
    for name in sorted(outputs):
        t = outputs[name]
        if isinstance(t, torch.Tensor):
            own = hashlib.sha256() if name in apart else None
            for part in (name.encode(), str(t.dtype).encode(), str(tuple(t.shape)).encode(),
                         *_host_chunks(flat_bytes(t))):
                h.update(part)
                if own is not None:
                    own.update(part)
            if own is not None:
                each[name] = own.hexdigest()
    return h.hexdigest(), each


#: the bytes ``output_hashes`` copies to the host at a time
HASH_CHUNK_BYTES = 64 << 20


def _host_chunks(flat: torch.Tensor) -> Iterator[memoryview]:
    """``flat``'s bytes as host memory, a copy of ``HASH_CHUNK_BYTES`` at a time: numpy's
    view of a tensor's own memory would mark its storage not resizable for good (torch's
    tensor_numpy.cpp), which a later ``resize_`` of the caller's tensor then refuses, and
    which the reuse check reads as memory torch did not allocate."""
    for start in range(0, flat.numel(), HASH_CHUNK_BYTES):
        yield flat[start:start + HASH_CHUNK_BYTES].to("cpu", copy=True).numpy().data


@dataclass
class Calls:
    """What the checked calls before the timing leave (``checked_calls``), on this rank."""

    #: the peak memory of the last call (the shifted one's, where it ran)
    mem: PeakMemory
    setup: CaseSetup | None = None
    #: the inputs of the last call, the set-up whose values they hold (the case's, or its
    #: twin's), and the inputs an implementation may write
    inputs: dict[str, Any] = field(default_factory=dict)
    values: CaseSetup | None = None
    writable: set[str] = field(default_factory=set)
    tols: dict[str, compare.Tolerance] = field(default_factory=dict)
    #: per check ("call", and "shifted", "other_values" or "shifted_other_values"), each
    #: output's metrics and tolerance
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the hash of the first call's outputs, and of each of its replicated ones
    digest: str = ""
    replicas: dict[str, str] = field(default_factory=dict)
    #: the first call's outputs against the golden (``golden_check``)
    golden: dict[str, Any] | None = None
    #: what broke: the implementation (a CaseError) or the spec or harness
    error: str = ""
    #: the first call's outputs in memory of the implementation's own, each with a copy: a
    #: later call must leave them alone (``changed_since``)
    held: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    #: which call on the same inputs as the first gave other bits ("" if none)
    repeat: str = ""
    #: the calls made so far, a refused one too (their parity: ``timed_checks.paired``)
    made: int = 0
    #: a copy of the first call's outputs, where the case is small and deterministic: each
    #: timed repeat must give these bits (``timed_checks.RepeatWatch``)
    bits: dict[str, torch.Tensor] = field(default_factory=dict)


def checked_calls(world: World, case: Case, impl: Callable[..., Any], interpreter: str | None,
                  setups: SetupCache, golden: GoldenStore | GoldenShelf | None,
                  checks: list[str], phase: Callable[[str], None],
                  other_values: bool = False) -> Calls:
    """The first call, on fresh inputs with its outputs poisoned, then (where the case allows)
    a second (``_second_call``): shifted, and on the twin case's values with
    ``other_values``. Each call's outputs measured against its reference, the first's against
    the golden too. Every exception is caught into ``error``."""
    spec = case.spec
    calls = Calls(PeakMemory(world.device))
    try:
        phase("setup")
        setup = calls.setup = calls.values = setups.get(case, world.rank)
        zones = Redzones()
        inputs = calls.inputs = setup.inputs(world.device, redzones=zones)
        calls.writable = _writable(case, inputs)
        guards = guards_for(case, inputs, calls.writable)
        expected = setup.expected
        tols = calls.tols = tolerances(case, expected)
        if interpreter:
            tols = calls.tols = interpreted_lens(tols)
        phase("call")
        calls.made += 1
        with calls.mem:
            outputs = _call(world, case, impl, inputs, fresh_poison=True)
        phase("check")
        failed = ""
        try:
            check_contract(case, inputs, outputs, guards, zones, expected)
            calls.stages["call"] = measure(outputs, expected, tols, world.rank, setup.memos,
                                           setup.magnitudes)
            calls.digest, calls.replicas = output_hashes(outputs, spec.replicated)
            if golden is not None:
                calls.golden = golden_check(golden, case, outputs, tols, world.rank,
                                            setup.magnitudes)
        except CaseError as exc:
            if not (spec.distributed and world.size > 1):
                raise
            # the other ranks may have passed: this one makes the same calls as they do (the
            # shifted one's collectives would wait for it), then reports what it found
            failed = str(exc)
        small = nbytes(inputs) <= RELOCATE_CAP_BYTES
        if small:
            calls.held = own_memory(outputs, inputs)
            if spec.deterministic and not failed:
                calls.bits = {k: v.clone() for k, v in outputs.items()
                              if isinstance(v, torch.Tensor)}
        del outputs
        # an interpreter loads element by element (triton's interpreter.py: one address per
        # element, no vector width) and ignores divisibility, which the compiler specializes
        # on: only a compiled run shows a path picked by alignment
        if small and misaligned_here(case, world.size) and not interpreter:
            failed = _relaid_call(world, case, impl, calls, phase, failed, checks,
                                  "misaligned", {"misalign": misaligned_by(case)})
        padded = paddable(case, inputs, calls.writable) \
            if small and padded_here(case, world.size) else []
        if padded:
            failed = _padded_calls(world, case, impl, calls, phase, failed, checks, padded)
        shift, other_values = spec.shift_buffers and small, other_values and small
        if shift or other_values:
            _second_call(world, case, impl, calls, interpreter, phase, shift, other_values,
                         judge=not failed)
            checks += ["shifted_buffers"] * shift + ["other_values"] * other_values
        if failed:
            raise CaseError(failed)
    except CaseError as exc:
        calls.error = str(exc)
    except SpecError as exc:  # the op's own definition: the same for every implementation
        calls.error = f"the op's spec: {exc}"
    except Exception as exc:  # a bug in the spec or harness: say where
        calls.error = (f"harness error {type(exc).__name__}: {exc}\n"
                       f"{traceback.format_exc(limit=4)}")
    return calls


def own_memory(outputs: Mapping[str, Any], inputs: Mapping[str, Any]
                ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The outputs that share no memory with an input (those the harness poisons or an
    in-place case rewrites), each with a copy of what it holds now. Empty ones hold nothing
    a later call could overwrite (and an empty view of an input overlaps none of its
    bytes)."""
    ins = [t for _, t in tensors(inputs)]
    return {name: (t, t.clone()) for name, t in outputs.items()
            if isinstance(t, torch.Tensor) and t.numel() > 0
            and not any(overlaps(t, i) for i in ins)}


def changed_since(held: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> str:
    """Why an earlier call's outputs are not what it returned ("" when they are): the
    implementation returned memory it reuses (a workspace, a cache), and a later call on other
    values overwrote the result its caller still holds; or work it left running (a thread)
    wrote it after the call returned."""
    for name, (t, was) in held.items():
        if not same_bits(t, was):
            return (f"output {name!r} of an earlier call changed after it was returned, by "
                    "the later calls on other values (memory the implementation reuses: a "
                    "workspace or cache) or by work left running: a caller's result must stay "
                    "as returned; return memory of its own per call")
    return ""


def _relaid_call(world: World, case: Case, impl: Callable[..., Any], calls: Calls,
                 phase: Callable[[str], None], failed: str, checks: list[str],
                 stage: str, layout: Mapping[str, Any]) -> str:
    """A call on the case's values laid out anew (``layout``: ``CaseSetup.inputs``'
    keywords): ``stage`` "misaligned", every input off 16-byte alignment by one, two or four
    elements (``misaligned_by``; ``OpSpec.any_alignment``): a kernel that picks its vector
    width from the pointer's alignment (torch's ``can_vectorize_up_to``) has a path for
    each; "padded", the ``paddable`` inputs as rows of wider buffers (a kernel that ignores
    their strides).
    Checked against the reference under the case's tolerance but not for the first call's
    bits (a kernel may sum a misaligned head apart, as torch's vectorised reductions do).
    An implementation may refuse such inputs by raising (what a kernel that needs
    alignment or contiguous rows should do; check ``STAGE_refused``); it may not return
    wrong values, write outside its buffers or leave the device faulted. What has failed
    on this rank so far is returned, this call's failure added; a distributed rank goes on
    to the next call either way, so that the others' collectives are answered."""
    assert calls.setup is not None
    setup, zones = calls.setup, Redzones()
    inputs = setup.inputs(world.device, SHIFT_BYTES, zones, **layout)
    guards = guards_for(case, inputs, calls.writable)
    phase("call")
    calls.made += 1
    try:
        try:
            outputs = _call(world, case, impl, inputs)
        except CaseError as exc:
            # raised by the implementation (outputs it returned wrong are no refusal)
            if exc.__cause__ is not None and broken_context(world.device) is None:
                checks.append(f"{stage}_refused")
                return failed
            raise
        checks.append(stage)
        if failed:
            return failed
        phase("check")
        check_contract(case, inputs, outputs, guards, zones, setup.expected)
        calls.stages[stage] = measure(outputs, setup.expected, calls.tols, world.rank,
                                      setup.memos, setup.magnitudes)
    except CaseError as exc:
        if failed:
            return failed
        why = f"{STAGE_PREFIX[stage]}{exc}"
        if not (case.spec.distributed and world.size > 1):
            raise CaseError(why) from exc
        return why
    return failed


def _padded_calls(world: World, case: Case, impl: Callable[..., Any], calls: Calls,
                  phase: Callable[[str], None], failed: str, checks: list[str],
                  padded: list[str]) -> str:
    """The padded call (``_relaid_call``) with every ``padded`` input at once; refused, one
    call per input: a kernel may rightly refuse the one it cannot take (a weight it needs
    dense) and read another as dense rows, which the refusal would hide. Each stage named
    once in ``checks``."""
    failed = _relaid_call(world, case, impl, calls, phase, failed, checks, "padded",
                          {"padded": padded})
    if checks[-1] != "padded_refused" or len(padded) < 2 or failed:
        return failed
    # a distributed op pads at one rank only (``padded_here``), so no rank waits on this
    # one's collectives: a failure raises, none is carried
    start = len(checks)
    for name in padded:
        failed = _relaid_call(world, case, impl, calls, phase, failed, checks, "padded",
                              {"padded": [name]})
    seen = checks[start:]
    checks[start:] = [c for c in dict.fromkeys(seen) if c not in checks[:start]]
    return failed


def misaligned_by(case: Case) -> int:
    """How many elements a case's misaligned call moves its inputs: 1, 2 or 4, by its id,
    so that an op's cases between them take each width a vectorised kernel may pick."""
    return (1, 2, 4)[zlib.crc32(case.id.encode()) % 3]


def _second_call(world: World, case: Case, impl: Callable[..., Any], calls: Calls,
                 interpreter: str | None, phase: Callable[[str], None], shift: bool,
                 other_values: bool, judge: bool = True) -> None:
    """The call after the first, on a new set of inputs: ``shift``ed ``SHIFT_BYTES`` into fresh
    memory after every buffer of the first call was poisoned (a kernel that assumes an
    alignment, or reads a buffer it kept, is caught), and with ``other_values`` the twin
    case's values, checked against the twin's reference (a result kept by shape or by call
    count passes calls on the same values; a real timing ends with such a call instead). Its
    outputs are checked where this rank is to ``judge`` them (one that has already failed
    makes the call only to keep its collectives in step). The inputs become the timing's."""
    assert calls.setup is not None
    source = calls.setup.twin() if other_values else calls.setup
    zones = Redzones()
    inputs = source.inputs(world.device, SHIFT_BYTES if shift else 0, zones)
    guards = guards_for(case, inputs, calls.writable)
    if shift:
        for _, t in tensors(calls.inputs):
            poison_(t)
    calls.inputs, calls.values = inputs, source
    if other_values:
        tols = tolerances(source.case, source.expected)
        calls.tols = interpreted_lens(tols) if interpreter else tols
    calls.mem = PeakMemory(world.device)
    phase("call")
    calls.made += 1
    try:
        with calls.mem:
            outputs = _call(world, source.case, impl, inputs)
    except CaseError:
        if judge:
            raise
        return
    if judge:
        phase("check")
        check_contract(source.case, inputs, outputs, guards, zones, source.expected)
        stage = "_".join(n for n, on in (("shifted", shift), ("other_values", other_values))
                         if on)
        overwritten = changed_since(calls.held) if other_values else ""
        if overwritten:
            raise CaseError(overwritten)
        calls.stages[stage] = measure(
            outputs, source.expected, calls.tols, world.rank, source.memos, source.magnitudes)
        # on the first call's values (the twin's are another case), the same bits as it
        if source.case.spec.deterministic and not other_values and calls.digest \
                and output_hashes(outputs)[0] != calls.digest:
            calls.repeat = ("the second call, on the same inputs in shifted memory, gave "
                            "other bits than the first")
