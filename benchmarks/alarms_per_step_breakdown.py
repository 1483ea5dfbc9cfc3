"""What the alarms per injected step of benchmarks/regression_detection.py are made of, and
what the two rules that would bring them under the goal cost (issue 22).

The protocol is regression_detection.py's, at +10% on its quiet world-size-1 series: a step
that persists is injected at every night t, and every alarm of the harness's nightly analysis
from night t to t + AFTER counts. Each such alarm is put in one class:

* ``false alarm's night``: the night alarms on the unmodified runs too;
* ``first report``: the step's first alarm on another night;
* ``re-report after a withdrawal``: a new change point at the run of an earlier report that
  the analysis had withdrawn (slow runs at the step were reported as a larger step, then the
  level settled lower). From the runs alone this is the same history as slow runs reported
  and withdrawn *before* a step came: matching the two would leave that step unreported;
* ``another change point``: a new change point elsewhere (a slow stretch on the new level);
* ``grown``: a change point found under the threshold that grew past it.

The steps are also split by what their nights t..t+PROMPT show: two or more runs the machine
left alone (the new level seen as it is, twice), or fewer, where every night but one shows the
new level times a slowdown of unknown size. A step of the second kind is found within its
nights only by reporting slow runs, and a history of slow runs reported cannot be told from it
until later runs come: where both goals are lost is this split.

Then the same protocol under two rules that trade recall for fewer alarms: a change point
found again at the run of a withdrawn report is that report (``changes._reported_an_excursion``
never true), and a new level resting on the newest three runs waits for a fourth
(``changepoints.HOLD_RUNS = 3``, where it is 2).

    python benchmarks/alarms_per_step_breakdown.py                      # the quiet recording
    python benchmarks/alarms_per_step_breakdown.py --data benchmarks/data/regression_noise.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regression_detection as rd  # noqa: E402
from _figures import command, machine, record  # noqa: E402

from harness.history import changepoints, changes  # noqa: E402

SLOWDOWN = 0.10
#: a step's window by what its nights show (``rd.unslowed_in_windows``): two or more runs the
#: machine left alone (the new level seen as it is, twice), or fewer
WINDOWS = ("two unslowed runs or more", "fewer")
CLASSES = ("false alarm's night", "first report", "re-report after a withdrawal",
           "another change point", "grown")


def _kind(before: list[dict], after: list[dict], night: int) -> str:
    """Why night ``night`` alarmed, from the stored change points before and after it."""
    fresh = [p for p in after[len(before):] if p["reported_at"] == night]
    if not fresh:
        return "grown"
    earlier = {p["run_id"] for p in before if p["reported_at"] is not None}
    return ("re-report after a withdrawal" if any(p["run_id"] in earlier for p in fresh)
            else "another change point")


def breakdown(series: list[dict]) -> tuple[Counter, int, Counter]:
    """Every alarm in every +10% step window, by class; the number of steps; and per kind of
    window (``WINDOWS``) its steps, those found and their alarms (all, and on a false alarm's
    night)."""
    night = rd.ours(0.05)
    counts: Counter = Counter()
    windows: Counter = Counter()
    steps = 0
    for s in series:
        runs, n = s["runs"], len(s["runs"])
        clean, states = rd.replay(night, runs, 1, n, keep_states=True)
        alarms_anyway = {t for t in clean if t >= rd.WARMUP}
        unslowed = rd.unslowed_in_windows(runs, rd.WARMUP)
        for k, t in enumerate(range(rd.WARMUP, n - rd.PROMPT)):
            steps += 1
            window = WINDOWS[0] if unslowed[k] >= 2 else WINDOWS[1]
            stepped = runs[:t] + [rd.slowed(r, 1 + SLOWDOWN, 1.0, i)
                                  for i, r in enumerate(runs[t:], start=t)]
            state, own, found = states[t - 2], 0, False
            for u in range(t, min(n, t + rd.AFTER + 1)):
                before = (state or {}).get("stored", [])
                alarm, state = night(stepped, u, state)
                if not alarm:
                    continue
                found |= u <= t + rd.PROMPT
                windows[window, "alarms"] += 1
                if u in alarms_anyway:
                    counts["false alarm's night"] += 1
                    windows[window, "anyway"] += 1
                    continue
                own += 1
                counts["first report" if own == 1 else _kind(before, state["stored"], u)] += 1
            windows[window, "steps"] += 1
            windows[window, "found"] += found
    return counts, steps, windows


@contextmanager
def rule(name: str) -> Iterator[None]:
    """One of the two rules under test, in place for the duration."""
    if name == "match re-found changes with their withdrawn report":
        saved: Callable = changes._reported_an_excursion
        changes._reported_an_excursion = lambda *a, **k: False
        try:
            yield
        finally:
            changes._reported_an_excursion = saved
    elif name == "HOLD_RUNS 3":
        held = changepoints.HOLD_RUNS
        changepoints.HOLD_RUNS = 3
        try:
            yield
        finally:
            changepoints.HOLD_RUNS = held
    else:
        yield


def scores(series: list[dict]) -> dict:
    rows = rd.evaluate(series, {"ours": rd.ours(0.05)}, rd.WARMUP,
                       slowdowns=(0.0, SLOWDOWN))["ours"]
    sm = rd.summarize(rows, (0.0, SLOWDOWN))
    key = f"{SLOWDOWN:g}"
    return {"recall": sm["recall"][key], "false_alarms": sm["false_alarms"],
            "nights": sm["nights"], "alarms_per_step": sm["alarms_per_step"][key]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=rd.DATA)
    args = parser.parse_args()
    _, series = rd.load(args.data)
    chosen = [s for s in series if rd.is_quiet(s)]
    counts, steps, windows = breakdown(chosen)
    total = sum(counts.values())
    print(f"{args.data.name}: {len(chosen)} quiet world-size-1 series, {steps} steps of "
          f"+{SLOWDOWN:.0%}, {total} alarms from night t to t+{rd.AFTER}: "
          f"{total / steps:.3f} per step\n")
    print("| alarm | count | per step |\n|---|---|---|")
    for c in CLASSES:
        print(f"| {c} | {counts[c]} | {counts[c] / steps:.3f} |")
    print(f"\n| runs the machine left alone in the step's nights t..t+{rd.PROMPT} | steps | "
          "recall | alarms per step | of them on a false alarm's night |\n|---|---|---|---|---|")
    for w in WINDOWS:
        n = windows[w, "steps"]
        if n:
            print(f"| {w} | {n} | {windows[w, 'found'] / n:.1%} | "
                  f"{windows[w, 'alarms'] / n:.2f} | {windows[w, 'anyway'] / n:.2f} |")
    print("\n| rule | recall +10% | false alarms | alarms per step |\n|---|---|---|---|")
    rules = {}
    for name in ("as kept", "match re-found changes with their withdrawn report",
                 "HOLD_RUNS 3"):
        with rule(name):
            sc = scores(chosen)
        print(f"| {name} | {sc['recall']:.1%} | {sc['false_alarms']} of {sc['nights']} | "
              f"{sc['alarms_per_step']:.2f} |")
        rules[name] = {"recall_pct": round(100 * sc["recall"], 1),
                       "false_alarms": sc["false_alarms"],
                       "alarms_per_step": round(sc["alarms_per_step"], 3)}
    record(f"alarms_per_step_breakdown{rd.recording_tag(args.data)}",
           figure="What the alarms per +10% step of regression_detection are made of, and two "
                  f"rules that would lower them, {rd.recording_name(args.data)}",
           value=f"{total / steps:.2f}", unit="alarms per +10% step",
           command=command(__file__, *sys.argv[1:]), machine=machine(),
           details={"steps": steps,
                    "per_step": {c: round(counts[c] / steps, 3) for c in CLASSES},
                    "by_window": {w: {"steps": windows[w, "steps"],
                                      "recall_pct": round(100 * windows[w, "found"]
                                                          / windows[w, "steps"], 1),
                                      "alarms_per_step": round(windows[w, "alarms"]
                                                               / windows[w, "steps"], 3)}
                                  for w in WINDOWS if windows[w, "steps"]},
                    "rules": rules})
    return 0


if __name__ == "__main__":
    sys.exit(main())
