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
alone can only be ``newest_outlier``, "suspicious", until the next run confirms the new level
or returns to the old one.

Pure functions of numbers: the history DB side (matching change points across analyses,
triage) lives in ``harness.history.changes``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

#: the shortest segment: one run alone is an outlier, not a level
MIN_SIZE = 2
#: a run of a new level counts as at it (``_judge``) when nearer its median than the old
#: one's, or this many sigmas past the old level the step's way: a busy machine slows some
#: runs of the new level further, which pulls its median up and leaves a run of the new level
#: as it is nearer the old median. Recall at +10% on the recorded noise, quiet / under load /
#: holdout (benchmarks/regression_detection.py), 91.3% / 96.9% / 89.8% with the median alone;
#: 3 sigmas: 96.2% / 97.7% / 93.8%, false alarms over all series 41 / 20 / 54 -> 42 / 21 / 58;
#: 4: 96.2% / 98.0% / 93.8%, 41 / 20 / 56; 5: 95.8% / 96.9% / 94.5%, none more; 6: 94.8%
NEW_LEVEL_SIGMAS = 5.0
#: a change point needs this p-value or less (see ``p_value``)
ALPHA = 0.01
#: the runs on each side of a change point that its medians and p-value rest on (the nearest
#: ones inside its two segments: a level long ago says little about the step itself)
WINDOW = 30
#: MAD * 1.4826 estimates the standard deviation of normally distributed data
_MAD_TO_SIGMA = 1.4826


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

    @property
    def direction(self) -> str:
        """"up" or "down" (for a timing, up is slower)."""
        return "up" if self.after > self.before else "down"

    def to_dict(self) -> dict[str, object]:
        d = {"index": self.index, "before": self.before, "after": self.after,
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


#: a quantile other than the median needs this many samples in a run; with fewer (a smoke
#: tier's 5) it is nearly the fastest sample alone, and the run is read by its median
QUANTILE_SAMPLES = 10


def _quantile_of(size: int, quantile: float) -> float:
    return quantile if size >= QUANTILE_SAMPLES else 0.5


def _by_size(runs: Sequence[Sequence[float] | float]
             ) -> tuple[np.ndarray, dict[int, tuple[list[int], np.ndarray]]]:
    """(each run that is a number, nan elsewhere; per count of finite samples, the positions of
    the runs with that many and their finite samples as the rows of one array): a nightly's
    runs mostly hold the same number of samples, and numpy takes a quantile of every row of an
    array at once for about what one row costs alone."""
    numbers = np.full(len(runs), math.nan)
    rows: dict[int, tuple[list[int], list[np.ndarray]]] = {}
    for i, run in enumerate(runs):
        if isinstance(run, (int, float)):
            numbers[i] = float(run)
            continue
        a = np.asarray(run, dtype=np.float64).reshape(-1)
        a = a[np.isfinite(a)]
        if a.size:
            where, arrays = rows.setdefault(a.size, ([], []))
            where.append(i)
            arrays.append(a)
    return numbers, {size: (where, np.stack(arrays)) for size, (where, arrays) in rows.items()}


def run_values(runs: Sequence[Sequence[float] | float], quantile: float = 0.5) -> np.ndarray:
    """One value per run: a number as it is, a run's samples by their median (``quantile``:
    another quantile of them, where the run has QUANTILE_SAMPLES or more; non-finite samples
    dropped; a run with none is nan)."""
    return _run_values(_by_size(runs), quantile)


def _run_values(grouped: tuple[np.ndarray, dict[int, tuple[list[int], np.ndarray]]],
                quantile: float) -> np.ndarray:
    out, groups = grouped
    out = out.copy()
    for size, (where, block) in groups.items():
        out[where] = np.quantile(block, _quantile_of(size, quantile), axis=1)
    return out


#: below this many runs the differences are centred on 0, not on their median: with a few
#: differences one of them is the median itself, and the MAD of the rest is often near 0
_CENTRED_FROM = 10
_QUANTILE, _QUANTILE_OF_HALF_NORMAL = 0.25, 0.3186
_MEDIAN_OF_HALF_NORMAL = 1.0 / _MAD_TO_SIGMA  # 0.6745


def noise_sigma(values: np.ndarray, floor: float = 0.0, *, spikes: bool = True) -> float:
    """Run-to-run noise: a robust standard deviation from the differences of neighbouring runs
    (a level change moves one difference, not the estimate; a trend barely does), at least
    ``floor`` (``sample_floor``: runs cannot vary less than their own medians do).
    ``spikes=False``: for runs already rid of their excursions, the median of the differences,
    which varies less from series to series than their lower quartile."""
    if values.size < 2:
        return floor
    d = np.diff(values)
    centre = float(np.median(d)) if values.size >= _CENTRED_FROM else 0.0
    # the lower quartile of |d|: a spike moves two differences, and on a loaded machine a
    # quarter of the runs can be spikes, which a median (MAD) does not survive; for normal
    # noise, |d| is half-normal with scale sigma * sqrt(2), whose lower quartile is 0.3186 of it
    # (its median 0.6745)
    quantile, of_half_normal = ((_QUANTILE, _QUANTILE_OF_HALF_NORMAL) if spikes
                                else (0.5, _MEDIAN_OF_HALF_NORMAL))
    q = float(np.quantile(np.abs(d - centre), quantile))
    return max(q / (of_half_normal * math.sqrt(2.0)), floor)


def sample_floor(runs: Sequence[Sequence[float] | float], quantile: float = 0.5) -> float:
    """The typical standard error of a run's median (or other ``quantile``) from its own samples
    (0 without samples): sqrt(q (1 - q)) / phi(Phi^-1(q)) * sigma / sqrt(n), 1.2533 for the
    median, sigma robust (1.4826 * MAD: one preempted sample must not make a run look
    imprecise)."""
    return _sample_floor(_by_size(runs)[1], quantile)


def _sample_floor(groups: dict[int, tuple[list[int], np.ndarray]], quantile: float) -> float:
    normal = NormalDist()
    factor = {q: math.sqrt(q * (1 - q)) / normal.pdf(normal.inv_cdf(q)) for q in {quantile, 0.5}}
    errors = []
    for size, (_, block) in groups.items():
        if size < 2:
            continue
        mad = np.median(np.abs(block - np.median(block, axis=1, keepdims=True)), axis=1)
        errors.append(factor[_quantile_of(size, quantile)] * (_MAD_TO_SIGMA * mad)
                      / math.sqrt(size))
    return float(np.median(np.concatenate(errors))) if errors else 0.0


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
#: code seldom does. At a whole step only, three slow runs ahead of a +10% step, the last of
#: them 17% slow, made a +42% level of their own, partly back at the step, and the step was
#: never reported (benchmarks/regression_detection.py, quiet series: as many steps found, 11
#: false alarms instead of 14, 1.20 alarms per step instead of 1.22; the level model on TCPD:
#: 474 change points instead of 527, F1 0.505 -> 0.517)
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
    is the newest run (it has no neighbour after it: ``newest_outlier`` judges it).

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


#: a new level resting on the newest HOLD_RUNS runs alone waits for one more run when each of
#: them is as high above the level before it as this series' own slow excursions are (from
#: the _BAND_QUANTILE of their heights to _BAND_REACH times the highest, in the units
#: analysed: logs for timings; _BAND_MIN of them found): on a machine that slows runs, two
#: slow runs in a row are as common as one (benchmarks/data), and they were all 17 false
#: alarms on the quiet recording. A series without such excursions (a steady GPU runner) is
#: never held; one that has them learns of a step in that band a night later
HOLD_RUNS = MIN_SIZE
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


#: the penalty of a change point in ``segment``, in units of sigma^2 * log(n) (BIC's is 2)
PENALTY = 3.0

#: the two models of a series between its change points. "level": a constant plus noise, the
#: noise the run-to-run spread (``noise_sigma``): timings, whose changes are steps and whose
#: noise is read from neighbouring runs. "trend": a straight line plus noise, the noise what a
#: single line fitted to the whole series leaves (``trend_sigma``): any series, where a slow
#: drift or a random walk is not a change, and a change is a jump or a turn
MODELS = ("level", "trend")
#: the shortest segment of the trend model: a line through two points fits them exactly
TREND_MIN_SIZE = 3


def level_cost(values: np.ndarray):
    """``cost(starts, end)``: the squared residuals of the mean of each ``values[start:end]``
    (``starts`` an array), from cumulative sums."""
    x = values - float(np.mean(values))  # centred: the sums of squares stay well conditioned
    s1 = np.concatenate(([0.0], np.cumsum(x)))
    s2 = np.concatenate(([0.0], np.cumsum(x * x)))

    def cost(starts: np.ndarray, end: int) -> np.ndarray:
        return s2[end] - s2[starts] - (s1[end] - s1[starts]) ** 2 / (end - starts)

    return cost


def trend_cost(values: np.ndarray, weights: np.ndarray | None = None):
    """``cost(starts, end)``: the squared residuals of the least-squares line through each
    ``values[start:end]``, from cumulative sums (residual = Sxx - Sxt^2 / Stt, centred), each
    run's weighted by ``weights`` where given (weighted least squares)."""
    n = values.size
    scale = float(np.std(values)) or 1.0
    x = (values - float(np.mean(values))) / scale  # conditioned, as level_cost's
    t = np.arange(n, dtype=np.float64) / max(n, 1)
    w = np.ones(n) if weights is None else weights
    sums = [np.concatenate(([0.0], np.cumsum(a)))
            for a in (w, w * t, w * t * t, w * x, w * x * t, w * x * x)]

    def cost(starts: np.ndarray, end: int) -> np.ndarray:
        sw, st, stt, sx, sxt, sxx = (s[end] - s[starts] for s in sums)
        length = np.where(sw > 0, sw, 1.0)
        var_t = stt - st * st / length
        cov = sxt - st * sx / length
        var_x = sxx - sx * sx / length
        explained = np.divide(cov * cov, var_t, out=np.zeros_like(cov), where=var_t > 0)
        return np.maximum(var_x - explained, 0.0) * scale * scale

    return cost


def trend_sigma(values: np.ndarray, floor: float = 0.0) -> float:
    """The noise of the trend model: the standard deviation of what one straight line fitted
    to the whole series leaves (its changes count as noise, which keeps the model from
    cutting a wandering series into many stretches), at least ``floor``."""
    if values.size < 3:
        return floor
    t = np.arange(values.size, dtype=np.float64)
    residual = values - np.polyval(np.polyfit(t, values, 1), t)
    return max(float(np.std(residual)), floor)


#: a burst of two or more runs must be this many sigmas off to be set aside by ``spikes``
#: (one run: SPIKE_SIGMAS). In a wandering series a short stretch a few sigmas off is often a
#: real event, annotated as such: at 4 sigmas TCPD's cover fell from 0.707 to 0.700
#: (benchmarks/tcpd_changepoints.py), at 6 it stays
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


#: the trend model reads its noise again from the residuals of its own fit when they are white
#: (lag-1 autocorrelation below WHITE_AC), see ``refit``
WHITE_AC = 0.2


def piecewise_residuals(values: np.ndarray, bounds: Sequence[int]) -> np.ndarray:
    """What the least-squares line through each stretch between ``bounds`` leaves."""
    edges = [0, *bounds, values.size]
    out = []
    for a, b in itertools.pairwise(edges):
        t = np.arange(b - a, dtype=np.float64)
        out.append(values[a:b] - np.polyval(np.polyfit(t, values[a:b], 1), t)
                   if b - a > 2 else np.zeros(b - a))
    return np.concatenate(out)


def lag1_autocorrelation(residuals: np.ndarray) -> float:
    """The correlation of each residual with the next (1.0 when it cannot be told)."""
    if residuals.size < 4 or not np.std(residuals[:-1]) > 0 or not np.std(residuals[1:]) > 0:
        return 1.0
    return float(np.corrcoef(residuals[:-1], residuals[1:])[0, 1])


def refit(values: np.ndarray, sigma: float, bounds: list[int],
          floor: float = 0.0) -> tuple[float, list[int]]:
    """The trend model's second look: (sigma, boundaries). ``trend_sigma`` counts every change
    as noise, which keeps a wandering series (a random walk, a season) from being cut into many
    stretches, but in a series of steps and white noise (a performance history) it is the
    steps' size, not the noise's, and hides the smaller ones. So the series is segmented again
    with the noise the first fit leaves, and that is kept when its own residuals are white
    (lag-1 autocorrelation under WHITE_AC: the noise is independent, as the model assumes);
    a wandering series' residuals stay correlated, and it keeps the first fit. Measured on
    TCPD and on synthetic histories (benchmarks/tcpd_changepoints.py,
    benchmarks/detect_on_synthetic_histories.py)."""
    if not bounds:
        return sigma, bounds
    second = max(float(np.std(piecewise_residuals(values, bounds))), floor)
    if not 0 < second < sigma:
        return sigma, bounds
    again = segment(values, second, model="trend")
    if lag1_autocorrelation(piecewise_residuals(values, again)) >= WHITE_AC:
        return sigma, bounds
    return second, again


#: ``noise_profile``: the noise around a run is read from the NOISE_REACH runs either side of
#: it (the RMS of about 100 differences: steady to about 7%), and kept per run only where it
#: varies along the series by NOISE_RATIO or more
NOISE_REACH, NOISE_RATIO = 50, 2.0


def noise_profile(residuals: np.ndarray, floor: float = 0.0) -> np.ndarray | None:
    """The trend model's noise per run, for a series whose noise changes along it (a runner
    pool swapped, a machine that turned noisy): from the neighbouring differences of what its
    fit leaves (``residuals``: a step moves none of them), the RMS of those within NOISE_REACH
    runs, over sqrt(2), at least ``floor``; None where that varies by less than NOISE_RATIO
    (one noise fits the series) or the series is too short to tell. With one noise for all,
    the penalty and the test are the quieter part's in the noisier part, which is cut where
    it wanders (benchmarks/detect_on_synthetic_histories.py, "noise_change": F1 0.955 ->
    0.977). ``_find`` reads no run's noise below the series' own."""
    n = residuals.size
    if n < 2 * NOISE_REACH + 2:
        return None
    d = np.diff(residuals)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(d, NOISE_REACH, mode="edge"),
                                                       2 * NOISE_REACH + 1)
    local = np.sqrt(np.mean(windows * windows, axis=1) / 2.0)  # the run after each difference
    local = np.maximum(np.concatenate(([local[0]], local)), floor)
    if not local.min() > 0 or local.max() < NOISE_RATIO * local.min():
        return None
    return local


