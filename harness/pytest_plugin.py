"""pytest plugin: one item per (case, implementation) of the selected tier at this world size.

Every MPI rank runs pytest with this plugin::

    mpiexec -n 4 python -m pytest --pyargs suites -p harness.pytest_plugin -k allreduce

Collection is the same on every rank (it comes from the registry), so the ranks walk the items
in lockstep. Rank 0 alone reports to the terminal, writes ``--junitxml``, and appends each
``CaseResult`` to ``--harness-results`` as a fsynced JSON line; the other ranks stay quiet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.core import results as results_mod
from harness.core.discovery import BUILTIN_SUITE, builtin_suite_dir, registry, use_suites
from harness.core.golden import GoldenShelf
from harness.core.results import CaseResult, RunInfo
from harness.core.spec import PlannedItem, Registry, SpecError
from harness.core.timing import TimingConfig
from harness.device import children, process_state, triton_impl
from harness.device.envinfo import env_id
from harness.engine import alive, shm_sweep
from harness.engine.options import (
    FAST_EXIT_ENV,
    JOB_ENDED_EXIT,
    LAUNCH_HOST_ENV,
    LAUNCH_LOG_ENV,
    RunDir,
    RunOptions,
    stacks_in_log,
    write_json,
)
from harness.engine.watchdog import STACKS_WAIT_S, ahead

_SESSION = pytest.StashKey["HarnessSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("harness", "kernel-harness cases")
    g.addoption("--harness-run-dir", default=None,
                help="the run directory: its run.json holds the run's options (harness run "
                     "writes it); results, progress and placement files go there")
    g.addoption("--harness-world-size", type=int, default=None,
                help="the number of ranks the launcher started: a rank whose MPI world "
                     "differs stops the job (its ranks did not wire up into one)")
    g.addoption("--harness-wait-for", default=None, metavar="PATH",
                help="wait until PATH exists before reading the run directory (a job harness "
                     "started while it was still planning the run: harness.engine.warm)")
    g.addoption("--harness-set", action="append", default=[], metavar="NAME=VALUE",
                help="set one run option by hand (repeatable): tier=nightly, "
                     "impls=torch,tile, bench=false, device=cpu, timeout=60 (the fields of "
                     "harness.engine.options.RunOptions); over the run directory's run.json")


def rank_settings(config: pytest.Config, files: RunDir | None
                  ) -> tuple[RunOptions, RunInfo | None]:
    """This job's options (the run directory's ``run.json``, then any ``--harness-set``) and
    the run's record, if the directory holds one."""
    info = RunInfo.read(files.run_json) if files and files.run_json.is_file() else None
    options = RunOptions.from_mapping(info.options if info else {})
    try:
        for assignment in config.option.harness_set:
            options = options.with_text(assignment)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    return options, info


def _calibration_for(path: Path | None, device: Any) -> dict[str, Any] | None:
    """This rank's device's calibration from the file the launcher wrote, if any."""
    if path is None or not path.is_file():
        return None
    from harness.engine.calibrate import device_key

    try:
        calibrations = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # percent of peak is a nicety: never fail a run over it
    return calibrations.get(device_key(device))


def _write_placement(path: Path, world: Any) -> None:
    """Rank 0's report of the ranks' devices and of where each ran, for the launcher."""
    facts = world.facts
    write_json(path, {
        "backend": world.backend, "warning": world.placements[0].warning,
        "devices": [p.device for p in world.placements],
        "gpus": [p.gpu_uuid for p in world.placements],
        # where each rank ran: its node, its place on it, the ranks there, its CPUs
        "nodes": [f.node for f in facts], "local_ranks": [f.local_rank for f in facts],
        "local_sizes": [f.local_size for f in facts], "cpus": [list(f.cpus) for f in facts]})


def _watchdog(files: RunDir | None, size: int, rank: int, run_id: str) -> Any:
    """This rank's watchdog, asking and answering on its job's stacks board, writing into
    its job's log where it runs beside the launcher."""
    from mpi4py import MPI

    from harness.engine.watchdog import StacksBoard, Watchdog, log_to_append

    log = os.environ.get(LAUNCH_LOG_ENV)
    board = None if files is None else StacksBoard(
        files.of(size, "stacks-request"), [files.of(size, f"rank{r}.stacks")
                                           for r in range(size)],
        rank, job=log or f"{run_id}:{os.getppid()}")
    return Watchdog(abort=lambda code: MPI.COMM_WORLD.Abort(code), who=f"rank {rank}",
                    board=board, log=log_to_append(log, os.environ.get(LAUNCH_HOST_ENV),
                                                   socket.gethostname()))


