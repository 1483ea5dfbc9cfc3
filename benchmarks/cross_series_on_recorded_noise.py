"""Would the other series of a run help the nightly? Three ways of using them, replayed on
the recorded noise of benchmarks/regression_detection.py (same protocol, same figures).

On the 2-core VM a slow run is slow for most series at once (the recordings' slowness is
whole-run and shared within a ``harness run``), so a run's other series say whether the machine
was slow that night: ``machine_slow[t]`` is the share of the other series of the same world
size whose run ``t`` reads more than SLOW above the lower quartile of their runs so far (no
look-ahead). The variants (hooks of ``regression_detection.ours``; ``harness run`` uses none):

* history without machine-slow runs: earlier runs with ``machine_slow > BUSY`` are left out;
* defer on machine-slow nights: a night with ``machine_slow > BUSY`` reports no slower change;
  it stays stored and the first night that may report it does;
* first sight on quiet nights: a night with ``machine_slow <= QUIET_MACHINE`` reports a slower
  outlier at once, not after a second run at its level.

The steps are injected into one series at a time, so ``machine_slow`` never sees them; a step
of a whole family (a compiler, a driver) would move it too, and the first two variants would
hide such a step. Read the table as an upper bound on what these variants can give.

    python benchmarks/cross_series_on_recorded_noise.py          # the quiet recording
    python benchmarks/cross_series_on_recorded_noise.py --data benchmarks/data/regression_noise.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import regression_detection as rd  # noqa: E402  (this folder's protocol and data)
from _figures import command, machine, record  # noqa: E402

SLOW = 1.05  # a run this far above its series' lower quartile so far reads as slowed
BUSY = 0.5  # machine-slow: more than this share of the other series slowed
QUIET_MACHINE = 0.1  # machine-quiet: at most this share slowed


def slowed(series: list[dict]) -> np.ndarray:
    """[series, run]: the run's median is more than SLOW above the lower quartile of the
    series' run medians up to and including it."""
    n = max(len(s["runs"]) for s in series)
    medians = np.full((len(series), n), np.nan)
    for i, s in enumerate(series):
        for t, run in enumerate(s["runs"]):
            medians[i, t] = np.median(run)
    out = np.zeros(medians.shape, dtype=bool)
    for t in range(n):
        lower = np.nanpercentile(medians[:, :t + 1], 25, axis=1)
        out[:, t] = medians[:, t] > SLOW * lower
    return out


def variants(machine_slow: np.ndarray) -> dict[str, rd.Nightly]:
    def busy(t: int) -> bool:
        return bool(machine_slow[t] > BUSY)

    return {
        "ours (as harness run)": rd.ours(0.05),
        f"history without machine-slow runs (> {BUSY:.0%})":
            rd.ours(0.05, keep_run=lambda i: not busy(i)),
        f"defer on machine-slow nights (> {BUSY:.0%})":
            rd.ours(0.05, may_report=lambda t: not busy(t)),
        f"first sight on quiet nights (<= {QUIET_MACHINE:.0%})":
            rd.ours(0.05, first_sight=lambda t: bool(machine_slow[t] <= QUIET_MACHINE)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=rd.DATA)
    args = parser.parse_args()
    _, series = rd.load(args.data)
    flags = slowed(series)
    rows: dict[str, list[dict]] = {}
    for i, s in enumerate(series):
        if not rd.is_quiet(s):
            continue
        others = [j for j, o in enumerate(series) if j != i and o["world_size"] == 1]
        machine_slow = np.nanmean(flags[others], axis=0)
        for name, row in rd.evaluate([s], variants(machine_slow), rd.WARMUP,
                                     slowdowns=(0.1,)).items():
            rows.setdefault(name, []).extend(row)
    quiet = len(next(iter(rows.values())))
    print(f"{args.data.name}: the {quiet} quiet world-size-1 series (run-to-run noise < "
          f"{rd.QUIET:.0%}), a +10% step at every run from {rd.WARMUP}, found within "
          f"{rd.PROMPT} nights\n")
    print("| variant | recall +10% | not on a false alarm's night | alarms per step | "
          "false alarms |\n|---|---|---|---|---|")
    variants_seen = {}
    for name, got in rows.items():
        sm = rd.summarize(got, (0.1,))
        print(f"| {name} | {sm['recall']['0.1']:.1%} | {sm['recall_beyond_false']['0.1']:.1%} "
              f"| {sm['alarms_per_step']['0.1']:.2f} | {sm['false_alarms']}/{sm['nights']} |")
        variants_seen[name] = {
            "recall_pct": round(100 * sm["recall"]["0.1"], 1),
            "recall_pct_not_on_false_alarm_night": round(100 * sm["recall_beyond_false"]["0.1"],
                                                         1),
            "false_alarms": sm["false_alarms"], "nights": sm["nights"],
            "alarms_per_step": round(sm["alarms_per_step"]["0.1"], 3)}
    others = [v for k, v in variants_seen.items() if not k.startswith("ours")]
    record(f"cross_series_on_recorded_noise{rd.recording_tag(args.data)}",
           figure="The other series of a run as a machine-slowness signal, three uses, nightly "
                  f"replay of {rd.recording_name(args.data)}: recall at +10% of each",
           value=" / ".join(f"{v['recall_pct']:.1f}%" for v in others),
           unit="history without machine-slow runs / deferred reports / first-sight reports",
           command=command(__file__, *sys.argv[1:]), machine=machine(),
           details={"variants": variants_seen})
    return 0


if __name__ == "__main__":
    sys.exit(main())
