"""What is tested: OpSpec, Case, Work, and the registry that finds them.

An ``OpSpec`` describes one operation: its reference, how to make inputs, its parameter grids
per tier, tolerances, work model, implementations and negative controls. A ``Case`` is one
(op, params, world size); its ``id`` is stable text that keys the history forever.

The registry holds the op specs of every suite ``harness.core.discovery`` finds (this project's
``suites`` package, installed ``harness.suites`` plugins, ``--suite`` paths), third-party
implementations in the entry-point group ``harness.implementations``, and ad hoc
``module:callable`` implementations. The harness never imports a suite by name: it only finds
what the registry discovers.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.spec_checks import grid_problem, tolerance_problem
from harness.device.pyfile import import_file

TIERS = ("smoke", "nightly", "stress")
DEFAULT_WORLD_SIZES = (1, 4, 8)
ENTRY_POINT_GROUP = "harness.implementations"
#: what an implementation may raise that its case records against it: anything but
#: KeyboardInterrupt (someone stopping the run), which every site that catches these lets
#: through first. A ``sys.exit`` in a kernel's wrapper, a GeneratorExit, a ``pytest.skip``'s
#: outcome or a library's own BaseException must not end a rank mid-case
IMPL_RAISES: tuple[type[BaseException], ...] = (BaseException,)
#: how much of an exception's message a reason keeps (a 10 MB message would be stored whole
#: in the results, the junit file and the DB, and printed)
RAISED_CHARS = 2000


def raised(exc: BaseException) -> str:
    """``Type: message`` of an implementation's exception for a reason, the message cut to
    RAISED_CHARS characters; one whose ``str()`` raises is named so."""
    try:
        text = str(exc)
    except Exception as inner:  # noqa: BLE001 (a user's __str__ may raise anything)
        text = f"<its message could not be read: str() raised {type(inner).__name__}>"
    if len(text) > RAISED_CHARS:
        text = f"{text[:RAISED_CHARS]}... ({len(text) - RAISED_CHARS} more characters)"
    return f"{type(exc).__name__}: {text}"


def where_raised(exc: BaseException) -> str:
    """`` (at FILE, line N)``: the frame an exception was raised in, or "" without one."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


class SpecError(ValueError):
    """A selector, implementation or spec that does not resolve (exit code 2)."""


@dataclass(frozen=True)
class Work:
    """Work of one call: floating-point operations, bytes moved (for algbw / GB/s), and bytes
    scaled by the collective's bus factor (busbw, nccl-tests).

    ``flops_dtype`` names the matmul peak the flops run at, for "percent of peak": one of the
    dtype keys ``harness calibrate`` measures ("fp8", "bf16", "fp16", "tf32", "fp32"). Leave it
    None where the flops are not matmul flops, and no percentage is computed.
    """

    flops: float | None = None
    bytes: float | None = None
    bus_bytes: float | None = None
    flops_dtype: str | None = None


