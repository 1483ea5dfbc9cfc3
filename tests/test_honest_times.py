"""Times that cannot be faked: a time below the calibrated limits, a replaced clock, a result
cached by buffer or by call, and work left running after the call returns each fail the case
(harness/core/timing.py ``impossible`` and ``clock_tampering``, harness/engine/runner.py's
checks after timing). The cheats are in tests/helpers/timing_cheats.py."""

from __future__ import annotations

import sqlite3
import textwrap
import time

import pytest
import torch
from test_cli_integration import harness

from harness.core import timing
from harness.core.spec import Work

CAL = {"copy_gbps": 32.0, "matmul_tflops": {"fp32": 0.2, "bf16": 0.4}}


def _impossible(work, median_ns, cal, cold=False):
    return timing.impossible(work, timing.derived(work, median_ns), cal, llc=32 << 20,
                             cold=cold)


def test_a_rate_past_twice_the_calibrated_peak_is_impossible():
    work = Work(flops=1e12, flops_dtype="fp32")
    assert "5.0x this device's calibrated fp32 matmul peak" in _impossible(
        work, 1e9, CAL)  # 1 TFLOP/s against 0.2
    assert _impossible(work, 2.6e9, CAL) == ""  # 0.38 TFLOP/s
    assert _impossible(work, 1e9, None) == ""  # uncalibrated
    big = Work(bytes=float(1 << 30))
    assert "GB/s" in _impossible(big, 1e6, CAL)  # 1074 GB/s
    small = Work(bytes=float(1 << 20))  # cache-resident: its bandwidth is the cache's
    assert _impossible(small, 1e3, CAL) == ""
    assert "copy bandwidth" in _impossible(small, 1e3, CAL, cold=True)
    collective = Work(bytes=float(1 << 30), bus_bytes=float(1 << 30))
    assert _impossible(collective, 1e6, CAL) == ""


def test_a_replaced_clock_is_named_and_restored():
    trusted = time.perf_counter_ns
    assert timing.clock_tampering() == []
    time.perf_counter_ns = lambda: 0
    timing.Clock.time = lambda self, fn: 1.0
    try:
        assert sorted(timing.clock_tampering()) == ["harness.core.timing.Clock.time",
                                                    "time.perf_counter_ns"]
    finally:
        time.perf_counter_ns = trusted
    assert time.perf_counter_ns is trusted and timing.clock_tampering() == []


def _statuses(db):
    with sqlite3.connect(db) as conn:
        return {(impl, case): (status, reason) for impl, case, status, reason in conn.execute(
            "SELECT impl, case_id, status, reason FROM results")}


