"""``harness run --resume RUN_ID``: finish a run that was killed half-way.

A run writes each case's result to its run directory as it finishes (``results.jsonl``) and
is ingested into the history DB and analysed once, when it ends. A run killed before that (the
launcher killed, the node rebooted, a CI timeout) keeps its directory. Resuming it runs the
same selection with the same options, in the same directory and under the same run id: every
case already recorded is skipped (the launcher skips recorded keys, ``launch.RecordedKeys``),
the missing ones run, and the run is then ingested and analysed as any run is, once.

Before it launches anything it stops what is left of the killed run: the ranks of a job are
in a session of their own (``launch.run_world_size`` starts them with ``start_new_session``),
so killing ``harness run`` leaves them running, still appending results; and it cuts a result
line a killed rank left half-written, which the next append would otherwise run into.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from harness.core.discovery import use_suites
from harness.core.results import ResultsError, RunInfo
from harness.engine import runlock, shm_sweep, strays
from harness.engine.options import RunOptions

#: seconds to wait for the killed run's processes to go
_STOP_WAIT_S = 10.0


class ResumeError(Exception):
    """The run cannot be resumed: the message says why and what to do."""


def locate(runs_root: Path, text: str) -> tuple[Path, RunInfo]:
    """The run directory in ``runs_root`` whose run id is ``text`` or starts with it."""
    text = text.strip()
    if not text:
        raise ResumeError("--resume needs a run id (or the start of one): `harness run` "
                          "prints it when it starts, and names the run's folder by it")
    found = sorted(p for p in runs_root.glob(f"{text}*") if (p / "run.json").is_file())
    bare = sorted(p for p in runs_root.glob(f"{text}*") if p.is_dir())
    if not found and len(bare) == 1:  # the folder is here; what names the run is not
        raise ResumeError(f"run folder {bare[0]} has no run.json (deleted?), which holds the "
                          "run's selection and options: it cannot be resumed; start the run "
                          "again")
    if not found:
        raise ResumeError(f"no run {text!r} in {runs_root}: pass the --db (or --out-dir) that "
                          "the run was started with")
    if len(found) > 1:
        names = ", ".join(p.name[:12] for p in found[:5])
        raise ResumeError(f"run id {text!r} is ambiguous in {runs_root} ({names}): give more "
                          "of it")
    try:
        return found[0].resolve(), RunInfo.read(found[0] / "run.json")
    except ResultsError as exc:
        raise ResumeError(str(exc)) from exc


def options_of(info: RunInfo) -> RunOptions:
    """The options the run was started with: ``run.json``'s ``options``, which ``harness
    run`` records (a run started by a harness that did not record them cannot be resumed).
    The kept ones (``RunOptions.kept_names``) decide which cases it holds."""
    if not info.options:
        raise ResumeError(f"run {info.run_id} does not record the options it was started "
                          "with (an older harness wrote it): start it again")
    return RunOptions.from_mapping(info.options)


def check_same_machine(info: RunInfo, machine: dict[str, Any]) -> None:
    """A run's results are one machine's: resuming it elsewhere would mix two in one run."""
    theirs, mine = info.machine.get("fingerprint"), machine.get("fingerprint")
    if theirs != mine:
        raise ResumeError(f"run {info.run_id} was started on machine "
                          f"{info.machine.get('hostname') or theirs} ({theirs}), this is "
                          f"{machine.get('hostname') or mine} ({mine}): resume it there")


def check_same_commit(info: RunInfo, commit: str | None) -> None:
    """A run's results are one commit's: the cases still to run must run the same code."""
    if info.git_commit and commit and info.git_commit != commit:
        raise ResumeError(f"run {info.run_id} was started at commit {info.git_commit[:12]}, "
                          f"this checkout is at {commit[:12]}: check out "
                          f"{info.git_commit[:12]} to resume it, or start a new run")


def stop_leftovers(run_id: str, wait_s: float = _STOP_WAIT_S) -> list[int]:
    """SIGKILL every process of this user that carries ``run_id`` in HARNESS_RUN_ID (the
    launcher and ranks of a killed ``harness run``; the launcher gives it to each job's
    environment) and wait until they are gone. Returns their pids."""
    pids = strays.pids_with("HARNESS_RUN_ID", run_id)
    left = strays.kill(pids, wait_s)
    if left:
        raise ResumeError(f"processes {left} of run {run_id} survived SIGKILL for {wait_s:g} s: "
                          "wait for them to exit, then resume")
    return pids


def cut_torn_line(results_path: Path) -> int:
    """Truncate ``results_path`` after its last complete line: a rank killed mid-write leaves
    a line without its newline, which the next result appended would run into (making one
    corrupt line in the middle of the file). Returns the bytes cut."""
    try:
        data = results_path.read_bytes()
    except FileNotFoundError:
        return 0
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(results_path, "r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    return len(data) - end


def prepare(now: RunOptions, text: str, given: Collection[str] = ()
            ) -> tuple[Path, RunInfo, RunOptions, list[int]]:
    """The run ``text`` names, made ready to resume: its directory, record and options (its
    own, but for the ``given`` ones ``now`` sets anew), and the pids of what it left running,
    now stopped."""
    from harness.device import envinfo
    from harness.history import store

    run_dir, info = locate(store.runs_root(store.resolve_db_path(now.db), now.out_dir), text)
    options = options_of(info).resumed_with(now, given)
    # the run's own suites (its --suite or project file's), as its ranks load them: planned
    # without them, a run of a --suite op alone came back as every built-in case
    use_suites(options.suite_sources, options.suite_golden_dir
               and Path(options.suite_golden_dir))
    check_same_machine(info, envinfo.machine())
    check_same_commit(info, envinfo.git_commit())
    try:  # held until the resumed run ends (session.execute)
        runlock.hold(run_dir)
    except runlock.RunBusy as exc:
        who = f"harness pid {exc.pid}" if exc.pid else "another harness"
        stop = f"stop it (kill {exc.pid})" if exc.pid else "stop it"
        raise ResumeError(f"run {info.run_id[:8]} is still running ({who} holds {run_dir}): "
                          f"wait for it to end, or {stop} and resume it then") from None
    stopped = stop_leftovers(info.run_id)
    for record in run_dir.glob("w*.shm.json"):  # what the killed run's jobs left in /dev/shm
        shm_sweep.sweep(record)
    cut_torn_line(run_dir / "results.jsonl")
    from harness.history import exchange

    try:  # before a case runs: the run is stored whole at its end, or not at all
        exchange.load(run_dir)
    except exchange.ExchangeError as exc:
        raise ResumeError(f"{exc} (the run cannot be stored as it is; a deleted line's case "
                          "runs again)") from exc
    return run_dir, info, options, stopped
