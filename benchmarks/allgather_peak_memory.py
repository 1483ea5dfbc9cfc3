"""Peak memory of ZeRO-3's two allgather modes: bulk (one coalesced gather through a flat
temporary) against sequential (one gather per parameter, straight into place).

Runs the smoke tier's 8-parameter allgather case (~1 MiB per rank) with the real harness at
each world size and prints, per world size, the peak memory of one call of each mode (the
largest over ranks), their ratio, and bulk's theoretical temporary W * n * 4 bytes.

    python benchmarks/allgather_peak_memory.py [--world-sizes 1,4,8]

On the CPU the figure is the resident-set high-water mark of the call (page-granular, shared
with gloo's threads: a best effort); on CUDA the caching allocator's peak.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from _figures import command, machine, record

CASE = "allgather[dtype=f32,inplace=false,mode=exact,n=262147,tensors=8]"
N, ITEMSIZE = 262147, 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="1,4,8")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "h.db"
        cmd = [sys.executable, "-m", "harness", "run", CASE, "--impl", "bulk", "--impl",
               "sequential", "--world-sizes", args.world_sizes, "--no-bench", "--db", str(db)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT world_size, impl, peak_memory_bytes, peak_memory_kind "
                                "FROM results ORDER BY world_size, impl").fetchall()
    peaks: dict[int, dict[str, tuple[int | None, str]]] = {}
    for world, impl, peak, kind in rows:
        peaks.setdefault(world, {})[impl] = (peak, kind)
    print("| W | bulk peak (MB) | sequential peak (MB) | bulk / sequential | bulk temporary "
          "W*n*4 (MB) | measured as |")
    print("|---|---|---|---|---|---|")
    details: dict[str, dict] = {}
    for world, by in sorted(peaks.items()):
        (bulk, kind), (seq, _) = by["bulk"], by["sequential"]
        temporary = round(world * N * ITEMSIZE / 1e6, 2)
        details[f"world_size_{world}"] = {
            "bulk_mb": None if bulk is None else round(bulk / 1e6, 2),
            "sequential_mb": None if seq is None else round(seq / 1e6, 2),
            "bulk_temporary_mb": temporary, "measured_as": kind}
        if bulk is None or seq is None:
            print(f"| {world} | n/m | n/m | - | {world * N * ITEMSIZE / 1e6:.2f} | {kind} |")
            continue
        ratio = f"{bulk / seq:.1f}x" if seq else "inf"
        print(f"| {world} | {bulk / 1e6:.2f} | {seq / 1e6:.2f} | {ratio} | "
              f"{world * N * ITEMSIZE / 1e6:.2f} | {kind} |")
    ratios = [f"{d['bulk_mb'] / d['sequential_mb']:.1f}" if d["bulk_mb"] and d["sequential_mb"]
              else "n/m" for d in details.values()]
    cpu = all(d["measured_as"] == "cpu_rss_peak" for d in details.values())
    record("allgather_peak_memory",
           figure="Peak memory of one allgather of 8 parameters (~1 MiB per rank), bulk against "
                  f"sequential ({'CPU resident-set' if cpu else 'allocator'} peak, largest over "
                  "ranks)",
           value=" / ".join(ratios),
           unit=f"x at world size {' / '.join(str(w) for w in sorted(peaks))}",
           command=command(__file__, *sys.argv[1:]), machine=machine(), details=details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
