"""CaseResult: the one record that crosses process boundaries.

Rank 0 of every launch appends one JSON line per case to the run's ``results.jsonl``; the
launcher, the store and the reports read them back. The ``schema`` field versions the layout:
readers accept every version up to ``SCHEMA`` and reject newer ones with a clear message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file beside it, then a rename):
    a reader polling it, another rank or the launcher, never sees half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def scratch_beside(path: Path, mode: int = 0o644) -> Iterator[Path]:
    """A new, unique file name in ``path``'s directory (same file system: ``os.replace`` onto
    ``path`` is atomic) with ``mode``, removed afterwards unless it was moved. Where writers
    may meet (goldens, an export) or a failure must leave nothing behind; ``write_whole`` is
    the single writer's short form."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, mode)  # mkstemp's 0600 would make a committed golden the owner's alone
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


SCHEMA = 1

STATUSES = ("pass", "fail", "error", "timeout", "crash", "skip")
#: statuses that mean "the implementation is wrong or broken" (exit code 1)
FAILING = ("fail", "error", "timeout", "crash")


class ResultsError(ValueError):
    """A results file that cannot be read (corrupt line, newer schema)."""


@dataclass
class CaseResult:
    """Outcome of one (case, implementation, world size) on one run."""

    run_id: str
    case_id: str
    op: str
    family: str
    impl: str
    world_size: int
    params: dict[str, Any]
    status: str
    reason: str = ""
    #: per output name: metrics (compare.Metrics.to_dict()), tolerance text, passed
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: elements outside tolerance, summed over ranks and outputs (nccl-tests' #wrong)
    wrong: int = 0
    #: timing stats in nanoseconds: median, p10, p90, min, mean, std, n, samples; how they
    #: were taken (mode, l2_flush, launch_bound); ``contention``: why the ranks contended for
    #: CPUs or a GPU ("" when they did not) and ``minimal``: a token budget was spent on them
    timing: dict[str, Any] | None = None
    #: derived figures: tflops, gbps (algbw), busbw_gbps
    derived: dict[str, float] = field(default_factory=dict)
    #: the implementation call's peak memory above what was allocated when it began
    peak_memory_bytes: int | None = None
    #: how it was measured: "cuda_allocated_peak", "cpu_rss_peak" or "not_measured"
    peak_memory_kind: str | None = None
    #: checks beyond the first call: "poisoned_outputs", "shifted_buffers", "after_timing",
    #: "near_values", "reused_buffers", "settled", "replicated", "process_settings"
    checks: list[str] = field(default_factory=list)
    output_hash: str | None = None
    #: the first call against the stored golden: {"status": pass|fail|error|absent, "file",
    #: "outputs": {name: {"kind", "metrics", "tolerance", "passed"}}}; None when not compared
    golden: dict[str, Any] | None = None
    device: str = "cpu"
    #: the interpreter that ran the implementation's kernels ("triton": Triton's, on a CPU
    #: run), or "": its outputs are checked as any, its time is the interpreter's
    interpreter: str = ""
    backend: str | None = None
    started_at: float = 0.0
    duration_s: float = 0.0
    #: short environment fingerprint; the full environment lives in the run's metadata
    env_id: str = ""
    schema: int = SCHEMA

    @property
    def time_marks(self) -> str:
        """What a table prints after the time: ``~`` taken while ranks contended, ``*``
        launch-bound (the host's enqueue time set it), ``i`` an interpreter ran the kernels
        (Triton's, on the CPU: not kernel time)."""
        t = self.timing or {}
        return (("~" if t.get("contention") else "") + ("*" if t.get("launch_bound") else "")
                + ("i" if self.interpreter else ""))

    @property
    def key(self) -> str:
        """Identity of this result inside one run."""
        return result_key(self.case_id, self.impl, self.world_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the line written to results.jsonl)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """One line of JSON, no trailing newline: ``to_dict``'s, without its deep copy (a
        quarter of a millisecond of every case's cost)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.dumps(fields, sort_keys=True, allow_nan=True, default=_plain)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        """Rebuild from ``to_dict`` output; unknown keys from newer minor fields are ignored."""
        schema = int(data.get("schema", 0))
        if schema > SCHEMA:
            raise ResultsError(
                f"result schema v{schema} is newer than this harness (v{SCHEMA}): "
                "upgrade kernel-harness to read it"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _plain(value: Any) -> Any:
    """A nested dataclass as ``dataclasses.asdict`` gives it; anything else JSON cannot take is
    an error, as it is for ``to_dict``'s JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def result_key(case_id: str, impl: str, world_size: int) -> str:
    """Stable key of a result in a run: ``w4:allreduce[...]@torch``."""
    return f"w{world_size}:{case_id}@{impl}"


def append(path: str | os.PathLike[str], result: CaseResult) -> None:
    """Append one result as a JSON line, flushed and fsynced so a crash right after keeps it."""
    line = result.to_json() + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read(path: str | os.PathLike[str]) -> Iterator[CaseResult]:
    """Yield the results of a JSONL file.

    A torn last line (the writer died mid-write) is skipped: everything before it stays
    readable. A corrupt line elsewhere is an error naming the file and line.
    """
    p = Path(path)
    if not p.exists():
        return
    lines = p.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                return  # torn final line from a crash: ignore it
            raise ResultsError(f"{p}:{lineno}: not a JSON result line ({exc.msg})") from exc
        yield CaseResult.from_dict(data)


@dataclass
class RunInfo:
    """Metadata of one run (``run.json`` beside ``results.jsonl``)."""

    run_id: str
    started_at: float
    tier: str
    world_sizes: list[int]
    machine: dict[str, Any]
    env: dict[str, Any]
    finished_at: float | None = None
    selectors: list[str] = field(default_factory=list)
    impls: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    git_commit: str | None = None
    #: the options of the ``harness run`` that started it, by parameter name (what
    #: ``--resume`` runs it with; run.json only, not a DB column)
    options: dict[str, Any] = field(default_factory=dict)
    #: "running", "complete", "partial" (some launches failed), "infra_error" or
    #: "config_error" (the ranks found no placement for themselves)
    status: str = "running"
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        """Rebuild from ``to_dict`` output."""
        if int(data.get("schema", 0)) > SCHEMA:
            raise ResultsError(
                f"run schema v{data['schema']} is newer than this harness (v{SCHEMA}): "
                "upgrade kernel-harness to read it"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically so readers never see half a file (``write_whole``)."""
        write_whole(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunInfo:
        """Read a ``run.json``."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"{path}: cannot read run metadata ({exc})") from exc


def read_run_dir(run_dir: str | os.PathLike[str]) -> tuple[RunInfo, list[CaseResult]]:
    """A run directory's ``run.json`` and ``results.jsonl`` (a torn last line skipped)."""
    p = Path(run_dir)
    if not (p / "run.json").is_file():
        raise ResultsError(f"{p} is a directory without run.json ({p / 'run.json'} not found): "
                           "pass a run directory (one holding run.json and results.jsonl)")
    return RunInfo.read(p / "run.json"), list(read(p / "results.jsonl"))
