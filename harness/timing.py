"""Timing of one implementation call: warm-up, then repeats until a time or count budget.

On CUDA each repeat is bracketed by CUDA events; on the CPU by ``perf_counter_ns``. For a
distributed op every repeat starts after a barrier and its time is the maximum over ranks
(the collective is as slow as its slowest rank). Raw samples are kept; statistics come from
numpy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.spec import Work


@dataclass(frozen=True)
class TimingConfig:
    """How long to time. The repeat count is fixed after warm-up and is the same on all ranks."""

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 100
    budget_s: float = 0.5

    @classmethod
    def for_tier(cls, tier: str) -> TimingConfig:
        """Smoke runs on loaded CPU machines in CI: keep it short. GPU tiers time longer."""
        if tier == "smoke":
            return cls(warmup=1, min_repeats=3, max_repeats=20, budget_s=0.05)
        return cls()


def summarize(samples_ns: list[float]) -> dict[str, Any]:
    """median, p10, p90, min, mean, std and n of raw samples (nanoseconds), samples kept."""
    a = np.asarray(samples_ns, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "samples": []}
    p10, median, p90 = np.percentile(a, [10, 50, 90])
    return {
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "min": float(a.min()),
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "n": int(a.size),
        "samples": [float(x) for x in a],
    }


def derived(work: Work | None, median_ns: float | None) -> dict[str, float]:
    """TFLOP/s, GB/s (algbw) and busbw from the work model and the median time."""
    if work is None or not median_ns:
        return {}
    seconds = median_ns * 1e-9
    out: dict[str, float] = {}
    if work.flops is not None:
        out["tflops"] = work.flops / seconds / 1e12
    if work.bytes is not None:
        out["gbps"] = work.bytes / seconds / 1e9
    if work.bus_bytes is not None:
        out["busbw_gbps"] = work.bus_bytes / seconds / 1e9
    return out


class _Clock:
    """One repeat's elapsed time in ns, with CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e6
        t0 = time.perf_counter_ns()
        fn()
        return float(time.perf_counter_ns() - t0)


def time_call(fn: Callable[[], Any], world: Any, distributed: bool,
              config: TimingConfig) -> dict[str, Any]:
    """Time ``fn`` and return ``summarize`` of the per-repeat samples (max over ranks)."""
    clock = _Clock(world.device)

    def one() -> float:
        if distributed:
            world.synchronize()
            world.barrier()
        return clock.time(fn)

    warm = [one() for _ in range(config.warmup)]
    per_call = max(warm) if warm else 0.0
    if distributed:
        # every rank must run the same number of repeats, or the collectives deadlock
        per_call = world.allreduce_max(per_call)
    wanted = int(config.budget_s * 1e9 / per_call) if per_call > 0 else config.max_repeats
    repeats = min(config.max_repeats, max(config.min_repeats, wanted))
    samples = [one() for _ in range(repeats)]
    if distributed and world.size > 1:
        gathered = world.comm.allgather(samples)
        samples = list(np.max(np.asarray(gathered), axis=0))
    return summarize(samples)
