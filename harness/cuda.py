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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
        return ("NVRTC is not installed: `pip install nvidia-cuda-nvrtc` (or install the CUDA "
                "toolkit) to compile CUDA C++ sources")
    try:  # cuda.core 1.2 or newer: the program cache came with it
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except Exception as exc:
        return f"cuda.core is missing or too old ({exc}): `pip install 'cuda-core>=1.2'`"
    return None


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


def _toolkit_include() -> Path | None:
    """The CUDA runtime headers (cuda_fp16.h, ...) when a toolkit or wheel provides them."""
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception:
        return None
    return Path(found) if found else None


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
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

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
    where = cache_dir()
    disk = FileStreamProgramCache(where) if where is not None else None
    try:
        cached = disk.get(digest) if disk is not None else None
        symbols = disk.get(digest + b".symbols") if disk is not None and names else None
        if cached is not None and (symbols is not None or not names):
            module = CompiledModule(filename, arch, bytes(cached), key,
                                    json.loads(symbols) if symbols else {}, True)
        else:
            module = _compile(source, filename, arch, opts, names, key)
            if disk is not None:
                disk[digest] = module.cubin
                if names:
                    disk[digest + b".symbols"] = json.dumps(module.symbol_mapping).encode()
    finally:
        if disk is not None:
            disk.close()
    _MODULES[key] = module
    return module


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


_STREAMS: dict[int, Any] = {}


def launch(module: CompiledModule, kernel: str, grid: int | Sequence[int],
           block: int | Sequence[int], args: Sequence[Any], *, shared_mem: int = 0,
           device: Any = None) -> None:
    """Launch ``kernel`` of ``module`` on torch's current stream of ``device`` (so CUDA events
    and graph capture see it like any torch kernel). A grid with a zero dimension launches
    nothing (an empty tensor)."""
    import torch
    from cuda.core import LaunchConfig, Stream
    from cuda.core import launch as core_launch

    device = torch.device(device) if device is not None else \
        torch.device("cuda", torch.cuda.current_device())
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if any(int(d) == 0 for d in dims):
        return
    converted = kernel_arguments(kernel, args, device)
    handle = torch.cuda.current_stream(device).cuda_stream
    stream = _STREAMS.get(handle)
    if stream is None:
        stream = _STREAMS[handle] = Stream.from_handle(handle)
    config = LaunchConfig(grid=grid if isinstance(grid, int) else tuple(grid),
                          block=block if isinstance(block, int) else tuple(block),
                          shmem_size=int(shared_mem))
    core_launch(stream, config, module.kernel(kernel), *converted)