class HarnessSession:
    """Per-process state: the World, the registry, and where results go."""

    def __init__(self, config: pytest.Config) -> None:
        from mpi4py import MPI

        from harness.device.runtime import RuntimeSetupError, World, world_mismatch

        opt = config.option
        size = opt.harness_world_size or MPI.COMM_WORLD.Get_size()
        files = self.files = RunDir(Path(opt.harness_run_dir)) if opt.harness_run_dir else None
        if files:  # by hand, a folder not made yet
            try:
                files.path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise pytest.UsageError(f"--harness-run-dir {files.path}: cannot make it "
                                        f"({exc.strerror}): pass a folder you can write") from exc
        if files and MPI.COMM_WORLD.Get_rank() == 0:  # what a killed job leaves, before a wait
            shm_sweep.record(files.of(size, "shm.json"))
        if opt.harness_wait_for:
            alive.stop_watching()  # the wait for the go file is the run's planning, not a stall
            _wait_for(Path(opt.harness_wait_for))
            alive.watch_quiet()
        options, info = rank_settings(config, files)
        self.options = options
        self.tier, self.selectors, self.impls = options.tier, options.selectors, options.impls
        self.bench = options.timed
        self.results_path = files.results if files else None
        self.progress_path = files.of(size, "progress.json") if files else None
        self.sanitizer_log = str(files.of(size, "sanitizer")) if files and options.sanitize \
            else None
        self.run_id = info.run_id if info else os.environ.get("HARNESS_RUN_ID", "adhoc")
        self.env_id = env_id(info.env) if info else ""
        self.skip: set[str] = set()
        if files and files.of(size, "skip").exists():
            self.skip = set(files.of(size, "skip").read_text().split())
        placement_path = files.of(size, "placement.json") if files else None
        use_suites(options.suite_sources, options.suite_golden_dir
                   and Path(options.suite_golden_dir))
        try:
            unwired = world_mismatch(opt.harness_world_size, MPI.COMM_WORLD.Get_size())
            if unwired:
                raise RuntimeSetupError(unwired)
            self.registry: Registry = registry()
            self.world = World.from_mpi(options.device, timeout_s=self._group_timeout())
            # before any implementation is resolved: a Triton kernel is compiled or
            # interpreted when its module is imported (harness.device.triton_impl)
            triton_impl.configure_rank(self.world.device.type)
            # the implementations resolved here, not at collection: an --impl the launcher
            # imported that a rank cannot (another node's environment) is one line, exit 2
            self._planned = self.registry.plan(self.tier, self.world.size,
                                               list(self.selectors), list(self.impls),
                                               self.world.device.type)
        except (SpecError, RuntimeSetupError) as exc:
            # every rank decided the same; rank 0 tells the launcher, which stops with exit 2
            if placement_path is not None and MPI.COMM_WORLD.Get_rank() == 0:
                write_json(placement_path, {"error": str(exc)})
            raise pytest.UsageError(str(exc)) from exc
        if opt.harness_wait_for and self.world.rank == 0:
            # every rank is past its wait: the world above was made by all of them
            Path(opt.harness_wait_for).unlink(missing_ok=True)
        if placement_path is not None and self.world.rank == 0:
            _write_placement(placement_path, self.world)
        self.watchdog = _watchdog(files, size, self.world.rank, self.run_id)
        self.timing = dataclasses.replace(
            TimingConfig.for_tier(self.tier), mode=options.timing_mode,
            l2_flush=options.l2_flush,
        ).for_placement(self.world.contention, force=options.full_timing)
        self.calibration = _calibration_for(files and files.calibrations, self.world.device)
        self.golden = None if not options.use_golden else GoldenShelf(
            self.registry.golden_dir_of, options.golden_dir)
        from harness.engine.case_setup import SetupCache

        self.setups = SetupCache()  # a case's inputs and reference, shared by its impls
        self.phase = ""  # the case in progress's (runner.PHASES), for a timeout's reason
        self.exitstatus: int | None = None  # pytest's, once the session finished

    def _group_timeout(self) -> float:
        # collectives must outlive the watchdog: the watchdog, not gloo, decides a timeout
        longest = max((s.deadline_s for s in registry().specs.values()), default=120.0)
        return 2 * self.options.deadline_of(longest) + 60.0

    def planned(self) -> list[PlannedItem]:
        return self._planned

    def run(self, item: PlannedItem) -> CaseResult:
        from harness.engine.runner import run_case

        deadline = self.options.deadline_of(item.case.spec.deadline_s)
        root = self.world.rank == 0
        if root and self.progress_path is not None:
            write_json(self.progress_path, {"key": item.key, "started": time.time(),
                                             "deadline_s": deadline, "pid": os.getpid()})
        # other ranks wait a little longer, so that rank 0 records the timeout (and waits for
        # their stacks, which it asks for when it writes its own) before an abort
        on_expire = (lambda: self._record_timeout(item, deadline)) if root else None
        self.phase, self._own_failure = "", None
        alive.stop_watching()  # the start-up's alarm (the first case's: a no-op after it)
        self.watchdog.arm(item.key, deadline if root else deadline + STACKS_WAIT_S,
                          on_expire=on_expire, stacks_after=ahead(deadline), ask_others=root)
        result = run_case(self.world, item.case, item.impl, item.fn, run_id=self.run_id,
                          bench=self.bench, timing=self.timing, env_id=self.env_id,
                          golden=self.golden, calibration=self.calibration,
                          setups=self.setups, phase=self._enter,
                          on_failure=lambda why: self._note_failure(item, why))
        sticky = self._sticky_error(result, self._own_failure)
        if sticky:
            result = dataclasses.replace(result, status="error", reason=sticky)
        if self.watchdog.disarm() and root and self.results_path is not None:
            results_mod.append(self.results_path, result)
        self.watchdog.quiet(f"no case begun since {item.key}", alive.stall_s())
        if sticky or process_state.tainted():
            # one faulting kernel (or a flush-to-zero that threads inherited) costs one case:
            # the launcher relaunches the rest in new processes, as after a timeout
            _exit_now(JOB_ENDED_EXIT)
        return result

    def _sticky_error(self, result: CaseResult, own: str | None) -> str | None:
        """The case's reason, extended, when it left a rank's CUDA context, or its
        torch.distributed connections (``own``: this rank's error), unusable; every rank gets
        the same answer (the status is agreed, the probes gathered over MPI, which needs no
        CUDA and no torch.distributed)."""
        from harness.device.runtime import broken_communicator, broken_context

        # a fault surfaces as an exception (an "error"), never as wrong numbers alone; the
        # status is agreed, so every rank skips the gather alike, and the failing cases of
        # negative controls pay nothing
        if result.status != "error":
            return None
        why = broken_context(self.world.device) or (
            broken_communicator(own) if self.world.size > 1 else None)
        if why and self.sanitizer_log:
            from harness.device import sanitizer

            log = sanitizer.log_path(self.sanitizer_log, self.world.rank)
            report = sanitizer.first_error(log.read_text(errors="replace")) \
                if log.is_file() else None
            why = f"{why}; compute-sanitizer: {report}" if report else why
        broken = self.world.comm.allgather(why)
        ranks = [r for r, theirs in enumerate(broken) if theirs]
        if not ranks:
            return None
        what = "torch.distributed connections" if "torch.distributed" in broken[ranks[0]] \
            else "CUDA context"
        return (f"{result.reason}; it left the {what} of rank(s) "
                f"{', '.join(map(str, ranks))} unusable ({broken[ranks[0]]}): the job ended "
                "after this case and its remaining cases ran in a new one")

    def _enter(self, phase: str) -> None:
        self.phase = phase  # read by the watchdog's thread when a deadline passes

    def _note_failure(self, item: PlannedItem, why: str) -> None:
        self._own_failure = why
        if self.files is not None:
            self.files.note_failure(self.world.size, self.world.rank, item.key, why)

    def _record_timeout(self, item: PlannedItem, deadline: float) -> None:
        from harness.engine.runner import PHASES

        if self.results_path is None:
            return
        spec = item.case.spec
        # rank 0's phase: another rank may be stuck before it (a hung rank is not asked)
        who = "" if self.world.size == 1 else "rank 0 "
        where = f" ({who}{PHASES[self.phase]})" if self.phase in PHASES else ""
        if self.files is not None:
            where += self.files.failed_first(self.world.size, item.key)
        results_mod.append(self.results_path, CaseResult(
            run_id=self.run_id, case_id=item.case.id, op=spec.name, family=spec.family,
            impl=item.impl, world_size=item.case.world_size, params=dict(item.case.params),
            status="timeout", reason=f"no result within its {deadline:g} s deadline{where}; "
                                     "the job was aborted and the remaining cases relaunched"
                                     f"{stacks_in_log(os.environ.get(LAUNCH_LOG_ENV))}",
            device=str(self.world.device), started_at=time.time(), env_id=self.env_id,
            duration_s=deadline))


