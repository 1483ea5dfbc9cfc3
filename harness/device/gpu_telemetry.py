"""GPU clocks, temperature, power and throttle reasons through NVML (``nvidia-ml-py``).

A timing is only comparable with another taken at the same clocks: a GPU that throttled for
heat or power during the repeats runs slower for reasons outside the kernel. ``snapshot`` reads
what NVML knows at one instant; the timing code takes one right before and one right after the
repeats. Everything here is best effort: without pynvml or the driver it returns None, and it
never raises.
"""

from __future__ import annotations

import functools
import os
from typing import Any

#: NVML's clocks-event ("throttle") reason bits, named; the bits are NVML's ABI
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_reason_names(mask: int) -> list[str]:
    """Names of the reason bits set in an NVML clocks-event mask (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        names.append(hex(mask & ~known))
    return names


@functools.lru_cache(maxsize=1)
def _nvml() -> Any | None:
    """The initialised pynvml module, or None without pynvml or a driver (checked once)."""
    try:
        import pynvml
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def nvml() -> Any | None:
    """The initialised pynvml module, or None (for other modules' one-off questions)."""
    return _nvml()


def _handle(nvml: Any, device_index: int) -> Any | None:
    """NVML's handle of the CUDA device ``device_index`` as this process numbers it.

    CUDA numbers devices after CUDA_VISIBLE_DEVICES and in its own order, NVML numbers all of
    them in PCI order, so the device is matched by UUID when torch has a CUDA context; by index
    only when nothing can have renumbered the devices.
    """
    try:
        import torch

        if torch.cuda.is_initialized():
            uuid = str(torch.cuda.get_device_properties(device_index).uuid)
            prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
            return nvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
    except Exception:
        pass
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        try:
            return nvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            return None
    return None


def _read(fn: Any, *args: Any) -> Any | None:
    # one unsupported field (power on some boards) must not lose the others
    try:
        return fn(*args)
    except Exception:
        return None


def snapshot(device_index: int) -> dict[str, Any] | None:
    """SM and memory clocks (MHz), max SM clock, temperature (C), power (W) and the active
    throttle reasons of CUDA device ``device_index``; None where NVML is unavailable."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = _handle(nvml, device_index)
        if handle is None:
            return None
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = _read(reasons_fn, handle) if reasons_fn is not None else None
        power_mw = _read(nvml.nvmlDeviceGetPowerUsage, handle)
        return {
            "sm_clock_mhz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": _read(nvml.nvmlDeviceGetMaxClockInfo, handle,
                                      nvml.NVML_CLOCK_SM),
            "temperature_c": _read(nvml.nvmlDeviceGetTemperature, handle,
                                   nvml.NVML_TEMPERATURE_GPU),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "throttle_reasons": None if mask is None else throttle_reason_names(int(mask)),
        }
    except Exception:
        return None
