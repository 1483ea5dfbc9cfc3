"""Segmentation of a series into stretches of one level or one line: the two models' costs
and noise, the exact optimal partitioning with a penalty per change point (``segment``), the
trend model's second look at its noise (``refit``, ``noise_profile``), and the p-values a
boundary is judged by (``p_value``, ``trend_p``). ``harness.history.changepoints`` decides
which boundaries are change points."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: the shortest segment: one run alone is an outlier, not a level
MIN_SIZE = 2

#: the penalty of a change point in ``segment``, in units of sigma^2 * log(n) (BIC's is 2)
PENALTY = 3.0

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