def _wait_for(path: Path) -> None:
    """Until ``path`` exists: this job was started before its run was planned, and has
    imported torch and the suites and wired up MPI meanwhile."""
    from harness.engine.warm import GO_WAIT_S

    give_up = time.monotonic() + GO_WAIT_S
    while not path.exists():
        if time.monotonic() > give_up:
            raise pytest.UsageError(f"no {path} within {GO_WAIT_S:g} s: the harness that "
                                    "started this job is gone")
        time.sleep(0.005)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """No pytest-xdist workers in a rank, whatever ``-n auto`` an ini file adds (the
    project's own, when run by hand from its root): the ranks are the job's processes."""
    return 0


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    children.mark()
    session = HarnessSession(config)
    config.stash[_SESSION] = session
    if session.world.rank != 0:
        config.option.xmlpath = None  # one junit file, from rank 0
        config.option.verbose = -2


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    hs = session.config.stash[_SESSION]
    if hs.world.rank != 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    hs = session.config.stash.get(_SESSION, None)
    if hs is not None:
        hs.exitstatus = int(exitstatus)
        left = children.end_leftovers()
        if left:  # they would hold the launcher's pipes open, and outlive the run
            print(f"harness: rank {hs.world.rank} killed {len(left)} process(es) its "
                  f"implementations started and left running: pids {left}", file=sys.stderr,
                  flush=True)
        # the end can hang in C holding the GIL (MPI_Finalize), where no Python thread runs
        alive.watch_quiet()
        hs.world.close()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A job the launcher started ends here, once its results, junit file and summary are
    written: MPI finalized, then the process exits without tearing down the interpreter,
    whose torch modules take about 0.4 s of CPU each, seconds for 8 ranks on 2 cores at every
    job's end. pytest run by hand inside the ranks (no ``FAST_EXIT_ENV``) exits as usual."""
    hs = config.stash.get(_SESSION, None)
    # under compute-sanitizer the process ends as usual: its report comes at the exit
    if hs is None or hs.exitstatus is None \
            or os.environ.get(FAST_EXIT_ENV) != "1" or hs.options.sanitize:
        return
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    _exit_now(hs.exitstatus)


