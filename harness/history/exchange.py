"""Runs in and out of the harness: export formats and the files ``harness ingest`` reads.

Export formats (:func:`export_run`):

- ``json``: the *run JSON*, ``{"format": "kernel-harness-run", "schema": 1, "run": ...,
  "results": [...]}``; runners that do not share the history DB hand it to ``harness ingest``.
- ``csv``: one row per result, times in nanoseconds, for spreadsheets and pandas.
- ``pytest-benchmark``: a file that ``pytest-benchmark compare`` and pytest-benchmark's own
  loader read: times in seconds, one benchmark per timed result, ``group`` = op.

Inputs (:func:`load`): a run directory (``run.json`` + ``results.jsonl``), a run JSON, or a
pytest-benchmark JSON (``pytest --benchmark-json``), which becomes one run of its own.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.core import fields
from harness.core.results import CaseResult, ResultsError, RunInfo, result_key
from harness.device import envinfo

FORMATS = ("json", "csv", "pytest-benchmark")
RUN_FORMAT = "kernel-harness-run"
RUN_FORMAT_SCHEMA = 1
#: family and impl of results read from pytest-benchmark files
PYTEST_BENCHMARK = "pytest-benchmark"
#: the pytest-benchmark JSON layout written here (checked against pytest-benchmark 5.x)
PYTEST_BENCHMARK_LAYOUT = "5.2.3"

CSV_COLUMNS = (
    "run_id", "world_size", "case_id", "op", "family", "impl", "status", "wrong",
    "median_ns", "p10_ns", "p90_ns", "min_ns", "mean_ns", "std_ns", "n",
    "tflops", "gbps", "busbw_gbps", "peak_memory_bytes", "output_hash", "reason", "params",
)  # fmt: skip


class ExchangeError(ValueError):
    """A file that cannot be ingested; the message is one line naming it and the remedy."""


# ----------------------------------------------------------------------------- export


def export_run(run: RunInfo, results: list[CaseResult], fmt: str) -> str:
    """The text of ``run`` and its ``results`` in ``fmt`` (json, csv or pytest-benchmark).

    The pytest-benchmark format holds only passing results with timing: failed, skipped and
    unbenched results have no time to compare and are left out.
    """
    if fmt == "json":
        return _export_json(run, results)
    if fmt == "csv":
        return _export_csv(results)
    if fmt == PYTEST_BENCHMARK:
        return json.dumps(pytest_benchmark_doc(run, results), indent=2) + "\n"
    raise ValueError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")


def _export_json(run: RunInfo, results: list[CaseResult]) -> str:
    doc = {
        "format": RUN_FORMAT,
        "schema": RUN_FORMAT_SCHEMA,
        "run": run.to_dict(),
        "results": [r.to_dict() for r in results],
    }
    # allow_nan: metrics may be inf/NaN, as in results.jsonl, and must survive the round trip
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=True) + "\n"


def _csv_value(value: Any) -> Any:
    return "" if value is None else value


def _export_csv(results: list[CaseResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in results:
        timing = r.timing or {}
        derived = r.derived or {}
        reason = r.reason.splitlines()[0] if r.reason else ""
        row = (
            r.run_id, r.world_size, r.case_id, r.op, r.family, r.impl, r.status, r.wrong,
            timing.get("median"), timing.get("p10"), timing.get("p90"), timing.get("min"),
            timing.get("mean"), timing.get("std"), timing.get("n"),
            derived.get("tflops"), derived.get("gbps"), derived.get("busbw_gbps"),
            r.peak_memory_bytes, r.output_hash, reason,
            json.dumps(r.params, sort_keys=True, allow_nan=True),
        )  # fmt: skip
        writer.writerow([_csv_value(v) for v in row])
    return buf.getvalue()


def pytest_benchmark_doc(run: RunInfo, results: list[CaseResult]) -> dict[str, Any]:
    """The pytest-benchmark JSON document (a dict) of a run; see :func:`export_run`."""
    benchmarks = []
    for r in results:
        stats = _pb_stats(r.timing) if r.status == "pass" else None
        if stats is None:
            continue
        group, name, fullname, param, params = _pb_identity(r)
        extra = {"run_id": r.run_id, "case_id": r.case_id, "impl": r.impl,
                 "world_size": r.world_size, "family": r.family, "device": r.device,
                 **(r.derived or {})}
        if r.peak_memory_bytes is not None:
            extra["peak_memory_bytes"] = r.peak_memory_bytes
        timing = r.timing or {}
        # timing's mode says what ran: "events", "graph" (CUDA) or "perf_counter" (host)
        options = {"timer": timing.get("mode") or ("events" if r.device.startswith("cuda")
                                                   else "perf_counter")}
        if "l2_flush" in timing:
            options["l2_flush"] = timing["l2_flush"]
        benchmarks.append({
            "group": group, "name": name, "fullname": fullname, "params": params,
            "param": param, "extra_info": extra, "options": options, "stats": stats,
        })
    return {
        "machine_info": _pb_machine_info(run),
        "commit_info": _pb_commit_info(run),
        "benchmarks": benchmarks,
        "datetime": datetime.fromtimestamp(run.started_at, timezone.utc).isoformat(),
        "version": PYTEST_BENCHMARK_LAYOUT,
    }


def _pb_identity(r: CaseResult) -> tuple[str, str, str, str | None, dict[str, Any]]:
    """group, name, fullname, param and params of a result's benchmark entry."""
    if r.family == PYTEST_BENCHMARK and r.impl == PYTEST_BENCHMARK and r.world_size == 1:
        # came from a pytest-benchmark file: go back out under its own names, so that
        # pytest-benchmark -> harness -> pytest-benchmark keeps the test ids
        name = r.case_id.rsplit("::", 1)[-1]
        param = name[name.index("[") + 1 : -1] if name.endswith("]") and "[" in name else None
        return r.op, name, r.case_id, param, dict(r.params)
    # the case id's bracket is pytest's parametrize id; 'func' grouping then gives the op
    case_id = r.case_id
    param = case_id[case_id.index("[") + 1 : -1] if case_id.endswith("]") and "[" in case_id \
        else None
    params = dict(r.params)
    # --group-by param:impl / param:world_size compare implementations and scales
    params.setdefault("impl", r.impl)
    params.setdefault("world_size", r.world_size)
    name = f"{r.case_id}@{r.impl}:w{r.world_size}"
    return r.op, name, result_key(r.case_id, r.impl, r.world_size), param, params


