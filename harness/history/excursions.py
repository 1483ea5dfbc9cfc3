"""Runs set aside before a series is segmented: the slow runs of a loaded machine, alone or a
few in a row (``excursions``, the level model's), the spikes and bursts of any series
(``spikes``, the trend model's), how high a series' own excursions rise (``excursion_band``),
and the level model's noise read without them (``level_sigma``). Least squares would pay two
change points to fit each, which then hide a real step beside them."""

from __future__ import annotations

import math

import numpy as np

from harness.history.noise import noise_sigma

#: a run this many sigmas off both its neighbours, the same way, and off the local level of
#: the _LOCAL runs around it, is a spike (see ``despike``)
SPIKE_SIGMAS = 4.0
_LOCAL = 7
#: the local level is the lower quartile of those runs, not their median: on a loaded machine
#: a third of the runs can be slow, and between such runs the median is itself a slow one,
#: which makes the ordinary runs there look like spikes down
_LOCAL_QUANTILE = 0.25
#: the longest excursion ``despike`` sets aside: on a shared machine slow runs come two or
#: three in a row as often as alone (benchmarks/data: a quarter to a third of the runs)
EXCURSION_RUNS = 3
#: slow runs where a step happened are set aside when each is further above the higher level
#: than the step, or than this share of it where the run past the higher neighbour is not
#: back near the lower level (``_higher_kept``). A level of their own would be a second
#: change within three runs, partly taken back, which a loaded machine's slow runs mimic and
#: code seldom does.
#: chosen by benchmarks/regression_detection.py (benchmarks/RESULTS.md)
STEP_EXCURSION_SHARE = 0.6


