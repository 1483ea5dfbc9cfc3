"""CUDA through cuda-python, loaded lazily: device queries from the driver alone (no torch
CUDA context), the versions of the driver, cuda-bindings and NVRTC, and whether a CUDA C++
source can be compiled and loaded here. Compiling is ``harness.device.cuda_compile``'s,
launching on torch tensors ``harness.device.kernel_launch``'s.

Nothing here runs at import time: ``import harness`` must work, and stay cheap, on a machine
with no GPU and no driver. Every query returns "no devices" when the driver library is absent;
compiling needs only NVRTC (the ``nvidia-cuda-nvrtc`` wheel), so a CPU machine can check that
a kernel compiles for sm_90 without running it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DriverState:
    """cuda-python's view of the driver: the initialised ``cuda.bindings.driver`` module or
    None, whether a driver library exists at all, and, when one exists but cannot be used,
    the error it gave (kept for ``harness env``, never swallowed into "no GPU")."""

    module: Any | None
    present: bool
    error: str = ""


def _error_name(drv: Any, err: Any) -> str:
    """``CUDA_ERROR_NO_DEVICE`` for a CUresult (cuGetErrorName returns (CUresult, bytes))."""
    try:
        res, name = drv.cuGetErrorName(err)
        if res == drv.CUresult.CUDA_SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - naming an error must not raise another
        pass
    return getattr(err, "name", str(err))


def first_line(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@functools.lru_cache(maxsize=1)
def driver_state() -> DriverState:
    """The driver as cuda-python finds it, initialised once per process.

    cuda-bindings loads libcuda on the first call and resolves each entry point through
    cuGetProcAddress at the CUDA version that introduced it (cuda_bindings'
    _internal/driver_linux.pyx), so cuInit works on older drivers too and a function the
    driver lacks raises FunctionNotFoundError when called; without a driver library the call
    raises DynamicLibNotFoundError. cuInit returns CUDA_ERROR_NO_DEVICE on a machine with a
    driver and no GPU: that is no GPU, not a problem."""
    try:
        from cuda.bindings import driver
    except Exception as exc:  # noqa: BLE001
        return DriverState(None, False, f"cuda-python cannot be imported ({first_line(exc)})")
    return init_driver(driver)


def init_driver(driver: Any) -> DriverState:
    """cuInit on ``driver`` (cuda.bindings.driver, or a stand-in in tests), classified."""
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001
        if type(exc).__name__ == "DynamicLibNotFoundError":
            return DriverState(None, False)
        return DriverState(None, True, f"cuInit raised {first_line(exc)}")
    if err == driver.CUresult.CUDA_SUCCESS:
        return DriverState(driver, True)
    name = _error_name(driver, err)
    if name == "CUDA_ERROR_NO_DEVICE":
        return DriverState(None, True)
    return DriverState(None, True, f"cuInit failed with {name}")


def _driver() -> Any | None:
    """The initialised cuda.bindings driver module, or None without a usable driver."""
    return driver_state().module


def driver_available() -> bool:
    """Whether a CUDA driver is installed and initialises."""
    return _driver() is not None


def uuid_text(raw: bytes | str) -> str:
    """A GPU's UUID as nvidia-smi and NVML write it: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``
    from the driver's 16 bytes or torch's text (which has no prefix); MIG UUIDs kept as are."""
    if isinstance(raw, (bytes, bytearray)):
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    text = str(raw).strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _query(drv: Any, what: str, fn: Any, *args: Any) -> tuple[Any, str]:
    """(value, "") of a driver query, or (None, why) with the driver's error name."""
    try:
        err, *value = fn(*args)
    except Exception as exc:  # noqa: BLE001
        return None, f"{what}: {first_line(exc)}"
    if err != drv.CUresult.CUDA_SUCCESS:
        return None, f"{what}: {_error_name(drv, err)}"
    return (value[0] if len(value) == 1 else tuple(value)), ""


def _ask(drv: Any, errors: list[str], what: str, fn: Any, *args: Any) -> Any:
    """A driver query's value, or None with its error appended to ``errors``."""
    value, why = _query(drv, what, fn, *args)
    if why:
        errors.append(why)
    return value


