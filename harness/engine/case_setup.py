"""One rank's setup of a case: its inputs, made once for all of the case's implementations and
copied fresh into new memory for each call, its reference outputs (with the precision lens's
float64 values), the tolerance of each output, and an implementation's return value read as
named outputs."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from harness.core import compare
from harness.core.buffers import Redzones, nbytes, pad_rows, relocate, same_value
from harness.core.inputs import nudged, reseeded, seed_from
from harness.core.spec import Case, SpecError, raised, where_raised
from harness.core.spec_checks import tolerance_problem


class CaseError(Exception):
    """The implementation broke a contract (raised, wrong output type, clobbered an input)."""


def normalize_outputs(value: Any, names: tuple[str, ...], *, implementation: bool = False
                      ) -> dict[str, torch.Tensor]:
    """A reference's or an ``implementation``'s return value as {output name: plain tensor}
    (``plain``). A reference may add second references (``out:label``); of an
    implementation's dict only the op's outputs are read (a kernel's extra results, a
    router's logits or an attention's LSE, are not the op's: not checked)."""
    if isinstance(value, torch.Tensor):
        outputs = {names[0]: value}
    elif isinstance(value, Mapping):
        outputs = {k: v for k, v in value.items() if k in names} if implementation \
            else dict(value)
    elif isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise CaseError(f"returned {len(value)} outputs, expected {len(names)} {names}")
        outputs = dict(zip(names, value, strict=True))
    else:
        raise CaseError(f"returned a {type(value).__name__}; expected a tensor, tuple or dict")
    return {name: plain(name, t, implementation) for name, t in outputs.items()}


def plain(name: str, t: Any, implementation: bool = True) -> Any:
    """Output ``t`` as a plain dense tensor, the same memory: a torch.Tensor subclass may
    override the very operations that compare it (``__eq__``, ``torch.equal``), so it is
    judged as the tensor it holds, read with its overrides off. A subclass whose operations
    run in Python (``__torch_dispatch__``: DTensor, a wrapper), a sparse, nested or meta
    tensor has no dense values of its own to judge: a CaseError says what to return."""
    if not isinstance(t, torch.Tensor):
        return t  # compare says it is no tensor
    kind = type(t).__name__
    if type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise CaseError(f"output {name!r} is a {kind}, a tensor subclass whose operations "
                        "run in Python (__torch_dispatch__): return the plain tensor it holds "
                        "(a DTensor's to_local())")
    if t.is_nested or t.layout != torch.strided:
        layout = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise CaseError(f"output {name!r} is a {layout} tensor: return a dense one")
    if t.is_meta and implementation:  # a reference may be traced on meta inputs
        raise CaseError(f"output {name!r} is on the meta device: it holds no values")
    if type(t) is torch.Tensor:
        return t
    with torch._C.DisableTorchFunctionSubclass():  # as_subclass itself may be overridden
        return t.as_subclass(torch.Tensor)


#: the parameter that reseeds a case's inputs for the check after timing (CaseSetup.twin)
TWIN_PARAM = "twin"

#: the salt of a case's near twin (``CaseSetup.near``): its values but a few elements of each
#: tensor ``generate`` made
NEAR_SALT = seed_from("near twin")

#: the name suffix of an output's float64 value before its rounding (OpSpec.exact)
EXACT_SUFFIX = ":exact"
#: the precision lens's default share of elements that may differ from the float64 value
#: rounded once: correct float32 orders move a fraction of a percent, a second rounding a quarter.
#: chosen by benchmarks/precision_lens.py (benchmarks/RESULTS.md)
EXACT_OFF = 0.02


def tolerances(case: Case, expected: Mapping[str, torch.Tensor]) -> dict[str, compare.Tolerance]:
    """The tolerance of each output: the spec's (fixed, per output, or a function of the case),
    else the dtype's default."""
    tol = case.spec.tolerance
    if callable(tol) and not isinstance(tol, compare.Tolerance):
        tol = tol(case.params, case.world_size)
        problem = tolerance_problem(tol, case.spec.outputs, answer=True)
        if problem:
            raise SpecError(f"{case.spec.name}: {problem}")
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


def interpreted_lens(tols: Mapping[str, compare.Tolerance]) -> dict[str, compare.Tolerance]:
    """The precision lens for a kernel run by Triton's interpreter, which converts float32 to
    bf16 by truncation (suites/_triton/hopper.py): the share of elements off the value rounded
    once says nothing of the compiled kernel, so only an explicit ``ulps`` bound holds."""
    return {name: compare.rounding(1.0, t.ulps)
            if name.endswith(EXACT_SUFFIX) and t.kind == "rounding" else t
            for name, t in tols.items()}


def reference_outputs(case: Case, value: Any) -> dict[str, torch.Tensor]:
    """What the op's reference (or ``expected``) returned, as ``normalize_outputs`` gives it;
    a return value it refuses is the spec's mistake, said as such (not the implementation's,
    whose return value the same words describe)."""
    spec = case.spec
    try:
        return normalize_outputs(value, spec.outputs)
    except CaseError as exc:
        made_by = "expected" if spec.expected is not None else "reference"
        raise SpecError(f"{spec.name}: its {made_by} {exc}; fix it, or the spec's outputs="
                        f"{spec.outputs}") from None


def made_inputs(case: Case, rank: int) -> dict[str, Any]:
    """``make_inputs`` of one rank, checked to be the reference's keyword arguments."""
    spec = case.spec
    made = spec.make_inputs(case.params, rank, case.world_size)
    if not isinstance(made, Mapping) or not all(isinstance(k, str) for k in made):
        raise SpecError(f"{spec.name}: make_inputs returned a {type(made).__name__}; it must "
                        "return a dict of the reference's keyword arguments ({'x': tensor, "
                        "...})")
    return made


def expected_outputs(case: Case, rank: int) -> dict[str, torch.Tensor]:
    spec = case.spec
    if spec.expected is not None:
        value = spec.expected(case.params, rank, case.world_size)
    else:
        value = spec.reference(**made_inputs(case, rank))
    return reference_outputs(case, value)


def expected_with_magnitudes(case: Case, rank: int
                             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``expected_outputs`` and, per output, each element's magnitude (``OpSpec.magnitude``,
    made from the same inputs; empty where the op has none): what a golden is compared under
    when its tolerance scales with them."""
    spec = case.spec
    if spec.magnitude is None:
        return expected_outputs(case, rank), {}
    made = made_inputs(case, rank)
    if spec.expected is not None:
        value = spec.expected(case.params, rank, case.world_size)
    else:
        value = spec.reference(**relocate(made))  # its own copy: it may write its inputs
    return reference_outputs(case, value), dict(spec.magnitude(**made))


#: a case's pristine inputs are kept for its next implementation up to this size; bigger ones
#: (the stress tier) are generated again, as a copy would double their memory
SETUP_CACHE_CAP_BYTES = 256 << 20


class CaseSetup:
    """One rank's inputs and reference outputs of one case, made once for all of the case's
    implementations (they run back to back): each call gets a fresh copy of the pristine
    inputs, in new memory, bit for bit what generating them again would give. Inputs over
    ``SETUP_CACHE_CAP_BYTES`` are not kept; each copy is then generated afresh."""

    def __init__(self, case: Case, rank: int, *, lens: bool = True, nudge: int = 0) -> None:
        self.case, self.rank, self.nudge = case, rank, nudge
        #: a twin's inputs come from reseeded generators: other values even where an op keys
        #: its seeds on a few of its params, not on all of them
        self.salt = (seed_from(TWIN_PARAM, case.params[TWIN_PARAM])
                     if TWIN_PARAM in case.params else 0)
        with reseeded(self.salt), nudged(nudge):
            try:
                self._set_up(lens)
            except (SpecError, CaseError):
                raise
            except Exception as exc:  # the spec's own code runs here, no implementation's
                raise SpecError(f"{case.spec.name}: making the case's inputs and reference "
                                f"outputs raised {raised(exc)}{where_raised(exc)}") from exc

    def _set_up(self, lens: bool) -> None:
        case, rank, spec = self.case, self.rank, self.case.spec
        made = made_inputs(case, rank)
        self.pristine: dict[str, Any] | None = (
            made if nbytes(made) <= SETUP_CACHE_CAP_BYTES else None)
        if spec.expected is None and self.pristine is not None:
            # the reference gets its own copy of the kept inputs: it may write them
            self.expected = reference_outputs(case, spec.reference(**relocate(made)))
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
        self._near: CaseSetup | None = None

    def twin(self) -> CaseSetup:
        """The same case with other input values (``TWIN_PARAM`` in its params, every seed
        reseeded) and their reference: what an implementation is checked on where the calls
        before had the same values (``checked_calls._second_call``, or after a real timing
        in buffers it has seen). Made once for all the case's implementations."""
        if self._twin is None:
            spec = self.case.spec
            params = dict(spec.twin(self.case.params)) if spec.twin else dict(self.case.params)
            twin = Case(spec, {**params, TWIN_PARAM: 1}, self.case.world_size)
            self._twin = CaseSetup(twin, self.rank, lens=False)  # staleness, not precision
        return self._twin

    def near(self) -> CaseSetup:
        """The same case with its values but a few elements of each tensor ``generate`` made
        (``nudged``), and their reference: what a result kept by a sample of the inputs (a
        fingerprint of a few elements) gets wrong after a real timing on the case's values.
        Made once for all the case's implementations."""
        if self._near is None:
            self._near = CaseSetup(self.case, self.rank, lens=False, nudge=NEAR_SALT)
        return self._near

    def differs_from(self, other: CaseSetup) -> bool:
        """Whether any reference output of this setup is not bit for bit ``other``'s: where
        none is, a result kept from ``other``'s values is this setup's too (inputs made
        without ``generate`` take no nudge; a nudge may miss what an output reads)."""
        mine = {k: v for k, v in self.expected.items() if not k.endswith(EXACT_SUFFIX)}
        theirs = {k: v for k, v in other.expected.items() if not k.endswith(EXACT_SUFFIX)}
        return mine.keys() != theirs.keys() or any(  # the lens's float64 values left out
            not same_value(value, theirs[name]) for name, value in mine.items())

    def inputs(self, device: torch.device, shift_bytes: int = 0,
               redzones: Redzones | None = None, misalign: int = 0,
               padded: Collection[str] = ()) -> dict[str, Any]:
        """A fresh set of inputs on ``device``, ``shift_bytes`` into new memory (``misalign``
        elements further: ``relocate``), those named in ``padded`` as rows of a wider buffer
        (``pad_rows``); with ``redzones``, canaries around each new storage (none where
        inputs over the cap are used where they were made, on the CPU)."""
        if self.pristine is not None:
            return relocate(pad_rows(self.pristine, padded), shift_bytes=shift_bytes,
                            device=device, redzones=redzones, misalign=misalign)
        made, self._first = self._first, None
        if made is None:  # not kept: generate again
            with reseeded(self.salt), nudged(self.nudge):
                made = self.case.spec.make_inputs(self.case.params, self.rank,
                                                  self.case.world_size)
        return _place(pad_rows(made, padded), device, shift_bytes, redzones, misalign)


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


def _place(values: Mapping[str, Any], device: torch.device, shift_bytes: int = 0,
           redzones: Redzones | None = None, misalign: int = 0) -> dict[str, Any]:
    """Inputs on the device (aliasing kept); shifted into fresh memory when asked."""
    if device.type == "cpu" and shift_bytes == 0 and not misalign:
        return dict(values)
    return relocate(values, shift_bytes=shift_bytes, device=device, redzones=redzones,
                    misalign=misalign)
