"""Measured peaks of a device: copy bandwidth and matmul TFLOP/s per dtype.

A kernel's GB/s or TFLOP/s means little alone; as a percentage of what this very machine
reaches it says how much is left on the table. ``measure`` times the two yardsticks with the
same clock as the suites (``timing.Clock``): a large ``dst.copy_(src)`` (bytes read plus bytes
written, the suites' GB/s convention) and square matmuls per dtype. The dtype keys are the
values of ``Work.flops_dtype``: "fp32" (TF32 off), "tf32", "bf16", "fp16", "fp8" (e4m3).

A peak is a ceiling (a time past twice it fails as impossible), so each is the fastest repeat,
and a CPU calibration taken while other processes ran beside it is refused (``BusyMachine``):
its peaks would be low, and honest kernels would later fail against them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.timing import Clock
from harness.device.envinfo import _cpu_model
from harness.device.placement import usable_cpus

#: bytes of the copied buffer: far above any last-level cache, so the copy runs from DRAM/HBM
COPY_BYTES = {("cuda", False): 2**30, ("cuda", True): 256 * 2**20,
              ("cpu", False): 256 * 2**20, ("cpu", True): 64 * 2**20}
#: square matmul size: big enough to saturate the device, small enough to take well under a
#: second per call (a 2-core CPU does a 2048^3 fp32 matmul in about 0.3 s)
MATMUL_N = {("cuda", False): 8192, ("cuda", True): 4096,
            ("cpu", False): 2048, ("cpu", True): 1024}
REPEATS = {("cuda", False): 20, ("cuda", True): 5, ("cpu", False): 5, ("cpu", True): 3}
WARMUP = {False: 2, True: 1}
#: compute capability from which tensor cores run FP8 (Ada, Hopper and later)
FP8_CAPABILITY = (8, 9)


@contextlib.contextmanager
def _fp32_precision(precision: str) -> Iterator[None]:
    """float32 matmul precision ("highest": IEEE fp32, "high": TF32 allowed), then restored."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


#: the share of its threads' CPU time a CPU calibration must get: an idle machine gives its
#: matmuls and copies all of it (0.99 to 1.01 measured on a 2-core VM), one busy process beside
#: them about 0.55, two about 0.47
BUSY_SHARE = 0.8


class BusyMachine(RuntimeError):
    """A CPU calibration got too little of the CPU time its threads could use."""


@dataclass
class CpuUse:
    """The process CPU time and the wall time of the timed repeats, summed."""

    cpu_s: float = 0.0
    wall_s: float = 0.0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu_s += time.process_time() - cpu
            self.wall_s += time.perf_counter() - wall


