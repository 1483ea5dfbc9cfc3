"""Implementations that launch Triton kernels: compiled on CUDA, interpreted on the CPU.

A Triton implementation is a plain callable with the op's signature that allocates its outputs
and launches its kernels (``kernel[grid](...)``), passed as ``--impl mypkg.kernels:fn`` or
``--impl path/kernels.py:fn``; the built-in ones are :class:`TritonImplementation` references,
whose module is imported on the first call.

Triton decides whether a kernel is compiled or interpreted when ``@triton.jit`` decorates it:
``triton.runtime.jit.jit`` returns an ``InterpretedFunction`` when ``knobs.runtime.interpret``
is true, and that knob is an ``env_bool`` that reads ``TRITON_INTERPRET`` on every access
(triton 3.9 runtime/jit.py and knobs.py). And triton.language's own ``@jit`` functions
(``tl.max``, ``tl.sum``) are decorated when triton is imported, so the setting must be there
before anything imports triton. The launcher puts ``TRITON_INTERPRET=1`` in the environment of
ranks that will run on the CPU (:func:`launcher_environment`), and each rank confirms it once
its device is decided (:func:`configure_rank`, before any implementation is resolved); the
launcher's own environment, and a GPU rank's, never carries it.

An interpreted result says so (``CaseResult.interpreter == "triton"``, an ``i`` beside its
time): it is timed with a token budget, since interpreter time is not kernel time, and that
makes it ``timing.minimal``, which keeps it out of the history's series
(``harness.history.regress.in_series``) and off the dashboard's trends, as a contended time is.

The compiled path's cache: Triton's ``FileCacheManager.put`` writes each file into a directory
of its own process and renames it into place with ``os.replace`` (triton runtime/cache.py), so
the ranks of a node share ``TRITON_CACHE_DIR`` (default ``~/.triton/cache``) safely: a reader
sees a whole file or none. The harness leaves that setting to the user.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

#: what a user runs to get Triton
INSTALL = "pip install -e '.[triton]' (or pip install triton)"
INTERPRET_ENV = "TRITON_INTERPRET"
#: set beside TRITON_INTERPRET=1 where the launcher guessed it (``launcher_environment``)
GUESS_ENV = "HARNESS_TRITON_INTERPRET_GUESS"
#: the interpreter's name in a result's timing
INTERPRETER = "triton"
#: the most elements a built-in kernel is run through the interpreter with: it runs a program
#: as numpy operations on its block, about 10**6 elements a second for a copy on one core
INTERPRET_MAX_ELEMENTS = 1 << 24


def available() -> bool:
    """Whether triton can be imported here (without importing it)."""
    return "triton" in sys.modules or importlib.util.find_spec("triton") is not None


@dataclasses.dataclass(frozen=True)
class DriverFacts:
    """What Triton's first compiled launch on CUDA needs from the host: it builds a C stub
    (its CUDA driver utilities and the kernel launcher) with the host's C compiler against
    Python.h and libcuda, into its cache directory (triton backends/nvidia/driver.py and
    runtime/build.py, 3.6 to 3.9)."""

    #: $CC, else gcc, else clang on PATH (build.py's _find_compiler)
    compiler: str | None
    #: the Python include directory build.py adds (sysconfig, posix_local read as
    #: posix_prefix) and whether Python.h is in it
    python_include: str
    python_h: bool
    #: directories holding libcuda.so.1 as driver.py's libcuda_dirs finds them:
    #: $TRITON_LIBCUDA_PATH, else `/sbin/ldconfig -p`, else $LD_LIBRARY_PATH
    libcuda_dirs: tuple[str, ...]
    #: why `/sbin/ldconfig -p` could not be read ("" when it could)
    ldconfig_error: str
    #: $TRITON_CACHE_DIR, else $TRITON_HOME (or ~)/.triton/cache, and whether it can be
    #: written (or made)
    cache_dir: str
    cache_writable: bool


def driver_problem(f: DriverFacts) -> str | None:
    """Why compiled Triton kernels cannot launch on this host (one line, each missing piece
    with its remedy), or None."""
    missing = []
    if not f.compiler:
        missing.append("no C compiler (Triton builds its launcher with $CC, gcc or clang: "
                       "apt-get install gcc, or set CC)")
    if not f.python_h:
        missing.append(f"no Python.h in {f.python_include} (apt-get install python3-dev, or "
                       "the python*-dev of this interpreter)")
    if not f.libcuda_dirs:
        missing.append("no libcuda.so.1 found" + (f" ({f.ldconfig_error})" if f.ldconfig_error
                                                  else "")
                       + ": run /sbin/ldconfig as root, or set TRITON_LIBCUDA_PATH to the "
                       "directory that holds libcuda.so.1")
    if not f.cache_writable:
        missing.append(f"its cache directory {f.cache_dir} cannot be written: set "
                       "TRITON_CACHE_DIR to a writable directory")
    if not missing:
        return None
    return "compiled Triton kernels cannot launch here: " + "; ".join(missing)


def _writable(path: str) -> bool:
    p = os.path.abspath(path)
    while not os.path.exists(p):  # the first existing ancestor must let us make the rest
        parent = os.path.dirname(p)
        if parent == p:
            return False
        p = parent
    return os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)


def driver_facts(environ: Mapping[str, str] = os.environ) -> DriverFacts:
    """This host's :class:`DriverFacts`, read as Triton reads them."""
    import shutil
    import subprocess
    import sysconfig

    compiler = environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    scheme = sysconfig.get_default_scheme()
    include = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local"
                                  else scheme)["include"]
    dirs: list[str] = []
    error = ""
    if environ.get("TRITON_LIBCUDA_PATH"):
        dirs = [environ["TRITON_LIBCUDA_PATH"]]
    else:
        try:
            listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                                     timeout=30, check=True).stdout
            dirs = sorted({os.path.dirname(line.split()[-1]) for line in listing.splitlines()
                           if "libcuda.so.1" in line})
        except (OSError, subprocess.SubprocessError) as exc:
            error = f"/sbin/ldconfig -p failed: {exc}"
        if not dirs:
            dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":")
                    if d and os.path.exists(os.path.join(d, "libcuda.so.1"))]
        dirs = [d for d in dirs if os.path.exists(os.path.join(d, "libcuda.so.1"))]
    home = environ.get("TRITON_HOME") or os.path.expanduser("~")
    cache = environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")
    return DriverFacts(compiler=compiler, python_include=include,
                       python_h=os.path.exists(os.path.join(include, "Python.h")),
                       libcuda_dirs=tuple(dirs), ldconfig_error=error, cache_dir=cache,
                       cache_writable=_writable(cache))


