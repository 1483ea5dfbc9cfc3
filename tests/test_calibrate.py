"""Calibration: measured peaks are plausible, `harness calibrate` stores them, dtypes agree."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.core.discovery import registry
from harness.core.spec import TIERS
from harness.device import envinfo
from harness.engine import calibrate
from harness.history import store

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU to calibrate one")
#: every dtype any device calibrates; Work.flops_dtype must name one of them
CALIBRATED_DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8"}


def harness_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def quick_cpu() -> dict:
    # beside the suite's other tests: what is checked here is not the machine's load
    return calibrate.measure(torch.device("cpu"), quick=True, even_if_busy=True)


def test_quick_cpu_calibration_is_positive_and_finite(quick_cpu: dict) -> None:
    cal = quick_cpu
    assert cal["device"] == "cpu"
    assert cal["device_name"]
    assert set(cal["matmul_tflops"]) == {"fp32", "bf16"}
    values = [cal["copy_gbps"], *cal["matmul_tflops"].values()]
    assert all(math.isfinite(v) and v > 0 for v in values)
    # plausibility bounds that a unit slip (ns for s, bits for bytes, GFLOP for TFLOP) breaks
    assert 0.1 < cal["copy_gbps"] < 5_000
    assert all(1e-4 < v < 500 for v in cal["matmul_tflops"].values())
    assert cal["details"]["copy_bytes"] == 64 * 2**20 and cal["details"]["quick"] is True
    assert cal["details"]["torch"] == torch.__version__
    assert abs(cal["created_at"] - time.time()) < 600


def test_copy_bandwidth_agrees_with_an_independent_measurement() -> None:
    """The calibration's copy measurement against one of its own, taken in turns so that both
    see the same load (a test measured minutes after its fixture failed when another job
    started in between); the best of each, within a factor of 5."""
    n = 64 * 2**20
    src = torch.full((n,), 3, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    independent = calibrated = 0.0
    for _ in range(3):
        calibrated = max(calibrated, calibrate.copy_gbps(torch.device("cpu"), n, 1, 3))
        for _ in range(3):
            t0 = time.perf_counter()
            dst.copy_(src)
            independent = max(independent, 2 * n / (time.perf_counter() - t0) / 1e9)
    assert independent / 5 < calibrated < independent * 5


def test_cli_stores_a_calibration_that_reads_back(tmp_path: Path) -> None:
    db = tmp_path / "cal.db"
    proc = harness_cli("calibrate", "--quick", "--device", "cpu", "--db", str(db), "--json",
                       "--even-if-busy")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    conn = store.connect(db)
    try:
        got = store.latest_calibration(conn, envinfo.machine()["fingerprint"], "cpu")
    finally:
        conn.close()
    assert got is not None
    assert got["id"] == printed["id"]
    assert got["copy_gbps"] == pytest.approx(printed["copy_gbps"]) and got["copy_gbps"] > 0
    assert set(got["matmul_tflops"]) == {"fp32", "bf16"}
    assert got["details"]["quick"] is True


def test_cli_table_output(tmp_path: Path) -> None:
    db = tmp_path / "cal.db"
    proc = harness_cli("calibrate", "--quick", "--db", str(db), "--even-if-busy")
    assert proc.returncode == 0, proc.stderr
    assert "GB/s" in proc.stdout and "matmul fp32" in proc.stdout and str(db) in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cli_device_cuda_without_a_gpu_is_a_usage_error(tmp_path: Path) -> None:
    db = tmp_path / "cal.db"
    proc = harness_cli("calibrate", "--device", "cuda", "--db", str(db))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0] and "--device cpu" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not db.exists()  # refused before anything was measured or written


def test_the_cpu_share_counts_what_the_threads_could_get() -> None:
    use = calibrate.CpuUse(cpu_s=3.0, wall_s=2.0)
    assert calibrate.cpu_share(use, threads=2, cpus=2, quota=None) == pytest.approx(0.75)
    # a thread per CPU at most; no more CPUs than the affinity or the cgroup's quota give
    assert calibrate.cpu_share(use, threads=4, cpus=2, quota=None) == pytest.approx(0.75)
    assert calibrate.cpu_share(use, threads=2, cpus=8, quota=1.5) == pytest.approx(1.0)
    assert calibrate.cpu_share(calibrate.CpuUse(), threads=2, cpus=2, quota=None) == 1.0
    assert calibrate.cpu_quota("max 100000\n") is None
    assert calibrate.cpu_quota("150000 100000\n") == pytest.approx(1.5)
    assert calibrate.cpu_quota("garbage") is None and calibrate.cpu_quota("0 100000") is None
    assert calibrate.busy_reason(0.81, 2) == ""
    why = calibrate.busy_reason(0.47, 2)
    assert "busy" in why and "47%" in why and "--even-if-busy" in why


def test_the_peak_is_the_fastest_repeat() -> None:
    """A repeat slowed by something else on the machine does not lower a peak."""
    waits = iter([0.0, 0.03, 0.001, 0.03])  # warm-up, then the three repeats

    def call() -> None:
        time.sleep(next(waits))

    ns = calibrate._best_ns(call, torch.device("cpu"), warmup=1, repeats=3)
    assert 1e6 <= ns < 2.5e7  # the 1 ms repeat: at least its sleep, far below the 30 ms ones


def _first_line(pipe) -> str:
    """One line read a byte at a time: a buffered readline may take what follows it too (a
    refusal that came at once, on a machine busy already), which ``communicate`` then misses."""
    got = b""
    while not got.endswith(b"\n") and (byte := pipe.read(1)):
        got += byte
    return got.decode()


def test_a_calibration_beside_busy_processes_is_refused(tmp_path: Path) -> None:
    """Processes spinning on every CPU take over half of the CPU time from the calibration's
    threads, whatever else runs: refused in one line, exit 4, a DB made for it removed, one
    that was there kept. The spinners start when the measuring does (not while torch
    imports)."""
    spin = [subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.read(1)\n"
                              "while True: pass"], stdin=subprocess.PIPE)
            # two per CPU: under half of each CPU is left, however many threads calibrate
            for _ in range(2 * len(os.sched_getaffinity(0)))]

    def start_spinning() -> None:
        for p in spin:
            p.stdin.write(b"x")
            p.stdin.flush()
        time.sleep(0.2)

    old = tmp_path / "old.db"  # a history that was there before: refused, it stays
    store.connect(old).close()
    new = tmp_path / "new" / "cal.db"  # made for the calibration: refused, it goes
    try:
        clis = [subprocess.Popen([sys.executable, "-m", "harness", "calibrate", "--quick",
                                  "--device", "cpu", "--db", str(db)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
                for db in (new, old)]
        said = [_first_line(cli.stderr) for cli in clis]  # "calibrating cpu...", then it measures
        start_spinning()
        more = [cli.communicate(timeout=300)[1].decode() for cli in clis]
    finally:
        for p in spin:
            p.kill()
            p.wait()
    for cli, first, rest in zip(clis, said, more, strict=True):
        assert first.startswith("calibrating"), first + rest
        lines = [ln for ln in rest.splitlines() if ln.strip()]
        assert cli.returncode == 4 and len(lines) == 1, rest
        assert "busy while calibrating" in lines[0] and "Traceback" not in rest
    assert not new.parent.exists() and old.is_file()


def test_a_busy_calibration_asked_to_be_kept_is_marked(monkeypatch) -> None:
    """Any share counts as busy past a threshold above 1: kept when asked to, marked."""
    monkeypatch.setattr(calibrate, "BUSY_SHARE", 1.5)
    with pytest.raises(calibrate.BusyMachine, match="busy while calibrating"):
        calibrate.measure(torch.device("cpu"), quick=True)
    kept = calibrate.measure(torch.device("cpu"), quick=True, even_if_busy=True)
    assert kept["details"]["busy"] is True and 0 < kept["details"]["cpu_share"] < 1.5


def test_every_flops_dtype_in_the_suites_is_a_calibrated_dtype() -> None:
    seen = set()
    for spec in registry().specs.values():
        if spec.work is None:
            continue
        flops_seen = False
        for tier in TIERS[:2]:  # smoke, then nightly (stress shapes share their work models)
            if tier != "smoke" and not flops_seen and spec.grid.get("smoke"):
                break  # a bytes-only op: its nightly work models (some slow to build) add nothing
            for params in spec.grid.get(tier, ()):
                ws = spec.world_size_of(params) if spec.world_size_of else 4
                work = spec.work(params, ws if spec.distributed else 1)
                if work.flops is not None:
                    flops_seen = True
                    assert work.flops_dtype in CALIBRATED_DTYPES, (spec.name, params)
                    seen.add(work.flops_dtype)
                else:
                    assert work.flops_dtype is None, (spec.name, params)
    assert {"fp8", "bf16"} <= seen  # the FP8 GEMMs, and the bf16 MoE and Hopper GEMMs


@needs_cuda
def test_quick_cuda_calibration() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    cal = calibrate.measure(dev, quick=True)
    assert cal["device"] == f"cuda:{torch.cuda.get_device_name(dev)}"
    expected = {"bf16", "fp16", "fp32", "tf32"}
    if torch.cuda.get_device_capability(dev) >= (8, 9):
        expected.add("fp8")
    assert set(cal["matmul_tflops"]) == expected, cal["details"].get("skipped")
    peaks = cal["matmul_tflops"]
    assert all(math.isfinite(v) and v > 0 for v in peaks.values())
    # tensor cores: reduced precision is faster than IEEE fp32 on every GPU that has them
    assert peaks["bf16"] > peaks["fp32"] and peaks["tf32"] > peaks["fp32"]
    assert 10 < cal["copy_gbps"] < 50_000
    # the float32 precision setting is restored after the tf32 measurement
    assert torch.get_float32_matmul_precision() == "highest"