def _pb_machine_info(run: RunInfo) -> dict[str, Any]:
    machine = run.machine or {}
    if isinstance(machine.get("machine_info"), dict):
        return machine["machine_info"]  # read from a pytest-benchmark file: give it back
    env = run.env or {}
    platform_text = str(env.get("platform") or "")
    python = env.get("python") or ""
    return {
        "node": machine.get("hostname") or machine.get("name") or "",
        "processor": machine.get("cpu_model") or "",
        "machine": machine.get("arch") or "",
        "python_compiler": "",
        # torch, and so the harness, runs on CPython
        "python_implementation": env.get("python_implementation") or "CPython",
        "python_implementation_version": python,
        "python_version": python,
        "python_build": [],
        "release": "",
        "system": platform_text.split("-", 1)[0],
        "cpu": {"brand_raw": machine.get("cpu_model") or "", "count": machine.get("cpu_count"),
                "arch_string_raw": machine.get("arch") or ""},
        "kernel_harness": {"fingerprint": machine.get("fingerprint"),
                           "name": machine.get("name"), "gpus": machine.get("gpus", []),
                           "memory_gb": machine.get("memory_gb")},
    }


def _pb_commit_info(run: RunInfo) -> dict[str, Any]:
    stored = (run.env or {}).get("commit_info")
    if isinstance(stored, dict):
        return stored
    return {"id": run.git_commit or "unversioned", "time": None, "author_time": None,
            "dirty": None, "project": "kernel-harness", "branch": "(unknown)"}


def _pb_stats(timing: dict[str, Any] | None) -> dict[str, Any] | None:
    """pytest-benchmark's stats block (seconds), or None for a result without timing."""
    if not timing:
        return None
    iterations = int(timing.get("iterations") or 1)
    samples = timing.get("samples") or []
    if samples:
        stats = pb_stats_from_seconds([float(s) / 1e9 for s in samples])
        stats["iterations"] = iterations
        return stats
    if timing.get("median") is None:
        return None
    stored = timing.get("pytest_benchmark_stats")
    if isinstance(stored, dict):
        return {**stored, "data": [], "iterations": iterations}
    return _pb_stats_from_summary(timing, iterations)