def _weighted(sigma: float | np.ndarray) -> tuple[float, np.ndarray | None]:
    """(the sigma a cost is divided by, the runs' weights): a noise per run weighs each run by
    1 / its sigma^2, and the cost is then in units of sigma^2 already."""
    if isinstance(sigma, np.ndarray):
        return 1.0, 1.0 / (sigma * sigma)
    return sigma, None


def segment(values: np.ndarray, sigma: float | np.ndarray, penalty: float = PENALTY,
            model: str = "level") -> list[int]:
    """Optimal partitioning of ``values`` into stretches of one level (``model`` "level": one
    mean, every stretch at least MIN_SIZE long) or one line ("trend": at least TREND_MIN_SIZE),
    least squares, with a penalty of ``penalty * sigma^2 * log(n)`` per change point: the
    change point indices, before ``find``'s checks. Exact (Jackson et al. 2005, the recursion
    PELT prunes), O(n^2) with one numpy step per run: 2 ms for 600 runs. ``sigma`` per run
    (``noise_profile``, trend model): weighted least squares."""
    n = values.size
    min_size = TREND_MIN_SIZE if model == "trend" else MIN_SIZE
    if n < 2 * min_size:
        return []
    sigma, weights = _weighted(sigma)
    if weights is not None and model != "trend":
        raise ValueError("a noise per run is for the trend model only")
    if sigma <= 0:
        sigma = float(np.std(values)) or 1.0
    pen = penalty * sigma * sigma * math.log(n)
    cost = trend_cost(values, weights) if model == "trend" else level_cost(values)
    best = np.full(n + 1, np.inf)
    best[0] = -pen
    last = np.zeros(n + 1, dtype=np.int64)
    for end in range(min_size, n + 1):
        starts = np.arange(0, end - min_size + 1)
        total = best[starts] + cost(starts, end) + pen
        k = int(np.argmin(total))
        best[end], last[end] = total[k], starts[k]
    bounds, end = [], n
    while end > 0:
        end = int(last[end])
        if end > 0:
            bounds.append(end)
    return sorted(bounds)


