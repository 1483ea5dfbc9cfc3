"""A run over two SLURM nodes beside the same run on one node: what crossing nodes costs.

Brings up the tests' two-node cluster (tests/helpers/two_node_cluster.py: two slurmd in
namespaces of their own on this machine, joined by a bridge; needs root, util-linux and
slurm-wlm) and times, alternately, ``harness run`` of a few allreduce cases at world size 4,
checks only:

- two nodes: ``--launcher srun`` from the login node, ranks 0-1 on n1 and 2-3 on n2, their
  MPI and gloo traffic over the bridge;
- one node: ``mpiexec`` on this machine, the four ranks through shared memory.

Both wall times are the whole command (its start, the ranks' start, the cases, the ingest),
the median of ``--repeats``. The two nodes share this machine's cores, so the difference is
what SLURM, the PMI and the network path add, not what a second machine would give.

    python benchmarks/two_node.py [--repeats 3] [--json benchmarks/results/two_node.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _figures import command, machine  # noqa: E402
from _figures import record as record_figure  # noqa: E402

#: the cases of tests/test_two_nodes.py
SELECTORS = ("allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
             "allreduce[dtype=f32,inplace=true,mode=exact,n=65539,op=sum]",
             "allreduce[dtype=f32,inplace=false,mode=random,n=4099,op=sum]")


def _run(env: dict[str, str], tmp: Path, *extra: str) -> float:
    """Seconds of one `harness run` of the cases at world size 4 (every case passing)."""
    db = tmp / "h.db"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness", "run", *SELECTORS, "--world-sizes",
                          "4", "--no-bench", "--db", str(db), *extra],
                         cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"harness run {' '.join(extra)} exited {out.returncode}:\n"
                         f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None,
                    help="where the figure goes (default benchmarks/results/two_node.json)")
    args = ap.parse_args()

    import two_node_cluster

    t0 = time.perf_counter()
    try:
        cluster = two_node_cluster.TwoNodeCluster()
    except two_node_cluster.Unavailable as exc:
        print(f"two_node.py: no two-node cluster here: {exc}", file=sys.stderr)
        return 2
    bring_up = time.perf_counter() - t0
    try:
        two_env = {**cluster.env, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        one_env = {k: v for k, v in two_env.items() if not k.startswith("SLURM_")}
        slurm = subprocess.run(["srun", "--version"], env=cluster.env, capture_output=True,
                               text=True).stdout.strip()
        two, one, crossed = [], [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                before = cluster.traffic("n2")
                two.append(_run(two_env, Path(tmp), "--launcher", "srun"))
                crossed.append(cluster.traffic("n2") - before)
            with tempfile.TemporaryDirectory() as tmp:
                one.append(_run(one_env, Path(tmp)))
    finally:
        cluster.stop()

    two_s, one_s = statistics.median(two), statistics.median(one)
    print(f"cluster bring-up:        {bring_up:.2f} s")
    print(f"two nodes (srun, 2 + 2): {two_s:.2f} s   runs {', '.join(f'{t:.2f}' for t in two)}")
    print(f"one node (mpiexec, 4):   {one_s:.2f} s   runs {', '.join(f'{t:.2f}' for t in one)}")
    print(f"two nodes / one node:    {two_s / one_s:.2f}x; bytes over n2's link per run: "
          f"{statistics.median(crossed):,.0f}")
    path = record_figure(
        "two_node",
        figure=f"harness run of {len(SELECTORS)} allreduce cases x 3 implementations at world "
               "size 4, checks only, over two SLURM nodes (srun, 2 ranks each) / on one "
               "(mpiexec); both nodes share this machine's cores",
        value=f"{two_s:.2f} / {one_s:.2f}", unit="s, two nodes / one node",
        command=command(__file__, *sys.argv[1:]), machine=f"{machine()}, {slurm}",
        details={"two_over_one": round(two_s / one_s, 2),
                 "two_node_runs_s": [round(t, 2) for t in two],
                 "one_node_runs_s": [round(t, 2) for t in one],
                 "bring_up_s": round(bring_up, 2),
                 "bytes_over_n2_link_per_run": int(statistics.median(crossed)),
                 "selectors": list(SELECTORS)},
        out=args.json)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