def pb_stats_from_seconds(data: list[float]) -> dict[str, Any]:
    """pytest-benchmark's statistics of per-call times in seconds, computed by its own
    ``Stats`` (so they match whatever version reads them: 5.3 changed how hd15iqr is picked),
    with the raw ``data`` kept."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for value in data:
        stats.update(value)
    return {**stats.as_dict(), "data": list(data)}


def _pb_stats_from_summary(timing: dict[str, Any], iterations: int) -> dict[str, Any]:
    # No raw samples and no stored pytest-benchmark stats: fill from the summary. Unknown
    # quartiles become the median (iqr 0), outlier counts 0, max the largest known figure.
    median = float(timing["median"]) / 1e9
    known = [float(timing[k]) / 1e9 for k in ("min", "median", "mean", "p90", "max")
             if timing.get(k) is not None]
    mean = float(timing["median"] if timing.get("mean") is None else timing["mean"]) / 1e9
    rounds = int(timing.get("n") or 0)
    return {
        "min": min(known), "max": max(known), "mean": mean,
        "stddev": float(timing.get("std") or 0.0) / 1e9, "rounds": rounds, "median": median,
        "iqr": 0.0, "q1": median, "q3": median, "iqr_outliers": 0, "stddev_outliers": 0,
        "outliers": "0;0", "ld15iqr": min(known), "hd15iqr": max(known),
        "ops": 1 / mean if mean else 0, "total": mean * rounds, "data": [],
        "iterations": iterations,
    }  # fmt: skip


# ------------------------------------------------------------------------------- load


def load(path: str | os.PathLike[str]) -> list[tuple[RunInfo, list[CaseResult]]]:
    """The runs in ``path``: a run directory, a run JSON or a pytest-benchmark JSON.

    Raises ExchangeError (one line naming ``path``, and a results.jsonl's line) for anything
    else, for a field of a kind the store, reports and exports cannot use (``fields.problem``), and
    for runs the store would reject (no machine fingerprint, results of another run).
    """
    p = Path(path)
    if not p.is_dir() and not p.is_file():
        raise ExchangeError(f"{p} does not exist: pass a run directory, a run JSON "
                            "(harness export --format json) or a pytest-benchmark JSON")
    try:
        runs = [_load_run_dir(p) if p.is_dir() else _load_json_file(p)]
    except ExchangeError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError,
            RecursionError) as exc:  # what the checks here missed: still this file's fault
        raise ExchangeError(f"{p} cannot be ingested ({type(exc).__name__}: {_one_line(exc)}): "
                            "check the file") from exc
    for run, results in runs:
        _check_run(p, run, results)
    return runs


_RUN_DIR_FIX = "fix it (harness run writes it) or leave the run out, then ingest again"
_RUN_JSON_FIX = "export it again with `harness export --format json`"
_PB_FIX = "write the file again with pytest --benchmark-json"
_LINE_FIX = "fix or delete the line, then ingest again"


def _load_run_dir(p: Path) -> tuple[RunInfo, list[CaseResult]]:
    """A run directory's run.json and results.jsonl, each field checked (``fields.problem``); a torn
    last line of results.jsonl (its writer died mid-line) is left out (``results.read``)."""
    run_json = p / "run.json"
    if not run_json.is_file():
        raise ExchangeError(f"{p} is a directory without run.json ({run_json} not found): "
                            "pass a run directory (one holding run.json and results.jsonl)")
    run = _built(RunInfo, _json_of(_read(run_json), run_json, _RUN_DIR_FIX), f"{run_json}: ",
                 _RUN_DIR_FIX)
    path = p / "results.jsonl"
    lines = _read(path).splitlines() if path.exists() else []
    results = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data = _json_of(raw, where, _LINE_FIX)
        except ExchangeError:
            if lineno == len(lines):
                break  # a torn last line (its last character may be cut too)
            raise
        results.append(_built(CaseResult, data, f"{where}: ", _LINE_FIX))
    return run, results


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ExchangeError(f"{path} cannot be read ({exc.strerror}): check the file and its "
                            "permissions") from exc


def _json_of(raw: bytes, where: str | Path, fix: str) -> Any:
    """``raw``, UTF-8 JSON text, parsed; else ExchangeError naming ``where``, then ``fix``."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ExchangeError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}): "
                            f"{fix}") from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, an int of 5000 digits
        raise ExchangeError(f"{where}: not JSON ({_one_line(exc)}): {fix}") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _load_json_file(p: Path) -> tuple[RunInfo, list[CaseResult]]:
    what = ("is not a run directory, a run JSON (harness export --format json) or a "
            "pytest-benchmark JSON (pytest --benchmark-json)")
    data = _json_of(_read(p), p, f"it {what}")
    if isinstance(data, dict) and data.get("format") == RUN_FORMAT:
        return _from_run_json(p, data)
    if isinstance(data, dict) and "benchmarks" in data and "machine_info" in data:
        return _from_pytest_benchmark(p, data)
    if isinstance(data, dict) and "run_id" in data and "machine" in data:
        raise ExchangeError(f"{p} is a run.json alone: pass the run directory that holds it "
                            f"({p.parent}) so its results.jsonl comes along")
    raise ExchangeError(f"{p} {what}")


