"""``harness detect`` against Perfherder's rule on labelled histories, split for tuning and
held out.

Each series is scored as TCPD scores it (benchmarks/tcpd_changepoints.py, imported, not
copied): F1 with a margin of 5 and covering, index 0 added to both sides. Every series falls
in the tuning split or the held-out split by a hash of its name (``held_out``), so the split
is fixed, the same on every machine and for every detector; tune on ``tuning``, report
``held-out``.

Sources (each is skipped, with the reason, when its data is not here):

* ``perfherder``: performance histories with sheriff verdicts, ``--data FILE`` (repeatable):
  a JSON ``{"series": {NAME: {"values": [...], "alerts": [{"index": I, "status": S}]}}}``
  (one value per revision, oldest first; ``index`` the revision of the first value at the new
  level), or a folder of the per-signature CSVs of Mozilla's performance dataset (Besbes et
  al., ICPE 2025: github.com/mozilla/REALISE-Performance, ``data/all-datasets-annotated-
  aggregated``; doi 10.5281/zenodo.14642238). Verdicts map to truth as ``VERDICTS`` says: a
  change sheriffs accepted (acknowledged, reassigned, downstream, or an alert they made by
  hand where Perfherder made none) is a change point; one they marked invalid is not, so a
  detector that reports there scores a false positive (and the table counts such reports);
  one still untriaged or under investigation is left out (a report within the margin of it,
  and of no accepted change, is neither right nor wrong). Where Perfherder made no alert and
  no sheriff added one, the series did not change.
* ``tcpd``: the 25 TCPD series with their five annotators (``../shared/data/tcpd`` or
  ``TCPD_DIR``), as tcpd_changepoints.py scores them.
* ``otava``: the test suite of the ``otava-test-data`` package (``pip install --no-deps
  otava-test-data``): ``CombinationGenerator(lengths=[50, 500], seed=S)
  .generate_all_test_cases()`` for the seeds in OTAVA_SEEDS, 110 series each. Its ground truth,
  read as a sheriff would: a step and the start and end of a temporary regression are change
  points; a single outlier and a change of the noise alone are alerts a sheriff marks invalid
  (a one-run blip, a noisier machine: the level did not move; the synthetic histories' noise
  change is no change point either); a phase shift of a periodic signal is left out.

Detectors: ``harness`` (``harness.history.changepoints.find`` called as ``harness detect
--json`` calls it on a CSV at its defaults: one sample per run, the trend model, linear, runs
read by their median, changes of at least ``regress.MIN_CHANGE_PCT``), ``perfherder``
(Mozilla's rule: tcpd_changepoints.perfherder) and ``none`` (no change point).

    python benchmarks/detect_on_real_histories.py                  # the table, writes results
    python benchmarks/detect_on_real_histories.py --per-series tcpd  # harness vs perfherder
    python benchmarks/detect_on_real_histories.py --data histories.json --no-write
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import tcpd_changepoints as tcpd  # noqa: E402  (the scores and Perfherder's rule)
from _figures import command, machine, record  # noqa: E402

RESULTS = HERE / "results" / "detect_on_real_histories.json"
MARGIN = tcpd.MARGIN
OTAVA_SEEDS = (42, 7, 2026)
SPLITS = ("tuning", "held-out")

#: a sheriff's verdict on an alert, as truth: "change", "invalid" (no change: a report there is
#: a false positive) or "unsure" (left out). Treeherder's alert statuses, lower case, and the
#: summary verdicts of Mozilla's dataset (TP and FN: an accepted alert, one Perfherder missed
#: that a sheriff made by hand; FP: invalid; SP: not settled)
VERDICTS = {
    "acknowledged": "change", "reassigned": "change", "downstream": "change",
    "improvement": "change", "fixed": "change", "wontfix": "change", "backedout": "change",
    "manual": "change", "tp": "change", "fn": "change",
    "invalid": "invalid", "fp": "invalid",
    "untriaged": "unsure", "investigating": "unsure", "sp": "unsure",
}


@dataclass
class Series:
    """A labelled history: its values, the change points each annotator marked (one,
    "sheriffs", for a Perfherder history), and the points marked as no change (``invalid``)
    or not settled (``unsure``)."""

    values: np.ndarray
    annotations: dict[str, list[int]]
    invalid: list[int] = field(default_factory=list)
    unsure: list[int] = field(default_factory=list)


def held_out(name: str) -> bool:
    """Whether series ``name`` is held out: the parity of the first 32 bits of its SHA-256."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 2 == 1


