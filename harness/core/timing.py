"""Timing of one implementation call: warm-up, then repeats until a time or count budget.

On CUDA each repeat is bracketed by CUDA events; on the CPU by ``perf_counter_ns``. For a
distributed op every repeat starts after a barrier and its time is the maximum over ranks
(the collective is as slow as its slowest rank). Raw samples are kept; statistics come from
numpy.

Two options deepen a timing. ``mode="graph"`` (CUDA only) captures one call into a CUDA graph
and times replays of it, which takes the CPU's launch overhead out of the measurement; an
implementation that cannot be captured (it synchronises, allocates pinned memory, runs gloo
collectives) is timed with events instead and the result says why. ``l2_flush=True``
overwrites a scratch buffer of twice the last-level cache before every repeat, outside the
timed region, so each repeat starts with a cold cache as a kernel inside a real model would.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core.spec import IMPL_RAISES, Work
from harness.device import gpu_telemetry
from harness.device.cuda import first_line

MODES = ("events", "graph")
#: the ``mode`` a CPU timing reports: host clock, no events, no graphs
CPU_MODE = "perf_counter"
CPU_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
FALLBACK_LLC_BYTES = 32 * 2**20
#: repeats of a minimal timing (no warm-up): one, on a shifted copy of the inputs whose
#: output is then checked
MINIMAL_REPEATS = 1


@dataclass(frozen=True)
class TimingConfig:
    """How long to time. The repeat count is fixed after warm-up and is the same on all ranks.

    ``mode``: "events" (eager calls between CUDA events) or "graph" (replays of a CUDA graph of
    one call). ``l2_flush``: evict the last-level cache before every repeat.
    """

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 100
    budget_s: float = 0.5
    mode: str = "events"
    l2_flush: bool = False
    #: why times taken here measure contention (``World.contention``), or ""
    contention: str = ""
    #: a token budget, spent because the times cannot mean anything (``for_placement``)
    minimal: bool = False
    #: the interpreter that ran the implementation ("triton"), or "": its time is the
    #: interpreter's, not the kernel's (``interpreted``)
    interpreter: str = ""

    @property
    def full(self) -> bool:
        """Whether the calls are timed in full (no token budget, no interpreter): what a time
        that means something, and the checks that it is honest, need."""
        return not self.minimal and not self.interpreter

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"timing mode {self.mode!r} is not one of {MODES}")

    @classmethod
    def for_tier(cls, tier: str) -> TimingConfig:
        """Smoke runs on loaded CPU machines in CI: keep it short. GPU tiers time longer.

        At least 5 repeats even in smoke: with fewer, no shift can reach Mann-Whitney's
        p < 0.01 (4 against 4 samples give at best p = 0.014), so no regression could be found.
        """
        if tier == "smoke":
            return cls(warmup=1, min_repeats=5, max_repeats=20, budget_s=0.05)
        return cls()

    def interpreted(self, interpreter: str) -> TimingConfig:
        """This config for an implementation run by ``interpreter``: a token budget (one
        call on a shifted copy whose output is still checked), whose time is kept, marked,
        and left out of the history's series, as with ``minimal``."""
        return self._token(interpreter=interpreter)

    def for_placement(self, contention: str, force: bool = False) -> TimingConfig:
        """This config where the ranks run with ``contention`` (``World.contention``): as it
        is when there is none or ``force`` (``--bench``), else a token budget: one call, no
        warm-up, on a shifted copy of the inputs whose output is still checked; its time is
        kept, marked, and left out of the regression series (``regress.in_series``)."""
        if not contention:
            return self
        if force:
            return replace(self, contention=contention)
        return self._token(contention=contention)

    def _token(self, **why: str) -> TimingConfig:
        """A token budget: one call, no warm-up (``minimal``), and why."""
        return replace(self, warmup=0, min_repeats=MINIMAL_REPEATS,
                       max_repeats=MINIMAL_REPEATS, budget_s=0.0, minimal=True, **why)


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


def percent_of_peak(derived: Mapping[str, float], calibration: Mapping[str, Any] | None,
                    flops_dtype: str | None) -> dict[str, float]:
    """Derived throughput as a percentage of the machine's calibrated peak.

    ``pct_peak_bw``: GB/s against the calibrated copy bandwidth (both count bytes read plus
    bytes written); not for collectives (derived has ``busbw_gbps``), whose GB/s is bounded by
    the interconnect, which calibration does not measure. ``pct_peak_flops``: TFLOP/s against
    the calibrated matmul peak of ``flops_dtype``. A figure whose inputs are missing is left
    out, never guessed.
    """
    out: dict[str, float] = {}
    if not calibration:
        return out
    copy_gbps = calibration.get("copy_gbps")
    gbps = derived.get("gbps")
    if gbps is not None and "busbw_gbps" not in derived and copy_gbps:
        out["pct_peak_bw"] = 100.0 * gbps / copy_gbps
    peak = (calibration.get("matmul_tflops") or {}).get(flops_dtype) if flops_dtype else None
    tflops = derived.get("tflops")
    if tflops is not None and peak:
        out["pct_peak_flops"] = 100.0 * tflops / peak
    return out