def p_value(before: np.ndarray, after: np.ndarray, sigma: float) -> float:
    """Two-sided p-value of a level change between two stretches of runs: the difference of
    their medians against its standard error, 1.2533 * sigma * sqrt(1/n1 + 1/n2) (a median's,
    for normal noise), with sigma the series' run-to-run noise (``noise_sigma``, from every
    run) rather than the two stretches' own spread: right after a change the new stretch holds
    two or three runs, too few to estimate a spread, yet a step of many sigmas is certain.
    Medians, not means: a slow spike beside a change must not move it. Student's t with
    n1 + n2 - 2 degrees of freedom."""
    from scipy.stats import t as student_t

    if before.size == 0 or after.size == 0:
        return 1.0
    diff = abs(float(np.median(after)) - float(np.median(before)))
    if diff == 0.0:
        return 1.0
    if sigma <= 0.0:
        return 0.0
    t = diff / (1.2533 * sigma * math.sqrt(1.0 / before.size + 1.0 / after.size))
    df = max(before.size + after.size - 2, 1)
    return float(2.0 * student_t.sf(t, df))


def log_runs(runs: Sequence[Sequence[float] | float]) -> list[np.ndarray | float]:
    """``runs`` in natural log (a value of 0 or less becomes nan: dropped like a missing one).
    Timings vary by ratio: a kernel 100x slower is also noisier by 100x in nanoseconds, but
    not in log, where one sigma fits the whole series."""
    out: list[np.ndarray | float] = []
    for run in runs:
        a = np.asarray(run, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            logged = np.where(a > 0, np.log(np.where(a > 0, a, 1.0)), math.nan)
        out.append(float(logged) if logged.ndim == 0 else logged.reshape(-1))
    return out


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
        reading = _readings(runs, log, (quantile,))[0]
        points = _find(reading, min_change_pct=min_change_pct, alpha=alpha, model=model)
        if model == "trend" and points:
            points = _agreed(points, _find(reading, min_change_pct=min_change_pct, alpha=alpha,
                                           model="level"), reading.values, reading.floor)
        return points
    low, median = _readings(runs, log, (quantile, 0.5))
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


def _find(reading: _Reading, *, min_change_pct: float = 0.0, alpha: float = ALPHA,
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

    ``reading`` (``_readings``): the runs are analysed by its ``values`` (for timings the logs
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
        # quiet stretches of a bursty series were cut at sub-2% wiggles, F1 with
        # --min-change 0 0.85 -> 0.80)
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
    for cp, _ in judged:
        clean = np.flatnonzero(use[cp.index:])
        settled = cp.index + int(clean[0]) if clean.size else cp.index
        out.append(dataclasses.replace(cp, index=int(keep[cp.index]),
                                       settled=int(keep[settled])))
    return out


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
        if not failing:
            return judged
        del bounds[max(failing)[1]]


def _change_pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / abs(before) if before != 0 else math.nan


def moved(before: float, after: float, pct: float) -> bool:
    """Whether a level moved from ``before`` to ``after`` by at least ``pct`` percent of
    ``|before|`` (0 keeps any move). A move off a level of 0 is larger than any percent: its
    change_pct is nan, which compares false, and a series that leaves 0 would be no change."""
    if pct <= 0:
        return True
    if before == 0:
        return after != 0
    return abs(_change_pct(before, after)) >= pct


class _Reading(NamedTuple):
    """One reading of a series' runs (``_readings``)."""

    shown: np.ndarray  # each run's median in its own units: what a change point reports
    read: np.ndarray  # each run's median or other quantile, in its own units
    values: np.ndarray  # ``read`` as analysed: in log where asked (nan where not positive)
    floor: float  # ``sample_floor`` of ``values``


def _readings(runs: Sequence[Sequence[float] | float], log: bool,
              quantiles: Sequence[float]) -> list[_Reading]:
    """A reading of ``runs`` per quantile of their samples, in log if ``log``; the runs'
    samples are gathered into arrays once (``_by_size``), and the medians and the logs of the
    samples computed once for all."""
    grouped = _by_size(runs)
    shown = _run_values(grouped, 0.5)
    logged = _by_size(log_runs(runs))[1] if log else grouped[1]
    out = []
    for quantile in quantiles:
        read = shown if quantile == 0.5 else _run_values(grouped, quantile)
        values = read
        if log:
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.where(read > 0, np.log(np.where(read > 0, read, 1.0)), math.nan)
        out.append(_Reading(shown, read, values, _sample_floor(logged, quantile)))
    return out


def trend_p(values: np.ndarray, at: int, sigma: float | np.ndarray) -> float:
    """p-value of a boundary at ``values[at]`` under the trend model: what two lines (before
    ``at``, from it on) explain beyond one line through all of ``values``, in units of sigma^2,
    against chi-square with 2 degrees of freedom (Chow's test with the noise known: the
    stretch right after a change is too short to estimate its own; ``sigma`` per run: each
    run's, ``noise_profile``)."""
    from scipy.stats import chi2

    sigma, weights = _weighted(sigma)
    if sigma <= 0.0:
        return 0.0
    cost = trend_cost(values, weights)
    whole = np.array([0])
    gain = float(cost(whole, values.size)[0] - cost(whole, at)[0]
                 - cost(np.array([at]), values.size)[0])
    return float(chi2.sf(max(gain, 0.0) / (sigma * sigma), 2))


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
    cp = ChangePoint(index=b, before=level[0], after=level[1], change_pct=_change_pct(*level),
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


@dataclass(frozen=True)
class Outlier:
    """The newest run off its series' current level: "suspicious" until the next run says
    whether it was a step (then a change point) or one bad night (then nothing)."""

    value: float
    level: float  # median of the current level's runs (since the last change point)
    change_pct: float
    p_value: float

    @property
    def direction(self) -> str:
        return "up" if self.value > self.level else "down"


def newest_outlier(runs: Sequence[Sequence[float] | float], *, min_change_pct: float = 0.0,
                   alpha: float = ALPHA, log: bool = False,
                   quantile: float = 0.5) -> Outlier | None:
    """Whether the newest run left the level of the runs since the last change point before it:
    the same p-value as ``find`` (one run against the level, the series' run-to-run sigma) and
    the same ``min_change_pct``; where both sides have raw samples, a one-sided Mann-Whitney U
    test of the newest run's samples against the level's 5 newest runs must agree too (a run
    whose median moved but whose samples overlap the level's is noise). ``log`` and
    ``quantile`` as in ``find``."""
    shown, _, raw, floor = _readings(runs, log, (quantile,))[0]
    keep = np.flatnonzero(np.isfinite(raw))
    if keep.size < MIN_SIZE + 1 or keep[-1] != len(runs) - 1:
        return None
    values, shown = raw[keep], shown[keep]
    earlier = values[:-1]
    bounds = [b.index for b in find([float(v) for v in earlier], alpha=alpha)]
    start = bounds[-1] if bounds else 0
    level_runs = earlier[start:][-WINDOW:]
    if level_runs.size < MIN_SIZE:
        return None
    level, value = float(np.median(shown[:-1][start:][-WINDOW:])), float(shown[-1])
    change = _change_pct(level, value)
    sigma = level_sigma(values, floor)
    p = p_value(level_runs, values[-1:], sigma)
    if p > alpha or not moved(level, value, min_change_pct):
        return None
    newest = runs[-1]
    recent = [runs[int(i)] for i in keep[:-1][start:][-5:]]
    if not isinstance(newest, (int, float)) and all(not isinstance(r, (int, float))
                                                     for r in recent):
        pooled = np.concatenate([np.asarray(r, dtype=np.float64).reshape(-1) for r in recent])
        cur = np.asarray(newest, dtype=np.float64).reshape(-1)
        if mwu_p(cur[np.isfinite(cur)], pooled[np.isfinite(pooled)],
                  slower=value > level) >= 0.01:
            return None
    return Outlier(value=value, level=level, change_pct=change, p_value=p)
