"""Peak memory of one implementation call, above what was allocated before it.

On CUDA it is the caching allocator's peak (``torch.cuda.max_memory_allocated`` after a reset)
minus the bytes allocated when the call began: the call's own temporaries and outputs. On a
Linux CPU it is the process's resident-set high-water mark (reset through
``/proc/self/clear_refs``) minus the resident set when the call began, after returning free
heap pages to the system: the memory the call touched, page-granular and shared with any other
thread of the process, so a labelled best effort. Elsewhere it is not measured, and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from typing import Any

import torch

CUDA_KIND = "cuda_allocated_peak"
CPU_KIND = "cpu_rss_peak"
NOT_MEASURED = "not_measured"

_libc: Any = None


def libc() -> Any:
    """The C library through ctypes, or None where it cannot be loaded."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    return _libc or None


def _malloc_trim() -> None:
    """Give free heap pages back, so that reusing them during the call counts as touching."""
    lib = libc()
    if lib is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


def _status_bytes(status: Path, field: str) -> int | None:
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return None


class PeakMemory:
    """``with PeakMemory(device) as mem: fn()``; then ``mem.bytes`` (None when not measured)
    and ``mem.kind`` (CUDA_KIND, CPU_KIND or NOT_MEASURED)."""

    def __init__(self, device: torch.device, proc: str | Path = "/proc/self") -> None:
        self.device = device
        self.proc = Path(proc)
        self.bytes: int | None = None
        self.kind = NOT_MEASURED
        self._base: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        try:
            _malloc_trim()
            (self.proc / "clear_refs").write_text("5")  # 5: reset the peak RSS (Linux >= 4.0)
            self._base = _status_bytes(self.proc / "status", "VmRSS")
        except OSError:
            self._base = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.bytes, self.kind = max(0, peak - self._base), CUDA_KIND
            return
        try:
            peak = _status_bytes(self.proc / "status", "VmHWM")
        except OSError:
            return
        if peak is not None:
            self.bytes, self.kind = max(0, peak - self._base), CPU_KIND


def cuda_free_bytes(driver_free: int, reserved: int, allocated: int) -> int:
    """What a new tensor can use on a GPU: the driver's free memory plus what torch's caching
    allocator holds but no tensor uses (the driver counts that as used, so after one large
    case every later one would look short of memory)."""
    return driver_free + max(0, reserved - allocated)


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device``: CUDA's free device memory, a Linux CPU's
    MemAvailable; None where it cannot be known."""
    if device.type == "cuda":
        return cuda_free_bytes(int(torch.cuda.mem_get_info(device)[0]),
                               torch.cuda.memory_reserved(device),
                               torch.cuda.memory_allocated(device))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