def _from_run_json(p: Path, data: dict[str, Any]) -> tuple[RunInfo, list[CaseResult]]:
    schema = data.get("schema")
    if not fields.is_int(schema):
        raise ExchangeError(f"{p}: field 'schema' is {fields.shown(schema)}, not an integer: "
                            f"{_RUN_JSON_FIX}")
    if schema > RUN_FORMAT_SCHEMA:
        raise ExchangeError(f"{p} is run JSON schema {schema}, newer than this harness "
                            f"(v{RUN_FORMAT_SCHEMA}) reads: upgrade kernel-harness")
    if not isinstance(data.get("run"), dict) or not isinstance(data.get("results"), list):
        raise ExchangeError(f"{p} is a run JSON without its 'run' object or 'results' list: "
                            f"{_RUN_JSON_FIX}")
    run = _built(RunInfo, data["run"], f"{p}: a malformed run or result (the run: ",
                 _RUN_JSON_FIX, ")")
    results = [_built(CaseResult, r, f"{p}: a malformed run or result (result #{i}: ",
                      _RUN_JSON_FIX, ")") for i, r in enumerate(data["results"])]
    return run, results


def _built(cls: Any, data: Any, where: str, fix: str, close: str = "") -> Any:
    """``cls.from_dict(data)`` once ``data`` passed ``fields.problem``; else ExchangeError,
    one line: ``where`` (the file, a line), the problem, ``fix``."""
    problem = fields.problem(data, cls)
    if problem is None:
        try:
            return cls.from_dict(data)
        except ResultsError as exc:  # a newer schema: its message says what to do
            raise ExchangeError(f"{where}{_one_line(exc)}{close}") from exc
    raise ExchangeError(f"{where}{problem}{close}: {fix}")


def _check_built(p: Path, run: RunInfo, results: list[CaseResult]) -> None:
    """ExchangeError where a pytest-benchmark file made a run or result the store cannot use."""
    for i, obj in enumerate([run, *results]):
        problem = fields.problem({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)},
                           type(obj))
        if problem is not None:
            raise ExchangeError(f"{p}: {f'benchmark #{i - 1}' if i else 'the run'}: {problem}: "
                                f"{_PB_FIX}")


