"""What a GPU validation recorded (ci/gpu-validation.sh): per run, the pass/fail counts and
every failure, then the headline figures docs/gpu-validation.md asks for. Reads the history
DB only.

    python benchmarks/gpu_validation_summary.py HISTORY_DB
"""

from __future__ import annotations

import collections
import json
import sqlite3
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    if not Path(sys.argv[1]).is_file():
        print(f"no history DB at {sys.argv[1]}: run a step of ci/gpu-validation.sh first",
              file=sys.stderr)
        return 2
    conn = sqlite3.connect(sys.argv[1])
    conn.row_factory = sqlite3.Row
    for run in conn.execute("SELECT run_id, tier, world_sizes, argv FROM runs "
                            "ORDER BY started_at"):
        argv = json.loads(run["argv"] or "[]")
        rows = conn.execute("SELECT case_id, impl, world_size, status, reason, device "
                            "FROM results WHERE run_id = ?", (run["run_id"],)).fetchall()
        counts = collections.Counter(r["status"] for r in rows)
        devices = sorted({r["device"] for r in rows})
        print(f"run {run['run_id'][:8]} tier={run['tier']} world sizes={run['world_sizes']} "
              f"argv={' '.join(argv)!r} devices={devices}: "
              + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for r in rows:
            if r["status"] not in ("pass", "skip"):
                reason = (r["reason"] or "").splitlines()[0][:160] if r["reason"] else ""
                print(f"  {r['status'].upper()} w{r['world_size']} {r['case_id']}@{r['impl']}: "
                      f"{reason}")
    print("\n# headline figures (best over the recorded runs)")
    for row in conn.execute("SELECT device, copy_gbps, matmul FROM calibrations"):
        print(f"calibration {row['device']}: copy {row['copy_gbps']:.0f} GB/s, "
              f"matmul TFLOP/s {row['matmul']}")
    queries = {
        "strided copy GB/s (and % of copy bandwidth), by impl":
            "SELECT impl, MAX(gbps), MAX(json_extract(record, '$.derived.pct_peak_bw')) "
            "FROM results WHERE op = 'strided_copy' AND status = 'pass' GROUP BY impl",
        "FP8 GEMM TFLOP/s (and % of the fp8 matmul peak), by op and impl":
            "SELECT op || '@' || impl, MAX(tflops), "
            "MAX(json_extract(record, '$.derived.pct_peak_flops')) FROM results "
            "WHERE family = 'fp8_gemm' AND tflops IS NOT NULL AND status = 'pass' "
            "GROUP BY op, impl",
        "allreduce busbw GB/s, by impl and world size":
            "SELECT impl || ' w' || world_size, MAX(busbw_gbps), NULL FROM results "
            "WHERE op = 'allreduce' AND status = 'pass' GROUP BY impl, world_size",
    }
    for title, sql in queries.items():
        print(f"{title}:")
        for name, best, pct in conn.execute(sql):
            pct_text = f" ({pct:.1f}%)" if pct is not None else ""
            print(f"  {name}: {best if best is None else round(best, 1)}{pct_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
