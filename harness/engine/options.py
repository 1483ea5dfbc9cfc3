"""A run's settings, defined once, and the layout of its run directory.

``RunOptions`` is every setting of ``harness run``: the CLI builds it from its options (one
click option per field, of the same name), the run directory keeps it in ``run.json``, and the
ranks and ``--resume`` read it from there. The ranks' command line holds only the run
directory and the world size; everything else they derive from the record and ``RunDir``.
A new setting is one field here and one click option.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.results import write_whole
from harness.engine.giveup import GIVE_UP_AFTER
from harness.engine.joblog import MAX_OUTPUT_MIB
from harness.engine.stall import STALL_TIMEOUT_S

#: set in the environment of the ranks of a job the launcher starts: they end without tearing
#: down the interpreter (harness.pytest_plugin.pytest_unconfigure)
FAST_EXIT_ENV = "HARNESS_FAST_EXIT"
#: set in a job's ranks' environment: the job's launch log (their stdout and stderr)
LAUNCH_LOG_ENV = "HARNESS_LAUNCH_LOG"
#: set beside it: the host the launcher runs on, whose ranks may append to that log
#: themselves (harness.engine.watchdog.log_to_append)
LAUNCH_HOST_ENV = "HARNESS_LAUNCH_HOST"


def stacks_in_log(log: str | Path | None, when: str = "at the deadline") -> str:
    """What a timeout's or a stall's reason adds: where each rank's stacks went (each rank's
    watchdog writes them a moment before the deadline or the stall limit,
    harness.engine.watchdog)."""
    return f"; every rank's Python stacks {when}: {log}" if log else ""


#: how many times its op's deadline a case gets under ``--sanitize``: memcheck instruments
#: every memory access of every kernel, and NVIDIA gives no figure for the slowdown; a
#: kernel's first run under it also waits for the instrumented module to load
SANITIZE_DEADLINE_FACTOR = 10.0

#: a job's exit code after a case left a rank's process unusable (a sticky CUDA error, a
#: per-thread setting its threads inherited): the launcher relaunches the rest
JOB_ENDED_EXIT = 86


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` into ``path`` whole or not at all (a reader polling it never sees half)."""
    write_whole(path, json.dumps(data))


def _kept(default: Any) -> Any:
    """A field that decides which cases a run holds and what their results mean: a resumed
    run takes it from the run, never from the command that resumes it."""
    return field(default=default, metadata={"kept": True})


@dataclass(frozen=True)
class RunOptions:
    """Every setting of one run (``harness run --help`` says what each does)."""

    selectors: tuple[str, ...] = _kept(())
    tier: str = _kept("smoke")
    world_sizes: tuple[int, ...] = _kept((1, 4, 8))
    impls: tuple[str, ...] = _kept(())
    device: str = _kept("auto")
    #: None: time, with a token budget where ranks contend; True: time fully; False: no timing
    bench: bool | None = _kept(None)
    #: golden directory (None: the default), and whether to compare with goldens at all
    golden_dir: str | None = _kept(None)
    use_golden: bool = _kept(True)
    timing_mode: str = _kept("events")
    l2_flush: bool = _kept(False)
    sanitize: bool = _kept(False)
    #: suites loaded besides the built-in and installed ones, and the golden directory of
    #: those that name none (``--suite`` or the project file)
    suite_sources: tuple[str, ...] = _kept(())
    suite_golden_dir: str | None = _kept(None)
    # how the run is carried out: a resume may change these
    db: str | None = None
    out_dir: str | None = None
    #: per-case deadline in seconds (None: each op's own)
    timeout: float | None = None
    fail_on: str = "failure"
    launcher: str | None = None
    launcher_args: tuple[str, ...] = ()
    hostfile: str | None = None
    #: extra seconds the launcher's backstop waits past a case's deadline
    grace: float = 30.0
    #: cases in a row (twice as many in all) of one implementation at one world size that
    #: ended their job (timeout, crash, sticky fault) before its remaining cases there are
    #: skipped (harness.engine.giveup); 0 never skips
    give_up_after: int = GIVE_UP_AFTER
    #: seconds a job's ranks may be up with no case in progress (starting, between cases,
    #: ending) before the launcher stops it as stuck (harness.engine.stall); 0 never
    stall_timeout: float = STALL_TIMEOUT_S
    #: MiB of output a job's ranks may write to its log before the launcher stops the job,
    #: charging the case in progress (harness.engine.joblog); 0 never
    max_output_mib: int = MAX_OUTPUT_MIB
    report_dir: str | None = None

    @classmethod
    def kept_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("kept"))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunOptions:
        """The record from a mapping by field name (click's parameters, ``run.json``):
        sequences become tuples, names that are not fields are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: _frozen(v) for k, v in values.items() if k in names}
        if isinstance(given.get("world_sizes"), str):  # run.json of runs before this record
            given["world_sizes"] = tuple(int(w) for w in given["world_sizes"].split(",") if w)
        return cls(**given)

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}

    def resumed_with(self, now: RunOptions, given: Collection[str] = ()) -> RunOptions:
        """The options a resumed run finishes with: this run's own, but for those the command
        that resumes it gives anew (``given``, names of ``now``'s fields; never a kept one).
        A run started with srun is finished with srun unless told otherwise."""
        kept = set(self.kept_names())
        return dataclasses.replace(self, **{k: getattr(now, k) for k in given
                                            if k not in kept})

    def with_text(self, assignment: str) -> RunOptions:
        """``NAME=VALUE`` applied (pytest by hand: ``--harness-set tier=nightly``); lists are
        comma-separated, booleans true/false, ``none`` clears an optional setting."""
        name, sep, text = assignment.partition("=")
        fields = {f.name: f for f in dataclasses.fields(self)}
        if not sep or name not in fields:
            raise ValueError(f"--harness-set {assignment!r}: expected NAME=VALUE with NAME one "
                             f"of {', '.join(fields)}")
        return dataclasses.replace(self, **{name: _parse(fields[name], text.strip())})

    # what the ranks derive
    def deadline_of(self, op_deadline_s: float) -> float:
        """A case's deadline in seconds: ``--timeout`` where given, else its op's, times
        ``SANITIZE_DEADLINE_FACTOR`` under ``--sanitize``."""
        if self.timeout:
            return self.timeout
        return op_deadline_s * (SANITIZE_DEADLINE_FACTOR if self.sanitize else 1.0)

    @property
    def timed(self) -> bool:
        return self.bench is not False and not self.sanitize

    @property
    def full_timing(self) -> bool:
        return self.bench is True and self.timed


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _parse(f: dataclasses.Field, text: str) -> Any:
    kind = str(f.type)
    if text.lower() == "none" and "None" in kind:
        return None
    if kind.startswith("tuple[int"):
        return tuple(int(p) for p in text.split(",") if p.strip())
    if kind.startswith("tuple"):
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if kind.startswith("bool"):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"--harness-set {f.name}={text}: expected true or false")
        return text.lower() in ("true", "1", "yes")
    if kind.startswith("float"):
        return float(text)
    return text


class RunFolderError(FileNotFoundError):
    """The run folder cannot be made where the user's ``--out-dir`` or ``--db`` points (a
    path under /proc): theirs to change."""


def make_run_folder(path: Path) -> None:
    """``path`` made with its parents; RunFolderError where the path cannot hold a folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as exc:
        raise RunFolderError(exc.errno, exc.strerror, exc.filename) from exc


