"""Change point detectors scored on TCPD: 25 real series with human annotations (issue 22).

The data (``../shared/data/tcpd`` beside the repository, or ``TCPD_DIR``) are the univariate
series of the Turing Change Point Dataset with five annotators each; the scores are TCPDBench's
(van den Burg and Williams, 2020; ``analysis/scripts/metrics.py``), implemented here from their
definitions and checked against the examples of that file in tests/test_tcpd_scoring.py:

* F1 with a margin of 5: index 0 is added to every annotation set and to the prediction; a
  true positive is a one-to-one match within 5 indices; precision is against the union of the
  annotators' points, recall is per annotator and averaged;
* covering: the segmentation covering (Arbelaez et al. 2011) of the predicted partition of each
  annotator's, averaged over the annotators.

Every detector gets one fixed setting for all series, as TCPDBench's "default" table does:

* ``harness``: ``harness.history.changepoints.find`` with the trend model, what ``harness detect``
  runs on a CSV at its defaults (changes of at least 2%);
* ``harness-min-change-0``: the same with ``--min-change 0`` (every significant change);
* ``harness-level``: the same with the level model, what ``harness run`` and ``harness
  detect`` on a history DB run on timings (linear here: TCPD holds values below 0);
* ``none``: no change point (the floor: F1 0.647, cover 0.557 on these 25 series);
* ``perfherder``: Mozilla Perfherder's rule (treeherder's ``perfalert.detect_changes``: a t
  between the up to 12-24 points before and the 12 from each point on, linearly weighted
  means, |t| > 7 and a local maximum, then its alert floor of a 2% change of the means);
* ``otava``: Apache Otava's ``compute_change_points`` at its defaults (E-divisive means with a
  t-test in windows of 50), when installed (``pip install --no-deps apache-otava``);
* ``binseg``, ``pelt``: ruptures' binary segmentation and PELT with the l2 cost, every
  stretch at least 2 points, and the harness's penalty of 3 sigma^2 log n, sigma from the
  median absolute first difference (not centred), when installed.

Published reference (TCPDBench, their 37 univariate series, default settings): binseg F1 0.698
/ cover 0.672 (the best), pelt 0.674 / 0.652, E-divisive 0.560 / 0.470, no change point 0.645 /
0.566. Goal for ``harness``: F1 >= 0.75 and cover >= 0.70.

    python benchmarks/tcpd_changepoints.py                  # the table
    python benchmarks/tcpd_changepoints.py --per-series     # plus harness vs perfherder per series
    python benchmarks/tcpd_changepoints.py --only harness,none --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _figures import command, machine, record  # noqa: E402

MARGIN = 5

Detector = Callable[[np.ndarray], list[int]]


# ------------------------------------------------------------------------------- the scores

def matched(truth: Iterable[int], predicted: Iterable[int], margin: int = MARGIN) -> set[int]:
    """The points of ``truth`` matched one-to-one by a prediction within ``margin``: each takes
    its nearest prediction still free (TCPDBench's ``true_positives``)."""
    free = set(predicted)
    hits = set()
    for tau in truth:
        near = sorted((abs(tau - x), x) for x in free if abs(tau - x) <= margin)
        if near:
            hits.add(tau)
            free.remove(near[0][1])
    return hits


def f1(annotations: Mapping[str, Sequence[int]], predicted: Iterable[int],
       margin: int = MARGIN) -> float:
    """F1 against several annotators, with 0 added to every set (TCPDBench's ``f_measure``)."""
    per_annotator = [set(points) | {0} for points in annotations.values()]
    union = set().union(*per_annotator)
    guess = set(predicted) | {0}
    precision = len(matched(union, guess, margin)) / len(guess)
    recall = sum(len(matched(t, guess, margin)) / len(t)
                 for t in per_annotator) / len(per_annotator)
    return 2 * precision * recall / (precision + recall)


def partition(points: Iterable[int], n: int) -> list[range]:
    """The stretches [0, n) is cut into at ``points`` (0 and out-of-range points cut nothing)."""
    edges = [0, *sorted(p for p in set(points) if 0 < p < n), n]
    return [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _jaccard(a: range, b: range) -> float:
    inter = max(0, min(a.stop, b.stop) - max(a.start, b.start))
    return inter / (len(a) + len(b) - inter)


def cover(truth: list[range], predicted: list[range]) -> float:
    """How well ``predicted`` covers ``truth``: each true stretch's best Jaccard overlap with a
    predicted one, weighted by its length (TCPDBench's ``cover_single``)."""
    n = sum(len(r) for r in truth)
    return sum(len(r) * max(_jaccard(r, p) for p in predicted) for r in truth) / n


def covering(annotations: Mapping[str, Sequence[int]], predicted: Iterable[int], n: int) -> float:
    """Covering averaged over the annotators (TCPDBench's ``covering``)."""
    mine = partition(predicted, n)
    scores = [cover(partition(points, n), mine) for points in annotations.values()]
    return sum(scores) / len(scores)


# ------------------------------------------------------------------------------- detectors

def harness_find(model: str, min_change_pct: float | None = None) -> Detector:
    """``harness detect`` on a CSV with ``--model model``; ``min_change_pct`` None: at its
    default ``--min-change`` (regress.MIN_CHANGE_PCT)."""
    def detect(values: np.ndarray) -> list[int]:
        sys.path.insert(0, str(HERE.parent))
        from harness.history import changepoints, regress

        floor = regress.MIN_CHANGE_PCT if min_change_pct is None else min_change_pct
        return [cp.index for cp in changepoints.find([float(v) for v in values], model=model,
                                                      min_change_pct=floor)]

    return detect


def no_change(values: np.ndarray) -> list[int]:
    return []


def _weighted_t(before: list[float], after: list[float]) -> float:
    """Perfherder's ``calc_t`` for one value per revision: the difference of linearly weighted
    means (the nearest point weighs most) over the Welch standard error of the variances
    around them."""
    if not before or not after:
        return 0.0
    stats = []
    for window in (before, after):
        w = np.array([(len(window) - i) / len(window) for i in range(len(window))])
        x = np.asarray(window, dtype=np.float64)
        avg = float(np.sum(w * x) / np.sum(w))
        var = float(np.sum((x - avg) ** 2) / (x.size - 1)) if x.size > 1 else 0.0
        stats.append((avg, var, x.size))
    delta = stats[1][0] - stats[0][0]
    if delta == 0:
        return 0.0
    if stats[0][1] == 0 and stats[1][1] == 0:
        return math.inf
    return delta / math.sqrt(stats[0][1] / stats[0][2] + stats[1][1] / stats[1][2])


def perfherder(values: np.ndarray, min_back: int = 12, max_back: int = 24, fore: int = 12,
               t_threshold: float = 7.0, floor_pct: float = 2.0) -> list[int]:
    """Mozilla Perfherder's change detection (treeherder ``perfalert.detect_changes`` and the
    alert floor of ``perf/alerts.py``), one value per revision."""
    x = [float(v) for v in values]
    n = len(x)
    t, back_n, fore_n, means = [0.0] * n, [0] * n, [0] * n, [(0.0, 0.0)] * n
    since_change = 0
    for i in range(1, n):
        # the back window grows past 12 points while no change was seen, up to 24
        reach = min(max(since_change, min_back), max_back)
        before = [x[j] for j in range(i - 1, max(-1, i - 1 - reach), -1)][:max_back]
        after = x[i:i + fore]
        back_n[i], fore_n[i] = len(before), len(after)
        means[i] = (float(np.mean(before)), float(np.mean(after)))
        t[i] = abs(_weighted_t(before, after))
        since_change = 0 if t[i] > t_threshold else since_change + 1
    out = []
    for i in range(1, n):
        if back_n[i] < min_back or fore_n[i] < fore or t[i] <= t_threshold:
            continue
        if t[i - 1] > t[i] or (i + 1 < n and t[i + 1] > t[i]):
            continue
        prev, new = means[i]
        pct = 100.0 * abs(new - prev) / prev if prev != 0 else 0.0
        if pct >= floor_pct:
            out.append(i)
    return out


def otava(values: np.ndarray) -> list[int]:
    from otava.analysis import compute_change_points

    points, _ = compute_change_points([float(v) for v in values])
    return [int(p.index) for p in points]


def _ruptures(algo: str) -> Detector:
    def detect(values: np.ndarray) -> list[int]:
        import ruptures

        x = np.asarray(values, dtype=np.float64)
        sigma = float(np.median(np.abs(np.diff(x)))) * 1.4826 / math.sqrt(2) or float(np.std(x))
        pen = 3.0 * sigma ** 2 * math.log(x.size)
        model = (ruptures.Binseg if algo == "binseg" else ruptures.Pelt)(
            model="l2", min_size=2, jump=1).fit(x)
        return [int(b) for b in model.predict(pen=pen) if b < x.size]

    return detect


DETECTORS: dict[str, tuple[Detector, str | None]] = {
    "harness": (harness_find("trend"), None),
    "harness-min-change-0": (harness_find("trend", 0.0), None),
    "harness-level": (harness_find("level"), None),
    "none": (no_change, None),
    "perfherder": (perfherder, None),
    "otava": (otava, "otava"),
    "binseg": (_ruptures("binseg"), "ruptures"),
    "pelt": (_ruptures("pelt"), "ruptures"),
}
INSTALL = {"otava": "pip install --no-deps apache-otava", "ruptures": "pip install ruptures"}


# ------------------------------------------------------------------------------- the run

def data_dir() -> Path:
    path = Path(os.environ.get("TCPD_DIR") or HERE.parent.parent / "shared" / "data" / "tcpd")
    if not (path / "annotations.json").is_file():
        raise SystemExit(f"error: no TCPD data at {path} (annotations.json missing): set "
                         "TCPD_DIR to the folder of the series and annotations.json")
    return path


def load(path: Path) -> dict[str, tuple[np.ndarray, dict[str, list[int]]]]:
    annotations = json.loads((path / "annotations.json").read_text())
    out = {}
    for name in sorted(annotations):
        raw = json.loads((path / f"{name}.json").read_text())["series"][0]["raw"]
        out[name] = (np.asarray(raw, dtype=np.float64), annotations[name])
    return out


def _available(module: str | None) -> bool:
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def score(series: dict, detect: Detector) -> dict:
    rows, start = {}, time.perf_counter()
    for name, (values, marked) in series.items():
        found = sorted(set(detect(values)))
        rows[name] = {"points": found, "f1": f1(marked, found),
                      "cover": covering(marked, found, values.size)}
    return {"f1": float(np.mean([r["f1"] for r in rows.values()])),
            "cover": float(np.mean([r["cover"] for r in rows.values()])),
            "points": sum(len(r["points"]) for r in rows.values()),
            "seconds": time.perf_counter() - start, "series": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated detectors (default: all)")
    parser.add_argument("--per-series", action="store_true",
                        help="per series: harness against perfherder")
    parser.add_argument("--json", type=Path, help="write every score and point here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(DETECTORS)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        parser.error(f"unknown detector(s) {', '.join(unknown)}; known: {', '.join(DETECTORS)}")
    series = load(data_dir())
    results: dict[str, dict | str] = {}
    print(f"TCPD: {len(series)} series, {sum(v.size for v, _ in series.values())} points\n")
    print("| detector | F1 (margin 5) | cover | change points | seconds |\n|---|---|---|---|---|")
    for name in names:
        detect, module = DETECTORS[name]
        if not _available(module):
            results[name] = f"skipped ({INSTALL[module]})"
            print(f"| {name} | {results[name]} | | | |")
            continue
        r = score(series, detect)
        results[name] = r
        print(f"| {name} | {r['f1']:.3f} | {r['cover']:.3f} | {r['points']} | "
              f"{r['seconds']:.1f} |")
    if args.per_series and all(isinstance(results.get(n), dict)
                               for n in ("harness", "perfherder")):
        ours, theirs = results["harness"], results["perfherder"]
        print("\n| series | n | harness F1 | cover | points | perfherder F1 | cover |\n"
              "|---|---|---|---|---|---|---|")
        for name, (values, _) in series.items():
            a, b = ours["series"][name], theirs["series"][name]
            print(f"| {name} | {values.size} | {a['f1']:.3f} | {a['cover']:.3f} | "
                  f"{a['points']} | {b['f1']:.3f} | {b['cover']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.only:
        print("(a selection of detectors: no figure recorded)", file=sys.stderr)
        return 0
    ours = results["harness"]
    assert isinstance(ours, dict)
    record("tcpd_changepoints",
           figure=f"Change points on TCPD's {len(series)} annotated series, one fixed setting: "
                  "harness detect on a CSV",
           value=f"{ours['f1']:.3f} / {ours['cover']:.3f}", unit="F1 (margin 5) / cover",
           command=command(__file__, *sys.argv[1:]), machine=machine(), headline=True,
           details={"detectors": {n: r if isinstance(r, str) else
                                  {"f1": round(r["f1"], 3), "cover": round(r["cover"], 3),
                                   "points": r["points"]} for n, r in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