@pytest.mark.mpi
def test_cached_late_clock_patching_and_unwritten_implementations_fail_and_torch_passes(tmp_path):
    cheats = ("by_address", "by_call", "by_fingerprint", "late_thread", "patched_clock")
    args = [a for c in cheats for a in ("--impl", f"timing_cheats:{c}")]
    # in the same launch: an output left partly unwritten, in a block that held the answer
    out = harness(tmp_path, "run", "hopper_tasks.rmsnorm", "--world-sizes", "1",
                  "--impl", "torch", *args, "--impl", "unwritten:tail", timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "note: this machine has no calibration" in out.stderr  # the impossible check is off
    got = _statuses(tmp_path / "h.db")
    assert {s for (impl, _), (s, _) in got.items() if impl == "torch"} == {"pass"}
    late = ("buffers an earlier call used", "after the call returned", "after the timed repeats")
    seen = ("buffers an earlier call used",)
    why = {"by_address": seen, "by_call": seen, "by_fingerprint": ("a fingerprint?",),
           "late_thread": late, "patched_clock": ("a clock was replaced",)}
    for cheat, words in why.items():
        results = [v for (impl, _), v in got.items() if impl == f"timing_cheats:{cheat}"]
        assert results and all(s == "fail" and any(w in r for w in words)
                               for s, r in results), (cheat, results)
    # harness/core/buffers.py fresh_memory_poisoned: the unwritten tail holds 0xFE bytes, -1.7e38
    tail = [v for (impl, _), v in got.items() if impl == "unwritten:tail"]
    assert tail and all(s == "fail" and "e+38" in r for s, r in tail), tail



@pytest.mark.mpi
def test_a_collective_kept_by_a_fingerprint_fails_across_ranks_and_torch_passes(tmp_path):
    """Two ranks timed in full: a nudged element lies in one rank's input only, and the
    near values' reference (every rank's inputs made again, nudged alike) shows the stale
    sum on both."""
    out = harness(tmp_path, "run", "allreduce[*inplace=false,mode=exact,n=1031,op=sum]",
                  "--world-sizes", "2", "--bench", "--impl", "torch",
                  "--impl", "timing_cheats:allreduce_by_fingerprint", timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    got = _statuses(tmp_path / "h.db")
    assert {s for (impl, _), (s, _) in got.items() if impl == "torch"} == {"pass"}, got
    cheat = [v for (impl, _), v in got.items() if impl.endswith("allreduce_by_fingerprint")]
    assert len(cheat) >= 2 and all(s == "fail" and "a fingerprint?" in r for s, r in cheat), \
        cheat


@pytest.mark.mpi
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_side_stream_cached_and_clock_cheats_fail_and_torch_passes(tmp_path):
    """On CUDA: work left on a side stream the events never wait for, results cached by
    buffer or call, a replaced clock."""
    cheats = ("by_address", "by_call", "side_stream", "patched_clock")
    args = [a for c in cheats for a in ("--impl", f"timing_cheats:{c}")]
    out = harness(tmp_path, "run", "hopper_tasks.rmsnorm", "--world-sizes", "1", "--device",
                  "cuda", "--impl", "torch", *args, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    got = _statuses(tmp_path / "h.db")
    assert {s for (impl, _), (s, _) in got.items() if impl == "torch"} == {"pass"}, got
    for cheat in cheats:
        results = [v for (impl, _), v in got.items() if impl == f"timing_cheats:{cheat}"]
        assert results and all(s == "fail" for s, _ in results), (cheat, results)

SUITE = textwrap.dedent('''
    import torch
    from harness.api import OpSpec, allclose, case_tensor
    from harness.core.spec import Work

    def inputs(p, rank, world_size):
        n = p["n"]
        return {"a": case_tensor("mm", p, "a", (n, n), torch.float32),
                "b": case_tensor("mm", p, "b", (n, n), torch.float32)}

    _kept = {}

    def checksum_cache(a, b):
        """Right answers, kept by a checksum of every value's bits (a changed element changes
        it): the timed repeats cost an integer sum where a matmul should be, several times
        past the peak on an idle machine (3.7x on a 2-core VM; a float64 sum cost most of
        that margin), not on a busy one: the test runs alone."""
        key = (tuple(a.shape), int(a.view(torch.int32).sum()), int(b.view(torch.int32).sum()))
        if key not in _kept:
            _kept[key] = a @ b
        return _kept[key].clone()

    SPECS = [OpSpec(name="cheat.matmul", family="cheat", reference=lambda a, b: a @ b,
                    make_inputs=inputs, grid={"smoke": [{"n": 1024}]},
                    tolerance=allclose(1e-4, 1e-4),
                    work=lambda p, w: Work(flops=2.0 * p["n"] ** 3, flops_dtype="fp32"),
                    # honest and well below the fp32 peak (float64 runs at about half of
                    # it), so that a calibration taken while the machine was busy cannot make
                    # it look impossible
                    implementations={"honest": lambda a, b: (a.double() @ b.double()).float()},
                    negative_controls={"checksum_cache": checksum_cache})]
''')


@pytest.mark.mpi
@pytest.mark.alone  # the calibration and the run it judges, at two moments
def test_a_time_past_the_calibrated_peak_fails_as_impossible(tmp_path):
    (tmp_path / "mm_suite.py").write_text(SUITE)
    for _ in range(3):  # refused (exit 4) while a process another test left still ends
        cal = harness(tmp_path, "calibrate", "--quick", timeout=300)
        if cal.returncode != 4:
            break
        time.sleep(2)
    assert cal.returncode == 0, cal.stderr
    out = harness(tmp_path, "run", "cheat.matmul", "--suite", "mm_suite.py", "--world-sizes",
                  "1", "--impl", "honest", "--impl", "checksum_cache", timeout=300)
    got = {impl: v for (impl, _), v in _statuses(tmp_path / "h.db").items()}
    assert got["honest"][0] == "pass", got
    status, reason = got["checksum_cache"]
    assert status == "fail" and reason.startswith("impossible time:"), got
    assert out.returncode == 1 and "no calibration" not in out.stderr


def test_a_control_that_passes_every_case_it_ran_is_called_out(capsys):
    from harness.cli.show import print_uncaught_controls
    from harness.core.results import CaseResult

    def result(case, impl, status):
        return CaseResult(run_id="r", case_id=f"hopper_tasks.argmax[{case}]",
                          op="hopper_tasks.argmax", family="hopper_tasks", impl=impl,
                          world_size=1, params={}, status=status)

    print_uncaught_controls([result("b=3", "nan_skipped", "pass"),  # NaN-free: right
                             result("b=4", "nan_skipped", "pass"),
                             result("b=3", "last_on_ties", "pass"),
                             result("b=6", "last_on_ties", "fail"),
                             result("b=3", "torch", "pass")],
                            {"hopper_tasks.argmax": {"nan_skipped", "last_on_ties"}})
    said = " ".join(capsys.readouterr().out.split())
    assert "negative control hopper_tasks.argmax@nan_skipped passed every case" in said
    assert "last_on_ties" not in said and "@torch" not in said


def test_the_timing_modules_own_names_are_clocks_too():
    """A slower ``_perf_counter_ns`` (the CPU clock Clock.time reads) and the runner's own
    imported ``time_call`` replaced by one that divides: both named and put back."""
    from harness.engine import runner

    trusted_clock, trusted_call = timing._perf_counter_ns, runner.time_call
    timing._perf_counter_ns = lambda: trusted_clock() // 8
    runner.time_call = lambda *a, **k: trusted_call(*a, **k)
    try:
        assert sorted(timing.clock_tampering()) == ["harness.core.timing._perf_counter_ns",
                                                    "harness.engine.runner.time_call"]
    finally:
        timing._perf_counter_ns, runner.time_call = trusted_clock, trusted_call
    assert timing._perf_counter_ns is trusted_clock and runner.time_call is trusted_call
    assert timing.clock_tampering() == []
