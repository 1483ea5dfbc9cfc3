"""The nightly's analysis (``harness run``) replayed night by night on the synthetic histories
of benchmarks/detect_on_synthetic_histories.py: false alarms and prompt finds per family.

detect_on_synthetic_histories.py scores whole histories read at once (``harness detect``);
a nightly reads one more run each night and must not fail for noise. This replays the
analysis ``harness run`` stores (benchmarks/regression_detection.py's ``ours``: the history
window, the stored change points carried from night to night, an alarm being a new slower
change point of at least 5%) over the first RUNS runs of SERIES histories per family, one
value per run (no samples: an imported history, or one run's median), and counts:

* false alarms: alarms on a night that is not within AFTER nights of a slower step (so also
  every alarm after a faster one: the runs only got faster);
* found: slower steps of at least 5% alarmed within PROMPT nights of their first run (the
  new level needs two runs, so the first chance is the step's second night).

Slower steps under 5% neither count as found nor make their alarms false. The families are
those of the synthetic benchmark: normal noise, a kernel that takes one of two paths
(``bimodal``: 30% of the runs 6% up), spikes, bursts of slow runs, a drift, and noise that
triples from a run on.

    python benchmarks/nightly_on_synthetic_histories.py               # the table (~2 min)
    python benchmarks/nightly_on_synthetic_histories.py --seed 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import detect_on_synthetic_histories as synthetic  # noqa: E402  (the draw)
import regression_detection as rd  # noqa: E402  (the nightly replay)
from _figures import command, machine, record  # noqa: E402

SERIES = 20  # histories per family
RUNS = 200  # nights replayed per history
THRESHOLD = 0.05  # an alarm: a new slower change point of at least this
PROMPT, AFTER = rd.PROMPT, rd.AFTER


def replay_one(values: np.ndarray, steps: list[int]) -> dict[str, int]:
    """One history's nightly replay, scored."""
    runs = [[float(v)] for v in values[:RUNS]]
    n = len(runs)
    alarms, _ = rd.replay(rd.ours(THRESHOLD), runs, 1, n)
    # each step's size from the medians of the 20 runs either side (steps are 40 or more
    # runs apart; the draw keeps only where they are)
    sizes = []
    for at in (s for s in steps if s < n):
        before = float(np.median(values[max(0, at - 20):at]))
        sizes.append((at, float(np.median(values[at:at + 20])) / before - 1))
    near = {u for at, change in sizes if change > 0 for u in range(at, at + AFTER + 1)}
    regressions = [at for at, change in sizes if change >= THRESHOLD and at + PROMPT < n]
    return {"nights": n - 1, "false_alarms": sum(u not in near for u in alarms),
            "steps": len(regressions),
            "found": sum(any(at <= u <= at + PROMPT for u in alarms) for at in regressions)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026, help="the draw (default 2026)")
    args = parser.parse_args()
    print(f"{SERIES} synthetic histories per family, their first {RUNS} runs replayed night by "
          f"night, seed {args.seed}\n")
    print("| family | false alarms per 100 nights | slower steps >= 5% found within "
          f"{PROMPT} nights | seconds |\n|---|---|---|---|")
    per_100: dict[str, float] = {}
    all_steps = all_found = 0
    for family in synthetic.FAMILIES:
        rng = np.random.default_rng([args.seed, synthetic.FAMILIES.index(family)])
        data = [synthetic.draw(family, rng) for _ in range(SERIES)]
        start = time.perf_counter()
        got = [replay_one(values, steps) for values, steps in data]
        nights = sum(g["nights"] for g in got)
        false = sum(g["false_alarms"] for g in got)
        steps, found = sum(g["steps"] for g in got), sum(g["found"] for g in got)
        print(f"| {family} | {100 * false / nights:.2f} ({false} of {nights}) | "
              f"{found}/{steps} | {time.perf_counter() - start:.0f} |", flush=True)
        per_100[family] = round(100 * false / nights, 2)
        all_steps, all_found = all_steps + steps, all_found + found
    record("nightly_on_synthetic_histories" + ("" if args.seed == 2026 else f"_seed{args.seed}"),
           figure=f"The nightly's analysis replayed night by night on synthetic histories "
                  f"({SERIES} per family, {RUNS} runs, one value per run): false alarms, "
                  "bimodal / bursts",
           value=f"{per_100['bimodal']:.2f} / {per_100['bursts']:.2f}", unit="per 100 nights",
           command=command(__file__, *sys.argv[1:]), machine=machine(),
           details={"seed": args.seed, "false_alarms_per_100_nights": per_100,
                    f"slower_steps_found_within_{PROMPT}_nights": f"{all_found} of {all_steps}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