#: an events time is launch-bound when the host took at least this share of it to enqueue the
#: call: the GPU then waited on Python, and the time measures the launch set-up, not the kernel
LAUNCH_BOUND_SHARE = 0.8


def launch_bound(host_median_ns: float | None, device_median_ns: float | None) -> bool:
    """Whether an events-mode time is the host's enqueue time rather than the device's work.

    Between the two events the stream runs whatever the host enqueues; when the host spends
    most of the interval in Python (argument packing, a launch description's set-up) the
    device idles, and the interval is the host's. Graph replay has no such host part."""
    if not host_median_ns or not device_median_ns:
        return False
    return host_median_ns >= LAUNCH_BOUND_SHARE * device_median_ns


# ------------------------------------------------------------------------------ honest times
#: an achieved rate past this multiple of the calibrated peak is impossible: calibration
#: measures what large copies and matmuls reach, not the datasheet, so a correct kernel may
#: beat it a little, never twice over
IMPOSSIBLE_FACTOR = 2.0


def impossible(work: Work | None, rates: Mapping[str, float],
               calibration: Mapping[str, Any] | None, llc: int, cold: bool) -> str:
    """Why a time is below the physical limit, or "": its ``derived`` ``rates`` past
    ``IMPOSSIBLE_FACTOR`` times the calibrated peak (``percent_of_peak``): the matmul peak of
    the work's dtype, or the copy bandwidth where the bytes cannot sit in cache (more than
    twice the last-level cache ``llc``, or the cache flushed before each repeat: ``cold``). A
    result cached across calls, work left running after the call returns, or a doctored
    clock land here. Collectives' bytes cross the interconnect, which calibration does not
    measure: not judged (``percent_of_peak`` leaves them out)."""
    if not work or not calibration:
        return ""
    pct = percent_of_peak(rates, calibration, work.flops_dtype)
    limit = 100.0 * IMPOSSIBLE_FACTOR
    if pct.get("pct_peak_flops", 0.0) > limit:
        return (f"impossible time: {rates['tflops']:.3g} TFLOP/s is "
                f"{pct['pct_peak_flops'] / 100:.1f}x this device's calibrated "
                f"{work.flops_dtype} matmul peak "
                f"({calibration['matmul_tflops'][work.flops_dtype]:.3g})")
    if pct.get("pct_peak_bw", 0.0) > limit and (cold or (work.bytes or 0) > 2 * llc):
        return (f"impossible time: {rates['gbps']:.4g} GB/s over {work.bytes / 2**20:.0f} MiB "
                f"is {pct['pct_peak_bw'] / 100:.1f}x this device's calibrated copy bandwidth "
                f"({calibration['copy_gbps']:.4g} GB/s)")
    return ""


# The clock functions a timing trusts, taken when the harness is imported (before any
# implementation's module is): an implementation that replaces one fails its case.
_perf_counter_ns = time.perf_counter_ns


#: the modules whose functions time a call, looked up by name when it runs: this one, and
#: each one ``watch`` adds (the runner's own imported ``time_call``)
_WATCHED: list[Any] = [sys.modules[__name__]]


def _module_functions(module: Any) -> dict[str, Any]:
    return {f"{module.__name__}.{name}": value for name, value in vars(module).items()
            if callable(value) and not name.startswith("__")}


def _bindings() -> dict[str, Any]:
    module = sys.modules[__name__]
    found = {"time.perf_counter_ns": time.perf_counter_ns, "time.perf_counter": time.perf_counter,
             "time.monotonic_ns": time.monotonic_ns, "time.time_ns": time.time_ns}
    for watched in _WATCHED:  # a slower _perf_counter_ns, a time_call that divides
        found.update(_module_functions(watched))
    found["harness.core.timing.Clock.time"] = getattr(getattr(module, "Clock", None), "time", None)
    event = getattr(torch.cuda, "Event", None)
    for name in ("record", "elapsed_time", "synchronize"):
        found[f"torch.cuda.Event.{name}"] = getattr(event, name, None)
    found["torch.cuda.synchronize"] = getattr(torch.cuda, "synchronize", None)
    return found