def format_value(value: Any) -> str:
    """Canonical text of a parameter value in a case id."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "x".join(format_value(v) for v in value)
    return str(value)


def case_id(op: str, params: Mapping[str, Any]) -> str:
    """``op[k=v,...]`` with keys sorted: stable text that keys the history. Changing how ids are
    made orphans every stored series, so do not, without a migration."""
    inner = ",".join(f"{k}={format_value(params[k])}" for k in sorted(params))
    return f"{op}[{inner}]"


@dataclass
class OpSpec:
    """One operation under test.

    ``make_inputs(params, rank, world_size)`` returns the keyword arguments of this rank's call
    (new tensors on every call, on the CPU: the runner keeps them as the case's pristine inputs
    for all its implementations and hands each call a copy, or, past 256 MiB, calls it again
    and may poison what it returned, so never return a cached tensor) and ``expected(params, rank,
    world_size)`` the outputs that rank must produce, computed with ``reference``. For a
    non-distributed op ``expected`` defaults to calling the reference on the same inputs.
    Implementations take the inputs as keywords, distributed ones the ``World`` first.
    """

    name: str
    family: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Mapping[str, Any], int, int], dict[str, Any]]
    grid: Mapping[str, Sequence[Mapping[str, Any]]]
    implementations: Mapping[str, Callable[..., Any]]
    negative_controls: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    expected: Callable[[Mapping[str, Any], int, int], Any] | None = None
    #: ``magnitude(**inputs)``, called as the reference is: {output name: each element's
    #: magnitude} for an allclose tolerance's ``magnitude_rtol`` (a GEMM's sum_k |a_ik| |b_jk|:
    #: its rounding error grows with it, so a near-cancelled element is held to its terms'
    #: size). It reads the inputs the case made (never writes them)
    magnitude: Callable[..., Mapping[str, Any]] | None = None
    #: ``exact(**inputs)``, called as the reference is: {output name: the float64 value
    #: before the output's one rounding}, for the precision lens (``compare.rounding``): each
    #: becomes a second reference ``NAME:exact``, checked with the spec's tolerance for that
    #: name, else ``compare.rounding(EXACT_OFF)``. It reads the inputs (never writes them)
    exact: Callable[..., Mapping[str, Any]] | None = None
    #: tolerance per output name (or one for all), or a function of (params, world_size)
    tolerance: Any = None
    work: Callable[[Mapping[str, Any], int], Work] | None = None
    distributed: bool = False
    #: None: any world size; otherwise the ones the op runs at
    world_sizes: tuple[int, ...] | None = None
    #: the one world size a case runs at, from its params (a device mesh's size); None: any
    world_size_of: Callable[[Mapping[str, Any]], int] | None = None
    #: inputs an implementation may overwrite (all others are checked untouched)
    inplace_inputs: tuple[str, ...] = ()
    #: output names, in the order of a returned tuple
    outputs: tuple[str, ...] = ("out",)
    #: {output name: input name}: the implementation must write that output into the buffer
    #: the harness passes as that input (poisoned first, so unwritten elements fail); a case
    #: that passes None for that input has no such output
    out_buffers: Mapping[str, str] = field(default_factory=dict)
    #: an output may share memory with an input the case does not let it write (DTensor's
    #: redistribute returns its input where the layout does not change); otherwise that is
    #: an error: an output is memory of its own
    outputs_may_alias: bool = False
    #: an output may have any strides; otherwise it must be contiguous or have the strides of
    #: the reference's output (a transposed or padded view holds the right values where a
    #: kernel that reads the output as dense rows finds the wrong ones)
    any_output_layout: bool = False
    #: inputs every call updates in place (a KV cache): writable, never poisoned; the update
    #: must be idempotent (the same call twice leaves the same state)
    readwrite_inputs: tuple[str, ...] = ()
    #: outputs every rank must hold bit for bit the same (an allreduce's result: NCCL's ring,
    #: tree and NVLS algorithms all end by sending each reduced chunk to every rank, and data
    #: parallel training relies on identical replicas), even where a tolerance allows each
    #: rank's own rounding
    replicated: tuple[str, ...] = ()
    #: the outputs are a pipeline's stages, in order: a failure names the first stage whose
    #: output diverges
    pipeline: bool = False
    #: ``twin(params)``: the params of the twin case, the call checked on other values (its
    #: seeds are reseeded either way), where inputs made from the params rather than from a
    #: seed must differ too: tables (a RoPE base), counts (tokens per expert in another
    #: order). Keep the shapes the case's where you can: the call is there to catch a result
    #: kept by shape
    twin: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    #: re-run the check on inputs moved to fresh, shifted memory with the old buffers
    #: poisoned, and rotate shifted copies between timed repeats (off for inputs too big
    #: to copy)
    shift_buffers: bool = True
    #: the op takes inputs at any address a tensor of their dtype can have (a slice ``x[1:]``
    #: of a buffer), not only 16-byte aligned ones: each implementation is also called on
    #: inputs one, two or four elements off alignment (by case) and checked against the
    #: reference (a vectorised kernel's paths for such inputs are otherwise never reached).
    #: An implementation that needs alignment (TMA, 16-byte vector loads) may refuse them
    #: by raising; a wrong value, a write outside its buffers or a device fault fails it.
    #: Every case up to 4 ranks, one in four past that (``checked_calls.misaligned_here``)
    any_alignment: bool = False
    #: inputs whose strides are part of the op's meaning (the storage an ``as_strided`` view
    #: reads), or "*" for all. Every other read-only tensor input is also passed, once, as
    #: rows of a wider buffer holding the same values (``buffers.pad_rows``: q of a fused
    #: qkv projection, a slice), checked against the reference: a kernel that reads it as
    #: dense rows is wrong; one that needs contiguous inputs may refuse them by raising
    fixed_layout_inputs: tuple[str, ...] = ()
    #: same inputs give the same bits (enables "bits changed" detection)
    deterministic: bool = True
    #: relative slowdown that counts as a regression for this op
    regression_threshold: float = 0.05
    #: ``requires(params, world_size, device)``: why a case cannot run here (too little
    #: memory for a large-tensor case), or None; a reason makes the result a ``skip`` that
    #: says so, never a silent omission. One that also takes a ``backend`` keyword is told
    #: the job's torch.distributed backend (``gloo`` or ``nccl``); so is a ``skip_reason``
    requires: Callable[[Mapping[str, Any], int, Any], str | None] | None = None
    #: per-case deadline in seconds (watchdog)
    deadline_s: float = 120.0
    description: str = ""

    def __post_init__(self) -> None:
        problem = grid_problem(self.grid) or tolerance_problem(self.tolerance, self.outputs)
        if problem:
            raise SpecError(f"{self.name}: {problem}")
        unknown = set(self.grid) - set(TIERS)
        if unknown:
            raise SpecError(f"{self.name}: unknown tiers {sorted(unknown)}; use {TIERS}")
        for field_name, names in (("out_buffers", self.out_buffers),
                                  ("replicated", self.replicated)):
            stray = set(names) - set(self.outputs)
            if stray:
                raise SpecError(f"{self.name}: {field_name} names {sorted(stray)}, which are "
                                f"not outputs {self.outputs}")
        clash = set(self.implementations) & set(self.negative_controls)
        if clash:
            raise SpecError(f"{self.name}: {sorted(clash)} is both an implementation and a control")

    def cases(self, tier: str, world_size: int) -> list[Case]:
        """The cases of a tier at one world size (none if the op does not run there)."""
        if self.world_sizes is not None and world_size not in self.world_sizes:
            return []
        if not self.distributed and world_size != 1:
            # a single-device op runs the same on every rank: run it at world size 1 only
            return []
        return [Case(self, dict(p), world_size) for p in self.grid.get(tier, ())
                if self.world_size_of is None or self.world_size_of(p) == world_size]

    def world_sizes_of(self, tier: str) -> str:
        """Where this op's cases of ``tier`` run, in words: "world size 1 only", "world
        sizes 1, 4, 8", "any world size", or "no case in this tier"."""
        params = self.grid.get(tier, ())
        if not params:
            return "no case in this tier"
        if not self.distributed:
            return "world size 1 only (a single-device op)"
        if self.world_size_of is not None:
            sizes = sorted({self.world_size_of(p) for p in params})
        elif self.world_sizes is not None:
            sizes = sorted(self.world_sizes)
        else:
            return "any world size"
        return f"world size {sizes[0]} only" if len(sizes) == 1 else \
            "world sizes " + ", ".join(str(w) for w in sizes)

    def all_impls(self) -> dict[str, Callable[..., Any]]:
        """Implementations and negative controls by name."""
        return {**self.implementations, **self.negative_controls}