def device_records(drv: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Each device the driver ``drv`` sees (index, uuid, name, capability, memory, compute
    mode) and the errors of the queries that failed, every CUresult checked."""
    from harness.device.placement import COMPUTE_MODES

    count, why = _query(drv, "cuDeviceGetCount", drv.cuDeviceGetCount)
    if why:
        return [], [why]
    attr = drv.CUdevice_attribute
    records: list[dict[str, Any]] = []
    errors: list[str] = []
    for i in range(int(count)):
        dev = _ask(drv, errors, f"cuDeviceGet({i})", drv.cuDeviceGet, i)
        if dev is None:
            continue
        # cuda-bindings 13: cuDeviceGetUuid(dev) -> (CUresult, CUuuid), the _v2 entry point
        # inside; CUuuid.bytes is 16 bytes. cuDeviceGetAttribute(attr, dev) -> (CUresult, int)
        uuid = _ask(drv, errors, f"device {i} uuid", drv.cuDeviceGetUuid, dev)
        name = _ask(drv, errors, f"device {i} name", drv.cuDeviceGetName, 256, dev)
        major, minor, mode = (
            _ask(drv, errors, f"device {i} {what}", drv.cuDeviceGetAttribute, a, dev)
            for what, a in (("capability", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            ("capability", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
                            ("compute mode", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)))
        total = _ask(drv, errors, f"device {i} memory", drv.cuDeviceTotalMem, dev)
        if uuid is None:  # without its UUID a device cannot be told apart: leave it out
            continue
        records.append({
            "index": i,
            "uuid": uuid_text(uuid.bytes if hasattr(uuid, "bytes") else uuid),
            "name": (name.split(b"\0", 1)[0].decode(errors="replace")
                     if isinstance(name, bytes) else str(name or "")),
            "capability": f"{major}.{minor}" if major is not None else "?",
            "memory_bytes": int(total) if total is not None else 0,
            "compute_mode": COMPUTE_MODES.get(int(mode), str(mode)) if mode is not None
            else "unknown",
        })
    return records, errors


@functools.lru_cache(maxsize=1)
def _device_records() -> tuple[list[dict[str, Any]], list[str]]:
    drv = _driver()
    return device_records(drv) if drv is not None else ([], [])


def device_count() -> int:
    """Number of CUDA devices the driver sees (0 without a usable driver)."""
    return len(_device_records()[0])


def devices() -> list[dict[str, Any]]:
    """Index, UUID, name, compute capability, memory and compute mode of each device, from the
    driver alone (no torch context)."""
    return [dict(r) for r in _device_records()[0]]


def device_errors() -> list[str]:
    """The driver queries about devices that failed, with the driver's error names."""
    return list(_device_records()[1])


def visible_gpus() -> tuple[Any, ...]:
    """The GPUs this process sees, as placement facts (``placement.GpuFacts``): the driver's
    list through cuda-python, or torch's when cuda-python cannot use the driver (its error
    stays in :func:`driver_state` for ``harness env``) or failed to describe every device."""
    from harness.device.placement import GpuFacts

    records, errors = _device_records()
    if records or (driver_state().module is not None and not errors):
        return tuple(GpuFacts(r["uuid"], r["name"], r["compute_mode"], r["index"])
                     for r in records)
    return torch_gpus()


def torch_gpus() -> tuple[Any, ...]:
    """The GPUs torch's runtime sees (UUID, name; compute mode from NVML when it answers). On a
    CPU-only torch, none. torch.cuda.device_count asks NVML first and does not poison fork
    when NVML answers (torch/cuda/__init__.py); device properties initialise torch's CUDA."""
    import torch

    from harness.device.placement import GpuFacts

    if not torch.version.cuda:
        return ()
    try:
        count = torch.cuda.device_count()
        found = []
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            uuid = uuid_text(str(props.uuid))  # a _CUuuid whose str() has no GPU- prefix
            found.append(GpuFacts(uuid, props.name, _nvml_compute_mode(uuid), i))
    except Exception:  # noqa: BLE001 - torch cannot see them either: no GPU for this process
        return ()
    return tuple(found)


def _nvml_compute_mode(uuid: str) -> str:
    """A GPU's compute mode from NVML (NVML_COMPUTEMODE_* numbers the modes as CUDA does)."""
    from harness.device import gpu_telemetry
    from harness.device.placement import COMPUTE_MODES

    nvml = gpu_telemetry.nvml()
    try:
        mode = nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid))
    except Exception:  # noqa: BLE001
        return "unknown"
    return COMPUTE_MODES.get(int(mode), str(mode))


