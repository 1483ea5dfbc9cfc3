"""Change points of one series of runs: where its level moved, found once, with their evidence.

A series is a list of runs in order, each a value or the raw samples of one run (a run's value
is the median of its samples: robust to the odd slow sample). ``find`` segments the run values
into stretches of one level (or one line: ``MODELS``) and reports each boundary as a
:class:`ChangePoint`: the first run of the new stretch, the medians before and after, the
change in percent, and a p-value.

The methods and their one fixed setting were chosen by measurement: the level model, for
timings, on recorded harness noise (benchmarks/regression_detection.py), the trend model, for
any other series, on 25 human-annotated series (benchmarks/tcpd_changepoints.py) and on
synthetic performance histories (benchmarks/detect_on_synthetic_histories.py), each the
wrong one for the other's data (benchmarks/models_on_recorded_noise.py). Every segment holds
at least MIN_SIZE runs, so a single odd run is never a change point by itself: the newest run
alone can only be "suspicious" (``harness.history.outlier``), until the next run confirms the
new level or returns to the old one.

Pure functions of numbers: the history DB side (matching change points across analyses,
triage) lives in ``harness.history.changes``. The runs are read by ``harness.history.noise``,
their excursions set aside by ``harness.history.excursions`` and segmented by
``harness.history.segmentation``; here, the checks that make a boundary a change point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.history.excursions import (
    EXCURSION_RUNS,
    excursion_band,
    excursions,
    level_sigma,
    spikes,
)
from harness.history.noise import Reading, noise_sigma, readings
from harness.history.segmentation import (
    MIN_SIZE,
    TREND_MIN_SIZE,
    noise_profile,
    p_value,
    piecewise_residuals,
    refit,
    segment,
    trend_p,
    trend_sigma,
)

#: a run of a new level counts as at it (``_judge``) when nearer its median than the old
#: one's, or this many sigmas past the old level the step's way: a busy machine slows some
#: runs of the new level further, which pulls its median up and leaves a run of the new level
#: as it is nearer the old median.
#: chosen by benchmarks/regression_detection.py (benchmarks/RESULTS.md)
NEW_LEVEL_SIGMAS = 5.0
#: a change point needs this p-value or less (see ``p_value``)
ALPHA = 0.01
#: the runs on each side of a change point that its medians and p-value rest on (the nearest
#: ones inside its two segments: a level long ago says little about the step itself)
WINDOW = 30


@dataclass(frozen=True)
class ChangePoint:
    """One change of level in a series."""

    index: int  # 0-based position of the first run of the new level
    before: float  # median of the runs before it (up to WINDOW, within the segment)
    after: float  # median of the runs from it on (up to WINDOW, within the segment)
    change_pct: float  # 100 * (after - before) / |before|; nan when before is 0
    p_value: float
    n_before: int  # runs the figures rest on, each side
    n_after: int
    #: the first run of the new level that is not an excursion (``excursions``): slow runs
    #: where a step happened are counted to its level but are not what it rests on
    settled: int | None = None
    #: found by ``find``'s second reading, the medians: the step slowed part of the samples
    partial: bool = False
    #: the first run the change may have begun at, where the runs cannot say which (runs
    #: between the two levels, slow runs set aside, or runs without a value, before
    #: ``index``); None: at ``index``
    earliest: int | None = None
    #: the last run it may have begun at, where the runs from ``index`` on are slow (a night
    #: slowed by chance just before a step up is the new level's first run, but the step may
    #: as well have come with the next: ``_open_edges``); None: at ``index``.
    #: [earliest, latest] is the range to bisect
    latest: int | None = None

    @property
    def first_possible(self) -> int:
        """The first run the change may have begun at (``index`` where the runs say)."""
        return self.index if self.earliest is None else self.earliest

    @property
    def last_possible(self) -> int:
        """The last run the change may have begun at (``index`` where the runs say)."""
        return self.index if self.latest is None else self.latest

    @property
    def direction(self) -> str:
        """"up" or "down" (for a timing, up is slower)."""
        return "up" if self.after > self.before else "down"

    def to_dict(self) -> dict[str, object]:
        d = {"index": self.index, "earliest_index": self.first_possible,
             "latest_index": self.last_possible,
             "before": self.before, "after": self.after,
             "change_pct": self.change_pct, "p_value": self.p_value,
             "direction": self.direction, "n_before": self.n_before, "n_after": self.n_after}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}


def mwu_p(current: np.ndarray, baseline: np.ndarray, slower: bool) -> float:
    """One-sided MWU p-value that ``current`` is stochastically greater (slower) or less."""
    if current.size < 2 or baseline.size < 2:
        return 1.0
    if np.all(current == current[0]) and np.all(baseline == current[0]):
        return 1.0  # nothing differs: scipy's answer would be nan or 1
    # imported here: scipy.stats costs 0.6 s, and a run with no history never tests
    from scipy.stats import mannwhitneyu

    try:
        res = mannwhitneyu(current, baseline, alternative="greater" if slower else "less")
    except ValueError:
        return 1.0
    p = float(res.pvalue)
    return p if math.isfinite(p) else 1.0


#: a new level resting on the newest HOLD_RUNS runs alone waits for one more run when each of
#: them is as high above the level before it as this series' own slow excursions are (from
#: the _BAND_QUANTILE of their heights to _BAND_REACH times the highest, in the units
#: analysed: logs for timings; _BAND_MIN of them found): on a machine that slows runs, two
#: slow runs in a row are as common as one (benchmarks/data). A series without such
#: excursions (a steady GPU runner) is never held; one that has them learns of a step in that
#: band a night later.
#: chosen by benchmarks/regression_detection.py (benchmarks/RESULTS.md)
HOLD_RUNS = MIN_SIZE

#: the two models of a series between its change points. "level": a constant plus noise, the
#: noise the run-to-run spread (``noise_sigma``): timings, whose changes are steps and whose
#: noise is read from neighbouring runs. "trend": a straight line plus noise, the noise what a
#: single line fitted to the whole series leaves (``trend_sigma``): any series, where a slow
#: drift or a random walk is not a change, and a change is a jump or a turn
MODELS = ("level", "trend")

#: a change the runs' medians show and their ``quantile`` does not, found once its new level
#: held this many runs: ``find``'s second reading, for steps that slow part of the samples
PARTIAL_HOLD = 3
#: a change of the medians this many runs or fewer from one of the ``quantile``'s, the same
#: way, is that one
PARTIAL_NEAR = 3
#: and the ``quantile`` moved at most this share of what the medians did (``_moved_apart``)
PARTIAL_SHARE = 0.5


def find(runs: Sequence[Sequence[float] | float], *, min_change_pct: float = 0.0,
         alpha: float = ALPHA, log: bool = False, model: str = "level",
         quantile: float = 0.5) -> list[ChangePoint]:
    """The change points of a series of runs (oldest first), both directions (``_find``).

    Read by a low ``quantile`` of their samples, runs say little of a step that slows only
    part of them (a slow path taken by 60% of the launches leaves the 10th percentile where it
    was); such a step moves their medians. So the level model reads the runs a second time,
    by their medians, and adds each change found there but not near one the ``quantile``
    found (PARTIAL_NEAR runs, the same way), once its new level held PARTIAL_HOLD runs whose
    medians moved and whose low quantiles did not (``_moved_apart``): a busy machine slows a
    night or two, seldom three in a row, and slows the fastest samples of a night as well.
    Such a change point says so (``ChangePoint.partial``). A slow path taken by fewer than
    half the launches moves neither reading."""
    if quantile == 0.5 or model != "level":
        reading = readings(runs, log, (quantile,))[0]
        points = _find(reading, min_change_pct=min_change_pct, alpha=alpha, model=model)
        if model == "trend" and points:
            points = _agreed(points, _find(reading, min_change_pct=min_change_pct, alpha=alpha,
                                           model="level"), reading.values, reading.floor)
        return points
    low, median = readings(runs, log, (quantile, 0.5))
    points = _find(low, min_change_pct=min_change_pct, alpha=alpha)
    if low.floor == median.floor and np.array_equal(low.read, median.read, equal_nan=True):
        return points  # every run read by its median (too few samples): one reading, not two
    extra = [dataclasses.replace(cp, partial=True)
             for cp in _find(median, min_change_pct=min_change_pct, alpha=alpha)
             if cp.n_after >= PARTIAL_HOLD
             and not any(p.direction == cp.direction and abs(p.index - cp.index) <= PARTIAL_NEAR
                         for p in points)
             and _moved_apart(low.read, median.read, cp)]
    return sorted(points + extra, key=lambda cp: cp.index)


#: a change point of the trend model is reported where the level model, on the same runs, finds
#: one within this many runs (``_agreed``): TCPD's margin
AGREE_NEAR = 5
#: ... or where it is a turn, which the level model cannot see: the lines either side of it
#: meet within this many sigmas of the run-to-run noise
TURN_SIGMAS = 1.0


def _agreed(points: list[ChangePoint], level: list[ChangePoint],
            values: np.ndarray, floor: float = 0.0) -> list[ChangePoint]:
    """The trend model's change points that the level model confirms (one of its own within
    AGREE_NEAR runs, either direction), and its turns (``_jump`` under TURN_SIGMAS sigmas).
    Two models that read noise differently (a line and its residuals; levels with excursions
    set aside) seldom cut the same noise at the same place; a step both see is kept where the
    trend model put it. Chosen on the tuning half of labelled series split by name
    (benchmarks/detect_on_real_histories.py) over a minimum of runs after a change at a
    series' end and over votes with Perfherder's rule, and kept for what it does on the
    held-out half. The turns cost a little there, but without them a series that rises and
    then falls would have no change point."""
    at = [cp.index for cp in level]
    finite = np.flatnonzero(np.isfinite(values))
    sigma = noise_sigma(values[finite], floor, spikes=False)
    edges = [0, *(cp.index for cp in points), values.size]
    return [cp for j, cp in enumerate(points)
            if any(abs(cp.index - i) <= AGREE_NEAR for i in at)
            or _jump(values, finite, edges[j], cp.index, edges[j + 2]) < TURN_SIGMAS * sigma]


def _jump(values: np.ndarray, finite: np.ndarray, lo: int, at: int, hi: int) -> float:
    """How far apart, at ``at``, the lines fitted to the runs of [lo, at) and [at, hi) are
    (the nearest WINDOW runs of each; inf where either has fewer than two)."""
    before = finite[(finite >= lo) & (finite < at)][-WINDOW:]
    after = finite[(finite >= at) & (finite < hi)][:WINDOW]
    if before.size < 2 or after.size < 2:
        return math.inf
    left = np.polyfit(before.astype(np.float64), values[before], 1)
    right = np.polyfit(after.astype(np.float64), values[after], 1)
    return abs(float(np.polyval(right, at - 0.5) - np.polyval(left, at - 0.5)))


def _moved_apart(low: np.ndarray, mid: np.ndarray, cp: ChangePoint) -> bool:
    """Whether ``cp``, a change of the runs' medians (``mid``, one per run), is one of part of
    their samples: each of the first PARTIAL_HOLD runs of its new level has its median nearer
    the new level than the old (a busy machine slows a night here and there, not each), and
    their low quantile (``low``), by its median over them, moved by at most PARTIAL_SHARE of
    the step from the low quantiles before it (a busy machine moves both in the runs it slows)
    over the runs ``cp`` rests on, as near as the positions say (its counts leave out
    excursions)."""
    finite = np.isfinite(low) & np.isfinite(mid)
    before = np.flatnonzero(finite[:cp.index])[-cp.n_before:]
    held = cp.index + np.flatnonzero(finite[cp.index:])[:PARTIAL_HOLD]
    if not before.size or held.size < PARTIAL_HOLD or not cp.before:
        return False
    base = float(np.median(low[before]))
    nearer = np.abs(mid[held] - cp.after) < np.abs(mid[held] - cp.before)
    moved = abs(float(np.median(low[held])) - base) / abs(base) if base else math.inf
    step = abs(cp.after - cp.before) / abs(cp.before)
    return bool(nearer.all() and moved <= PARTIAL_SHARE * step)


def _find(reading: Reading, *, min_change_pct: float = 0.0, alpha: float = ALPHA,
          model: str = "level") -> list[ChangePoint]:
    """The change points of one reading of a series' runs (oldest first), both directions.

    ``segment`` proposes boundaries; each must then hold up against its two neighbouring
    segments (the nearest WINDOW runs of each): a p-value of at most ``alpha``, medians that
    moved by at least ``min_change_pct`` percent (practical significance; 0 keeps any), and at
    least MIN_SIZE runs on each side nearer their own side's median than the other's (so one odd
    run beside a boundary cannot carry it). Under the level model, a boundary whose new level
    is the newest HOLD_RUNS runs alone, each as high as the series' own slow excursions
    (``excursion_band``), fails too, until a further run comes. The weakest boundary that
    fails is dropped, its two segments merge, and the rest are judged again, until all hold.

    ``reading`` (``readings``): the runs are analysed by its ``values`` (for timings the logs
    of a low quantile of their samples: ``regress.TIMING_QUANTILE``), their medians in their
    own units (``shown``) are what is reported. ``model``: one of MODELS; under "trend" wild
    runs and bursts of up to EXCURSION_RUNS runs are set aside (``spikes``), the noise is
    read again from the fit where that leaves white noise (``refit``), and per run where it
    changes along the series (``noise_profile``), a boundary's p-value is that of the fit it
    adds (``trend_p``), the nearer-median check does not apply (a turn of a line need not
    move the median), and the boundaries left around a short burst that comes back are
    dropped (``short_excursions``)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}")
    shown, _, raw, floor = reading
    keep = np.flatnonzero(np.isfinite(raw))  # runs without a value drop out, positions kept
    values, shown = raw[keep], shown[keep]
    use = np.ones(values.size, dtype=bool)  # the runs a change point's figures rest on
    band = (math.inf, -math.inf)
    if model == "trend":
        # spikes against the median neighbour difference, not the lower quartile the level
        # model takes (made for a machine that slows a third of the runs): on a seasonal
        # series the lower quartile is small and a season's peaks read as spikes
        values, aside = spikes(values, noise_sigma(values, floor, spikes=False))
        use = ~aside
        whole = trend_sigma(values, floor)
        sigma, bounds = refit(values, whole, segment(values, whole, model="trend"), floor)
        # a series of steps and white noise (``refit`` kept its second fit) whose noise
        # changes along it: segmented again, each run weighed by the noise around it, never
        # read below the series' own (only the noisier part weighs less: read lower, the
        # quiet stretches of a bursty series were cut at sub-2% wiggles; chosen by
        # benchmarks/detect_on_synthetic_histories.py)
        profile = (noise_profile(piecewise_residuals(values, bounds), floor)
                   if sigma < whole else None)
        if profile is not None:
            sigma = np.maximum(profile, sigma)
            bounds = segment(values, sigma, model="trend")
    else:
        sigma = level_sigma(values, floor)
        cleaned, aside = excursions(values, sigma)
        bounds = segment(cleaned, sigma)
        use = ~aside
        band = excursion_band(values, cleaned, aside, sigma)
    while True:
        judged = _pruned(values, shown, bounds, sigma, model, use, alpha, min_change_pct, band)
        if model != "trend":
            break
        values, bounds, gone = short_excursions(values, bounds, alpha)
        if not gone.any():
            break
        use &= ~gone
    out = []
    for j, (cp, _) in enumerate(judged):
        if model == "level":
            cp = _dated(values, shown, bounds, j, sigma, use, cp)
        # from where it may have begun: a range's runs are where the step happened
        clean = np.flatnonzero(use[cp.first_possible:])
        settled = cp.first_possible + int(clean[0]) if clean.size else cp.first_possible
        edges = [0, *bounds, values.size]
        first, last = _open_edges(values, use, cp, edges[j], edges[j + 2],
                                  BETWEEN_SIGMAS * sigma if model == "level" else None)
        # runs without a value just before the first possible one may have been its start too
        earliest = int(keep[first - 1]) + 1 if first > 0 else 0
        index = int(keep[cp.index])
        out.append(dataclasses.replace(cp, index=index, settled=int(keep[settled]),
                                       earliest=earliest if earliest < index else None,
                                       latest=int(keep[last]) if last > cp.index else None))
    return out