@dataclass(frozen=True)
class RunDir:
    """Where a run's files are: everything the launcher and ranks exchange lies in here."""

    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def results(self) -> Path:
        return self.path / "results.jsonl"

    @property
    def work(self) -> Path:
        """The ranks' working directory: a file an implementation writes by a relative path
        lands here, never over the run's own (results.jsonl, run.json)."""
        return self.path / "work"

    @property
    def calibrations(self) -> Path:
        """This machine's calibrations, written at start when it has any."""
        return self.path / "calibrations.json"

    def of(self, world_size: int, what: str) -> Path:
        """A world size's file: ``progress.json`` (the case in progress), ``skip`` (result
        keys already recorded), ``placement.json`` (rank 0's report of the ranks' devices),
        ``sanitizer`` (the compute-sanitizer logs' prefix), ``rankN.failure.json`` (the last
        case rank N failed, and why: ``note_failure``), ``stacks-request`` and
        ``rankN.stacks`` (a rank's request for every rank's stacks near its deadline, and the
        last request rank N answered: harness.engine.watchdog.StacksBoard)."""
        return self.path / f"w{world_size}.{what}"

    def note_failure(self, world_size: int, rank: int, key: str, why: str) -> None:
        """Leave word that ``rank``'s part of case ``key`` failed: a rank that raises goes on
        to the verdict while the others may wait in the implementation's collective for it,
        and the timeout that follows should name the cause (``failures``)."""
        write_json(self.of(world_size, f"rank{rank}.failure.json"), {"key": key, "why": why})

    def failures(self, world_size: int, key: str) -> list[tuple[int, str]]:
        """(rank, why) of each rank that left word it failed case ``key``, by rank."""
        found = []
        for path in self.path.glob(f"w{world_size}.rank*.failure.json"):
            try:
                note = json.loads(path.read_text())
                rank = int(path.name.split(".")[1].removeprefix("rank"))
            except (OSError, ValueError):
                continue
            if note.get("key") == key:
                found.append((rank, str(note.get("why", ""))))
        return sorted(found)

    def failed_first(self, world_size: int, key: str) -> str:
        """The ranks that failed case ``key`` before it timed out, for its reason ("" if
        none): "; rank 1 had failed it: implementation raised ..." """
        return "".join(f"; rank {rank} had failed it: {why.splitlines()[0] if why else why}"
                       for rank, why in self.failures(world_size, key))

    def launch_log(self, world_size: int, attempt: int) -> Path:
        return self.of(world_size, f"launch-{attempt}.log")

    def junit(self, world_size: int, attempt: int) -> Path:
        return self.of(world_size, f"junit-{attempt}.xml")