def cpu_quota(cpu_max: str) -> float | None:
    """CPUs a cgroup v2 ``cpu.max`` ("max 100000" or "150000 100000") allows, or None."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_cpus() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            return cpu_quota(f.read())
    except OSError:
        return None


def cpu_share(use: CpuUse, threads: int, cpus: int, quota: float | None) -> float:
    """The share of the CPU time its threads could get that the timed repeats got: at most
    one CPU per thread, no more than the process may run on (affinity) or its cgroup allows."""
    can = min(threads, cpus, quota if quota is not None else threads)
    return use.cpu_s / (use.wall_s * can) if use.wall_s > 0 and can > 0 else 1.0


def busy_reason(share: float, threads: int) -> str:
    """Why a CPU calibration with ``share`` must not be stored, or ""."""
    if share >= BUSY_SHARE:
        return ""
    return (f"the machine was busy while calibrating: its {threads} thread(s) got "
            f"{share:.0%} of the CPU time they could use (other processes ran beside them), "
            "so the peaks would be low and honest times could later fail as impossible; run "
            "`harness calibrate` again when the machine is idle, or pass --even-if-busy to "
            "store them anyway")


def _best_ns(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int,
             use: CpuUse | None = None) -> float:
    """The fastest of ``repeats`` timed calls: a peak is what the device reaches."""
    clock = Clock(device)
    for _ in range(warmup):
        clock.time(fn)
    with use.counting() if use is not None else contextlib.nullcontext():
        return min(clock.time(fn) for _ in range(repeats))


def copy_gbps(device: torch.device, nbytes: int, warmup: int, repeats: int,
              use: CpuUse | None = None) -> float:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` buffers, counting 2 * nbytes moved."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(7)  # touch every page: the first copy must not pay for page faults
    dst = torch.empty_like(src)
    seconds = _best_ns(lambda: dst.copy_(src), device, warmup, repeats, use) * 1e-9
    return 2 * nbytes / seconds / 1e9


def _matmul_call(dtype: str, n: int, device: torch.device) -> Callable[[], Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    if dtype == "fp8":
        a = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn)
        # _scaled_mm wants the second operand column-major
        b = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16, use_fast_accum=True)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                   "fp32": torch.float32, "tf32": torch.float32}[dtype]
    a = torch.randn(n, n, device=device, generator=gen, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, generator=gen, dtype=torch_dtype)
    out = torch.empty(n, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b, out=out)


def matmul_tflops(dtype: str, device: torch.device, n: int, warmup: int, repeats: int,
                  use: CpuUse | None = None) -> float:
    """TFLOP/s of an n x n x n matmul in ``dtype`` (2 n^3 flops per call)."""
    call = _matmul_call(dtype, n, device)
    with _fp32_precision("high" if dtype == "tf32" else "highest"):
        seconds = _best_ns(call, device, warmup, repeats, use) * 1e-9
    return 2.0 * n**3 / seconds / 1e12


def matmul_dtypes(device: torch.device) -> list[str]:
    """The dtypes calibrated on ``device``: the CPU has no TF32, FP16 or FP8 fast path."""
    if device.type != "cuda":
        return ["fp32", "bf16"]
    dtypes = ["bf16", "fp16", "fp32", "tf32"]
    if torch.cuda.get_device_capability(device) >= FP8_CAPABILITY:
        dtypes.append("fp8")
    return dtypes


def device_key(device: torch.device) -> str:
    """How calibrations of ``device`` are keyed in the history DB: "cpu" or "cuda:<name>" (all
    GPUs of one model on a machine share their calibration)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def measure(device: torch.device, quick: bool = False, even_if_busy: bool = False
            ) -> dict[str, Any]:
    """Copy bandwidth and matmul peaks of ``device`` ("cpu" or a CUDA device).

    ``quick`` uses smaller buffers and fewer repeats (seconds instead of tens of seconds):
    good enough for a test, too noisy for a reference peak. On the CPU, raises
    ``BusyMachine`` where the repeats got less than ``BUSY_SHARE`` of their threads' CPU time
    (``details["cpu_share"]``), unless ``even_if_busy``.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"cannot calibrate device {device}: use cpu or cuda")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, quick)
    warmup, repeats, n = WARMUP[quick], REPEATS[key], MATMUL_N[key]
    details: dict[str, Any] = {
        "quick": quick, "copy_bytes": COPY_BYTES[key], "matmul_n": n, "warmup": warmup,
        "repeats": repeats, "torch": torch.__version__,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        details["capability"] = f"{props.major}.{props.minor}"
        details["fp8"] = "e4m3 x e4m3 -> bf16, torch._scaled_mm, use_fast_accum=True"
    else:
        name = _cpu_model()
        details["threads"] = torch.get_num_threads()
    # a CUDA device's work is the GPU's: the host thread mostly waits, its CPU time says nothing
    use = CpuUse() if device.type == "cpu" else None
    bandwidth = copy_gbps(device, COPY_BYTES[key], warmup, repeats, use)
    peaks: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for dtype in matmul_dtypes(device):
        try:
            peaks[dtype] = matmul_tflops(dtype, device, n, warmup, repeats, use)
        except (RuntimeError, NotImplementedError) as exc:
            # a torch build without this kernel: say so instead of failing the whole run
            skipped[dtype] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if skipped:
        details["skipped"] = skipped
    if use is not None:
        threads = details["threads"]
        share = cpu_share(use, threads, len(usable_cpus()), _cgroup_cpus())
        details["cpu_share"] = round(share, 3)
        why = busy_reason(share, threads)
        if why and not even_if_busy:
            raise BusyMachine(why)
        details["busy"] = bool(why)
    return {
        "device": device_key(device),
        "device_name": name,
        "copy_gbps": bandwidth,
        "matmul_tflops": peaks,
        "created_at": time.time(),
        "details": details,
    }