def clock_tampering() -> list[str]:
    """The trusted clock bindings an implementation replaced since the harness was imported
    (each restored before this returns, so later cases time honestly)."""
    now = _bindings()
    changed = [name for name, value in now.items() if value is not _TRUSTED.get(name, value)]
    changed += [name for name in _TRUSTED if name not in now]  # deleted
    for name in changed:
        owner_path, attr = name.rsplit(".", 1)
        owner = {"time": time,
                 "harness.core.timing.Clock": _TRUSTED["harness.core.timing.Clock"],
                 "torch.cuda.Event": getattr(torch.cuda, "Event", None),
                 "torch.cuda": torch.cuda}.get(owner_path, sys.modules.get(owner_path))
        if owner is not None:
            setattr(owner, attr, _TRUSTED[name])
    return changed


def watch(module: Any) -> None:
    """Trust ``module``'s functions as they are now (call it as the module is imported, before
    any implementation runs): ``clock_tampering`` names and restores any replaced later."""
    _WATCHED.append(module)
    _TRUSTED.update(_module_functions(module))


class Clock:
    """One call's elapsed time in ns: CUDA events on a GPU, ``perf_counter_ns`` on the CPU.
    On a GPU ``host_ns`` keeps how long the host took to enqueue the call (event to event)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host_ns: list[float] = []

    def time(self, fn: Callable[[], Any]) -> float:
        """Run ``fn`` once and return its elapsed time in nanoseconds."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            h0 = _perf_counter_ns()
            start.record()
            fn()
            end.record()
            self.host_ns.append(float(_perf_counter_ns() - h0))
            end.synchronize()
            return start.elapsed_time(end) * 1e6
        t0 = _perf_counter_ns()
        fn()
        return float(_perf_counter_ns() - t0)


