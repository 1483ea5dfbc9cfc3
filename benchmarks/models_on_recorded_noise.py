"""The two change point models on whole recorded harness histories, with a step injected.

``harness detect`` offers a level model (the nightly's) and a trend model (its default for a
CSV, chosen on TCPD: benchmarks/tcpd_changepoints.py). This replays the recorded noise of
benchmarks/regression_detection.py offline: each whole 40-run series (world size 1, run-to-run
noise under 3%: the "quiet" series) gets a step of +s from run t on (t = 5, 8, ..., n - 6), and
``changepoints.find`` with each model sees the whole series at once, as ``harness detect``
does on a history DB (each run by the 10th percentile of its samples, in log). A step is
found when a change point lies within 2 runs of t; every other change point counts as
"other". The unmodified series' change points are listed too.

    python benchmarks/models_on_recorded_noise.py            # the quiet recording
    python benchmarks/models_on_recorded_noise.py --data benchmarks/data/regression_noise.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import regression_detection  # noqa: E402  (this folder's loader and data)
from _figures import command, machine, record  # noqa: E402

from harness.history import changepoints, regress  # noqa: E402

STEPS = (0.05, 0.10, 0.20)
MARGIN = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=regression_detection.DATA)
    args = parser.parse_args()
    _, series = regression_detection.load(args.data)
    quiet = [s for s in series if regression_detection.is_quiet(s)]
    print(f"{len(quiet)} quiet world-size-1 series of {args.data.name}\n")
    print("| model | change points, unmodified | "
          + " | ".join(f"+{s:.0%} found / other per series" for s in STEPS)
          + " |\n|---|---|" + "---|" * len(STEPS))
    by_step: dict[str, dict] = {}
    unmodified: dict[str, int] = {}
    for model in changepoints.MODELS:
        def points(runs: list[list[float]], model: str = model) -> list[int]:
            return [cp.index for cp in changepoints.find(
                runs, log=True, model=model, quantile=regress.TIMING_QUANTILE)]

        clean = sum(len(points(s["runs"])) for s in quiet)
        unmodified[model] = clean
        cells = []
        for step in STEPS:
            found = other = tried = 0
            for s in quiet:
                runs = s["runs"]
                for t in range(5, len(runs) - 5, 3):
                    got = points(runs[:t] + [[x * (1 + step) for x in r] for r in runs[t:]])
                    hit = any(abs(i - t) <= MARGIN for i in got)
                    found, other, tried = found + hit, other + len(got) - hit, tried + 1
            cells.append(f"{found / tried:.0%} / {other / tried:.2f}")
            by_step.setdefault(f"+{step:.0%}", {})[model] = {
                "found_pct": round(100 * found / tried), "other_per_series": round(other / tried,
                                                                                 2)}
        print(f"| {model} | {clean} | " + " | ".join(cells) + " |")
    level = by_step["+10%"]["level"]
    record(f"models_on_recorded_noise{regression_detection.recording_tag(args.data)}",
           figure=f"The level model on whole recorded histories ({len(quiet)} quiet world-size-1 "
                  f"series of {regression_detection.recording_name(args.data)}, a +10% step "
                  "injected): steps found within "
                  f"{MARGIN} runs / other change points",
           value=f"{level['found_pct']}% / {level['other_per_series']:.2f}",
           unit="found / other per series", command=command(__file__, *sys.argv[1:]),
           machine=machine(), details={**by_step, "unmodified_change_points": unmodified,
                                       "runs_read_by": "the 10th percentile of their samples, "
                                                       "as on a history DB"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