def _open_edges(values: np.ndarray, use: np.ndarray, cp: ChangePoint, lo: int, hi: int,
                reach: float | None) -> tuple[int, int]:
    """The first and last run ``cp`` may have begun at (``lo``, ``hi``: the stretches on either
    side), widened over the runs that touch its range and say nothing of the level they are
    of: runs set aside as slow (``use`` false) and, with ``reach``, a slow run kept at a level
    (more than ``reach`` above the median of that level's runs beyond it, and above the
    nearest three). A machine slows runs by any amount: a night slowed by chance just before
    a step up is placed at the new level (the earliest run it can have come from), yet the
    step may have come with the next run; one before a step down is placed at the old level,
    yet the step may have come with it. Both commits are then the range to bisect."""
    up = cp.direction == "up"

    def slow(k: int, level: np.ndarray, nearest: np.ndarray) -> bool:
        """Whether run ``k`` is above ``level`` (the runs of its level beyond it, nearest
        first) as a slowed run is."""
        return (reach is not None and level.size > 0
                and values[k] > max(float(np.median(level)) + reach, float(np.max(nearest))))

    def before(k: int) -> bool:  # the old level's last run, before a step down
        old = values[lo:k][use[lo:k]][-WINDOW:]
        return not use[k] or (not up and slow(k, old, old[-3:]))

    def after(k: int) -> bool:  # the new level's first run, of a step up
        new = values[k + 1:hi][use[k + 1:hi]][:WINDOW]
        return not use[k] or (up and slow(k, new, new[:3]))

    first, last = cp.first_possible, cp.index
    while first > lo and before(first - 1):
        first -= 1
    while last + 1 < hi and after(last):
        last += 1
    return first, last