@dataclass
class Case:
    """One (op, params, world size)."""

    spec: OpSpec
    params: dict[str, Any]
    world_size: int

    @property
    def id(self) -> str:
        return case_id(self.spec.name, self.params)

    def __repr__(self) -> str:
        return f"Case({self.id}, world_size={self.world_size})"


@dataclass
class PlannedItem:
    """One implementation on one case."""

    case: Case
    impl: str
    fn: Callable[..., Any]

    @property
    def key(self) -> str:
        """Same text as ``results.result_key``: ``w4:allreduce[...]@torch``."""
        return f"w{self.case.world_size}:{self.case.id}@{self.impl}"


@dataclass
class Registry:
    """Every op spec, by name, with the implementations added from outside."""

    specs: dict[str, OpSpec] = field(default_factory=dict)
    #: suite name -> the suite (harness.core.discovery.Suite) each op came from
    suites: dict[str, Any] = field(default_factory=dict)
    #: op name -> its suite's name; ops added with ``add`` alone have none
    suite_of: dict[str, str] = field(default_factory=dict)
    #: suites named by --suite or the project file: a selection without selectors is theirs
    #: alone (a user's repository runs its own ops; a selector still reaches any op)
    focus: set[str] = field(default_factory=set)

    def add(self, spec: OpSpec, suite: Any = None) -> None:
        if spec.name in self.specs:
            raise SpecError(f"op {spec.name!r} is defined twice: {self._where(spec, suite)} and "
                            f"{self._where(self.specs[spec.name], self.suite_of.get(spec.name))}"
                            "; rename one (an op's name keys its history)")
        self.specs[spec.name] = spec
        if suite is not None:
            self.suite_of[spec.name] = suite.name

    def add_suite(self, suite: Any) -> None:
        """Add every op of a ``harness.core.discovery.Suite``; a name clash is a SpecError."""
        if suite.name in self.suites:
            raise SpecError(f"two suites are named {suite.name!r} ({suite.origin} and "
                            f"{self.suites[suite.name].origin}): rename one")
        self.suites[suite.name] = suite
        for spec in suite.specs:
            self.add(spec, suite)

    def _where(self, spec: OpSpec, suite: Any) -> str:
        if isinstance(suite, str):
            suite = self.suites.get(suite)
        origin = f"suite {suite.name} ({suite.origin})" if suite is not None else "an ad hoc add"
        return f"family {spec.family} of {origin}"

    def suite_for(self, op: str) -> Any:
        """The ``harness.core.discovery.Suite`` an op came from; None for an op added at run
        time."""
        return self.suites.get(self.suite_of.get(op, ""))

    def origin_of(self, op: str) -> str:
        """The suite an op came from and how, e.g. "kernel-harness (built-in)"."""
        suite = self.suite_for(op)
        return f"{suite.name} ({suite.origin})" if suite is not None else "added at run time"

    def golden_dir_of(self, op: str) -> Any:
        """Where an op's goldens live: its suite's directory, None for the built-in one."""
        suite = self.suite_for(op)
        return None if suite is None else suite.golden_dir

    @property
    def families(self) -> list[str]:
        return sorted({s.family for s in self.specs.values()})

    def add_implementation(self, op: str, impl_name: str, fn: Callable[..., Any]) -> None:
        """Register an implementation of ``op`` from outside the suites."""
        spec = self.specs.get(op)
        if spec is None:
            raise SpecError(f"implementation {impl_name!r} is for unknown op {op!r}; "
                            f"known ops: {', '.join(sorted(self.specs))}")
        impls = dict(spec.implementations)
        impls[impl_name] = fn
        spec.implementations = impls

    def select(self, selectors: Sequence[str], tier: str) -> list[OpSpec]:
        """Ops matched by any selector: a suite, a family, an op name, a case id, or a glob over
        op names or case ids (``allreduce[*dtype=bf16*]``; ``*`` and ``?`` are the wildcards). No
        selector means every op with cases in the tier (of the ``focus`` suites, if any)."""
        if tier not in TIERS:
            raise SpecError(f"unknown tier {tier!r}; use one of {', '.join(TIERS)}")
        chosen: dict[str, OpSpec] = {}
        for sel in selectors:
            matched = [s for s in self.specs.values()
                       if self.suite_of.get(s.name) == sel or _matches_op(s, sel, tier)]
            if not matched:
                raise SpecError(
                    f"selector {sel!r} matches no suite, family, op or case id; families: "
                    f"{', '.join(self.families)}; ops: {', '.join(sorted(self.specs))}"
                )
            chosen.update((s.name, s) for s in matched)
        if selectors:
            specs = list(chosen.values())
        else:
            specs = [s for s in self.specs.values()
                     if not self.focus or self.suite_of.get(s.name) in self.focus]
        return [s for s in specs if s.grid.get(tier)]

    def case_filter(self, selectors: Sequence[str]) -> Callable[[Case], bool]:
        """Predicate keeping the cases a selector list asks for (globs match case ids)."""
        if not selectors:
            return lambda case: True

        def keep(case: Case) -> bool:
            for sel in selectors:
                if sel in (case.spec.family, case.spec.name, self.suite_of.get(case.spec.name)):
                    return True
                if glob_match(sel, case.id):  # a glob, or one exact case id
                    return True
                if _is_glob(sel) and (glob_match(sel, case.spec.name)
                                      or glob_match(sel, case.spec.family)):
                    return True
            return False

        return keep

    def resolve_impls(self, spec: OpSpec, requested: Sequence[str],
                      device_type: str | None = None) -> dict[str, Callable]:
        """Implementations to run for ``spec``: the requested names (implementations, negative
        controls, ``module:callable`` or ``path.cu:launch``), or, when none is requested, every
        implementation that can run on ``device_type`` (a CUDA C++ one cannot on the CPU;
        asked for by name it runs and skips, saying why). Names this op lacks are skipped
        (another selected op may have them)."""
        if not requested:
            return {name: fn for name, fn in spec.implementations.items()
                    if device_type is None or runs_on(fn, device_type)}
        known = spec.all_impls()
        out: dict[str, Callable] = {}
        for name in requested:
            if name in known:
                out[name] = known[name]
            elif ":" in name:
                out[name] = load_callable(name)
        return out

    def plan(self, tier: str, world_size: int, selectors: Sequence[str] = (),
             impls: Sequence[str] = (), device_type: str | None = None) -> list[PlannedItem]:
        """Every (case, implementation) to run at one world size on ``device_type`` (None:
        any), in a stable order. The launcher and every rank's pytest collection call this, so
        they agree on the items."""
        keep = self.case_filter(selectors)
        items = []
        for spec in sorted(self.select(selectors, tier), key=lambda s: (s.family, s.name)):
            chosen = self.resolve_impls(spec, impls, device_type)
            for case in spec.cases(tier, world_size):
                if keep(case):
                    items.extend(PlannedItem(case, name, fn) for name, fn in chosen.items())
        return items

    def shared_impl_names(self, specs: Sequence[OpSpec], requested: Sequence[str]
                          ) -> dict[str, list[str]]:
        """Requested names (not ``module:callable``) that more than one of ``specs`` has:
        {name: the ops}. A control name such as ``rope_before_norm`` selects every op with
        one, which a user asking for one op's control should be told."""
        out = {}
        for name in requested:
            if ":" in name:
                continue
            ops = [s.name for s in specs if name in s.all_impls()]
            if len(ops) > 1:
                out[name] = ops
        return out

    def check_impls(self, specs: Sequence[OpSpec], requested: Sequence[str]) -> None:
        """Raise SpecError for a requested implementation that none of ``specs`` has."""
        for name in requested:
            if ":" in name:
                load_callable(name)
                continue
            if not any(name in s.all_impls() for s in specs):
                names = sorted({n for s in specs for n in s.all_impls()})
                raise SpecError(f"unknown implementation {name!r} for the selected ops; "
                                f"known: {', '.join(names)} (or module:callable)")