def _exit_now(code: int) -> None:
    """End this process with ``code`` after flushing its output, skipping the teardown."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    suites_dir = builtin_suite_dir()
    if (suites_dir is not None and file_path.suffix == ".py"
            and file_path.parent.resolve() == suites_dir.resolve()
            and not file_path.name.startswith("_")):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


def _external(hs: HarnessSession, planned: PlannedItem) -> bool:
    """Whether an item's op comes from a suite outside this project's ``suites`` package."""
    return hs.registry.suite_of.get(planned.case.spec.name, BUILTIN_SUITE) != BUILTIN_SUITE


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so they apply to these too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Items of other suites' ops (plugins, --suite paths) have no module in ``suites``:
    they hang off the session, after the built-in ones, in the registry's order."""
    hs = config.stash.get(_SESSION, None)
    if hs is None:
        return
    for planned in hs.planned():
        if _external(hs, planned) and planned.key not in hs.skip:
            items.append(CaseItem.from_parent(session, name=f"{planned.case.id}@{planned.impl}",
                                              planned=planned))


class SuiteFile(pytest.File):
    """A suites module: its items come from the registry, not from test functions."""

    def collect(self):  # type: ignore[override]
        hs: HarnessSession = self.config.stash[_SESSION]
        family = self.path.stem
        for planned in hs.planned():
            if (planned.case.spec.family != family or planned.key in hs.skip
                    or _external(hs, planned)):
                continue
            yield CaseItem.from_parent(self, name=f"{planned.case.id}@{planned.impl}",
                                       planned=planned)


class CaseFailed(Exception):
    """The case did not pass; carries its result for the report."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.reason)
        self.result = result


class CaseItem(pytest.Item):
    """One implementation on one case."""

    def __init__(self, *, planned: PlannedItem, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.planned = planned
        self.extra_keyword_matches.update(
            {planned.impl, planned.case.spec.name, planned.case.spec.family})

    def runtest(self) -> None:
        result = self.config.stash[_SESSION].run(self.planned)
        self.user_properties.append(("status", result.status))
        if result.status == "skip":
            pytest.skip(result.reason)
        if result.status != "pass":
            raise CaseFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None):  # type: ignore[override]
        if isinstance(excinfo.value, CaseFailed):
            r = excinfo.value.result
            return f"{r.status.upper()} {r.case_id}@{r.impl} (world {r.world_size}): {r.reason}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name
