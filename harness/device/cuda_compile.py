"""CUDA C++ source compiled with NVRTC (cuda.core) to a cubin for one architecture, cached in
memory and on disk (keyed by the source, options, architecture, NVRTC version and the headers it
may include), with the CUDA runtime headers of NVRTC's major on the include path. Functions of
``harness.device.cuda`` are called through the module, so that tests can stand in for them."""

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

from harness.device import cuda
from harness.device.cuda import DEFAULT_ARCH, CudaCompileError, CudaUnavailable, first_line

#: header suffixes whose contents key the cache (a source's own directory is on the include
#: path, so an edited header must recompile)
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".hh", ".inc", ".inl")

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
    if path is None or headers_problem(cuda.nvrtc_version(), version):
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
    missing = cuda.nvrtc_missing()
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