#: a run is between two levels (``_dated``) when it is more than this many sigmas of the
#: run-to-run noise from each, on the way from the old to the new
BETWEEN_SIGMAS = NEW_LEVEL_SIGMAS


def _dated(values: np.ndarray, shown: np.ndarray, bounds: list[int], j: int, sigma: float,
           use: np.ndarray, cp: ChangePoint) -> ChangePoint:
    """Boundary ``j`` (``cp``), a step up, dated by the runs of each level alone: the runs at
    the start of its new stretch that are between the two levels (BETWEEN_SIGMAS from each)
    are not the new level's, so its first run is the first after them; those runs, and the
    runs at the end of the old stretch between the levels, are where it may have begun
    (``earliest``). Its medians and counts then rest on the runs of each level only (at least
    one each side); its p-value stays the boundary's. A night slowed by chance just before a
    step otherwise becomes the step's first run: its commit blamed, its time mixed into the new
    level's."""
    edges = [0, *bounds, values.size]
    b = bounds[j]
    lo, hi = max(edges[j], b - WINDOW), min(edges[j + 2], b + WINDOW)
    left = [k for k in range(lo, b) if use[k]]
    right = [k for k in range(b, hi) if use[k]]
    if not left or not right:
        return cp
    if np.median(values[right]) <= np.median(values[left]):
        # a step down: a run between the levels is as likely one of the new level that a
        # busy machine slowed, which no run can tell from the change itself
        return cp
    reach = BETWEEN_SIGMAS * sigma

    def between(k: int, old: list[int], new: list[int]) -> bool:
        """Whether run ``k`` is at neither level: more than ``reach`` above the old and below
        the new, and nearer the old (a run nearer the new level that is not at it is one of
        the new level a busy machine slowed, or held back). The new level by its lowest run: a
        machine slows runs, never speeds them up, and the newest of a few runs may be a slow
        one not yet known for an excursion."""
        level_old, level_new = float(np.median(values[old])), float(np.min(values[new]))
        v = float(values[k])
        return level_old + reach < v < level_new - reach and v - level_old < level_new - v

    # from the boundary outwards, runs in a row: an excursion (a slow run, set aside) ends
    # the walk, as any run at a level does; each run against the runs beyond it
    first = earliest = b
    while (len(right) > 1 and right[0] == first and right[1] == first + 1
           and between(first, left, right[1:])):
        right = right[1:]
        first += 1
    while (len(left) > 1 and left[-1] == earliest - 1
           and between(earliest - 1, left[:-1], right)):
        left = left[:-1]
        earliest -= 1
    if first == b and earliest == b:
        return cp
    before, after = float(np.median(shown[left])), float(np.median(shown[right]))
    return dataclasses.replace(cp, index=first, before=before, after=after,
                               change_pct=change_pct_of(before, after), n_before=len(left),
                               n_after=len(right), earliest=earliest)