def _local_level(values: np.ndarray, quantile: float, width: int = _LOCAL) -> np.ndarray:
    """Per run, the ``quantile`` of the ``width`` runs around it (the ends padded with their
    own value)."""
    padded = np.pad(values, width // 2, mode="edge")
    return np.quantile(np.lib.stride_tricks.sliding_window_view(padded, width), quantile,
                       axis=1)


def _beside(values: np.ndarray, local: np.ndarray, reach: float, k: int):
    """Every stretch ``values[i:i + k]`` (i from 1 to the last with a run after it) against its
    two neighbours: (left neighbours, right neighbours, the stretches, whether the neighbours
    are of one level, whether the whole stretch is above both by more than ``reach``, below
    both, off ``local`` by more than ``reach``), one row per stretch."""
    windows = np.lib.stride_tricks.sliding_window_view
    left, right = values[:-k - 1], values[k + 1:]
    runs, near = windows(values[1:-1], k), windows(local[1:-1], k)
    # between two runs of one level: the run before a step, whose left neighbour is a spike,
    # is below both neighbours too, but they are not of one level
    level = np.abs(left - right) <= reach
    up = np.all(runs - np.maximum(left, right)[:, None] > reach, axis=1)
    down = np.all(np.minimum(left, right)[:, None] - runs > reach, axis=1)
    # and off the local level: an ordinary run between two spikes is off both of its
    # neighbours as well, but not off the level of the runs around it
    off = np.all(np.abs(runs - near) > reach, axis=1)
    return left, right, runs, level, up, down, off


def _higher_kept(values: np.ndarray, i: int, k: int) -> bool:
    """Whether the higher neighbour of the stretch ``values[i:i + k]`` is a level the series
    stays at: the run past it (the newest has none: not known yet, kept) is nearer it than the
    lower neighbour. Four runs of a slow path taken by part of the launches, the last of them
    less slow, then fixed: the fourth is no level the three before it stepped to."""
    lower, higher = sorted((values[i - 1], values[i + k]))
    past = i + k + 1 if values[i + k] >= values[i - 1] else i - 2
    if not 0 <= past < values.size:
        return True
    return bool(abs(values[past] - higher) < abs(values[past] - lower))


def despike(values: np.ndarray, sigma: float) -> np.ndarray:
    """``values`` with every excursion set aside (``excursions``): for the segmentation."""
    return excursions(values, sigma)[0]


def excursions(values: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(``values`` with every excursion replaced by the mean of its two neighbours, a mask of
    the runs replaced). An excursion is 1 to EXCURSION_RUNS runs each more than SPIKE_SIGMAS
    sigmas above (or each below) both neighbours, which are of one level, and off the median
    of the _LOCAL runs around it: a loaded machine makes runs 50% slower, alone or a few in a
    row, and least squares would pay two change points to fit each, which then hide a real
    step beside them (the new level is judged against the excursion, not the level before
    it). A step is never touched (the run after it is at the new level too, not back), nor
    is the newest run (it has no neighbour after it: ``outlier.newest_outlier`` judges it).

    Slow runs right where a step happened, above both levels, are excursions too, replaced by
    the higher level (see below). ``find`` then leaves every excursion out of a change
    point's medians and p-value."""
    aside = np.zeros(values.size, dtype=bool)
    if values.size < 3 or sigma <= 0:
        return values, aside
    x = values.copy()
    reach = SPIKE_SIGMAS * sigma
    local = _local_level(values, _LOCAL_QUANTILE)
    for k in range(1, EXCURSION_RUNS + 1):
        if values.size < k + 2:
            break
        left, right, runs, level, up, down, off = _beside(values, local, reach, k)
        for i in np.flatnonzero(level & (up | down) & off) + 1:
            x[i:i + k] = (values[i - 1] + values[i + k]) / 2.0
            aside[i:i + k] = True
        # slow runs right where a step happened (above both levels): taken to be at the higher
        # level, so a step up is placed at the first of them (the earliest run it can have
        # come from). Were they left as they are, they would make a stretch of their own and
        # the step beside it would be judged against them: a +10% step after two runs 80%
        # slow read as a 40% improvement. Slow only: a loaded machine slows a run, never
        # speeds it up (benchmarks/data: the "quiet" series' runs are bimodal, never faster)
        # and further above the higher level than the step (or STEP_EXCURSION_SHARE of it):
        # the first run of a new level a little above the second is that level's own noise
        above = np.min(runs - np.maximum(left, right)[:, None], axis=1)
        step = np.abs(left - right)
        far = above > STEP_EXCURSION_SHARE * step
        for i in np.flatnonzero(~level & up & off & far) + 1:
            if above[i - 1] <= step[i - 1] and not _higher_kept(values, i, k):
                continue
            x[i:i + k] = max(values[i - 1], values[i + k])
            aside[i:i + k] = True
    # the two ends have one neighbour: whether they are spikes is not known, but each is held
    # within SPIKE_SIGMAS of it, so that one wild run cannot move where a boundary falls
    x[0] = min(max(x[0], x[1] - reach), x[1] + reach)
    x[-1] = min(max(x[-1], x[-2] - reach), x[-2] + reach)
    return x, aside


#: ``excursion_band``: from the _BAND_QUANTILE of the heights of a series' slow
#: excursions to _BAND_REACH times the highest, with at least _BAND_MIN of them
#: found (what holds back a new level of the newest runs alone:
#: ``changepoints.HOLD_RUNS``)
_BAND_QUANTILE, _BAND_MIN, _BAND_REACH = 0.25, 3, 2.0
#: the band's lower edge, lowered by this many sigmas of run-to-run noise: a new run's rise
#: carries its own noise. Where the excursions are all alike (a kernel that takes its slow
#: path on 30% of the runs, 6% up), the quartile sits within the noise of their common
#: height, and half of all pairs of slow-path runs fell under it and alarmed
_BAND_SIGMAS = 2.0


def excursion_band(values: np.ndarray, cleaned: np.ndarray, aside: np.ndarray,
                   sigma: float = 0.0) -> tuple[float, float]:
    """How high this series' slow excursions rise above the level they left: from the
    _BAND_QUANTILE of their heights, less _BAND_SIGMAS times ``sigma`` (the run-to-run
    noise), to _BAND_REACH times the highest (two slow runs in a row can be slower than one;
    a step far beyond every excursion is none), or an empty band when fewer than _BAND_MIN
    were set aside."""
    heights = (values - cleaned)[aside]
    heights = heights[heights > 0]
    if heights.size < _BAND_MIN:
        return math.inf, -math.inf
    return (float(np.quantile(heights, _BAND_QUANTILE)) - _BAND_SIGMAS * sigma,
            _BAND_REACH * float(np.max(heights)))


#: ``noise_sigma`` has broken down when it is this many times ``lower_spread`` (with at least
#: _BREAKDOWN_RUNS runs; in normal noise a ratio above 10 comes once in 10,000 series of 12 runs
#: and rarer with more)
_BREAKDOWN_RATIO, _BREAKDOWN_RUNS = 10.0, 12
#: normal quantiles 0.40 and 0.05 are 1.392 sigmas apart
_LOW_QUANTILES, _LOW_SPAN = (0.05, 0.40), 1.392


def lower_spread(values: np.ndarray) -> float:
    """The spread of the lower 40% of the runs, in sigmas of normal noise: runs a machine left
    alone, when up to half of them were slowed (a machine slows runs, never speeds them up)."""
    lo, hi = np.quantile(values, _LOW_QUANTILES)
    return float(hi - lo) / _LOW_SPAN


def level_sigma(values: np.ndarray, floor: float = 0.0) -> float:
    """The level model's noise: ``noise_sigma`` estimated again without the excursions it
    lets ``despike`` find (they inflate the differences' spread too). Where slow runs are so
    many that fewer than a quarter of the neighbouring differences are between two ordinary
    runs, ``noise_sigma`` is a slow run's difference and ``despike`` finds nothing with it:
    there the excursions are found with ``lower_spread``, and the noise is that of the runs
    left."""
    start = noise_sigma(values, floor)
    low = lower_spread(values) if values.size >= _BREAKDOWN_RUNS else math.inf
    # (low is 0 where the lower runs tie, a coarse timer's: nothing to start from there)
    if 0 < low and start > _BREAKDOWN_RATIO * low:
        # the runs left, in their order: with this many set aside, the despiked series holds
        # runs of identical stand-ins, whose differences are 0
        aside = excursions(values, max(low, floor))[1]
        return noise_sigma(values[~aside], floor, spikes=False)
    return noise_sigma(despike(values, start), floor)


#: a burst of two or more runs must be this many sigmas off to be set aside by ``spikes``
#: (one run: SPIKE_SIGMAS). In a wandering series a short stretch a few sigmas off is often a
#: real event, annotated as such.
#: chosen by benchmarks/tcpd_changepoints.py (benchmarks/RESULTS.md)
BURST_SIGMAS = 6.0


def spikes(values: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The trend model's outliers: (``values`` with every spike replaced by the mean of its two
    neighbours, a mask of them). A spike is one run more than SPIKE_SIGMAS sigmas above (or
    below) both neighbours, which are of one level, and off the median of the _LOCAL runs
    around it; a burst, 2 to EXCURSION_RUNS runs in a row each more than BURST_SIGMAS off
    them the same way, and off the median of the 4k + 3 runs around it (k of them: so that
    the few ordinary runs between two bursts are not a dip off a local level the bursts
    make). Least squares would pay two change points to fit each and judge the stretches
    beside it against it; and wild runs inflate the noise a whole line leaves
    (``trend_sigma``), which hides the small steps: a history from a shared machine, slow
    stretches of 1 to 3 runs from a tenth of its runs, had a third of its steps found
    (benchmarks/detect_on_synthetic_histories.py, "bursts"). Found in passes over the
    series cleaned so far, until a pass finds nothing new (at most EXCURSION_RUNS): bursts
    a run or two apart hide each other from the first. Both directions alike (any series,
    not only timings). The two ends are left as they are; what remains is found after the
    fit (``short_excursions``)."""
    aside = np.zeros(values.size, dtype=bool)
    if values.size < 3 or sigma <= 0:
        return values, aside
    x = values.copy()
    for _ in range(EXCURSION_RUNS):
        before = x.copy()
        # the longest first: the ordinary runs between two bursts are off both of their
        # neighbours as well, and are so no longer once the bursts are set aside
        for k in range(min(EXCURSION_RUNS, values.size - 2), 0, -1):
            reach = (SPIKE_SIGMAS if k == 1 else BURST_SIGMAS) * sigma
            seen = x.copy()
            local = _local_level(seen, 0.5, _LOCAL if k == 1 else 4 * k + 3)
            _, _, _, level, up, down, off = _beside(seen, local, reach, k)
            for i in np.flatnonzero(level & (up | down) & off) + 1:
                x[i:i + k] = (seen[i - 1] + seen[i + k]) / 2.0
                aside[i:i + k] = True
        if np.array_equal(before, x):
            break
    return x, aside
