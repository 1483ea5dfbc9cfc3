"""CUDA through cuda-python, loaded lazily: device queries from the driver alone (no torch
CUDA context), and CUDA C++ source compiled with NVRTC (cuda.core) and launched on torch
tensors on torch's current stream.

Nothing here runs at import time: ``import harness`` must work, and stay cheap, on a machine
with no GPU and no driver. Every query returns "no devices" when the driver library is absent;
compiling needs only NVRTC (the ``nvidia-cuda-nvrtc`` wheel), so a CPU machine can check that
a kernel compiles for sm_90 without running it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


# ---------------------------------------------------------------- NVRTC
#: the architecture compiled for when no device says otherwise (Hopper)
DEFAULT_ARCH = "sm_90"
#: header suffixes whose contents key the cache (a source's own directory is on the include
#: path, so an edited header must recompile)
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".hh", ".inc", ".inl")


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


_LOG_LINE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error): "
                       r"(?P<text>.*)$", re.MULTILINE)


def _compile_error(filename: str, log: str) -> CudaCompileError:
    """A CudaCompileError whose headline is the log's first error as ``file:line: ...``."""
    first = _LOG_LINE.search(log)
    if first is None:
        line = next((ln.strip() for ln in log.splitlines() if ln.strip()), "no compiler log")
        return CudaCompileError(f"{filename}: {line}", log)
    return CudaCompileError(f"{first['file']}:{first['line']}: {first['kind']}: "
                            f"{first['text'].strip()}", log)


def _nvrtc_log(exc: Exception) -> str:
    """The compiler log inside cuda.core's NVRTCError message."""
    text = str(exc)
    _, sep, log = text.partition("compilation log:")
    return log.strip("\n ") if sep else text


