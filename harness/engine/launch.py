"""Launch the ranks: one MPI job per world size, relaunched after a timeout or crash.

Each job is ``mpiexec -n N python -m pytest --pyargs suites -p harness.pytest_plugin ...``.
Rank 0 appends results to the run's ``results.jsonl`` and names the case in progress in a
progress file. When a job dies (its in-rank watchdog aborted it, a rank crashed, or this
launcher's own backstop killed it past the deadline plus a grace period), the case in progress
is recorded as ``timeout`` or ``crash`` and a new job runs the cases not yet recorded.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import results as results_mod
from harness.core.discovery import SUITES_PACKAGE
from harness.core.results import CaseResult
from harness.core.spec import PlannedItem
from harness.device import cuda, sanitizer, triton_impl
from harness.device.placement import usable_cpus
from harness.engine import mpi_init, shm_sweep, srun, strays
from harness.engine.alive import ALIVE_ENV, STALL_ENV
from harness.engine.giveup import JobEndingStreaks
from harness.engine.joblog import (
    PYTEST_NORMAL,
    SlurmLines,
    cut,
    death,
    flood_reason,
    flooded,
    launcher_signal,
    lost_node_message,
    signal_name,
    start_and_end,
    tail,
)
from harness.engine.options import (
    FAST_EXIT_ENV,
    JOB_ENDED_EXIT,
    LAUNCH_HOST_ENV,
    LAUNCH_LOG_ENV,
    RunDir,
    RunOptions,
    stacks_in_log,
)
from harness.engine.rank_env import rank_environment, wait_environment
from harness.engine.recorded import LauncherError, RecordedKeys
from harness.engine.stall import Stall, StallClock

#: free bytes under which a job's death is put down to a full disk
DISK_LOW = 1 << 20


def disk_short(path: Path) -> bool:
    """Whether the file system holding ``path`` has under DISK_LOW bytes free for this user."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_LOW


class NodeLost(LauncherError):
    """SLURM declared a node of the job dead (its slurmd stopped answering) while the job ran:
    the run stops there, in one line, with the results it recorded kept and the case in
    progress unrecorded, for ``harness run --resume`` once the node is back. It does not
    relaunch: a job asking for the same nodes would wait for the lost one, and inside a batch
    allocation the allocation itself is gone (exit code 4)."""


class PlacementFailed(RuntimeError):
    """The ranks started but found no placement for themselves (a CPU-only torch beside GPUs,
    ranks sharing an exclusive GPU): a configuration error, said in one line (exit code 2)."""


