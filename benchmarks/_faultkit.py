"""What benchmarks/faults.py injects faults with: a scratch lab that starts real `harness`
processes, and the checks a fault is judged by (the line the user saw, the results lost,
the history DB's integrity, agreement with a clean run, processes left behind)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "helpers"
#: a collective at 2 ranks whose cases take a third of a second each (sleep, then torch's
#: allreduce): long enough to stop a run half-way, short enough to run the table in minutes
SELECTION = ("allreduce[*op=sum*]", "--world-sizes", "2", "--no-bench",
             "--impl", "harness_test_impls:sleepy")
DELAY_S = "0.3"
#: cases with committed goldens (world size 1), for the golden faults
GOLDEN_SELECTION = ("hopper_tasks.rmsnorm[b=2*]", "hopper_tasks.rmsnorm[b=4*]",
                    "--world-sizes", "1", "--impl", "torch", "--no-bench")
_BAR = re.compile(r"━|^\s*$")


class Skip(Exception):
    """The fault cannot be injected here; the message says what is missing."""


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``path`` (a new directory), unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        raise Skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size: str) -> None:
    """Give the tmpfs on ``path`` room again."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def fill(path: Path) -> None:
    """Take what is left of the file system holding ``path`` (a new file of that name)."""
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"x" * 4096)
        except OSError:
            pass


@dataclass
class Row:
    """One fault: how it was injected, whether the harness survived it, how many results were
    lost, the line the user saw, and what was checked afterwards."""

    fault: str
    injected: str
    survived: bool = False
    lost: int | str = 0
    saw: str = ""
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def need(self, ok: bool, what: str) -> bool:
        """Record a check: ``what`` is what should hold."""
        (self.checks if ok else self.problems).append(what)
        return ok

    def done(self) -> Row:
        self.survived = not self.problems
        return self


@dataclass
class Done:
    rc: int
    out: str
    err: str

    @property
    def line(self) -> str:
        """The last line harness printed on stderr (progress bars left out)."""
        lines = [ln for ln in self.err.splitlines() if not _BAR.search(ln)]
        return lines[-1].strip() if lines else ""


class Lab:
    """A scratch directory and the environment of the `harness` processes started in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "HARNESS_TEST_DELAY_S": DELAY_S, "COLUMNS": "200",
                    "PYTHONPATH": os.pathsep.join([str(HELPERS),
                                                   os.environ.get("PYTHONPATH", "")])}
        self.env.pop("HARNESS_DB", None)

    def dir(self, name: str) -> Path:
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "harness", *args]

    def run(self, *args: str, cwd: Path, timeout: float = 600, env: dict | None = None
            ) -> Done:
        out = subprocess.run(self.cmd(*args), cwd=cwd, env=env or self.env,
                             capture_output=True, text=True, timeout=timeout)
        return Done(out.returncode, out.stdout, out.stderr)

    def start(self, *args: str, cwd: Path) -> subprocess.Popen:
        return subprocess.Popen(self.cmd(*args), cwd=cwd, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 600) -> Done:
    out, err = proc.communicate(timeout=timeout)
    return Done(proc.returncode, out, err)


def lines_of(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for(what: str, ready, timeout: float = 300, proc: subprocess.Popen | None = None):
    """``ready()``'s first true value, polled; RuntimeError naming ``what`` past the timeout or
    when ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the run ended before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not happen within {timeout:g} s")


def recorded(runs: Path, at_least: int) -> Path | None:
    """The results file of the run under ``runs`` once it holds ``at_least`` lines."""
    found = list(runs.glob("*/results.jsonl"))
    return found[0] if found and lines_of(found[0]) >= at_least else None


def rank_pid(run_dir: Path, world_size: int = 2) -> int | None:
    """A rank of the job running now (the progress file names rank 0's pid)."""
    try:
        return int(json.loads((run_dir / f"w{world_size}.progress.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def processes_of(run_id: str) -> list[int]:
    """Processes whose command line names the run (its ranks, its launcher)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if run_id in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def no_orphans(row: Row, run_id: str, within_s: float = 30) -> None:
    """Check that nothing of the run outlives harness (waiting ``within_s`` for a job's
    teardown); whatever is left is killed after being counted."""
    deadline = time.monotonic() + within_s
    while processes_of(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_of(run_id)
    row.need(not left, "no process of the run left behind")
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def keyed(db: str | Path, run_id: str | None = None) -> dict[tuple, tuple]:
    """{(case, impl, world size): (status, output hash)} of a run (or of every run) in a DB."""
    from harness.history import store

    conn = store.connect(db)
    try:
        sql = "SELECT case_id, impl, world_size, status, output_hash FROM results"
        rows = conn.execute(sql + (" WHERE run_id = ?" if run_id else ""),
                            (run_id,) if run_id else ()).fetchall()
    finally:
        conn.close()
    return {(r[0], r[1], int(r[2])): (r[3], r[4]) for r in rows}


def run_ids(db: str | Path) -> list[str]:
    from harness.history import store

    conn = store.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs").fetchall()]
    finally:
        conn.close()


def integrity(db: str | Path) -> str:
    """'ok', or what is wrong with a history DB: SQLite's integrity_check, and on either
    engine results of no stored run, results stored twice, runs never analysed."""
    from harness.history import pg, store

    conn = store.connect(db)
    try:
        problems = []
        if not pg.is_url(db):
            checked = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
            if checked != ["ok"]:
                problems.append("integrity_check: " + "; ".join(checked)[:200])
        stray = conn.execute("SELECT COUNT(*) FROM results WHERE run_id NOT IN "
                             "(SELECT run_id FROM runs)").fetchone()[0]
        twice = conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM results GROUP BY run_id, "
                             "case_id, impl, world_size HAVING COUNT(*) > 1) t").fetchone()[0]
        unanalysed = conn.execute("SELECT COUNT(*) FROM runs WHERE analyzed_at IS NULL"
                                  ).fetchone()[0]
        problems += [f"{n} {what}" for n, what in ((stray, "results of no run"),
                                                   (twice, "results stored twice"),
                                                   (unanalysed, "runs not analysed")) if n]
        return "; ".join(problems) or "ok"
    finally:
        conn.close()


def against_clean(row: Row, got: dict, clean: dict, what: str = "the run") -> None:
    """Check the results of ``what`` against the clean run's: nothing lost, every case with
    the clean run's status and output hash."""
    lost = len(set(clean) - set(got))
    row.lost = lost
    row.need(lost == 0, f"{what}: all {len(clean)} results stored")
    differ = [k for k in clean if k in got and got[k] != clean[k]]
    row.need(not differ, f"{what}: statuses and output hashes as a clean run's")


def one_line(row: Row, text: str, *needles: str) -> None:
    """Check that the user saw one line naming the cause and the fix (``needles``)."""
    row.saw = text
    row.need(bool(text) and "\n" not in text and "Traceback" not in text,
             "one line, no traceback")
    missing = [n for n in needles if n not in text]
    row.need(not missing, "the line names " + ", ".join(repr(n) for n in needles))
