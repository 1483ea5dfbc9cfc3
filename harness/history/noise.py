"""A series' runs read as numbers, and their noise: one value per run (the median of its
samples, or another quantile of them), the run-to-run noise from neighbouring runs, the floor
a run's own samples set on it, and the logs timings are analysed in. The readings
``harness.history.changepoints`` segments."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

#: MAD * 1.4826 estimates the standard deviation of normally distributed data
_MAD_TO_SIGMA = 1.4826

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


class Reading(NamedTuple):
    """One reading of a series' runs (``readings``)."""

    shown: np.ndarray  # each run's median in its own units: what a change point reports
    read: np.ndarray  # each run's median or other quantile, in its own units
    values: np.ndarray  # ``read`` as analysed: in log where asked (nan where not positive)
    floor: float  # ``sample_floor`` of ``values``


def readings(runs: Sequence[Sequence[float] | float], log: bool,
              quantiles: Sequence[float]) -> list[Reading]:
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
        out.append(Reading(shown, read, values, _sample_floor(logged, quantile)))
    return out
