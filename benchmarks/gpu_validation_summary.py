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
    # the records are parsed here, not by SQLite's json_extract: they may hold Infinity
    # (a golden check's unbounded sample tolerance), which SQLite before 3.42 calls malformed
    queries = {
        "strided copy GB/s (and % of copy bandwidth), by impl":
            ("SELECT impl, gbps, record FROM results WHERE op = 'strided_copy' "
             "AND status = 'pass'", "pct_peak_bw"),
        "FP8 GEMM TFLOP/s (and % of the fp8 matmul peak), by op and impl":
            ("SELECT op || '@' || impl, tflops, record FROM results WHERE family = 'fp8_gemm' "
             "AND tflops IS NOT NULL AND status = 'pass'", "pct_peak_flops"),
        "allreduce busbw GB/s, by impl and world size":
            ("SELECT impl || ' w' || world_size, busbw_gbps, NULL FROM results "
             "WHERE op = 'allreduce' AND status = 'pass'", None),
    }
    for title, (sql, pct_key) in queries.items():
        print(f"{title}:")
        best: dict[str, list] = {}
        for name, value, record in conn.execute(sql):
            pct = json.loads(record).get("derived", {}).get(pct_key) if pct_key else None
            top = best.setdefault(name, [None, None])
            if value is not None and (top[0] is None or value > top[0]):
                top[0] = value
            if pct is not None and (top[1] is None or pct > top[1]):
                top[1] = pct
        for name, (value, pct) in sorted(best.items()):
            pct_text = f" ({pct:.1f}%)" if pct is not None else ""
            print(f"  {name}: {value if value is None else round(value, 1)}{pct_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
