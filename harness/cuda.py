"""Lazy CUDA device queries through cuda-python, without a torch CUDA context.

Nothing here runs at import time: ``import harness`` must work, and stay cheap, on a machine
with no GPU and no driver. Every query returns "no devices" when the driver library is absent.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _driver() -> Any | None:
    """The initialised cuda.bindings driver module, or None without a usable driver."""
    try:
        from cuda.bindings import driver
    except Exception:
        return None
    try:
        (err,) = driver.cuInit(0)
    except Exception:  # the driver library itself is missing (DynamicLibNotFoundError)
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return driver


def driver_available() -> bool:
    """Whether a CUDA driver is installed and initialises."""
    return _driver() is not None


def device_count() -> int:
    """Number of CUDA devices the driver sees (0 without a driver)."""
    drv = _driver()
    if drv is None:
        return 0
    err, count = drv.cuDeviceGetCount()
    return int(count) if err == drv.CUresult.CUDA_SUCCESS else 0


def devices() -> list[dict[str, Any]]:
    """Name, compute capability and memory of each device, from the driver alone."""
    drv = _driver()
    if drv is None:
        return []
    out = []
    attr = drv.CUdevice_attribute
    for i in range(device_count()):
        _, dev = drv.cuDeviceGet(i)
        _, name = drv.cuDeviceGetName(256, dev)
        _, major = drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        _, total = drv.cuDeviceTotalMem(dev)
        out.append({
            "index": i,
            "name": name.split(b"\0", 1)[0].decode(errors="replace"),
            "capability": f"{major}.{minor}",
            "memory_bytes": int(total),
        })
    return out


def driver_version() -> str | None:
    """CUDA driver API version as ``major.minor``, or None."""
    drv = _driver()
    if drv is None:
        return None
    err, version = drv.cuDriverGetVersion()
    if err != drv.CUresult.CUDA_SUCCESS:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def nvrtc_version() -> str | None:
    """NVRTC version if the library loads (the nvidia-cuda-nvrtc wheel or a CUDA toolkit)."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:
        return None
    return f"{major}.{minor}" if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None
