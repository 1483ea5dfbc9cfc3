"""Timing: repeat counts, L2 flush, graph-mode fallback, percent of peak, GPU telemetry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.core.spec import Work
from harness.core.timing import (
    FALLBACK_LLC_BYTES,
    L2Flusher,
    TimingConfig,
    cpu_llc_bytes,
    derived,
    llc_bytes,
    parse_cache_size,
    percent_of_peak,
    time_call,
)
from harness.device import gpu_telemetry
from harness.device.runtime import World

CPU = torch.device("cpu")
SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CUDA events, graphs, NVML)")


def world(device: torch.device = CPU) -> World:
    # a one-rank world: time_call of a non-distributed op only reads its device
    backend = "nccl" if device.type == "cuda" else "gloo"
    return World(comm=None, rank=0, size=1, local_rank=0, local_size=1, device=device,
                 backend=backend)


def sysfs_llc_bytes() -> int | None:
    """The largest cache of CPU 0, read here independently of harness.core.timing."""
    sizes = []
    for f in SYSFS.glob("index*/size"):
        text = f.read_text().strip()
        factor = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KMG")) * factor)
    return max(sizes) if sizes else None


# ----------------------------------------------------------------------------- CPU timing


def test_cpu_samples_are_real_durations_within_the_repeat_bounds() -> None:
    cfg = TimingConfig(warmup=1, min_repeats=3, max_repeats=7, budget_s=1.0)
    res = time_call(lambda: time.sleep(0.002), world(), False, cfg)
    assert 3 <= res["n"] <= 7
    assert len(res["samples"]) == res["n"]
    # each repeat slept 2 ms, so no sample can be shorter; a unit slip (us, ms) would show
    assert min(res["samples"]) >= 2e6
    assert res["median"] < 1e9
    assert res["min"] <= res["p10"] <= res["median"] <= res["p90"]
    assert res["mode"] == "perf_counter" and res["mode_note"] == ""
    assert res["l2_flush"] is False and res["gpu"] is None


def test_repeat_count_follows_budget_between_min_and_max() -> None:
    slow = time_call(lambda: time.sleep(0.005), world(), False,
                     TimingConfig(warmup=1, min_repeats=4, max_repeats=50, budget_s=0.001))
    assert slow["n"] == 4  # the budget allows fewer than min_repeats: min wins
    fast = time_call(lambda: None, world(), False,
                     TimingConfig(warmup=1, min_repeats=4, max_repeats=9, budget_s=10.0))
    assert fast["n"] == 9  # the budget allows millions: max wins


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="timing mode 'cudagraph'"):
        TimingConfig(mode="cudagraph")


def test_graph_mode_on_cpu_falls_back_with_a_note() -> None:
    calls = []
    cfg = TimingConfig(warmup=2, min_repeats=3, max_repeats=5, budget_s=0.01, mode="graph")
    res = time_call(lambda: calls.append(1), world(), False, cfg)
    assert res["mode"] == "perf_counter"
    assert "graph mode needs CUDA" in res["mode_note"]
    assert 3 <= res["n"] <= 5
    assert len(calls) == 2 + res["n"]  # warm-up plus repeats, each a real eager call


# ----------------------------------------------------------------------------- L2 flush


@pytest.mark.skipif(not SYSFS.is_dir(), reason="no /sys CPU cache information here")
def test_cpu_llc_size_matches_sysfs() -> None:
    expected = sysfs_llc_bytes() or FALLBACK_LLC_BYTES
    assert cpu_llc_bytes() == expected
    assert llc_bytes(CPU) == expected


def test_cpu_llc_size_from_a_cache_directory(tmp_path: Path) -> None:
    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "1M\n")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert cpu_llc_bytes(tmp_path) == 2048 * 1024
    assert cpu_llc_bytes(tmp_path / "missing") == 32 * 2**20
    assert parse_cache_size("32768K") == 32 * 2**20
    assert parse_cache_size("512") == 512
    assert parse_cache_size("lots") is None


def test_flusher_buffer_is_twice_the_llc_and_every_flush_overwrites_it() -> None:
    flusher = L2Flusher(CPU)
    expected = 2 * (sysfs_llc_bytes() or FALLBACK_LLC_BYTES)
    assert flusher.nbytes == expected
    assert flusher.buffer.numel() * flusher.buffer.element_size() == expected
    seen = []
    for _ in range(3):
        flusher.buffer.zero_()
        flusher.flush()
        assert int(flusher.buffer.min()) > 0  # every byte written
        assert int(flusher.buffer.min()) == int(flusher.buffer.max())
        seen.append(int(flusher.buffer[0]))
    assert len(set(seen)) == 3  # a new value each time


def test_time_call_flushes_between_every_two_repeats() -> None:
    stamps: list[int] = []

    def fn() -> None:
        stamps.append(time.perf_counter_ns())

    cfg = TimingConfig(warmup=1, min_repeats=6, max_repeats=6, budget_s=0.01, l2_flush=True)
    res = time_call(fn, world(), False, cfg)
    nbytes = 2 * (sysfs_llc_bytes() or FALLBACK_LLC_BYTES)
    assert res["l2_flush"] is True and res["l2_flush_bytes"] == nbytes
    assert res["n"] == 6 and len(stamps) == 7
    # writing nbytes takes at least nbytes / (1 TB/s) on any CPU; without a flush the gap
    # between two empty calls is a few microseconds
    gaps = [stamps[i + 1] - stamps[i] for i in range(len(stamps) - 1)]
    assert min(gaps) >= nbytes / 1e12 * 1e9
    # and the flush stays outside the timed region: an empty call times in microseconds
    assert res["median"] < nbytes / 1e12 * 1e9


# ----------------------------------------------------------------------------- peaks


CAL = {"copy_gbps": 20.0, "matmul_tflops": {"fp32": 0.08, "bf16": 0.4}}


def test_percent_of_peak_arithmetic() -> None:
    d = {"gbps": 5.0, "tflops": 0.02}
    assert percent_of_peak(d, CAL, "fp32") == {"pct_peak_bw": 25.0, "pct_peak_flops": 25.0}
    assert percent_of_peak(d, CAL, "bf16") == {"pct_peak_bw": 25.0, "pct_peak_flops": 5.0}
    # no dtype, or one never calibrated: no flops figure, never a guessed one
    assert percent_of_peak(d, CAL, None) == {"pct_peak_bw": 25.0}
    assert percent_of_peak(d, CAL, "fp8") == {"pct_peak_bw": 25.0}
    assert percent_of_peak(d, None, "fp32") == {}
    assert percent_of_peak({}, CAL, "fp32") == {}
    assert percent_of_peak(d, {"copy_gbps": None, "matmul_tflops": {}}, "fp32") == {}


def test_percent_of_peak_leaves_collectives_bandwidth_out() -> None:
    collective = {"gbps": 10.0, "busbw_gbps": 15.0}
    assert percent_of_peak(collective, CAL, None) == {}


def test_percent_of_peak_from_a_work_model() -> None:
    work = Work(flops=2.0 * 64**3, bytes=3 * 64 * 64 * 4.0, flops_dtype="fp32")
    d = derived(work, 1e6)  # 1 ms
    pct = percent_of_peak(d, CAL, work.flops_dtype)
    assert pct["pct_peak_flops"] == pytest.approx(100 * 524288 / 1e-3 / 1e12 / 0.08)
    assert pct["pct_peak_bw"] == pytest.approx(100 * 49152 / 1e-3 / 1e9 / 20.0)


# ----------------------------------------------------------------------------- telemetry


def test_throttle_reason_names() -> None:
    assert gpu_telemetry.throttle_reason_names(0) == []
    assert gpu_telemetry.throttle_reason_names(0x4 | 0x40) == ["sw_power_cap",
                                                              "hw_thermal_slowdown"]
    assert gpu_telemetry.throttle_reason_names(0x1 | 0x10000) == ["gpu_idle", "0x10000"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_snapshot_without_a_driver_is_none() -> None:
    assert gpu_telemetry.snapshot(0) is None
    assert gpu_telemetry.snapshot(7) is None


# ----------------------------------------------------------------------------- CUDA


@needs_cuda
def test_cuda_events_timing_and_telemetry() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.randn(2048, 2048, device=dev)
    out = torch.empty_like(a)
    cfg = TimingConfig(warmup=2, min_repeats=5, max_repeats=20, budget_s=0.05)
    res = time_call(lambda: torch.matmul(a, a, out=out), world(dev), False, cfg)
    assert res["mode"] == "events" and res["mode_note"] == ""
    assert 5 <= res["n"] <= 20 and min(res["samples"]) > 0
    snap = gpu_telemetry.snapshot(dev.index)
    if snap is not None:  # pynvml and the driver are there
        assert snap["sm_clock_mhz"] > 0 and isinstance(snap["throttle_reasons"], list)
        assert res["gpu"]["before"]["max_sm_clock_mhz"] >= res["gpu"]["after"]["sm_clock_mhz"]


@needs_cuda
def test_cuda_graph_replays_run_the_captured_work() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    counter = torch.zeros((), device=dev)
    cfg = TimingConfig(warmup=2, min_repeats=5, max_repeats=10, budget_s=0.01, mode="graph")
    res = time_call(lambda: counter.add_(1), world(dev), False, cfg)
    assert res["mode"] == "graph" and res["mode_note"] == ""
    torch.cuda.synchronize(dev)
    # 2 eager warm-ups on the side stream, a capture that runs nothing, 2 timed warm-up
    # replays and n repeats: each replay really adds 1
    assert int(counter.item()) == 2 + 2 + res["n"]


@needs_cuda
def test_cuda_graph_removes_launch_overhead() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(16, device=dev)

    def many_tiny_kernels() -> None:
        for _ in range(200):
            x.add_(1)

    cfg = TimingConfig(warmup=2, min_repeats=10, max_repeats=10, budget_s=0.01)
    eager = time_call(many_tiny_kernels, world(dev), False, cfg)
    graph = time_call(many_tiny_kernels, world(dev), False,
                      TimingConfig(warmup=2, min_repeats=10, max_repeats=10, mode="graph"))
    assert graph["mode"] == "graph"
    assert graph["median"] < eager["median"]


@needs_cuda
def test_cuda_graph_capture_failure_falls_back_to_events() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(1024, device=dev)

    def synchronising() -> float:
        return float(x.sum().item())  # a device-to-host copy: not capturable

    cfg = TimingConfig(warmup=1, min_repeats=3, max_repeats=5, budget_s=0.01, mode="graph")
    res = time_call(synchronising, world(dev), False, cfg)
    assert res["mode"] == "events"
    assert res["mode_note"].startswith("CUDA graph capture failed")
    assert 3 <= res["n"] <= 5
    # the device is still usable, on the default stream, after the failed capture
    assert torch.cuda.current_stream(dev) == torch.cuda.default_stream(dev)
    assert float((x * 2).sum().item()) == 2048.0


@needs_cuda
def test_cuda_l2_flush_buffer_is_twice_l2() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flusher = L2Flusher(dev)
    assert flusher.nbytes == 2 * l2 and flusher.buffer.device == dev
    res = time_call(lambda: None, world(dev), False,
                    TimingConfig(warmup=1, min_repeats=3, max_repeats=3, l2_flush=True))
    assert res["l2_flush"] is True and res["l2_flush_bytes"] == 2 * l2


def test_the_budget_counts_what_surrounds_each_call() -> None:
    """An empty call under an L2 flush: the calls alone would fit ~10**5 repeats in the
    budget, but each repeat's wall time is the flush's, and the budget is wall time."""
    cfg = TimingConfig(warmup=1, min_repeats=2, max_repeats=100_000, budget_s=0.02,
                       l2_flush=True)
    t0 = time.perf_counter()
    res = time_call(lambda: None, world(), False, cfg)
    nbytes = res["l2_flush_bytes"]
    per_repeat_floor_s = nbytes / 1e12  # writing nbytes at 1 TB/s, faster than any CPU
    assert res["n"] <= max(2, int(0.02 / per_repeat_floor_s)) + 1
    assert res["median"] < 1e6  # the calls themselves stay empty
    # a budget of flush-free time would run 100,000 flushes: minutes, even on a fast machine
    assert time.perf_counter() - t0 < 60.0


# ----------------------------------------------------------------------------- contention
SMOKE = TimingConfig.for_tier("smoke")


def test_without_contention_the_config_is_unchanged() -> None:
    assert SMOKE.for_placement("") == SMOKE
    assert SMOKE.for_placement("", force=True) == SMOKE


def test_contended_ranks_get_one_call_marked_minimal() -> None:
    cfg = SMOKE.for_placement("8 ranks on 2 CPU(s) of vm")
    assert (cfg.warmup, cfg.min_repeats, cfg.max_repeats) == (0, 1, 1)
    calls = []
    res = time_call(lambda: calls.append(1), world(), False, cfg)
    assert len(calls) == 1 and res["n"] == 1
    assert res["minimal"] is True and res["contention"] == "8 ranks on 2 CPU(s) of vm"


def test_forced_timing_is_full_but_still_says_the_ranks_contended() -> None:
    cfg = SMOKE.for_placement("4 ranks on 2 CPU(s) of vm", force=True)
    assert (cfg.warmup, cfg.min_repeats, cfg.max_repeats, cfg.budget_s) == (
        SMOKE.warmup, SMOKE.min_repeats, SMOKE.max_repeats, SMOKE.budget_s)
    res = time_call(lambda: None, world(), False, cfg)
    assert res["n"] >= SMOKE.min_repeats
    assert res["minimal"] is False and res["contention"] == "4 ranks on 2 CPU(s) of vm"


def test_an_uncontended_timing_says_so() -> None:
    res = time_call(lambda: None, world(), False, SMOKE)
    assert res["minimal"] is False and res["contention"] == ""