@dataclass
class LaunchConfig:
    """What the launcher needs besides the run's options: where the run is, under which id,
    and the resolved launcher (and compute-sanitizer) to start the ranks with."""

    launcher: str
    run_dir: Path
    run_id: str
    options: RunOptions = field(default_factory=RunOptions)
    env_id: str = ""
    #: compute-sanitizer to run every rank under (memcheck), or None
    sanitizer: str | None = None
    #: launches in a row that record nothing before the launcher gives up
    max_fruitless: int = 2

    @property
    def files(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def results_path(self) -> Path:
        return self.files.results


@dataclass
class WorldOutcome:
    """What happened at one world size."""

    world_size: int
    launches: int = 0
    infra_error: str | None = None
    #: the ranks' devices, backend and any warning about them (rank 0's placement report)
    placement: dict | None = None
    logs: list[Path] = field(default_factory=list)
    #: what the user should hear of though the cases ran (a job stopped stuck at its end)
    notes: list[str] = field(default_factory=list)


#: launcher options that place ranks on other hosts
_HOST_OPTIONS = ("-f", "-hostfile", "--hostfile", "-machinefile", "-host", "-hosts", "--host")


def one_node(cfg: LaunchConfig, env: Mapping[str, str]) -> bool:
    """Whether every rank of a job runs on this host: mpiexec or mpirun with no host list,
    outside a SLURM allocation of several nodes (hydra spreads ranks over one); srun inside an
    allocation of one node (outside one, srun may place the ranks anywhere)."""
    nodes = (env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "").strip()
    if Path(cfg.launcher).name.startswith("srun"):
        return nodes == "1"
    if cfg.options.hostfile:
        return False
    if any(a.split("=")[0] in _HOST_OPTIONS for a in cfg.options.launcher_args):
        return False
    return nodes in ("", "1")


def build_command(cfg: LaunchConfig, world_size: int, attempt: int, go: Path | None = None
                  ) -> list[str]:
    """The mpiexec (or srun) command line of one job: the ranks get the run directory and
    their world size, and read every other setting from the run's ``run.json`` (once ``go``
    exists, where given: harness.engine.warm)."""
    opts, files = cfg.options, cfg.files
    name = Path(cfg.launcher).name
    args = srun.srun_args(opts.launcher_args) if name.startswith("srun") \
        else opts.launcher_args
    cmd = [cfg.launcher, *args, "-n", str(world_size)]
    if opts.hostfile and name != "srun":
        cmd += ["-hostfile", opts.hostfile]
    if cfg.sanitizer:
        cmd += sanitizer.command_prefix(cfg.sanitizer, str(files.of(world_size, "sanitizer")))
    return cmd + [
        sys.executable, "-m", "pytest", "--pyargs", SUITES_PACKAGE, "-p", "harness.engine.alive",
        "-p", "harness.pytest_plugin",
        "-p", "no:cacheprovider", "-p", "no:unraisableexception",
        # -s: what the ranks write (a kernel's printf, MPI's abort, the watchdog's and
        # faulthandler's stacks) goes to the launch log as it comes, not into pytest's
        # capture, which a dead or aborted rank takes with it
        "-c", os.devnull, "--rootdir", str(cfg.run_dir), "-q", "-s", "-rfE",
        "--junitxml", str(files.junit(world_size, attempt)),
        "--harness-run-dir", str(cfg.run_dir), "--harness-world-size", str(world_size),
        *(["--harness-wait-for", str(go)] if go is not None else [])]


def _read_progress(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


#: prctl(2)'s option that sets the signal a process gets when its parent exits
_PR_SET_PDEATHSIG = 1


def _stop_with_harness() -> Callable[[], None] | None:
    """A ``preexec_fn`` for the MPI launcher: SIGTERM to it when harness exits, however
    harness exits (prctl(2) PR_SET_PDEATHSIG, kept across execve; Linux only, else None).
    The launcher runs in a session of its own, so a signal to harness's process group never
    reaches it, and without this a killed harness left the job running (mpiexec, given
    SIGTERM, stops its ranks; srun cancels its step). The signal comes when the *thread* that
    started the launcher ends: `harness run` starts it from its main thread. prctl is looked
    up here, in the parent: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # harness exited before the line above: no signal comes
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def kill_group(proc: subprocess.Popen, at_once: bool = False) -> None:
    """Stop a job's launcher and its ranks: SIGTERM, then SIGKILL if they outlive 5 s."""
    steps = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
    for sig, wait in steps[1:] if at_once else steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def dead_case_device(placement: Mapping[str, Any] | None, requested: str) -> str:
    """The device a case that killed its job ran on, as its ranks record it (rank 0's, from
    the job's placement file); without one, the device asked for ("cpu" for auto). On an
    H200, crashes of 4 ranks sharing the GPU were recorded as "cpu" beside their "cuda:0"
    neighbours."""
    devices = (placement or {}).get("devices") or []
    if devices:
        return str(devices[0])
    return requested if requested not in ("", "auto") else "cpu"


def _record_dead_case(cfg: LaunchConfig, item: PlannedItem, status: str, reason: str,
                      placement: Mapping[str, Any] | None = None) -> None:
    spec = item.case.spec
    results_mod.append(cfg.results_path, CaseResult(
        run_id=cfg.run_id, case_id=item.case.id, op=spec.name, family=spec.family,
        impl=item.impl, world_size=item.case.world_size, params=dict(item.case.params),
        status=status, reason=reason, started_at=time.time(), env_id=cfg.env_id,
        device=dead_case_device(placement, cfg.options.device)))


def job_environment(cfg: LaunchConfig, world_size: int) -> dict[str, str]:
    """The environment of one job's ranks (``rank_environment`` plus Triton's and the wait
    settings, a setting the user made winning; ``FAST_EXIT_ENV``, where the ranks say they
    are up, ``ALIVE_ENV``, and the stall limit their stacks are written ahead of,
    ``STALL_ENV``)."""
    env = rank_environment(os.environ, cfg.run_id)
    if not Path(cfg.launcher).name.startswith("srun"):
        # the ranks skip the interpreter's teardown (harness.pytest_plugin.pytest_unconfigure).
        # Not under srun: in one two-node SLURM test its ranks sat in the explicit
        # MPI_Finalize on slurmstepd's PMI2 socket, cause unknown; srun jobs keep the usual exit
        env[FAST_EXIT_ENV] = "1"
    env[ALIVE_ENV] = str(cfg.files.of(world_size, "alive"))
    env[STALL_ENV] = f"{cfg.options.stall_timeout:g}"
    # before anything in a rank imports triton (harness.device.triton_impl)
    device = cfg.options.device
    gpus = cuda.device_count() if device == "auto" else 0
    for name, value in triton_impl.launcher_environment(device, gpus, env).items():
        env.setdefault(name, value)
    for name, value in wait_environment(world_size, len(usable_cpus()),
                                        one_node(cfg, env)).items():
        env.setdefault(name, value)
    return env


def _watch(cfg: LaunchConfig, proc: subprocess.Popen, recorded: RecordedKeys,
           progress_path: Path, report: Callable[[set[str]], None],
           slurm: SlurmLines | None = None, clock: StallClock | None = None
           ) -> tuple[dict | None, Stall | None]:
    """Wait for a job to end, reporting progress; kill it when its case in progress outlives
    its deadline plus the grace period (the in-rank watchdog did not fire), when its log
    (``slurm``'s) passes ``--max-output-mib``, at once when srun reports a node lost (SLURM
    has cancelled the step already) or slurmstepd a PMI request cut (its ranks cannot wire
    up), or when ``clock`` finds it stuck outside any case.
    Returns the progress record of the case it was killed in (``flood``: the log's size
    where that was why; {} where none was in progress), or None, and the Stall it was
    stopped for, or None."""
    killed: dict | None = None
    limit = cfg.options.max_output_mib
    try:
        while proc.poll() is None:
            try:  # a poll every 0.2 s, and at once when the job ends
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            now_done = recorded.update()
            report(now_done)
            if slurm is not None and slurm.update():
                kill_group(proc, at_once=True)
                break
            prog = _read_progress(progress_path)
            flood = flooded(slurm.path, limit) if slurm is not None and not killed else None
            if flood is not None:
                kill_group(proc)
                in_case = prog and prog["key"] not in now_done
                return {**(prog if in_case else {}), "flood": flood}, None
            if (prog and time.time() - prog["started"] > prog["deadline_s"] + cfg.options.grace
                    and prog["key"] not in now_done):
                killed = prog
                kill_group(proc)
            stall = clock.poll(now_done, prog and prog["key"]) if clock and not killed else None
            if stall is not None and proc.poll() is None:
                kill_group(proc)
                return None, stall
    except BaseException:
        kill_group(proc)  # Ctrl-C: take the ranks down with us
        raise
    return killed, None


def _record_case_in_progress(cfg: LaunchConfig, item: PlannedItem, prog: dict,
                             killed: dict | None, rc: int | None, log_path: Path,
                             placement: dict | None, said: str = "") -> None:
    """The case a job died in, recorded as a timeout (killed, or past its deadline: a rank's
    watchdog aborted the job before rank 0 could record it) or a crash."""
    overdue = time.time() - prog["started"] >= prog["deadline_s"]
    if killed and "flood" in killed:  # charged to the case as a crash is (giveup)
        status, why = "crash", flood_reason(killed["flood"], cfg.options.max_output_mib,
                                            log_path)
    elif killed:
        status, why = "timeout", (f"no result within its {prog['deadline_s']:g} s deadline "
                                  f"(+{cfg.options.grace:g} s grace); the job was killed"
                                  f"{stacks_in_log(log_path)}")
    elif overdue:
        status, why = "timeout", (f"no result within its {prog['deadline_s']:g} s deadline; "
                                  f"the job was aborted{stacks_in_log(log_path)}")
    else:
        status, why = "crash", (f"the job died with {death(rc, log_path)} during this case; "
                                f"log: {log_path}{said}")
    why += cfg.files.failed_first(item.case.world_size, item.key)
    _record_dead_case(cfg, item, status, why, placement)


def _dead_in_case(cfg: LaunchConfig, item: PlannedItem, prog: dict, end: _JobEnd,
                  outcome: WorldOutcome, spared: set[str]) -> None:
    """Record the case a job died in; but where the launcher itself was killed by a signal
    from outside (a user, a reaper, a scheduler: no rank's death in its log), the case
    had no fair run and runs again in the next job, once: a second such death in it is
    charged to it (an implementation that kills its launcher)."""
    number = launcher_signal(end.rc, end.log_path) if end.killed is None else None
    if number is not None and item.key not in spared:
        spared.add(item.key)
        outcome.notes.append(
            "the launcher was killed by "
            f"{signal_name(number)} from outside the job during {item.case.id}@{item.impl}; "
            f"the case ran again in a new job (log: {end.log_path})")
        return
    again = "; a second time in this case (it ran again after the first)" if number else ""
    _record_case_in_progress(cfg, item, prog, end.killed, end.rc, end.log_path,
                             outcome.placement, again)


def _give_up(cfg: LaunchConfig, streaks: JobEndingStreaks, recorded: RecordedKeys,
             by_key: Mapping[str, PlannedItem], placement: dict | None,
             ended_by: str | None = None) -> bool:
    """Feed the results read since the last call to ``streaks`` (``ended_by``: the key of
    an error after which its job ended, a sticky fault); record as skipped the cases left of
    an implementation that reached a limit of job-ending cases (``JobEndingStreaks``). True
    if any."""
    gave_up = False
    for key, status in recorded.drain():
        item = by_key.get(key)
        if item is None or status == "skip":  # a skip says nothing about the implementation
            continue
        how = status if status in ("timeout", "crash") else "fault" if key == ended_by else ""
        if not how:
            streaks.ran([item])
        elif streaks.ended_job(item, how):
            pending = [by_key[k] for k in by_key.keys() - recorded.keys]
            given_up, why = streaks.abandoned(item, pending)
            for other in given_up:
                _record_dead_case(cfg, other, "skip", why, placement)
            gave_up = gave_up or bool(given_up)
    return gave_up


def _launches_before(files: RunDir, world_size: int) -> int:
    """The launches a run already made at this world size: a resumed run numbers its
    launches on from them, whose logs stay (the srun line of a lost node among them)."""
    earlier = 0
    while files.launch_log(world_size, earlier + 1).exists():
        earlier += 1
    return earlier


def start_job(cfg: LaunchConfig, world_size: int, attempt: int, log: Any,
              go: Path | None = None) -> subprocess.Popen:
    """One job of the ranks, its output to ``log`` after its command line. The ranks run in
    the run directory's ``work`` folder (what an implementation writes by a relative path
    stays out of the run's files); relative --impl paths (kernel.cu:launch) are the user's,
    so they resolve against the directory harness was started in."""
    env = {**job_environment(cfg, world_size), LAUNCH_LOG_ENV: str(log.name),
           LAUNCH_HOST_ENV: socket.gethostname()}
    work = cfg.files.work
    work.mkdir(exist_ok=True)
    cmd = build_command(cfg, world_size, attempt, go)
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    # appending: the ranks' watchdogs write into the log themselves (harness.engine.watchdog),
    # and the MPI launcher's writes at its own offset would overwrite theirs
    fcntl.fcntl(log.fileno(), fcntl.F_SETFL, fcntl.fcntl(log.fileno(), fcntl.F_GETFL)
                | os.O_APPEND)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=work, start_new_session=True,
                                preexec_fn=_stop_with_harness())
    except OSError as exc:
        raise LauncherError(f"cannot start {cfg.launcher}: {exc}") from exc


def _node_lost(cfg: LaunchConfig, world_size: int, lost: SlurmLines, recorded: RecordedKeys,
               progress_path: Path, by_key: dict[str, PlannedItem]) -> None:
    """Raise NodeLost for the job whose node SLURM declared lost, naming the case it was in."""
    after, prog = recorded.update(), _read_progress(progress_path)
    item = by_key.get(prog["key"]) if prog and prog["key"] not in after else None
    raise NodeLost(lost_node_message(
        world_size, lost.nodes, f"{item.case.id}@{item.impl}" if item else None,
        len(after & by_key.keys()), len(by_key), cfg.run_id))


@dataclass
class _JobEnd:
    """How one job ended: the launcher's exit code, the case it was killed on past its
    deadline (None if none), the Stall it was stopped for (None if none), its log."""

    rc: int | None
    killed: dict | None
    stall: Stall | None
    log_path: Path


def _run_job(cfg: LaunchConfig, world_size: int, attempt: int, warm: Any,
             recorded: RecordedKeys, by_key: Mapping[str, PlannedItem],
             report: Callable[[set[str]], None]) -> _JobEnd:
    """Start one job (or let ``warm``'s go) and watch it to its end; raise NodeLost where
    srun reported a node of it lost, LauncherError where Slurm cut its ranks' wire-up."""
    files = cfg.files
    alive, progress_path = files.of(world_size, "alive"), files.of(world_size, "progress.json")
    already = set(recorded.keys)  # before the job can record anything
    if warm is not None:  # its ranks are up already: their mark stays
        proc, log_path = warm.go()
    else:
        alive.unlink(missing_ok=True)
        log_path = files.launch_log(world_size, attempt)
        with open(log_path, "w") as log:
            proc = start_job(cfg, world_size, attempt, log)
    slurm = SlurmLines(log_path)
    clock = StallClock(cfg.options.stall_timeout, alive, by_key.keys(), already)
    killed, stall = _watch(cfg, proc, recorded, progress_path, report, slurm, clock)
    if stall is not None:
        with open(log_path, "a") as log:
            log.write(f"harness: {stall.describe(cfg.options.stall_timeout)}\n")
    if proc.returncode not in PYTEST_NORMAL or killed or stall:
        # what outlived its launcher (ranks under a stopped proxy): by the job's own mark
        left = strays.pids_with(LAUNCH_LOG_ENV, str(log_path))
        if left:
            strays.kill(left, 5.0)
            with open(log_path, "a") as log:
                log.write(f"harness: killed {len(left)} process(es) of the job that outlived "
                          f"its launcher: {' '.join(map(str, left))}\n")
    if killed and "flood" in killed:  # its ranks are gone: none writes to it any more
        cut(log_path)
    slurm.update()
    if slurm.nodes:
        _node_lost(cfg, world_size, slurm, recorded, progress_path, dict(by_key))
    if slurm.pmi_cut:  # not launched again: the next job would start in the same environment
        raise LauncherError(f"world size {world_size}: the MPI job was stopped as its ranks "
                            f"wired up: {srun.PMI1_CUT_ADVICE}; log: {log_path}")
    return _JobEnd(proc.returncode, killed, stall, log_path)


def _fruitless(world_size: int, end: _JobEnd, jobs: int, stall_limit: float,
               max_output_mib: int = 0) -> str:
    """Why a world size gave up after ``jobs`` launches in a row that ran no case."""
    if end.stall:  # its ranks wrote their stacks a moment before it was stopped
        why = end.stall.describe(stall_limit, jobs) + stacks_in_log(end.log_path, "then")
    elif end.killed and "flood" in end.killed:  # outside any case: at start-up, say
        why = f"{jobs} job(s) in a row ran no case; the last: " + flood_reason(
            end.killed["flood"], max_output_mib, end.log_path, "outside any case")
    else:
        why = (f"the MPI job exited with code {end.rc} {jobs} times in a row without running "
               f"a case; last lines of {end.log_path}:\n{tail(end.log_path)}")
    log = start_and_end(end.log_path)  # where a launch fails, and what it last said
    hint = mpi_init.init_failed(log, os.environ)
    return f"world size {world_size}: {why}" + (f"\n{hint}" if hint else "")


def _endless(world_size: int, outcome: WorldOutcome, planned: Collection[str],
             done: Collection[str]) -> str:
    """Why a world size stopped relaunching: each job records a case or counts as fruitless,
    so jobs past (cases + 1) x max_fruitless lose what they record somewhere."""
    missing = set(planned) - set(done)
    return (f"world size {world_size}: {outcome.launches} jobs for {len(planned)} cases, "
            f"{len(missing)} never recorded: see {outcome.logs[-1]}")


def run_world_size(cfg: LaunchConfig, world_size: int, items: Sequence[PlannedItem],
                   on_progress: Callable[[int], None] | None = None, warm: Any = None
                   ) -> WorldOutcome:
    """Run every item at one world size, relaunching after timeouts and crashes. ``warm``:
    this world size's first job, already started and waiting (harness.engine.warm), which
    the first launch lets go instead of starting one."""
    outcome = WorldOutcome(world_size)
    by_key = {item.key: item for item in items}
    files = cfg.files
    progress_path, placement_path = (files.of(world_size, name)
                                     for name in ("progress.json", "placement.json"))
    fruitless, spared = 0, set()  # spared: cases in which a launcher was killed from outside
    streaks = JobEndingStreaks(cfg.options.give_up_after)
    ended_by: str | None = None  # the case whose fault ended the last job
    recorded = RecordedKeys(cfg.results_path, world_size)
    earlier = 0 if warm is not None else _launches_before(files, world_size)

    def report(done: set[str]) -> None:
        if on_progress:
            on_progress(len(done & by_key.keys()))

    while True:
        done = recorded.update()
        if _give_up(cfg, streaks, recorded, by_key, outcome.placement, ended_by):
            done = recorded.update()
        report(done)
        if by_key.keys() <= done:
            return outcome
        if outcome.launches > (len(by_key) + 1) * cfg.max_fruitless:  # see _endless
            outcome.infra_error = _endless(world_size, outcome, by_key.keys(), done)
            return outcome
        files.of(world_size, "skip").write_text("\n".join(sorted(done)))
        progress_path.unlink(missing_ok=True)
        placement_path.unlink(missing_ok=True)
        outcome.launches += 1
        end = _run_job(cfg, world_size, earlier + outcome.launches, warm, recorded, by_key,
                       report)
        warm, rc, killed, log_path = None, end.rc, end.killed, end.log_path
        # a fault that left a rank's process unusable ends the job after its case is recorded
        ended_by = recorded.fresh[-1][0] if rc == JOB_ENDED_EXIT and recorded.fresh else None
        outcome.logs.append(log_path)
        if end.stall is not None and end.stall.where != "start":
            outcome.notes.append(end.stall.describe(cfg.options.stall_timeout)
                                 + stacks_in_log(log_path, "then"))
        placement = _read_progress(placement_path)
        if placement and placement.get("error"):
            raise PlacementFailed(f"world size {world_size}: {placement['error']}")
        outcome.placement = placement or outcome.placement
        shm_sweep.sweep(files.of(world_size, "shm.json"), log_path)  # unfinalized
        after = recorded.update()
        new = len(after - done)
        prog = _read_progress(progress_path)
        if rc not in PYTEST_NORMAL and disk_short(cfg.run_dir):
            # a rank that cannot write its result dies; recording a crash would blame the case
            raise OSError(errno.ENOSPC, f"the job died with under {DISK_LOW >> 10} KiB free "
                          "beside its run folder", str(cfg.run_dir))
        # a case in progress unrecorded: the job died in it, perhaps with exit code 0 (not
        # one begun as a stuck job was stopped: it had no fair run, and runs again)
        dead_in_case = bool(prog and prog["key"] in by_key and prog["key"] not in after
                            and end.stall is None)
        if rc in PYTEST_NORMAL and not killed and not end.stall and not dead_in_case:
            # finished, or the job stopped recording (pytest's -x): do not loop. A job that
            # ends "normally" having recorded nothing while cases remain (a launcher that
            # exits 1 at once, a collection that finds nothing) ran nothing: never a pass
            if after >= by_key.keys() or new == 0:
                if new == 0:
                    outcome.infra_error = (f"world size {world_size}: the MPI job exited with "
                                           f"code {rc} and no case ran; see {log_path}")
                return outcome
            continue
        if dead_in_case:
            _dead_in_case(cfg, by_key[prog["key"]], prog, end, outcome, spared)
            fruitless = 0
            continue
        fruitless = 0 if new else fruitless + 1
        if fruitless >= cfg.max_fruitless:
            outcome.infra_error = _fruitless(world_size, end, fruitless,
                                             cfg.options.stall_timeout,
                                             cfg.options.max_output_mib)
            return outcome
