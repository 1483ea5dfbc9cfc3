"""One run, start to end: plan, preflight, launch every world size, ingest, analyse.

``execute`` takes a ``RunOptions`` record and returns an ``Outcome`` (the results, the
findings, the infrastructure and placement errors); it prints nothing itself but tells a
``Reporter`` what happens as it happens. What is wrong before anything runs (a bad selection,
a missing launcher) raises ``RunRefused`` with one line naming the cause and the fix.
``harness run`` is the CLI over it; a script may call it the same way.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.core.results import CaseResult, RunInfo
from harness.engine import runlock, shm_sweep
from harness.engine.joblog import big_logs
from harness.engine.options import RunDir, RunOptions, make_run_folder


class RunRefused(Exception):
    """The run cannot start (or its results cannot be stored): ``message`` says why and what
    to do; ``infra``: the infrastructure is missing (no launcher), not the user's input;
    ``detail``: a longer text to show above the line (a compiler's log)."""

    def __init__(self, message: str, infra: bool = False, detail: str = "") -> None:
        super().__init__(message)
        self.infra, self.detail = infra, detail


class Reporter(Protocol):
    """What a run tells its user while it runs."""

    def note(self, text: str) -> None:
        """One line beside the run (what will not run, a missing calibration)."""

    def started(self, info: RunInfo, run_dir: Path, resumed: bool, cases: int) -> None:
        """The run is about to launch its first job; ``cases``: how many it plans."""

    def world(self, world_size: int, cases: int) -> Callable[[int], None]:
        """A world size starts; the callable is told how many of its cases are recorded."""

    def warning(self, world_size: int, text: str) -> None:
        """A world size's warning: its ranks' placement, a job stopped stuck outside any
        case."""


@dataclass
class Plan:
    """What a run will run: the selected specs, the items per world size, the device type."""

    specs: list[Any]
    items: dict[int, list[Any]]
    device_type: str

    @property
    def keys(self) -> set[str]:
        return {i.key for items in self.items.values() for i in items}


@dataclass
class Outcome:
    """What a run produced, and what is needed to show it without asking the registry."""

    info: RunInfo
    run_dir: Path
    db_path: Path | str
    results: list[CaseResult] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)
    infra_errors: list[str] = field(default_factory=list)
    placement_error: str = ""
    #: False: the history DB could not be reached, the results wait in ``run_dir``
    stored: bool = True
    #: each planned op's negative controls, and its work model (for bandwidth columns)
    controls: dict[str, frozenset[str]] = field(default_factory=dict)
    work_models: dict[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.info.run_id

    @property
    def seconds(self) -> float:
        return (self.info.finished_at or time.time()) - self.info.started_at

    @property
    def failing(self) -> list[CaseResult]:
        return [r for r in self.results if r.status in ("fail", "error", "timeout", "crash")]

    def work_of(self, op: str, params: Any, world_size: int) -> Any:
        model = self.work_models.get(op)
        return model(params, world_size) if model is not None else None


def plan(selectors: Sequence[str], tier: str, sizes: Sequence[int], impls: Sequence[str],
         device: str = "auto") -> Plan:
    """The selected op specs and the items to run per world size on ``device`` (resolved as
    rank 0 resolves it). A CUDA C++ source named by ``impls`` is compiled here first, so that a
    compile error stops the run before any rank starts."""
    from torch import device as torch_device

    from harness.core.discovery import registry
    from harness.core.spec import SpecError
    from harness.device.runtime import RuntimeSetupError, resolve_device

    try:
        resolved = torch_device(resolve_device(device).device)
        reg = registry()
        specs = reg.select(list(selectors), tier)
        reg.check_impls(specs, list(impls))
        items = {w: reg.plan(tier, w, list(selectors), list(impls), resolved.type)
                 for w in sizes}
    except (RuntimeSetupError, SpecError) as exc:
        raise RunRefused(str(exc)) from exc
    _compile_cuda_sources(impls)
    return Plan(specs, items, resolved.type)


def _compile_cuda_sources(impls: Sequence[str]) -> None:
    """Compile every ``path.cu:launch`` implementation for this machine's GPU (sm_90 without
    one) where NVRTC is installed."""
    from harness.core.spec import load_callable
    from harness.device import cuda

    sources = [name for name in impls if name.partition(":")[0].endswith(".cu")]
    if not sources or cuda.nvrtc_missing():
        return
    arch = cuda.driver_arch()
    for name in sources:
        try:
            load_callable(name).compile(arch)  # type: ignore[attr-defined]
        except cuda.CudaCompileError as exc:
            raise RunRefused(f"--impl {name}: {exc.headline} (compiling for {arch}; the NVRTC "
                             "log is above)", detail=exc.full()) from exc


def shared_impl_notes(specs: Sequence[Any], impls: Sequence[str]) -> list[str]:
    """One line per requested name that several selected ops have (it runs on all)."""
    from harness.core.discovery import registry

    return [f"note: --impl {name} is a name of {len(ops)} selected ops ({', '.join(ops)}): "
            "it runs on each; select one op to run only its own"
            for name, ops in registry().shared_impl_names(specs, list(impls)).items()]


def _not_run_notes(specs: Sequence[Any], device_type: str) -> list[str]:
    """What a run on ``device_type`` leaves out unless asked for, in a line per kind."""
    from harness.core.spec import not_runnable

    left_out = not_runnable(specs, device_type)
    triton = [name for name, fn in left_out if getattr(fn, "triton", False)]
    cuda_cpp = [name for name, fn in left_out if not getattr(fn, "triton", False)]
    notes = []
    if cuda_cpp:
        notes.append(f"not run on {device_type}: {', '.join(cuda_cpp)} (CUDA C++ "
                     "implementations; they run with --device cuda on a GPU machine)")
    if triton:
        notes.append(f"not run on {device_type} unless asked for: {', '.join(triton)} (Triton "
                     "implementations: --impl NAME runs them through Triton's interpreter "
                     "here; a GPU run compiles them)")
    return notes


#: the longest deadline, grace or stall limit a run takes: longer ones are typing errors
#: (nan, inf and 1e300 passed once and failed every case in the timer's arithmetic)
MAX_SECONDS = 7 * 24 * 3600.0


def check_seconds(options: RunOptions) -> None:
    """Refuse a deadline, grace or stall limit that is no number of seconds up to a week:
    first thing, before a job starts or a suite is imported."""
    for flag, value, least in (("--timeout", options.timeout, None),
                               ("--grace", options.grace, 0.0),
                               ("--stall-timeout", options.stall_timeout, 0.0)):
        if value is not None and not (
                (value > 0 if least is None else value >= least) and value <= MAX_SECONDS):
            raise RunRefused(f"{flag} {value} must be a number of seconds "
                             f"{'above 0' if least is None else 'from 0'} up to {MAX_SECONDS:.0f}"
                             " (a week)")


def preflight(options: RunOptions, device_type: str) -> tuple[str, str | None]:
    """The MPI launcher and compute-sanitizer (or None) the run starts its ranks with;
    refuses what would break the ranks, before any starts."""
    from harness.device import envinfo

    if options.timing_mode == "graph" and device_type != "cuda":
        raise RunRefused("--timing-mode graph replays CUDA graphs and needs a GPU: drop it (CPU "
                         "timing uses perf_counter) or run with --device cuda on a machine "
                         "with one")
    sanitizer = None
    if options.sanitize:
        from harness.device import sanitizer as compute_sanitizer

        if device_type != "cuda":
            raise RunRefused("--sanitize checks CUDA kernels with compute-sanitizer and needs "
                             "a GPU: run with --device cuda on a machine with one")
        sanitizer = compute_sanitizer.find()
        if sanitizer is None:
            raise RunRefused("--sanitize needs compute-sanitizer (part of the CUDA toolkit): "
                             "put its bin directory on PATH or set CUDA_HOME")
    if options.hostfile:
        from harness.engine import hostfile

        bad = hostfile.problem(options.hostfile)
        if bad:
            raise RunRefused(bad)
    mpiexec = envinfo.find_launcher(options.launcher)
    if mpiexec is None:
        if options.launcher:
            named = f" ({options.launcher!r})"
        elif os.environ.get("HARNESS_MPIEXEC"):
            named = (f" ($HARNESS_MPIEXEC is {os.environ['HARNESS_MPIEXEC']!r}: unset it or "
                     "point it at one)")
        else:
            named = ""
        raise RunRefused(f"no MPI launcher found{named}: `pip install mpich` (or install MPI), "
                         "or pass --launcher PATH", infra=True)
    if options.device != "cpu":
        from harness.device import bringup

        blockers = bringup.run_blockers(envinfo.site_facts(mpiexec, env={}, mpi=False),
                                        options.device, options.world_sizes)
        if blockers:
            raise RunRefused(f"{blockers[0]} (`harness env --check` lists every check)")
    return mpiexec, sanitizer


def check_db(db_path: Path | str, reporter: Reporter) -> bool:
    """Whether the history DB can take the run's results, checked before any rank starts: a
    damaged SQLite file or a DB that refuses this user refuses the run (nothing is written to
    it); one that cannot take writes now (a PostgreSQL server unreachable, a full disk) does
    not (False: the run keeps its results in its folder and stores them at its end if the DB
    is back, or `harness ingest` does)."""
    from harness.history import store
    from harness.history.sql import Unavailable

    if isinstance(db_path, Path) and not db_path.exists():
        return True
    try:
        conn = store.connect(db_path)
        try:
            store.check_integrity(conn)
        finally:
            conn.close()
    except Unavailable as exc:
        reporter.note(f"warning: {exc}; the run goes on and keeps its results in its run "
                      "folder, to be stored at its end or with `harness ingest`")
        return False
    except store.StoreError as exc:
        raise RunRefused(str(exc)) from exc
    return True


def write_calibrations(db_path: Path | str, fingerprint: str, files: RunDir) -> bool:
    """This machine's calibrations (``harness calibrate``) into the run directory, where the
    ranks read them, so results carry percent of peak; False when the machine was never
    calibrated."""
    from harness.history import store

    if isinstance(db_path, Path) and not db_path.exists():
        return False
    try:
        conn = store.connect(db_path)
        try:
            found = store.latest_calibrations(conn, fingerprint)
        finally:
            conn.close()
    except store.StoreError as exc:
        raise RunRefused(str(exc)) from exc
    if found:
        files.calibrations.write_text(json.dumps(found, indent=1), encoding="utf-8")
    return bool(found)


def new_run(options: RunOptions, mpiexec: str, db_path: Path | str,
            run_id: str | None = None) -> tuple[Path, RunInfo]:
    """A new run's directory (beside the history DB ``db_path``, or in ``--out-dir``) and
    record; ``run_id``: the one its warm job was started under."""
    import sys

    from harness.device import envinfo
    from harness.history import store

    run_id = run_id or uuid.uuid4().hex
    run_dir = (store.runs_root(db_path, options.out_dir) / run_id).resolve()
    make_run_folder(run_dir)
    env = envinfo.environment(mpiexec)
    info = RunInfo(run_id=run_id, started_at=time.time(), tier=options.tier,
                   world_sizes=list(options.world_sizes), machine=envinfo.machine(), env=env,
                   selectors=list(options.selectors), impls=list(options.impls),
                   argv=sys.argv[1:], git_commit=env.get("git_commit"))
    return run_dir, info


def execute(options: RunOptions, reporter: Reporter,
            resumed: tuple[Path, RunInfo] | None = None) -> Outcome:
    """Run ``options`` (or finish the ``resumed`` run: its directory and record), store the
    results in the history DB, analyse them, and return what happened. A new run starts its
    first job before it plans (harness.engine.warm), and kills it if it is refused."""
    from harness.device import envinfo
    from harness.engine import warm as warm_start
    from harness.history import store

    check_seconds(options)
    if options.golden_dir:
        options = dataclasses.replace(options, golden_dir=str(Path(options.golden_dir).resolve()))
    db_path = store.resolve_db_path(options.db)
    warm = None
    if resumed is None:
        warm = warm_start.start(options, envinfo.find_launcher(options.launcher),
                                store.runs_root(db_path, options.out_dir), uuid.uuid4().hex)
    try:
        return _execute(options, reporter, resumed, db_path, warm)
    finally:
        runlock.release_all()  # the run's folder (held from when it is known)
        if warm is not None:
            warm.cancel()  # nothing once its world size's launch has let it go


def nothing_to_run(the_plan: Plan, tier: str, world_sizes: Sequence[int]) -> str | None:
    """Why ``the_plan`` runs nothing, in words (None where it runs a case): its ops' cases
    are at other world sizes, or in no case of the tier."""
    if any(the_plan.items.values()):
        return None
    specs = the_plan.specs
    where = "; ".join(f"{s.name} runs at {s.world_sizes_of(tier)}" for s in specs[:4]
                      if s.world_sizes_of(tier)) or "none of its ops has cases there"
    more = f" (and {len(specs) - 4} more ops)" if len(specs) > 4 else ""
    return (f"the selection has no case in tier {tier!r} at world sizes "
            f"{','.join(map(str, world_sizes))}: {where}{more}")


def _execute(options: RunOptions, reporter: Reporter, resumed: tuple[Path, RunInfo] | None,
             db_path: Path | str, warm: Any) -> Outcome:
    """``execute`` once the first job is started (``warm``) or is not started early."""
    from harness.device import envinfo

    the_plan = plan(options.selectors, options.tier, options.world_sizes, options.impls,
                    options.device)
    empty = nothing_to_run(the_plan, options.tier, options.world_sizes)
    if empty:
        raise RunRefused(f"{empty}; try `harness list` to see what exists")
    for line in shared_impl_notes(the_plan.specs, options.impls):
        reporter.note(line)
    mpiexec, sanitizer = preflight(options, the_plan.device_type)
    reachable = check_db(db_path, reporter)
    run_dir, info = resumed if resumed is not None else new_run(
        options, mpiexec, db_path, warm and warm.cfg.run_id)
    runlock.hold(run_dir)  # a resumed run's was taken by resume.prepare
    info.status, info.options = "running", options.to_json()
    files = RunDir(run_dir)
    info.write(files.run_json)
    calibrated = reachable and write_calibrations(db_path, info.machine["fingerprint"], files)
    if not calibrated and options.timed:
        reporter.note("note: this machine has no calibration: times are not checked against "
                      "its copy and matmul peaks (a time past them fails as impossible) and no "
                      "% of peak is shown; `harness calibrate` measures them once")
    reporter.started(info, run_dir, resumed is not None, len(the_plan.keys))
    if not options.impls and resumed is None:  # said once the run is sure to start
        for line in _not_run_notes(the_plan.specs, the_plan.device_type):
            reporter.note(line)
    outcome = Outcome(info=info, run_dir=run_dir, db_path=db_path,
                      controls={s.name: frozenset(s.negative_controls) for s in the_plan.specs},
                      work_models={s.name: s.work for s in the_plan.specs if s.work})
    from harness.engine.launch import LaunchConfig

    cfg = LaunchConfig(launcher=mpiexec, run_dir=run_dir, run_id=info.run_id, options=options,
                       env_id=envinfo.env_id(info.env), sanitizer=sanitizer)
    try:
        _launch_all(cfg, the_plan, reporter, outcome, warm)
        info.finished_at = time.time()
        info.status = ("infra_error" if outcome.infra_errors else
                       "config_error" if outcome.placement_error else "complete")
        info.write(files.run_json)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise RunRefused(f"the disk holding {run_dir} is full ({exc.strerror}): the cases "
                         f"recorded so far stay in {files.results}; free space, then `harness "
                         f"run --resume {info.run_id}` runs the rest and stores the run",
                         infra=True) from exc
    _store_and_analyse(outcome)
    outcome.missing = the_plan.keys - {r.key for r in outcome.results}
    return outcome


def _launch_all(cfg: Any, the_plan: Plan, reporter: Reporter, outcome: Outcome,
                warm: Any = None) -> None:
    """Every world size's job in turn, until the launcher fails or the ranks find no
    placement; ``warm``, the first world size's job already started, is let go by its
    launch (or killed, where that world size has nothing to run)."""
    from harness.engine.launch import LauncherError, PlacementFailed, run_world_size

    for w in cfg.options.world_sizes:
        items = the_plan.items.get(w) or []
        if not items:
            continue
        first = warm if warm is not None and warm.world_size == w else None
        if warm is not None and first is None:
            warm.cancel()
        warm = None
        try:
            world = run_world_size(cfg, w, items, reporter.world(w, len(items)), warm=first)
        except LauncherError as exc:
            outcome.infra_errors.append(str(exc))
            return
        except PlacementFailed as exc:
            outcome.placement_error = str(exc)
            return
        finally:  # a job stopped by Ctrl-C or a lost node: what its MPI left on this node
            shm_sweep.sweep(cfg.files.of(w, "shm.json"))
        warning = (world.placement or {}).get("warning")
        for said in ([warning] if warning else []) + world.notes + big_logs(world.logs):
            reporter.warning(w, said)
        if world.infra_error:
            outcome.infra_errors.append(world.infra_error)


def _store_and_analyse(outcome: Outcome) -> None:
    """Ingest the run directory into the history DB and find what changed; both are done
    again on a new connection where a PostgreSQL server restarts under them."""
    from harness.history import regress, store
    from harness.history.sql import Unavailable

    def work(conn: Any) -> None:
        store.ingest_dir(conn, outcome.run_dir)
        outcome.results = store.results_for_run(conn, outcome.run_id)
        outcome.findings = regress.analyze_and_store(conn, outcome.run_id)

    kept = (f"the run's results are kept in {outcome.run_dir}: `harness ingest "
            f"{outcome.run_dir}` stores them")
    try:
        store.reconnecting(outcome.db_path, work)
    except Unavailable as exc:  # the results are sound: shown from the folder they wait in
        from harness.core.results import read_run_dir

        _, outcome.results = read_run_dir(outcome.run_dir)
        outcome.stored = False
        outcome.infra_errors.append(f"{exc} ({kept})")
    except store.StoreError as exc:
        raise RunRefused(f"{exc} ({kept})") from exc