def from_alerts(values: Sequence[float], alerts: Iterable[Mapping]) -> Series:
    """A Perfherder history (``values``, one per revision) with its alerts' verdicts
    (``VERDICTS``); an alert on a point that also carries an accepted one is that change."""
    kinds: dict[str, set[int]] = {"change": set(), "invalid": set(), "unsure": set()}
    for alert in alerts:
        status = str(alert["status"]).strip().lower()
        if status not in VERDICTS:
            raise ValueError(f"unknown alert status {alert['status']!r}: one of "
                             f"{', '.join(sorted(VERDICTS))}")
        kinds[VERDICTS[status]].add(int(alert["index"]))
    change = kinds["change"]
    return Series(np.asarray(values, dtype=np.float64), {"sheriffs": sorted(change)},
                  sorted(kinds["invalid"] - change),
                  sorted(kinds["unsure"] - change - kinds["invalid"]))


def kept(series: Series, predicted: Iterable[int], margin: int = MARGIN) -> list[int]:
    """The predictions scored: those within ``margin`` of an unsettled alert and of no
    annotated change are left out."""
    truth = set().union(*series.annotations.values()) if series.annotations else set()
    return sorted(p for p in set(predicted)
                  if not (any(abs(p - u) <= margin for u in series.unsure)
                          and not any(abs(p - t) <= margin for t in truth)))


def invalid_hits(series: Series, predicted: Iterable[int], margin: int = MARGIN) -> int:
    """How many of the alerts sheriffs marked invalid have a prediction within ``margin``."""
    guess = list(predicted)
    return sum(any(abs(p - x) <= margin for p in guess) for x in series.invalid)


def score_series(series: Series, predicted: Iterable[int]) -> dict:
    """TCPD's F1 and covering of one series, with the unsettled points left out."""
    found = kept(series, predicted)
    return {"f1": tcpd.f1(series.annotations, found),
            "cover": tcpd.covering(series.annotations, found, series.values.size),
            "points": len(found), "invalid_hits": invalid_hits(series, found)}


def summarise(rows: Mapping[str, dict]) -> dict:
    """Mean F1 and covering over series, with the points and invalid hits summed."""
    if not rows:
        return {"series": 0}
    return {"series": len(rows),
            "f1": float(np.mean([r["f1"] for r in rows.values()])),
            "cover": float(np.mean([r["cover"] for r in rows.values()])),
            "points": sum(r["points"] for r in rows.values()),
            "invalid_hits": sum(r["invalid_hits"] for r in rows.values())}


# ------------------------------------------------------------------------------- detectors

def harness_detect(values: np.ndarray) -> list[int]:
    """``harness detect --json`` on a CSV with one row per run, at its defaults
    (cli_changes.detect: --model trend, --linear, quantile 0.5, --min-change
    regress.MIN_CHANGE_PCT)."""
    from harness.history import changepoints, regress

    return [cp.index for cp in changepoints.find([[float(v)] for v in values],
                                                  min_change_pct=regress.MIN_CHANGE_PCT,
                                                  log=False, model="trend", quantile=0.5)]


Detector = Callable[[np.ndarray], list[int]]
DETECTORS: dict[str, Detector] = {"harness": harness_detect, "perfherder": tcpd.perfherder,
                                  "none": tcpd.no_change}


# ------------------------------------------------------------------------------- the data

def load_json(path: Path) -> dict[str, Series]:
    doc = json.loads(path.read_text())
    return {name: from_alerts(entry["values"], entry.get("alerts", []))
            for name, entry in sorted(doc["series"].items())}


