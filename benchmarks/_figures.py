"""The one place a benchmark's figure is written: ``benchmarks/results/NAME.json``.

Every benchmark that measures something ends with ``record(...)``; ``benchmarks/render.py``
turns the files into benchmarks/RESULTS.md and the README's headline table. A file holds the
latest measurement only: the commit and date say when it was taken, and a rerun replaces it.

    {"name": ..., "figure": "what is measured, one short sentence",
     "value": 81.6 or "0.820 / 0.727", "unit": "s" or "F1 / cover",
     "command": "the command that reproduces it", "commit": "<git HEAD>[-dirty]",
     "date": "YYYY-MM-DD", "machine": "2-core VM", "details": {...}, "headline": false}

``FIGURES_RESULTS`` (a folder) writes the files there instead, e.g. for a trial run;
``FIGURES_MACHINE`` names the machine where ``machine()`` would guess.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: the keys every figure file has, and the types their values may take
REQUIRED: dict[str, tuple[type, ...]] = {
    "name": (str,), "figure": (str,), "value": (int, float, str), "unit": (str,),
    "command": (str,), "commit": (str,), "date": (str,), "machine": (str,),
    "details": (dict,), "headline": (bool,),
}
#: what recording and rendering figures write: a change there does not make a measurement dirty
_OUTPUTS = ("benchmarks/results", "benchmarks/RESULTS.md", "README.md")


def results_dir() -> Path:
    return Path(os.environ["FIGURES_RESULTS"]) if os.environ.get("FIGURES_RESULTS") else RESULTS


def commit() -> str:
    """git HEAD, with "-dirty" when the tree differs from it outside the figure files;
    "unknown" outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--", ".",
                      *(f":(exclude){p}" for p in _OUTPUTS))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if changed else head


def machine(device: str | None = None) -> str:
    """What the figure was measured on: ``FIGURES_MACHINE`` if set, else the CUDA device's
    name for a ``device`` of "cuda", else "N-core VM" (or "N-core host" where the CPU reports
    no hypervisor), N the CPUs this process may use."""
    if os.environ.get("FIGURES_MACHINE"):
        return os.environ["FIGURES_MACHINE"]
    if device is not None and str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    try:
        virtual = " hypervisor" in Path("/proc/cpuinfo").read_text()
    except OSError:
        virtual = False
    return f"{cpus}-core {'VM' if virtual else 'host'}"


def yardstick(rounds: int = 3) -> float | None:
    """Seconds a fixed single-threaded workload takes on this machine, the best of
    ``rounds``: pure Python (a harness's bookkeeping) and small torch operations (its checks
    on small tensors); None without torch (a fresh machine before its install). Recorded
    beside a wall time, it tells a slower machine from slower code: figures from two
    machines compare as value / yardstick, roughly."""
    import time

    try:
        import torch
    except ImportError:
        return None

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = float("inf")
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            total = 0
            for i in range(2_000_000):
                total += i * i % 7
            x = torch.arange(1024, dtype=torch.float32)
            for _ in range(15_000):
                x = (x * 1.0001).add_(1.0).sin_()
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return round(best, 3)


def command(script: str, *args: str) -> str:
    """``python benchmarks/SCRIPT ARGS``: the command line of a benchmark run as given."""
    import shlex

    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


def record(name: str, *, figure: str, value: float | int | str, unit: str, command: str,
           machine: str, details: dict | None = None, headline: bool = False,
           out: Path | None = None) -> Path:
    """Write the figure ``name`` (``results_dir()/NAME.json``, or ``out``) and return its path.
    ``value`` is the headline number, or a short string where it is several ("0.820 / 0.727");
    ``details`` the breakdown; ``headline``: shown in the README's table."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"figure name {name!r}: give a file name without a folder")
    doc = {"name": name, "figure": figure, "value": value, "unit": unit, "command": command,
           "commit": commit(), "date": _dt.date.today().isoformat(), "machine": machine,
           "details": details or {}, "headline": bool(headline)}
    problems = check(doc)
    if problems:
        raise ValueError(f"figure {name}: {'; '.join(problems)}")
    path = out if out is not None else results_dir() / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"figure {name}: {value} {unit} -> {path} (python benchmarks/render.py updates "
          "RESULTS.md and the README)", file=sys.stderr)
    return path


def check(doc: object) -> list[str]:
    """What is wrong with a figure document: missing keys, values of the wrong type."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    for key, types in REQUIRED.items():
        if key not in doc:
            problems.append(f"no {key!r}")
        elif not isinstance(doc[key], types) or (
                types != (bool,) and isinstance(doc[key], bool)):
            problems.append(f"{key!r} is {type(doc[key]).__name__}, not "
                            + " or ".join(t.__name__ for t in types))
    for key in ("name", "figure", "unit", "command", "commit", "machine"):
        if isinstance(doc.get(key), str) and not doc[key].strip():
            problems.append(f"{key!r} is empty")
    if isinstance(doc.get("date"), str):
        try:
            _dt.date.fromisoformat(doc["date"])
        except ValueError:
            problems.append(f"'date' {doc['date']!r} is not an ISO date (YYYY-MM-DD)")
    return problems