#: the longest stretch between two trend change points that ``short_excursions`` may find to
#: be an excursion: a burst of up to EXCURSION_RUNS odd runs and one ordinary run either side
SHORT_STRETCH = EXCURSION_RUNS + 2


def short_excursions(values: np.ndarray, bounds: list[int],
                     alpha: float = ALPHA) -> tuple[np.ndarray, list[int], np.ndarray]:
    """The trend model's excursions, found after the fit: (``values`` with each replaced by
    the line of the runs around it, the boundaries left, a mask of the runs replaced). An
    excursion is a stretch of at most SHORT_STRETCH runs between two change points whose two
    sides are one line: two lines explain them no better than one at ``alpha`` (``trend_p``'s
    test, with the noise those two lines leave). Least squares cuts around a burst ``spikes``
    could not tell (one beside a step, a cluster of them, one less than BURST_SIGMAS off) as
    it did around one wild run; the line through both sides says whether anything
    changed."""
    from scipy.stats import chi2

    values, gone = values.copy(), np.zeros(values.size, dtype=bool)
    edges = [0, *bounds, values.size]
    keep = list(bounds)
    j = 0
    while j < len(bounds) - 1:
        lo, a, b, hi = edges[j], edges[j + 1], edges[j + 2], edges[j + 3]
        if b - a > SHORT_STRETCH or a - lo < TREND_MIN_SIZE or hi - b < TREND_MIN_SIZE:
            j += 1
            continue
        t = np.concatenate((np.arange(lo, a), np.arange(b, hi))).astype(np.float64)
        both = np.concatenate((values[lo:a], values[b:hi]))
        line = np.polyfit(t, both, 1)
        apart = piecewise_residuals(both, [a - lo])
        noise = float(np.mean(apart * apart))
        one = both - np.polyval(line, t)
        gain = float(one @ one - apart @ apart)
        if noise > 0 and chi2.sf(max(gain, 0.0) / noise, 2) > alpha:
            values[a:b] = np.polyval(line, np.arange(a, b, dtype=np.float64))
            gone[a:b] = True
            keep.remove(a)
            keep.remove(b)
            j += 2
            continue
        j += 1
    return values, keep, gone