def load_mozilla_csvs(folder: Path) -> dict[str, Series]:
    """The per-signature CSVs of Mozilla's performance dataset (one row per revision, its
    ``value``; an alert's verdict in ``single_alert_status``, or ``alert_summary_status_
    general`` where that is empty; ``single_alert_manually_created`` True: a sheriff's own
    alert, a change)."""
    out = {}
    for path in sorted(folder.rglob("*_timeseries_data.csv")):
        values, alerts = [], []
        with path.open(newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                values.append(float(row["value"]))
                status = (row.get("single_alert_status") or "").strip()
                general = (row.get("alert_summary_status_general") or "").strip()
                if (row.get("single_alert_manually_created") or "").strip() == "True":
                    alerts.append({"index": i, "status": "manual"})
                elif status:
                    alerts.append({"index": i, "status": status})
                elif general and general.upper() != "TN":
                    alerts.append({"index": i, "status": general})
        out[f"{path.parent.name}/{path.name.split('_')[0]}"] = from_alerts(values, alerts)
    return out


def load_tcpd() -> dict[str, Series]:
    return {name: Series(values, {k: list(v) for k, v in marked.items()})
            for name, (values, marked) in tcpd.load(tcpd.data_dir()).items()}


#: otava-test-data's change types as a sheriff's verdicts (``VERDICTS``)
OTAVA_VERDICTS = {"step": "manual", "regression_start": "manual", "regression_end": "manual",
                  "outlier": "invalid", "variance": "invalid", "phase": "investigating"}


def load_otava(seeds: Sequence[int] = OTAVA_SEEDS) -> dict[str, Series]:
    from otava_test_data.generators.combiner import CombinationGenerator

    out: dict[str, Series] = {}
    for seed in seeds:
        for ts in CombinationGenerator(lengths=[50, 500], seed=seed).generate_all_test_cases():
            sigma = ts.parameters.get("noise_sigma", 0.0)
            base = f"otava/{seed}/{ts.generator_name}/L{len(ts.data)}/sigma{sigma:g}"
            name, k = base, 1
            while name in out:
                k += 1
                name = f"{base}/{k}"
            alerts = [{"index": cp.index, "status": OTAVA_VERDICTS[cp.change_type]}
                      for cp in ts.change_points]
            out[name] = from_alerts(ts.data, alerts)
    return out


def sources(data: Sequence[Path]) -> dict[str, dict[str, Series] | str]:
    out: dict[str, dict[str, Series] | str] = {}
    real: dict[str, Series] = {}
    for path in data:
        real.update(load_mozilla_csvs(path) if path.is_dir() else load_json(path))
    out["perfherder"] = real if real else (
        "skipped (no sheriff-labelled histories: pass --data FILE.json or a folder of "
        "Mozilla's per-signature CSVs)")
    try:
        out["tcpd"] = load_tcpd()
    except SystemExit as exc:
        out["tcpd"] = f"skipped ({exc})"
    try:
        out["otava"] = load_otava()
    except ImportError:
        out["otava"] = "skipped (pip install --no-deps otava-test-data)"
    return out


# ------------------------------------------------------------------------------- the run

def run(series: Mapping[str, Series], detectors: Mapping[str, Detector]) -> dict:
    """Per split and detector: the summary, with each series' scores."""
    out: dict = {split: {} for split in SPLITS}
    for name, detect in detectors.items():
        rows = {s: score_series(series[s], detect(series[s].values)) for s in series}
        for split in SPLITS:
            part = {s: r for s, r in rows.items() if held_out(s) == (split == "held-out")}
            out[split][name] = {**summarise(part), "per_series": part}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, action="append", default=[],
                        help="sheriff-labelled histories: a JSON file or a folder of CSVs")
    parser.add_argument("--only", help="comma-separated detectors (default: all)")
    parser.add_argument("--per-series", metavar="SOURCE",
                        help="per series of SOURCE, both splits: harness against perfherder")
    parser.add_argument("--no-write", action="store_true",
                        help=f"do not record the figure ({RESULTS.relative_to(HERE.parent)})")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(DETECTORS)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        parser.error(f"unknown detector(s) {', '.join(unknown)}; known: {', '.join(DETECTORS)}")
    detectors = {n: DETECTORS[n] for n in names}
    results: dict = {}
    print("| source | split | series | detector | F1 (margin 5) | cover | change points | "
          "on invalid alerts | seconds |\n|---|---|---|---|---|---|---|---|---|")
    for source, series in sources(args.data).items():
        if isinstance(series, str):
            results[source] = series
            print(f"| {source} | | | | {series} | | | | |")
            continue
        start = time.perf_counter()
        results[source] = run(series, detectors)
        seconds = time.perf_counter() - start
        for split in SPLITS:
            for name in names:
                r = results[source][split][name]
                print(f"| {source} | {split} | {r['series']} | {name} | {r['f1']:.3f} | "
                      f"{r['cover']:.3f} | {r['points']} | {r['invalid_hits']} | "
                      f"{seconds:.1f} |")
    if args.per_series and isinstance(results.get(args.per_series), dict) \
            and {"harness", "perfherder"} <= set(names):
        print("\n| series | split | harness F1 | cover | points | perfherder F1 | cover | "
              "points |\n|---|---|---|---|---|---|---|---|")
        for split in SPLITS:
            ours = results[args.per_series][split]["harness"]["per_series"]
            theirs = results[args.per_series][split]["perfherder"]["per_series"]
            for s in sorted(ours, key=lambda s: ours[s]["f1"] - theirs[s]["f1"]):
                a, b = ours[s], theirs[s]
                print(f"| {s} | {split} | {a['f1']:.3f} | {a['cover']:.3f} | {a['points']} | "
                      f"{b['f1']:.3f} | {b['cover']:.3f} | {b['points']} |")
    held_out = results.get("tcpd", {}).get("held-out", {}).get("harness") \
        if isinstance(results.get("tcpd"), dict) else None
    if args.no_write:
        pass
    elif held_out is None:
        print("(no TCPD held-out score for harness: no figure recorded)", file=sys.stderr)
    else:
        record("detect_on_real_histories",
               figure="Change points on labelled histories split by name into a tuning and a "
                      "held-out half (TCPD; otava-test-data's 330 series): harness detect on "
                      "TCPD's held-out half",
               value=f"{held_out['f1']:.3f} / {held_out['cover']:.3f}",
               unit="F1 (margin 5) / cover", command=command(__file__, *sys.argv[1:]),
               machine=machine(), details=json.loads(json.dumps(results, sort_keys=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