# ------------------------------------------------------------------------------ L2 flush
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache size such as ``32768K``; None if unreadable."""
    m = _SIZE.match(text)
    return int(m.group(1)) * _UNIT[m.group(2).upper()] if m else None


def cpu_llc_bytes(sysfs: Path = CPU_CACHE_SYSFS) -> int:
    """The largest cache of CPU 0 from ``sysfs/index*/size``; 32 MiB where it is unknown."""
    sizes = []
    for entry in sysfs.glob("index*/size"):
        try:
            size = parse_cache_size(entry.read_text())
        except OSError:
            continue
        if size:
            sizes.append(size)
    return max(sizes, default=FALLBACK_LLC_BYTES)


def llc_bytes(device: torch.device) -> int:
    """Last-level cache of ``device``: the GPU's L2, or the CPU's largest cache."""
    if device.type == "cuda":
        size = int(torch.cuda.get_device_properties(device).L2_cache_size)
        return size or FALLBACK_LLC_BYTES
    return cpu_llc_bytes()


class L2Flusher:
    """A scratch buffer of twice the last-level cache; ``flush()`` overwrites all of it.

    Writing (not reading) makes every line of the cache dirty scratch data, so whatever the
    timed call left there is gone. Each flush writes a new value, so no hardware can skip it.
    """

    def __init__(self, device: torch.device, nbytes: int | None = None) -> None:
        self.nbytes = 2 * llc_bytes(device) if nbytes is None else int(nbytes)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        self.count = 0

    def flush(self) -> None:
        """Overwrite the whole buffer (asynchronously on CUDA, on the current stream)."""
        self.count += 1
        self.buffer.fill_(self.count % 255 + 1)


# ------------------------------------------------------------------------------ CUDA graphs
def capture_graph(fn: Callable[[], Any], device: torch.device,
                  warmup: int) -> tuple[Any | None, str]:
    """Capture one call of ``fn`` into a CUDA graph: (graph, "") or (None, why it failed).

    Warm-up runs on a side stream first, as torch's CUDA-graph docs require, so that lazy
    initialisation (cuBLAS handles, workspaces, autotuning) happens outside the capture. An
    error raised by ``fn`` during warm-up propagates: it is the implementation's, not capture's.
    """
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    current.wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    error: BaseException | None = None
    # torch.cuda.graph() would leave the capture stream current if capture_end raised; here
    # the stream context always restores it, and capture always ends once it began.
    with torch.cuda.stream(side):
        try:
            graph.capture_begin(capture_error_mode="thread_local")
        except Exception as exc:
            return None, f"capture could not begin ({first_line(exc)})"
        try:
            fn()
        except KeyboardInterrupt:
            raise
        except IMPL_RAISES as exc:
            error = exc
        try:
            graph.capture_end()
        except Exception as exc:
            error = error or exc
    if error is None:
        return graph, ""
    del graph
    # a failed capture leaves no sticky error; if something else broke, say so here
    torch.cuda.synchronize(device)
    return None, first_line(error)


def graph_mode_refusal(device_type: str, distributed: bool, backend: str) -> str:
    """Why graph mode is not even attempted for a call, or "" when capture is worth trying:
    CUDA graphs need CUDA, and gloo's collectives run on host threads that a capture cannot
    record (NCCL's kernels on the capturing stream can be captured)."""
    if device_type != "cuda":
        return "graph mode needs CUDA: timed with perf_counter on the CPU"
    if distributed and backend == "gloo":
        return ("graph mode is not attempted for distributed ops on the gloo backend "
                "(gloo collectives cannot be captured): timed with CUDA events")
    return ""


# ------------------------------------------------------------------------------ time_call
def _gpu_snapshot(device: torch.device) -> dict[str, Any] | None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return gpu_telemetry.snapshot(index)


def time_call(fn: Callable[[], Any], world: Any, distributed: bool,
              config: TimingConfig, after_each: Callable[[], Any] | None = None
              ) -> dict[str, Any]:
    """Time ``fn``: ``summarize`` of the per-repeat samples (max over ranks), plus ``mode``
    (what ran: "events", "graph" or "perf_counter"), ``mode_note`` (why a requested graph
    mode fell back, else ""), ``host_median`` and ``launch_bound`` (events mode: the host's
    enqueue time, and whether it set the time; :func:`launch_bound`), ``l2_flush`` and
    ``l2_flush_bytes``, ``gpu`` (NVML telemetry right before and after the repeats on CUDA,
    else None), and ``contention``, ``minimal`` and ``interpreter`` from ``config``.
    ``after_each`` runs after every call, warm-up included, outside the timed interval."""
    device = world.device
    cuda = device.type == "cuda"
    mode, note = ("events" if cuda else CPU_MODE), ""
    flusher = L2Flusher(device) if config.l2_flush else None
    timed = fn
    graph = None
    if config.mode == "graph":
        note = graph_mode_refusal(device.type, distributed, world.backend)
        if not note:
            graph, why = capture_graph(fn, device, config.warmup)
            if distributed:
                # every rank must time the same way, or their repeats run different collectives
                failed_somewhere = world.allreduce_max(0.0 if graph is not None else 1.0) > 0
                if failed_somewhere and graph is not None:
                    graph, why = None, "capture failed on another rank"
            if graph is not None:
                mode, timed = "graph", graph.replay
            else:
                note = f"CUDA graph capture failed ({why}): timed with CUDA events"
    clock = Clock(device)

    def one() -> float:
        if flusher is not None:
            flusher.flush()
        if distributed:
            world.synchronize()
            world.barrier()
        elapsed = clock.time(timed)
        if after_each is not None:  # outside the clock: a check of what the call wrote
            after_each()
        return elapsed

    # the budget is wall time: a repeat costs its call and what surrounds it (the barrier of
    # a distributed op, an L2 flush, the event sync), which for a small collective on ranks
    # oversubscribed on a few cores is far more than the call
    per_repeat = 0.0
    for _ in range(config.warmup):
        t0 = _perf_counter_ns()
        call_ns = one()
        per_repeat = max(per_repeat, call_ns, float(_perf_counter_ns() - t0))
    if distributed and config.min_repeats < config.max_repeats:
        # every rank must run the same number of repeats, or the collectives deadlock
        per_repeat = world.allreduce_max(per_repeat)
    wanted = (int(config.budget_s * 1e9 / per_repeat) if per_repeat > 0
              else config.max_repeats)
    repeats = min(config.max_repeats, max(config.min_repeats, wanted))
    gpu_before = _gpu_snapshot(device) if cuda else None
    samples = [one() for _ in range(repeats)]
    gpu_after = _gpu_snapshot(device) if cuda else None
    if distributed and world.size > 1:
        gathered = world.comm.allgather(samples)
        samples = list(np.max(np.asarray(gathered), axis=0))
    stats = summarize(samples)
    host = clock.host_ns[-len(samples):] if cuda and mode == "events" else []
    host_median = float(np.median(host)) if host else None
    stats.update(
        host_median=host_median,
        launch_bound=launch_bound(host_median, stats.get("median")),
        mode=mode,
        mode_note=note,
        l2_flush=flusher is not None,
        l2_flush_bytes=flusher.nbytes if flusher is not None else None,
        gpu=({"before": gpu_before, "after": gpu_after}
             if gpu_before is not None or gpu_after is not None else None),
        contention=config.contention,
        minimal=config.minimal,
        interpreter=config.interpreter,
    )
    return stats


_TRUSTED = _bindings()