def nvml_gpu_count() -> int:
    """GPUs NVML sees after CUDA_VISIBLE_DEVICES ("" or -1 hides them all; NVML itself
    ignores the variable), for telling "no GPU" from "GPUs nobody here can use"."""
    from harness.device import gpu_telemetry

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip()]
        if not entries or entries[0].strip() == "-1":
            return 0
    nvml = gpu_telemetry.nvml()
    try:
        count = int(nvml.nvmlDeviceGetCount()) if nvml is not None else 0
    except Exception:  # noqa: BLE001
        return 0
    return min(count, len(entries)) if visible is not None else count


def mps_running() -> bool:
    """Whether an MPS control daemon serves this node (its pipe directory has a control
    socket: $CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps by default)."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    return (pipe / "control").exists()


def driver_version() -> str | None:
    """CUDA driver API version as ``major.minor``, or None."""
    from harness.device.bringup import fmt_api_version

    v = driver_api_version()
    return None if v is None else fmt_api_version(v)


def driver_api_version() -> int | None:
    """The driver's CUDA version as the driver API encodes it (12040 for 12.4): from
    cuda-python, else from NVML (which works with any driver, whatever cuda-python's major)."""
    state = driver_state()
    if state.module is not None:
        value, why = _query(state.module, "cuDriverGetVersion", state.module.cuDriverGetVersion)
        if not why:
            return int(value)
    from harness.device import gpu_telemetry

    nvml = gpu_telemetry.nvml()
    try:
        return int(nvml.nvmlSystemGetCudaDriverVersion()) if nvml is not None else None
    except Exception:  # noqa: BLE001
        return None


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str | None:
    """NVRTC version if the library loads (the nvidia-cuda-nvrtc wheel or a CUDA toolkit)."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:
        return None
    return f"{major}.{minor}" if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def bindings_version() -> str | None:
    """The installed cuda-bindings version (its major must not exceed the driver's)."""
    try:
        from cuda.bindings import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001
        return None
#: the architecture compiled for when no device says otherwise (Hopper)
DEFAULT_ARCH = "sm_90"


class CudaCompileError(Exception):
    """NVRTC rejected a source. ``headline`` is the first error as ``file:line: error: text``,
    ``log`` the compiler's whole log; ``str()`` is the headline with the log under it, so a
    case whose kernel fails to compile keeps the log in its reason."""

    def __init__(self, headline: str, log: str):
        super().__init__(headline)
        self.headline = headline
        self.log = log

    def __str__(self) -> str:
        return self.full()

    def full(self) -> str:
        """The headline, then the compiler log indented under it."""
        body = "\n".join("    " + line for line in self.log.strip().splitlines())
        return f"{self.headline}\nNVRTC log:\n{body}" if body else self.headline


class CudaUnavailable(RuntimeError):
    """NVRTC or the CUDA driver is missing; the message says what to install."""


def nvrtc_missing() -> str | None:
    """Why NVRTC cannot compile here, or None when it can."""
    if nvrtc_version() is None:
        from harness.device.bringup import CUDA13_INSTALL

        return f"NVRTC is not installed: {CUDA13_INSTALL} to compile CUDA C++ sources"
    try:  # cuda.core 1.2 or newer: the program cache came with it
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except Exception as exc:
        return f"cuda.core is missing or too old ({exc}): `pip install 'cuda-core>=1.2'`"
    return None


@functools.lru_cache(maxsize=1)
def run_problem() -> str | None:
    """Why a CUDA C++ source cannot be compiled *and loaded* on this machine's driver, with
    the install command, or None: NVRTC missing (the right wheel for the driver's CUDA major
    named), cuda.core missing, or an NVRTC of a newer CUDA major than the driver (its cubins
    do not load: minor-version compatibility holds within a major only)."""
    from harness.device.bringup import nvrtc_problem

    return nvrtc_problem(nvrtc_version(), driver_api_version()) or nvrtc_missing()


def arch_for(device: Any) -> str:
    """``sm_XY`` of a torch CUDA device (``sm_90`` on Hopper)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def driver_arch() -> str:
    """``sm_XY`` of the first GPU the driver sees (no torch context), else DEFAULT_ARCH."""
    gpus = devices()
    return f"sm_{gpus[0]['capability'].replace('.', '')}" if gpus else DEFAULT_ARCH
