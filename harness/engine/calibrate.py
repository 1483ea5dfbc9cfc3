"""Measured peaks of a device: copy bandwidth and matmul TFLOP/s per dtype.

A kernel's GB/s or TFLOP/s means little alone; as a percentage of what this very machine
reaches it says how much is left on the table. ``measure`` times the two yardsticks with the
same clock as the suites (``timing.Clock``): a large ``dst.copy_(src)`` (bytes read plus bytes
written, the suites' GB/s convention) and square matmuls per dtype. The dtype keys are the
values of ``Work.flops_dtype``: "fp32" (TF32 off), "tf32", "bf16", "fp16", "fp8" (e4m3).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.core.timing import Clock
from harness.device.envinfo import _cpu_model

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


def _median_ns(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    clock = Clock(device)
    for _ in range(warmup):
        clock.time(fn)
    return statistics.median(clock.time(fn) for _ in range(repeats))


def copy_gbps(device: torch.device, nbytes: int, warmup: int, repeats: int) -> float:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` buffers, counting 2 * nbytes moved."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(7)  # touch every page: the first copy must not pay for page faults
    dst = torch.empty_like(src)
    seconds = _median_ns(lambda: dst.copy_(src), device, warmup, repeats) * 1e-9
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


def matmul_tflops(dtype: str, device: torch.device, n: int, warmup: int, repeats: int) -> float:
    """TFLOP/s of an n x n x n matmul in ``dtype`` (2 n^3 flops per call)."""
    call = _matmul_call(dtype, n, device)
    with _fp32_precision("high" if dtype == "tf32" else "highest"):
        seconds = _median_ns(call, device, warmup, repeats) * 1e-9
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


def measure(device: torch.device, quick: bool = False) -> dict[str, Any]:
    """Copy bandwidth and matmul peaks of ``device`` ("cpu" or a CUDA device).

    ``quick`` uses smaller buffers and fewer repeats (seconds instead of tens of seconds):
    good enough for a test, too noisy for a reference peak.
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
    bandwidth = copy_gbps(device, COPY_BYTES[key], warmup, repeats)
    peaks: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for dtype in matmul_dtypes(device):
        try:
            peaks[dtype] = matmul_tflops(dtype, device, n, warmup, repeats)
        except (RuntimeError, NotImplementedError) as exc:
            # a torch build without this kernel: say so instead of failing the whole run
            skipped[dtype] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if skipped:
        details["skipped"] = skipped
    return {
        "device": device_key(device),
        "device_name": name,
        "copy_gbps": bandwidth,
        "matmul_tflops": peaks,
        "created_at": time.time(),
        "details": details,
    }
