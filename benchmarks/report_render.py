"""How long `harness report` takes, and how big the site gets, on a long history.

A long history of real runs would take days to record here, so this replicates the results of
one real run (the newest of --from-db, e.g. a smoke run at 1, 4 and 8 ranks) into --runs runs
of the same machine, one per "night", every timing sample scaled by a per-run factor
(lognormal, 3% spread) so the trends and the regression analysis have noise to work on. It
ingests them with `harness ingest` (which stores each run's findings, as nightly CI does),
then times `harness report` twice: a first render (plotly.min.js copied) and a re-render.

    python benchmarks/report_render.py --from-db harness-results/history.db --runs 30
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _figures import command, machine, record

from harness.history import store
from harness.history.exchange import RUN_FORMAT, RUN_FORMAT_SCHEMA


def _harness(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True,
                         text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"harness {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-db", required=True, type=Path,
                        help="A history DB whose newest run is replicated.")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    conn = store.connect(args.from_db)
    newest = store.run_ids(conn, limit=1)
    if not newest:
        sys.exit(f"{args.from_db} holds no run: `harness run --db {args.from_db}` first")
    run = store.get_run(conn, newest[0])
    results = store.results_for_run(conn, newest[0])
    conn.close()
    assert run is not None
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        files = []
        for night in range(args.runs):
            factor = rng.lognormvariate(0.0, 0.03)
            doc_run = {**run.to_dict(), "run_id": f"bench-{night:04d}",
                       "started_at": run.started_at + 86400.0 * night}
            docs = []
            for r in results:
                d = r.to_dict()
                d["run_id"] = doc_run["run_id"]
                t = d.get("timing")
                if isinstance(t, dict) and t.get("samples"):
                    t["samples"] = [s * factor * rng.lognormvariate(0.0, 0.01)
                                    for s in t["samples"]]
                    for k in ("median", "p10", "p90", "min", "mean"):
                        if isinstance(t.get(k), (int, float)):
                            t[k] *= factor
                docs.append(d)
            path = tmp / f"run-{night:04d}.json"
            path.write_text(json.dumps({"format": RUN_FORMAT, "schema": RUN_FORMAT_SCHEMA,
                                        "run": doc_run, "results": docs}))
            files.append(str(path))
        db = tmp / "history.db"
        t0 = time.perf_counter()
        _harness("ingest", *files, "--db", str(db))
        ingest_s = time.perf_counter() - t0
        site = tmp / "site"
        timings = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = _harness("report", "--db", str(db), "--out", str(site))
            timings.append(time.perf_counter() - t0)
        pages = list(site.rglob("*.html"))
        biggest = max(pages, key=lambda p: p.stat().st_size)
        print(f"{args.runs} runs x {len(results)} results (replicated from run "
              f"{newest[0][:8]} of {args.from_db})")
        print(f"harness ingest (with the analysis of every run): {ingest_s:.1f} s")
        print(f"harness report: first render {timings[0]:.1f} s, re-render {timings[1]:.1f} s")
        print(f"site: {len(pages)} pages, {_size(site) / 1e6:.1f} MB in all "
              f"({_size(site / 'assets') / 1e6:.1f} MB of assets); largest page "
              f"{biggest.relative_to(site)} {biggest.stat().st_size / 1e6:.2f} MB")
        print(out.stdout.strip().splitlines()[0])
        record("report_render",
               figure=f"harness report of a {args.runs}-night history (a real smoke run of "
                      f"{len(results)} results, replicated with jittered timings): first render",
               value=round(timings[0], 1), unit="s",
               command=command(__file__, *sys.argv[1:]), machine=machine(), headline=True,
               details={"re_render_s": round(timings[1], 1), "pages": len(pages),
                        "site_mb": round(_size(site) / 1e6, 1),
                        "assets_mb": round(_size(site / "assets") / 1e6, 1),
                        "largest_page": str(biggest.relative_to(site)),
                        "largest_page_mb": round(biggest.stat().st_size / 1e6, 2),
                        "ingest_s": round(ingest_s, 1),
                        "ingest_s_per_run": round(ingest_s / args.runs, 1),
                        "runs": args.runs, "results_per_run": len(results)})


if __name__ == "__main__":
    main()
