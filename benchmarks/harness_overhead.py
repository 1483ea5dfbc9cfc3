"""The harness's own cost per case, measured with an op whose implementation does nothing.

The op ``noop`` copies 16 floats into its output buffer: its implementation costs a few
microseconds, so what a case takes beyond its implementation's calls is the harness: the
pytest item, the skip question, the inputs and the reference, poisoning, the shifted copy,
the checks and their gathers over the ranks, the golden lookup, the timing loop's barriers,
the result line (fsynced) and the progress file. Every case has its own parameters, so
nothing is cached across cases that a real tier would not cache.

Each world size is one real ``mpiexec`` job running pytest with the harness plugin, as
``harness run`` launches it. Rank 0 times every item (pytest's whole run protocol) and the
time spent inside the implementation; the overhead of an item is the difference. Prints the
median and p90 per world size and timing mode:

    python benchmarks/harness_overhead.py [--cases 200] [--world-sizes 1,8]

``auto`` is what ``harness run`` does by default (full smoke timing where ranks have their
own CPUs, a token call where they outnumber them), ``no-bench`` checks only, ``bench`` times
fully everywhere (``--bench``). Goals (issue 19): median <= 5 ms at world size 1 and <= 50 ms
at world size 8 on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _figures import command, machine, record  # noqa: E402

N = 16
#: the benchmark's op borrows a family of the suites package: the plugin collects each family
#: from its module's file, and the op is selected by name alone
FAMILY = "collectives"
INSIDE_NS: list[int] = []


def _noop_spec(cases: int):
    import torch

    from harness.core.buffers import poisoned
    from harness.core.spec import OpSpec

    def make_inputs(params, rank, world_size):
        x = torch.arange(N, dtype=torch.float32) + rank + params["i"]
        return {"x": x, "out": poisoned(N, torch.float32)}

    def expected(params, rank, world_size):
        return torch.arange(N, dtype=torch.float32) + rank + params["i"]

    def noop(world, x, out):
        t0 = time.perf_counter_ns()
        out.copy_(x)
        INSIDE_NS.append(time.perf_counter_ns() - t0)
        return out

    return OpSpec(name="noop", family=FAMILY, reference=lambda x, out: x.clone(),
                  expected=expected, make_inputs=make_inputs,
                  grid={"smoke": [{"i": i} for i in range(cases)]},
                  implementations={"noop": noop}, out_buffers={"out": "out"},
                  distributed=True, description="does nothing: the harness's own cost")


class NoopPlugin:
    """Adds the no-op op to the registry before the harness plugin reads it, and times every
    item on rank 0."""

    def __init__(self, cases: int, out: Path) -> None:
        self.cases, self.out = cases, out
        self.items: list[tuple[int, int]] = []  # (item wall ns, implementation ns)

    def pytest_configure(self, config) -> None:
        from harness.core.discovery import registry

        registry().add(_noop_spec(self.cases))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        inside = len(INSIDE_NS)
        t0 = time.perf_counter_ns()
        yield
        self.items.append((time.perf_counter_ns() - t0, sum(INSIDE_NS[inside:])))

    def pytest_unconfigure(self, config) -> None:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            self.out.write_text(json.dumps(self.items))


def worker(args: argparse.Namespace, pytest_args: list[str]) -> int:
    plugin = NoopPlugin(args.cases, Path(args.out))
    # the plugin first, so that its pytest_configure runs before the harness's
    return pytest.main(["-p", "no:cacheprovider", "-q", "--pyargs", "suites",
                        "--harness-set", "selectors=noop", *pytest_args,
                        "-p", "harness.pytest_plugin"], plugins=[plugin])


def run(world_size: int, mode: str, cases: int, tmp: Path) -> dict[str, float]:
    from harness.device.placement import usable_cpus
    from harness.engine.launch import wait_environment

    out = tmp / f"w{world_size}-{mode}.json"
    flags = {"auto": [], "no-bench": ["--harness-set", "bench=false"],
             "bench": ["--harness-set", "bench=true"]}[mode]
    run_dir = tmp / f"w{world_size}-{mode}"
    run_dir.mkdir(exist_ok=True)
    from harness.device.envinfo import find_launcher

    mpiexec = find_launcher()  # what `harness run` launches with
    if mpiexec is None:
        sys.exit("no mpiexec: `pip install mpich`")
    env = {**os.environ, "MPIR_CVAR_ENABLE_GPU": "0",
           **wait_environment(world_size, len(usable_cpus()), single_node=True)}
    cmd = [mpiexec, "-n", str(world_size), sys.executable, str(HERE), "--worker",
           "--cases", str(cases), "--out", str(out), "--",
           "--harness-run-dir", str(run_dir), "--harness-set", "device=cpu", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
    if proc.returncode != 0:
        sys.exit(f"world size {world_size} ({mode}) failed:\n{proc.stdout[-3000:]}"
                 f"{proc.stderr[-3000:]}")
    items = np.asarray(json.loads(out.read_text()), dtype=np.float64)
    overhead = (items[:, 0] - items[:, 1]) / 1e6
    return {"items": len(items), "median_ms": float(np.median(overhead)),
            "p90_ms": float(np.percentile(overhead, 90)),
            "impl_ms": float(np.median(items[:, 1]) / 1e6)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--world-sizes", default="1,8")
    parser.add_argument("--modes", default="auto,no-bench,bench")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        return worker(args, [a for a in rest if a != "--"])
    print(f"{'world':>5} {'mode':>9} {'items':>6} {'median ms':>10} {'p90 ms':>8} "
          f"{'impl ms':>8}")
    sizes, modes = [int(x) for x in args.world_sizes.split(",")], args.modes.split(",")
    details: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in sizes:
            for mode in modes:
                r = run(w, mode, args.cases, Path(tmp))
                print(f"{w:>5} {mode:>9} {r['items']:>6} {r['median_ms']:>10.2f} "
                      f"{r['p90_ms']:>8.2f} {r['impl_ms']:>8.3f}", flush=True)
                details.setdefault(f"world_size_{w}", {})[mode] = {
                    k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    headline = modes[0]  # auto, what `harness run` does, unless --modes says otherwise
    record("harness_overhead",
           figure="Harness overhead per case: a no-op op through mpiexec and the pytest plugin, "
                  f"median of {args.cases} cases" + ("" if headline == "auto" else
                                                      f", {headline}"),
           value=" / ".join(f"{details[f'world_size_{w}'][headline]['median_ms']:.2f}"
                            for w in sizes),
           unit=f"ms at world size {' / '.join(map(str, sizes))}",
           command=command(__file__, *sys.argv[1:]), machine=machine(), details=details,
           headline=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