def _pruned(values: np.ndarray, shown: np.ndarray, bounds: list[int], sigma: float | np.ndarray,
            model: str, use: np.ndarray, alpha: float, min_change_pct: float,
            band: tuple[float, float]) -> list[tuple[ChangePoint, float]]:
    """``find``'s checks: every boundary judged (``_judge``), the weakest failing one dropped
    (``bounds`` is edited), until all hold."""
    while True:
        judged = [_judge(values, shown, bounds, j, sigma, model, use)
                  for j in range(len(bounds))]
        if model == "level" and bounds and values.size - bounds[-1] <= HOLD_RUNS:
            # the rise over the level before it, the stretch since the boundary before (as
            # ``_judge`` reads it): over every earlier run, an older step would count in it,
            # and two slow runs after an improvement would read as no rise at all
            start = bounds[-2] if len(bounds) > 1 else 0
            left = values[start:bounds[-1]][use[start:bounds[-1]]][-WINDOW:]
            rise = values[bounds[-1]:] - np.median(left) if left.size else None
            if rise is not None and np.all((rise >= band[0]) & (rise <= band[1])):
                judged[-1] = (judged[-1][0], 2.0)  # as high as an excursion: held
                # and set aside until the next run says what they are, as an excursion is:
                # merged into the stretch before, they would make a change of their own
                # there (one run of an improvement and two slow runs: a +24% step)
                use = use.copy()
                use[bounds[-1]:] = False
        failing = [(badness, j) for j, (cp, badness) in enumerate(judged)
                   if badness > alpha or not moved(cp.before, cp.after, min_change_pct)]
        if not failing and model == "level":
            failing = _levelless(values, shown, bounds, sigma, use, judged)
        if not failing:
            return judged
        del bounds[max(failing)[1]]