def _check_run(p: Path, run: RunInfo, results: list[CaseResult]) -> None:
    if not isinstance(run.machine, dict) or not run.machine.get("fingerprint"):
        raise ExchangeError(f"{p}: run {run.run_id} has no machine fingerprint: "
                            "re-run it with a current kernel-harness")
    for r in results:
        if r.run_id != run.run_id:
            raise ExchangeError(f"{p}: result {r.key} belongs to run {r.run_id}, not "
                                f"{run.run_id}: keep each run's results with its own run")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _from_pytest_benchmark(p: Path, data: dict[str, Any]) -> tuple[RunInfo, list[CaseResult]]:
    info = data["machine_info"]
    benchmarks = data["benchmarks"]
    if not isinstance(info, dict) or not isinstance(benchmarks, list):
        raise ExchangeError(f"{p}: pytest-benchmark JSON whose machine_info is not an object "
                            "or benchmarks not a list: write it again with --benchmark-json")
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    brand = cpu.get("brand_raw") or cpu.get("brand")  # py-cpuinfo < 7 called it "brand"
    # no hostname: CI containers get a new one every run, which would split one machine's
    # history (the same choice as envinfo.machine)
    ident = {
        "machine": info.get("machine"),
        "processor": info.get("processor"), "cpu": brand,
        "python_implementation": info.get("python_implementation"),
        "python_version": info.get("python_version"),
    }  # fmt: skip
    trimmed = dict(info)
    if "flags" in cpu:  # a hundred CPU flags per run would bloat every stored copy
        trimmed["cpu"] = {k: v for k, v in cpu.items() if k != "flags"}
    machine = {
        "fingerprint": envinfo.fingerprint(ident), "name": _text(info.get("node")),
        "hostname": _text(info.get("node")), "cpu_model": brand, "cpu_count": cpu.get("count"),
        "arch": info.get("machine"), "source": PYTEST_BENCHMARK, "machine_info": trimmed,
    }  # fmt: skip
    commit = data.get("commit_info") if isinstance(data.get("commit_info"), dict) else {}
    commit_id = _text(commit.get("id"))
    env = {
        "python": info.get("python_version"),
        "python_implementation": info.get("python_implementation"),
        "platform": "-".join(_text(info.get(k)) for k in ("system", "release", "machine")),
        "pytest_benchmark": data.get("version"),
        "commit_info": commit,
    }
    started_at = _timestamp(p, data.get("datetime"))
    # the content names the run, so ingesting the same file again updates instead of adding
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=True)
    run_id = hashlib.sha256(canonical.encode()).hexdigest()[:32]
    env_id = envinfo.env_id(env)
    run = RunInfo(
        run_id=run_id, started_at=started_at, finished_at=started_at, tier=PYTEST_BENCHMARK,
        world_sizes=[1], machine=machine, env=env, impls=[PYTEST_BENCHMARK],
        # pytest-benchmark writes "unversioned"/"unknown" when there was no usable VCS
        git_commit=commit_id if commit_id not in ("", "unversioned", "unknown") else None,
        status="complete",
    )  # fmt: skip
    results: list[CaseResult] = []
    seen: set[str] = set()
    for i, bench in enumerate(benchmarks):
        result = _pb_result(p, i, bench, run_id, started_at, env_id)
        if result.case_id in seen:
            raise ExchangeError(f"{p}: benchmark {result.case_id!r} appears twice: "
                                "merge files with distinct test ids")
        seen.add(result.case_id)
        results.append(result)
    _check_built(p, run, results)
    return run, results


def _timestamp(p: Path, text: Any) -> float:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError as exc:
        raise ExchangeError(f"{p}: 'datetime' {text!r} is not an ISO 8601 time: "
                            "write the file again with pytest --benchmark-json") from exc
    if when.tzinfo is None:  # pytest-benchmark < 4 wrote naive UTC (utcnow)
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _pb_result(p: Path, i: int, bench: Any, run_id: str, started_at: float,
               env_id: str) -> CaseResult:
    label = f"benchmark #{i}"
    if not isinstance(bench, dict) or not isinstance(bench.get("stats"), dict):
        raise ExchangeError(f"{p}: {label} has no 'stats' object: "
                            "write the file again with pytest --benchmark-json")
    name = bench.get("name") or bench.get("fullname")
    fullname = bench.get("fullname") or name
    if not fullname:
        raise ExchangeError(f"{p}: {label} has neither 'name' nor 'fullname': "
                            "write the file again with pytest --benchmark-json")
    stats = bench["stats"]
    try:
        iterations = int(stats.get("iterations") or 1)
        data = [float(x) for x in stats.get("data") or []]
        if data:
            # imported here: harness.core.timing imports torch, which run JSON ingest never needs
            from harness.core.timing import summarize

            timing = summarize([x * 1e9 for x in data])
        else:
            timing = {
                "median": float(stats["median"]) * 1e9, "min": float(stats["min"]) * 1e9,
                "mean": float(stats["mean"]) * 1e9,
                "std": float(stats.get("stddev") or 0.0) * 1e9,
                "max": float(stats["max"]) * 1e9, "n": int(stats["rounds"]), "samples": [],
                # kept whole so that exporting it again gives back the same stats
                "pytest_benchmark_stats": {k: v for k, v in stats.items()
                                           if k not in ("data", "iterations")},
            }  # fmt: skip
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # int(inf): Overflow
        raise ExchangeError(f"{p}: {label} ({fields.shown(fullname)}) has no usable stats "
                            f"({exc!r}): write the file again with pytest --benchmark-json"
                            ) from exc
    if iterations != 1:
        timing["iterations"] = iterations
    params = bench.get("params") if isinstance(bench.get("params"), dict) else {}
    return CaseResult(
        run_id=run_id, case_id=str(fullname),
        # pytest ids are func[param]: the function is the op, its parameters make the case
        op=str(bench.get("group") or str(name).split("[", 1)[0]),
        family=PYTEST_BENCHMARK, impl=PYTEST_BENCHMARK, world_size=1, params=params,
        status="pass", timing=timing, started_at=started_at, env_id=env_id,
    )  # fmt: skip
