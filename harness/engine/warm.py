"""A run's first job, started before the run is planned.

Planning a run imports torch and the suites (about 2 s on a 2-core machine), and so does every
rank when its job starts: done one after the other, a short run spent half its time importing.
A warm job starts the first world size's ranks at once; they import, wire up MPI, then wait for
the run's go file (``wN.go``) while harness plans, checks the DB and writes ``run.json``. Only
then do they read their options. A run that is refused before it starts kills the warm job and
removes the folder it made, so a refused run leaves nothing behind, as before.

Only fresh runs on mpiexec or mpirun start warm: a resumed run's folder and options come from
disk, srun places its job inside an allocation (a job cancelled there is a step in the
accounting), and compute-sanitizer is chosen after the device is resolved.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harness.engine import launch, shm_sweep
from harness.engine.launch import LaunchConfig
from harness.engine.options import RunOptions, make_run_folder

#: how long a warm job's ranks wait for their go file: past it, harness is gone or stuck
GO_WAIT_S = 3600.0


def eligible(options: RunOptions, launcher: str | None) -> bool:
    """Whether a run with ``options`` starts its first job warm on ``launcher``."""
    return (launcher is not None and not Path(launcher).name.startswith("srun")
            and not options.sanitize and bool(options.world_sizes))


def first_missing(path: Path) -> Path:
    """The outermost directory of ``path`` (itself included) that does not exist yet."""
    path = path.resolve()
    missing = path
    for parent in path.parents:
        if parent.exists():
            break
        missing = parent
    return missing


class WarmJob:
    """The job of ``world_size`` ranks of the run in ``run_dir``, started and waiting."""

    def __init__(self, cfg: LaunchConfig, world_size: int, made: Path) -> None:
        self.cfg, self.world_size, self.made = cfg, world_size, made
        files = cfg.files
        self.go_path = files.of(world_size, "go")
        self.log_path = files.launch_log(world_size, 1)
        with open(self.log_path, "w") as log:
            self.proc = launch.start_job(cfg, world_size, 1, log, go=self.go_path)
        self.adopted = False

    def go(self) -> tuple[subprocess.Popen, Path]:
        """Let the ranks read the run (call once ``run.json``, the calibrations and the skip
        file are in place); the job and its log are the launcher's from here."""
        self.go_path.touch()  # the ranks wait for it to exist, whatever it holds
        self.adopted = True
        return self.proc, self.log_path

    def cancel(self) -> None:
        """Kill the job unless it was adopted; remove what it made where the run never
        started (no ``run.json``), else its log alone."""
        if self.adopted:
            return
        launch.kill_group(self.proc)
        shm_sweep.sweep(self.cfg.files.of(self.world_size, "shm.json"), self.log_path)
        if not self.cfg.files.run_json.exists():
            _remove(self.cfg.run_dir, self.made)
            return
        for path in (self.log_path, self.go_path):
            path.unlink(missing_ok=True)


def _remove(run_dir: Path, made: Path) -> None:
    """The run folder, then each directory above it that this run made, while empty (another
    run may have put its own folder beside it meanwhile)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if not parent.is_relative_to(made):
            break
        try:
            parent.rmdir()
        except OSError:
            break


def start(options: RunOptions, launcher: str | None, runs_root: Path, run_id: str
          ) -> WarmJob | None:
    """The first world size's job of a new run ``run_id`` (its folder made in
    ``runs_root``), or None where the run does not start warm."""
    if not eligible(options, launcher):
        return None
    assert launcher is not None
    run_dir = (runs_root / run_id).resolve()
    made = first_missing(run_dir)
    make_run_folder(run_dir)
    cfg = LaunchConfig(launcher=launcher, run_dir=run_dir, run_id=run_id, options=options)
    try:
        return WarmJob(cfg, options.world_sizes[0], made)
    except launch.LauncherError:
        _remove(run_dir, made)
        return None  # the launch after planning fails again, and says so as it always has
    except BaseException:
        _remove(run_dir, made)
        raise