def _levelless(values: np.ndarray, shown: np.ndarray, bounds: list[int], sigma: float,
               use: np.ndarray, judged: list[tuple[ChangePoint, float]]
               ) -> list[tuple[float, int]]:
    """The weaker boundary beside each stretch between two change points that keeps fewer
    than MIN_SIZE runs at a level of its own once both are dated (``_dated`` sets aside the
    runs between two levels): a level resting on one run is one odd run, as a segment of one
    run would be. [L, L, L+4%, slow, H, H, H] segments as three levels when the noise is low
    (the +4% run is past the old level), and dating leaves the middle level the slow run
    alone, which the next step also takes as between its levels: two change points where one
    step with a run between is what the runs show. Failing as an odd run beside a boundary
    does (2.0); of the two, the weaker (the larger p-value) goes.

    The newest stretch is not held so (its level may rest on its newest run once a run
    between is dated out): a night's wait there cost 3.5 points of recall at +10% in
    benchmarks/regression_detection.py and no false alarm fewer."""
    dated = [_dated(values, shown, bounds, j, sigma, use, cp) for j, (cp, _) in enumerate(judged)]
    out = []
    for k in range(1, len(bounds)):
        if int(use[dated[k - 1].index:dated[k].first_possible].sum()) < MIN_SIZE:
            out.append((2.0, max((k - 1, k), key=lambda j: (judged[j][0].p_value, j))))
    return out