def cache_dir() -> Path | None:
    """Where compiled cubins are kept across processes: ``$HARNESS_CUDA_CACHE``, else
    ``$XDG_CACHE_HOME/kernel-harness/nvrtc``; ``HARNESS_CUDA_CACHE=off`` keeps them in memory
    only."""
    env = os.environ.get("HARNESS_CUDA_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-harness" / "nvrtc"


#: how deep below a source's directory headers are fingerprinted (``#include "sub/x.h"``)
HEADER_DEPTH = 3


def _headers(root: Path) -> list[Path]:
    """Header files under ``root``, at most HEADER_DEPTH levels down, hidden and cache
    directories skipped (a source at a project's root must not hash its whole tree)."""
    found = []
    for here, dirs, files in os.walk(root):
        depth = len(Path(here).relative_to(root).parts)
        dirs[:] = [] if depth >= HEADER_DEPTH else sorted(
            d for d in dirs if not d.startswith(".") and d not in ("__pycache__",
                                                                   "node_modules"))
        found += [Path(here) / f for f in files if Path(f).suffix in HEADER_SUFFIXES]
    return sorted(found)


def _header_digest(include_dirs: Sequence[Path]) -> bytes:
    """A fingerprint of the headers a source may include from its own directories (names and
    contents), so that editing one recompiles; system include directories count by path."""
    h = hashlib.sha256()
    for d in include_dirs:
        h.update(str(d).encode() + b"\0")
        if not d.is_dir() or d.name == "include":  # a toolkit's include dir: its path suffices
            continue
        for f in _headers(d):
            h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


_CUDART_VERSION = re.compile(r"^\s*#\s*define\s+CUDART_VERSION\s+(\d+)", re.MULTILINE)


def cudart_version(include_dir: Path) -> int | None:
    """CUDART_VERSION of the runtime headers in ``include_dir`` (13000 for 13.0), from
    cuda_runtime_api.h, where the toolkit defines it; None when unreadable."""
    try:
        text = (include_dir / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    found = _CUDART_VERSION.search(text)
    return int(found.group(1)) if found else None


@functools.lru_cache(maxsize=1)
def runtime_headers() -> tuple[Path | None, int | None]:
    """The CUDA runtime headers (cuda_fp16.h, ...) a toolkit or wheel provides, and their
    version. cuda-pathfinder looks in the wheels, CONDA_PREFIX, CUDA_PATH/CUDA_HOME and beside
    a loadable libcudart, with no regard to NVRTC's version (find_nvidia_headers.py)."""
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:
        return None, None
    if not found:
        return None, None
    return Path(found), cudart_version(Path(found))


def _toolkit_include() -> Path | None:
    """The runtime headers for NVRTC's include path, when their CUDA major is NVRTC's: the
    headers of another major declare what that NVRTC does not know (a CUDA 12 toolkit's
    beside NVRTC 13), so they are left out and ``harness env`` says so."""
    from harness.device.bringup import headers_problem

    path, version = runtime_headers()
    if path is None or headers_problem(nvrtc_version(), version):
        return None
    return path


@dataclass
class CompiledModule:
    """A cubin compiled from one source for one architecture, and its kernels once loaded."""

    filename: str
    arch: str
    cubin: bytes
    key: str
    symbol_mapping: dict[str, str] = field(default_factory=dict)
    from_cache: bool = False
    _object: Any = field(default=None, repr=False)
    _kernels: dict[str, Any] = field(default_factory=dict, repr=False)

    def kernel(self, name: str) -> Any:
        """The cuda.core Kernel ``name`` (an ``extern "C"`` name, or a name expression given
        at compile time); loads the cubin into the current context on first use."""
        if name not in self._kernels:
            from cuda.core import ObjectCode

            if self._object is None:  # NVRTC gives the lowered names as bytes
                lowered = {k: v.encode() for k, v in self.symbol_mapping.items()}
                self._object = ObjectCode.from_cubin(self.cubin, name=self.filename,
                                                     symbol_mapping=lowered or None)
            try:
                self._kernels[name] = self._object.get_kernel(name)
            except Exception as exc:
                raise KeyError(f"{self.filename} has no kernel {name!r} ({exc}); a kernel "
                               'must be extern "C" __global__, or a template named in '
                               "name_expressions") from exc
        return self._kernels[name]


_MODULES: dict[str, CompiledModule] = {}


def compile_source(source: str, *, filename: str = "kernel.cu", arch: str = DEFAULT_ARCH,
                   options: Mapping[str, Any] | None = None,
                   name_expressions: Sequence[str] = (),
                   include_dirs: Sequence[str | Path] = ()) -> CompiledModule:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` with NVRTC, or take it from the cache.

    ``options`` are :class:`cuda.core.ProgramOptions` fields (``{"std": "c++17",
    "define_macro": "N=4"}``); ``filename`` names the source in compiler messages. The cache is
    keyed by the source, options, architecture, NVRTC version and the headers of
    ``include_dirs``: in memory for this process, and on disk (:func:`cache_dir`) for the ranks
    and runs that follow. Raises CudaCompileError with the log, or CudaUnavailable.
    """
    missing = nvrtc_missing()
    if missing:
        raise CudaUnavailable(missing)
    from cuda.core import ProgramOptions
    from cuda.core.utils import make_program_cache_key

    dirs = [Path(d) for d in include_dirs]
    toolkit = _toolkit_include()
    if toolkit is not None and toolkit not in dirs:
        dirs.append(toolkit)
    fields = {"std": "c++17", **(options or {})}
    if dirs:
        fields["include_path"] = [str(d) for d in dirs]
    try:
        opts = ProgramOptions(name=filename, arch=arch, **fields)
    except TypeError as exc:
        raise CudaCompileError(f"{filename}: bad compile option ({exc}); options are "
                               "cuda.core.ProgramOptions fields", "") from exc
    names = tuple(name_expressions)
    digest = make_program_cache_key(code=source, code_type="c++", options=opts,
                                    target_type="cubin", name_expressions=names,
                                    extra_digest=_header_digest(dirs))
    key = digest.hex()
    if key in _MODULES:
        return _MODULES[key]
    disk = _disk_cache()
    try:
        cached = _cache_get(disk, digest)
        symbols = _cache_get(disk, digest + b".symbols") if names else None
        if cached is not None and (symbols is not None or not names):
            module = CompiledModule(filename, arch, bytes(cached), key,
                                    json.loads(symbols) if symbols else {}, True)
        else:
            module = _compile(source, filename, arch, opts, names, key)
            _cache_put(disk, digest, module.cubin)
            if names:
                _cache_put(disk, digest + b".symbols", json.dumps(module.symbol_mapping).encode())
    finally:
        if disk is not None:
            disk.close()
    _MODULES[key] = module
    return module


#: disk-cache directories already reported unusable (said once per process)
_UNUSABLE_CACHES: set[str] = set()


def _cache_unusable(exc: OSError) -> None:
    where = str(cache_dir())
    if where not in _UNUSABLE_CACHES:
        _UNUSABLE_CACHES.add(where)
        warnings.warn(f"the NVRTC disk cache {where} is unusable ({first_line(exc)}): compiled "
                      "kernels are kept in memory only; point HARNESS_CUDA_CACHE at a writable "
                      "directory (or set it to off)", RuntimeWarning, stacklevel=3)


def _disk_cache() -> Any | None:
    """cuda.core's FileStreamProgramCache at :func:`cache_dir`, or None: off, or unusable (its
    constructor makes the directories and lets OSError through; _file_stream.py)."""
    from cuda.core.utils import FileStreamProgramCache

    where = cache_dir()
    if where is None:
        return None
    try:
        return FileStreamProgramCache(where)
    except OSError as exc:
        _cache_unusable(exc)
        return None


def _cache_get(disk: Any | None, key: bytes) -> Any | None:
    if disk is None:
        return None
    try:  # get() turns only a missing entry into the default; other OSErrors pass through
        return disk.get(key)
    except OSError as exc:
        _cache_unusable(exc)
        return None


def _cache_put(disk: Any | None, key: bytes, value: bytes) -> None:
    if disk is None:
        return
    try:  # a read-only directory fails here (mkstemp), not in the constructor
        disk[key] = value
    except OSError as exc:
        _cache_unusable(exc)


def _compile(source: str, filename: str, arch: str, opts: Any, names: tuple[str, ...],
             key: str) -> CompiledModule:
    from cuda.core import Program

    program = Program(source, code_type="c++", options=opts)
    error: CudaCompileError | None = None
    try:
        obj = program.compile("cubin", name_expressions=names)
    except Exception as exc:
        if type(exc).__name__ != "NVRTCError" and "NVRTC" not in str(exc):
            raise
        error = _compile_error(filename, _nvrtc_log(exc))
    program.close()
    del program  # freed here, not while the error unwinds (cuda.core 1.2's dealloc trips then)
    if error is not None:
        raise error
    symbols = {str(k): (v.decode() if isinstance(v, bytes) else str(v))
               for k, v in (obj.symbol_mapping or {}).items()}
    return CompiledModule(filename, arch, bytes(obj.code), key, symbols)


# ---------------------------------------------------------------- launch
class KernelArgumentError(TypeError):
    """A kernel argument whose C type is ambiguous or whose tensor is on the wrong device."""


def kernel_arguments(kernel: str, args: Sequence[Any], device: Any) -> list[Any]:
    """cuda.core launch arguments: a torch tensor becomes its data pointer (it must live on
    ``device``); numpy and ctypes scalars pass as their C types. A bare Python int, float or
    bool is refused, since its C type (pointer? int32? int64? float or double?) is a guess."""
    import numpy as np
    import torch

    out: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.device != device:
                raise KernelArgumentError(
                    f"kernel {kernel!r} argument {i}: a tensor on {a.device}, but the kernel "
                    f"runs on {device}; move it with .to({str(device)!r})")
            out.append(a.data_ptr())
        elif isinstance(a, (bool, int, float)) and not isinstance(a, np.generic):
            kind = type(a).__name__
            hint = "np.float32(v) or np.float64(v)" if kind == "float" else \
                "np.int64(v), np.int32(v) or np.uint32(v)"
            raise KernelArgumentError(
                f"kernel {kernel!r} argument {i}: a Python {kind} has no C type; pass {hint} "
                "to say which the kernel takes")
        else:
            out.append(a)
    return out


def launch_dims(value: Any, what: str) -> int | tuple[int, ...]:
    """A grid or block as cuda.core's LaunchConfig takes it: a Python int, or a tuple of one to
    three Python ints. LaunchConfig accepts nothing else (``cast_to_3_tuple`` in cuda.core 1.2:
    a numpy integer raises ValueError), so numpy and torch integers become ints here; floats,
    bools, negatives and more than three dims are refused with what to pass instead."""
    import operator

    def one(v: Any) -> int:
        if isinstance(v, (bool, float)) or (hasattr(v, "dtype") and getattr(
                v.dtype, "is_floating_point", False)):
            raise KernelArgumentError(f"{what} {v!r} is not an integer; pass ints")
        try:
            n = operator.index(v)
        except TypeError as exc:
            raise KernelArgumentError(f"{what} {v!r} is not an integer; pass an int or a tuple "
                                      "of up to 3 ints") from exc
        if n < 0:
            raise KernelArgumentError(f"{what} {n} is negative")
        return int(n)

    if isinstance(value, (tuple, list)):
        dims = tuple(one(v) for v in value)
        if not 1 <= len(dims) <= 3:
            raise KernelArgumentError(f"{what} {value!r} has {len(dims)} dims; a launch takes "
                                      "1 to 3")
        return dims
    return one(value)


class _LaunchCache:
    """What a launch can reuse from the last one (a small kernel's events time counts every
    microsecond of Python between the two events): cuda.core Streams by handle (from_handle
    builds a class per call, ~10 us), LaunchConfigs by (grid, block, shared memory), and the
    cuda.core names themselves."""

    def __init__(self) -> None:
        self.streams: dict[int, Any] = {}
        self.configs: dict[tuple[Any, Any, int], Any] = {}
        self.core: tuple[Any, Any, Any] | None = None

    def stream(self, handle: int) -> Any:
        stream = self.streams.get(handle)
        if stream is None:
            stream = self.streams[handle] = self.core_names()[1].from_handle(handle)
        return stream

    def config(self, grid: Any, block: Any, shared_mem: int) -> Any:
        key = (grid, block, shared_mem)
        cfg = self.configs.get(key)
        if cfg is None:
            cfg = self.configs[key] = self.core_names()[0](grid=grid, block=block,
                                                           shmem_size=shared_mem)
        return cfg

    def core_names(self) -> tuple[Any, Any, Any]:
        if self.core is None:
            from cuda.core import LaunchConfig, Stream
            from cuda.core import launch as core_launch

            self.core = (LaunchConfig, Stream, core_launch)
        return self.core


_CACHE = _LaunchCache()


def current_stream_handle(device: Any) -> int:
    """The raw cudaStream_t of torch's current stream on ``device``, without making a Stream
    object: torch._C._cuda_getCurrentRawStream(device_index) -> int, what torch's Inductor
    passes its Triton launches (torch 2.13: _dynamo/device_interface.py, _C/__init__.pyi)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(device).cuda_stream)


def launch(module: CompiledModule, kernel: str, grid: Any, block: Any, args: Sequence[Any], *,
           shared_mem: int = 0, device: Any = None) -> None:
    """Launch ``kernel`` of ``module`` on torch's current stream of ``device`` (so CUDA events
    and graph capture see it like any torch kernel). A grid with a zero dimension launches
    nothing (an empty tensor)."""
    import torch

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    grid = launch_dims(grid, "grid")
    block = launch_dims(block, "block")
    if grid == 0 or (isinstance(grid, tuple) and 0 in grid):
        return
    converted = kernel_arguments(kernel, args, device)
    stream = _CACHE.stream(current_stream_handle(device))
    config = _CACHE.config(grid, block, int(shared_mem))
    # cuda.core 1.2 launch(stream, config, kernel, *args): packs args (ParamHolder), then
    # cuLaunchKernelEx with the GIL released (_launcher.pyx)
    _CACHE.core_names()[2](stream, config, module.kernel(kernel), *converted)