def runs_on(impl: Callable[..., Any], device_type: str) -> bool:
    """Whether ``impl`` can run on a device of this type: an implementation says so with a
    ``runs_on(device_type)`` method (CUDA C++ sources do); plain callables run anywhere."""
    check = getattr(impl, "runs_on", None)
    return bool(check(device_type)) if callable(check) else True


def not_runnable(specs: Sequence[OpSpec], device_type: str
                 ) -> list[tuple[str, Callable[..., Any]]]:
    """(``op@impl``, the implementation) of every implementation of ``specs`` left out on
    ``device_type``."""
    return [(f"{s.name}@{name}", fn) for s in specs for name, fn in s.implementations.items()
            if not runs_on(fn, device_type)]


def glob_match(pattern: str, text: str) -> bool:
    """Glob with ``*`` and ``?`` only: brackets are literal, since case ids contain them."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, text) is not None


def _is_glob(sel: str) -> bool:
    return "*" in sel or "?" in sel


def _matches_op(spec: OpSpec, sel: str, tier: str) -> bool:
    if sel in (spec.family, spec.name):
        return True
    if _is_glob(sel) and (glob_match(sel, spec.name) or glob_match(sel, spec.family)):
        return True
    # a glob over case ids, or one exact case id copied from a report
    return any(glob_match(sel, case_id(spec.name, p)) for p in spec.grid.get(tier, ()))


def load_callable(ref: str) -> Callable[..., Any]:
    """Import ``package.module:attr`` (attr may be dotted), load ``path/file.py:attr``, or
    ``path/kernel.cu:launch`` (a CUDA C++ source and its launch description,
    harness.device.cuda_impl). A module that needs triton where triton is not installed gives an
    implementation whose every case is a skip naming the install command."""
    module_name, _, attr = ref.rpartition(":") if ref.partition(":")[0].endswith(
        (".py", ".cu")) else ref.partition(":")
    if module_name.endswith(".cu"):
        from harness.device.cuda_impl import CudaImplError, load

        try:
            return load(ref)
        except CudaImplError as exc:
            raise SpecError(str(exc)) from exc
    if not module_name or not attr:
        raise SpecError(f"--impl {ref!r} is not of the form package.module:callable "
                        "or path/file.py:callable")
    try:
        obj: Any = (_import_path(ref, module_name) if module_name.endswith(".py")
                    else importlib.import_module(module_name))
    except ImportError as exc:
        missing = (exc.name or "") if isinstance(exc, ModuleNotFoundError) else ""
        if missing == "triton" or missing.startswith("triton."):
            from harness.device.triton_impl import MissingTriton

            return MissingTriton(ref)
        raise SpecError(f"--impl {ref!r}: cannot import {module_name!r} ({exc}); "
                        "is it installed or on PYTHONPATH?") from exc
    except SpecError:
        raise
    except (Exception, SystemExit) as exc:  # the user's module: name it, keep its message
        raise SpecError(f"--impl {ref!r}: importing {module_name!r} failed "
                        f"({import_failure(exc)})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise SpecError(f"--impl {ref!r}: {module_name!r} has no attribute {attr!r}") from exc
    if not callable(obj):
        raise SpecError(f"--impl {ref!r} is not callable")
    return obj


def _import_path(ref: str, path_text: str) -> Any:
    """The module of ``--impl path/file.py:callable``; relative paths are the user's (a rank
    runs in the run directory: ``HARNESS_INVOKED_FROM`` is where harness was started)."""
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("HARNESS_INVOKED_FROM", ".")) / path
    if not path.is_file():
        raise SpecError(f"--impl {ref!r}: no file {path} (paths are relative to the "
                        "directory harness runs in)")
    try:
        return import_file(path.resolve())
    except ModuleNotFoundError:
        raise
    except (Exception, SystemExit) as exc:
        raise SpecError(f"--impl {ref!r}: {path} failed to import "
                        f"({import_failure(exc)})") from exc


def import_failure(exc: BaseException) -> str:
    """What a user's module raised while imported, in words (``sys.exit`` named as such: it
    would end harness with the module's code, and no word of why)."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while being imported"
    # where it was raised (a SyntaxError's message names its own line)
    at = "" if isinstance(exc, SyntaxError) else where_raised(exc)
    return f"{type(exc).__name__}: {exc}{at}"


def add_entry_point_impls(registry: Registry) -> None:
    """Entry points in ``harness.implementations``: the name is the implementation's name and
    the object a mapping {op name: callable} (or a function returning one)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party package must say which one
            raise SpecError(f"entry point {ep.name} = {ep.value} in {ENTRY_POINT_GROUP} "
                            f"failed to load: {exc}") from exc
        mapping = obj() if callable(obj) and not isinstance(obj, Mapping) else obj
        if not isinstance(mapping, Mapping):
            raise SpecError(f"entry point {ep.name} = {ep.value} must be a mapping "
                            "{op name: callable} or a function returning one")
        for op, fn in mapping.items():
            registry.add_implementation(op, ep.name, fn)