def change_pct_of(before: float, after: float) -> float:
    """100 * (after - before) / |before|; nan when before is 0."""
    return 100.0 * (after - before) / abs(before) if before != 0 else math.nan


def moved(before: float, after: float, pct: float) -> bool:
    """Whether a level moved from ``before`` to ``after`` by at least ``pct`` percent of
    ``|before|`` (0 keeps any move). A move off a level of 0 is larger than any percent: its
    change_pct is nan, which compares false, and a series that leaves 0 would be no change."""
    if pct <= 0:
        return True
    if before == 0:
        return after != 0
    return abs(change_pct_of(before, after)) >= pct


def _judge(values: np.ndarray, shown: np.ndarray, bounds: list[int], j: int,
           sigma: float | np.ndarray, model: str = "level",
           use: np.ndarray | None = None) -> tuple[ChangePoint, float]:
    """Boundary ``j`` as a ChangePoint, and how badly it fails: its p-value, or 2.0 when one
    side has fewer than MIN_SIZE runs at its level (level model only): nearer its own median
    than the other's, or on the new side, NEW_LEVEL_SIGMAS past the old median the step's way.
    ``use``: the runs the figures may rest on (not the excursions); a side left with none
    fails (2.0)."""
    edges = [0, *bounds, values.size]
    b = bounds[j]
    if use is None:
        use = np.ones(values.size, dtype=bool)
    lo, hi = max(edges[j], b - WINDOW), min(edges[j + 2], b + WINDOW)
    left, right = values[lo:b][use[lo:b]], values[b:hi][use[b:hi]]
    if left.size == 0 or right.size == 0:
        return ChangePoint(index=b, before=math.nan, after=math.nan, change_pct=math.nan,
                           p_value=1.0, n_before=int(left.size),
                           n_after=int(right.size)), 2.0
    before, after = float(np.median(left)), float(np.median(right))
    if model == "trend":
        span = sigma[edges[j]:edges[j + 2]] if isinstance(sigma, np.ndarray) else sigma
        p = trend_p(values[edges[j]:edges[j + 2]], b - edges[j], span)
    else:
        p = p_value(left, right, sigma)
    # the medians in the values' own units (in log, an even count's would be a geometric mean)
    level = (float(np.median(shown[lo:b][use[lo:b]])), float(np.median(shown[b:hi][use[b:hi]])))
    cp = ChangePoint(index=b, before=level[0], after=level[1], change_pct=change_pct_of(*level),
                     p_value=p, n_before=int(left.size), n_after=int(right.size))
    if model == "trend":
        return cp, p
    # one odd run beside a boundary cannot carry it: the run next to it is at neither level
    nearer_after = ((np.abs(right - after) < np.abs(right - before))
                    | ((right - before) * math.copysign(1.0, after - before)
                       > NEW_LEVEL_SIGMAS * sigma))
    nearer_before = np.abs(left - before) < np.abs(left - after)
    if int(nearer_after.sum()) < MIN_SIZE or int(nearer_before.sum()) < MIN_SIZE:
        return cp, 2.0
    return cp, p