@functools.lru_cache(maxsize=1)
def host_driver_problem() -> str | None:
    """:func:`driver_problem` of this host, read once per process."""
    return driver_problem(driver_facts())


def interprets(device_type: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a rank on ``device_type`` runs Triton kernels through the interpreter: on the
    CPU always (Triton has no CPU code generator), on CUDA only where the user set
    TRITON_INTERPRET=1 (to debug a kernel on the GPU machine)."""
    if device_type != "cuda":
        return True
    return environ.get(INTERPRET_ENV, "0").strip().lower() in ("1", "true", "on")


def launcher_environment(requested_device: str, gpus_here: int,
                         environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a launcher adds to its ranks' environment so that TRITON_INTERPRET=1 is there
    before anything in a rank imports triton (triton.language's own ``@jit`` functions are
    compiled or interpreted at that import): where the ranks will run on the CPU, asked for
    (``--device cpu``) or by default with no GPU on this host. A guess, marked as one, which
    each rank confirms or undoes (:func:`configure_rank`: ranks of another host may have
    GPUs). The user's own TRITON_INTERPRET wins."""
    if INTERPRET_ENV in environ:
        return {}
    if requested_device == "cpu" or (requested_device == "auto" and gpus_here == 0):
        return {INTERPRET_ENV: "1", GUESS_ENV: "1"}
    return {}


def configure_rank(device_type: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set the interpreter up in a rank whose device is ``device_type``, before any Triton
    implementation module is imported (its kernels are decorated then): on, where the rank
    interprets; off on a GPU rank whose launcher guessed wrong."""
    if device_type == "cuda" and environ.get(GUESS_ENV):
        environ.pop(INTERPRET_ENV, None)
        environ.pop(GUESS_ENV, None)
    if interprets(device_type, environ):
        environ[INTERPRET_ENV] = "1"


def _kernel_types() -> tuple[type, ...]:
    """Triton's kernel classes, where triton is already imported (never imports it)."""
    if "triton" not in sys.modules:
        return ()
    from triton.runtime.jit import KernelInterface

    return (KernelInterface,)


def kernels_of(fn: Callable[..., Any]) -> list[Any]:
    """The Triton kernels (``@triton.jit``, autotuned or heuristic ones) among the globals of
    the module that defines ``fn``, and in the modules it imported by name (``import
    mypkg.kernels as k`` then ``k.scale[grid](...)``, triton's own excepted): how a plain
    callable is known to launch Triton."""
    kinds = _kernel_types()
    if not kinds:
        return []
    target = getattr(fn, "__wrapped__", fn)
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    names = getattr(target, "__globals__", None) or (vars(module) if module else {})
    values = list(names.values())
    for v in list(values):
        if issubclass(type(v), types.ModuleType) and not v.__name__.startswith("triton"):
            values += list(vars(v).values())
    # type(), not isinstance(): a deprecation proxy among a module's globals warns on __class__
    return [v for v in values if issubclass(type(v), kinds)]


def is_triton(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a Triton implementation: a :class:`TritonImplementation`, or a
    callable whose module defines Triton kernels."""
    return bool(getattr(fn, "triton", False)) or bool(kernels_of(fn))


def interpreter_of(fn: Callable[..., Any], device_type: str,
                   environ: Mapping[str, str] = os.environ) -> str:
    """``"triton"`` where ``fn`` runs through Triton's interpreter on ``device_type``, else
    ""."""
    return INTERPRETER if is_triton(fn) and interprets(device_type, environ) else ""


def mode_problem(fn: Callable[..., Any], device_type: str,
                 environ: Mapping[str, str] = os.environ) -> str | None:
    """Why ``fn``'s kernels cannot run on ``device_type``: on the CPU, kernels decorated before
    the interpreter was set up are compiled ones (imported by a package's entry point or a
    module imported too early), which have no CPU driver to run on."""
    if not interprets(device_type, environ):
        return None
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if not isinstance(standard.max, InterpretedFunction):
        # triton.language's own @jit functions (tl.max, tl.sum, ...) were decorated when
        # triton was imported: compiled ones, which an interpreted kernel cannot call
        return (f"triton was imported before {INTERPRET_ENV}=1 was set in this CPU process, "
                "so its own library functions are compiled ones that the interpreter cannot "
                f"call; set {INTERPRET_ENV}=1 before anything imports triton")

    compiled = [k for k in kernels_of(fn) if isinstance(k, JITFunction)
                and not isinstance(k, InterpretedFunction)]
    if compiled:
        names = ", ".join(sorted(getattr(k, "__name__", "?") for k in compiled))
        return (f"Triton kernel(s) {names} were defined before the harness set "
                f"{INTERPRET_ENV}=1 for this CPU run, so they are compiled kernels with no "
                "device to run on; import the module that defines them from the "
                "implementation, not at package import")
    return None


class TritonImplementation:
    """A Triton implementation by reference, ``package.module:function``: the module (which
    defines the kernels) is imported on the first call, after the rank chose compiled or
    interpreted kernels; without triton installed every case is a skip that names the
    install command. ``unsupported(params)``: why a case is outside what the kernels do (a
    skip), or None; ``elements(params)``: the elements a case moves, for the interpreter's
    limit (``INTERPRET_MAX_ELEMENTS``)."""

    triton = True

    def __init__(self, ref: str, *,
                 unsupported: Callable[[Mapping[str, Any]], str | None] | None = None,
                 elements: Callable[[Mapping[str, Any]], int] | None = None):
        self.ref = ref
        self.unsupported = unsupported
        self.elements = elements
        self.__name__ = ref.rpartition(":")[2]
        self.__doc__ = None

    def __repr__(self) -> str:
        return f"TritonImplementation({self.ref!r})"

    @functools.cached_property
    def function(self) -> Callable[..., Any]:
        module_name, _, attr = self.ref.partition(":")
        return getattr(importlib.import_module(module_name), attr)

    def runs_on(self, device_type: str) -> bool:
        """In the default plan on CUDA only, where the kernels compile. On the CPU they run
        through the interpreter when asked for by name (``--impl triton``): a check of the
        kernel's logic that costs more than the smoke tier's budget allows to run always."""
        return device_type == "cuda"

    def skip_reason(self, params: Mapping[str, Any], world_size: int, device: Any
                    ) -> str | None:
        if not available():
            return f"{self.ref} is a Triton implementation and triton is not installed: {INSTALL}"
        kind = getattr(device, "type", str(device))
        if self.elements is not None and interprets(kind):
            n = self.elements(params)
            if n > INTERPRET_MAX_ELEMENTS:
                return (f"{n:,} elements are past what Triton's interpreter runs in a "
                        f"case's time ({INTERPRET_MAX_ELEMENTS:,}); the kernel runs compiled "
                        "on a GPU")
        problem = mode_problem(self.function, kind)
        if problem:
            return problem
        if kind == "cuda" and not interprets(kind):
            problem = host_driver_problem()
            if problem:
                return problem
        return self.unsupported(params) if self.unsupported is not None else None

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        return self.function(*args, **inputs)


class MissingTriton:
    """An ``--impl`` whose module imports triton where triton is not installed: a skip on
    every case, naming the install command (not an error: the same command line runs where
    triton is there)."""

    triton = True

    def __init__(self, ref: str):
        self.ref = ref
        self.__name__ = ref.rpartition(":")[2]

    def runs_on(self, device_type: str) -> bool:
        return True

    def skip_reason(self, params: Mapping[str, Any], world_size: int, device: Any) -> str:
        return f"{self.ref} imports triton, which is not installed: {INSTALL}"

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        raise RuntimeError(self.skip_reason({}, 1, None))
