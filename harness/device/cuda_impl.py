"""Implementations written as CUDA C++ source: a ``.cu`` file plus a Python launch description.

The launch description is a function beside the source (``kernel.py`` next to ``kernel.cu``)
with the op's reference signature and one more first argument, the compiled kernels::

    def launch_scale(kernels, x, out, alpha):       # the op's inputs by name
        n = x.numel()
        kernels.scale(grid=(n + 255) // 256, block=256,
                      args=(out, x, np.float32(alpha), np.int64(n)))
        return out

``kernels.NAME(grid, block, args)`` launches the ``extern "C" __global__`` function ``NAME``
of the source on torch's current stream; a tensor argument passes its data pointer and scalars
say their C type with numpy (``np.int64``, ``np.float32``). Distributed ops get the World
after the kernels: ``launch(kernels, world, **inputs)``.

Select it with ``--impl path/kernel.cu:launch_scale``, or register it from a package's
``harness.implementations`` entry point with :func:`from_source`. On a machine without a GPU
such an implementation is not planned by default and, when asked for, is a ``skip`` that says
why. Nothing of CUDA is imported until the first call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.device import cuda, cuda_compile, kernel_launch
from harness.device.pyfile import import_file


def cuda_launch(*, options: Mapping[str, Any] | None = None,
                name_expressions: Sequence[str] = (),
                unsupported: Callable[[Mapping[str, Any]], str | None] | None = None,
                arch_suffix: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Optional decorator for a launch description: NVRTC ``options`` (cuda.core
    ProgramOptions fields, e.g. ``{"define_macro": "TILE=64"}``), template ``name_expressions``
    to instantiate (then ``kernels["name<float>"]``), ``unsupported(params)``, a reason why a
    case is outside what the kernel does (the case is then a ``skip``), or None, and
    ``arch_suffix="a"`` for a kernel that needs the architecture-specific features (wgmma,
    setmaxnreg: ``sm_90a`` on Hopper)."""
    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.cuda_options = dict(options or {})  # type: ignore[attr-defined]
        fn.cuda_name_expressions = tuple(name_expressions)  # type: ignore[attr-defined]
        fn.cuda_unsupported = unsupported  # type: ignore[attr-defined]
        fn.cuda_arch_suffix = arch_suffix  # type: ignore[attr-defined]
        return fn
    return mark


class Kernels:
    """The compiled source as a launch description sees it: ``kernels.NAME(grid, block,
    args, shared_mem=0)`` or ``kernels["name<T>"](...)``, plus the device's facts that size a
    grid. One per (implementation, device), made on the first call: a launch pays no Python
    set-up that can be done once."""

    def __init__(self, module: cuda_compile.CompiledModule, device: Any):
        self.module = module
        self.device = device
        self._launchers: dict[str, Callable[..., None]] = {}

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Callable[..., None]:
        launcher = self._launchers.get(name)
        if launcher is None:
            module, device = self.module, self.device

            def launcher(grid: Any, block: Any, args: Sequence[Any],
                         shared_mem: int = 0) -> None:
                kernel_launch.launch(module, name, grid, block, args, shared_mem=shared_mem,
                                     device=device)

            self._launchers[name] = launcher
        return launcher

    @functools.cached_property
    def sm_count(self) -> int:
        """Streaming multiprocessors of the device (132 on an H100 SXM)."""
        import torch

        return int(torch.cuda.get_device_properties(self.device).multi_processor_count)

    @property
    def arch(self) -> str:
        return self.module.arch


class CudaSourceImplementation:
    """An implementation made of a CUDA C++ source and its launch description."""

    def __init__(self, source: str | Path, launch: Callable[..., Any], *,
                 options: Mapping[str, Any] | None = None,
                 name_expressions: Sequence[str] = (),
                 unsupported: Callable[[Mapping[str, Any]], str | None] | None = None,
                 arch_suffix: str | None = None):
        self.source = Path(source)
        self.launch = launch
        self.options = dict(options if options is not None
                            else getattr(launch, "cuda_options", {}))
        self.name_expressions = tuple(name_expressions
                                      or getattr(launch, "cuda_name_expressions", ()))
        self.unsupported = unsupported or getattr(launch, "cuda_unsupported", None)
        self.arch_suffix = (arch_suffix if arch_suffix is not None
                            else getattr(launch, "cuda_arch_suffix", ""))
        self.__name__ = f"{self.source.name}:{getattr(launch, '__name__', 'launch')}"
        self.__doc__ = launch.__doc__
        #: compiled modules by architecture: a call must not reread and rehash the source
        #: (host time a small kernel's timing would see)
        self._compiled: dict[str, cuda_compile.CompiledModule] = {}
        #: the Kernels of each device index, made once
        self._kernels: dict[int | None, Kernels] = {}

    def __repr__(self) -> str:
        return f"CudaSourceImplementation({str(self.source)!r}, {self.__name__})"

    def compile(self, arch: str = cuda.DEFAULT_ARCH) -> cuda_compile.CompiledModule:
        """The source compiled for ``arch`` plus this kernel's suffix (``sm_90`` + ``a``),
        cached by source, options and headers."""
        if self.arch_suffix and not arch.endswith(self.arch_suffix):
            arch += self.arch_suffix
        try:
            text = self.source.read_text()
        except OSError as exc:
            raise cuda.CudaCompileError(f"{self.source}: cannot read the source ({exc})",
                                        "") from exc
        return cuda_compile.compile_source(text, filename=str(self.source), arch=arch,
                                           options=self.options,
                                           name_expressions=self.name_expressions,
                                           include_dirs=[self.source.parent])

    def runs_on(self, device_type: str) -> bool:
        """Whether this implementation can run on a device of this type at all."""
        return device_type == "cuda"

    def skip_reason(self, params: Mapping[str, Any], world_size: int, device: Any
                    ) -> str | None:
        """Why this case cannot run here: no CUDA device, no NVRTC that makes cubins this
        driver loads (the reason names the install command), or outside what the kernel
        does."""
        kind = getattr(device, "type", str(device))
        if kind != "cuda":
            return (f"{self.source.name} is CUDA C++ and needs a CUDA device; this run is on "
                    f"{kind} (run with --device cuda on a GPU machine)")
        problem = cuda.run_problem()
        if problem:
            return f"{self.source.name} is CUDA C++ and cannot be compiled here: {problem}"
        return self.unsupported(params) if self.unsupported is not None else None

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        import torch

        device = _cuda_device(args, inputs)
        kernels = self._kernels.get(device.index)
        if kernels is None:
            arch = cuda.arch_for(device)
            module = self._compiled.get(arch)
            if module is None:
                module = self._compiled[arch] = self.compile(arch)
            kernels = self._kernels[device.index] = Kernels(module, device)
        if torch.cuda.current_device() == device.index:  # the usual case: no switch to pay
            return self.launch(kernels, *args, **inputs)
        with torch.cuda.device(device):
            return self.launch(kernels, *args, **inputs)


def _cuda_device(args: Sequence[Any], inputs: Mapping[str, Any]) -> Any:
    """The CUDA device of the first CUDA tensor among the inputs (else torch's current one)."""
    import torch

    for value in (*args, *inputs.values()):
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return torch.device("cuda", torch.cuda.current_device())


def from_source(source: str | Path, launch: Callable[..., Any], **kwargs: Any
                ) -> CudaSourceImplementation:
    """An implementation from a ``.cu`` path and its launch function (for entry points and
    built-ins); keyword arguments as :func:`cuda_launch`."""
    return CudaSourceImplementation(source, launch, **kwargs)


class CudaImplError(ValueError):
    """A ``path.cu:launch`` reference that does not resolve (the CLI maps it to exit 2)."""


def load(ref: str) -> CudaSourceImplementation:
    """``path/kernel.cu:launch_fn``: the source, and ``launch_fn`` from ``path/kernel.py``."""
    path_text, _, fn_name = ref.rpartition(":")
    if not path_text or not fn_name:
        raise CudaImplError(f"--impl {ref!r} is not of the form path/kernel.cu:launch_function")
    source = Path(path_text).expanduser()
    if not source.is_absolute():  # a rank runs elsewhere than the user (harness.engine.launch)
        source = Path(os.environ.get("HARNESS_INVOKED_FROM", ".")) / source
    if not source.is_file():
        raise CudaImplError(f"--impl {ref!r}: no file {source} (paths are relative to the "
                            "directory harness runs in)")
    py = source.with_suffix(".py")
    if not py.is_file():
        raise CudaImplError(f"--impl {ref!r}: no launch description {py}; write "
                            f"`def {fn_name}(kernels, ...)` there (docs/cuda-and-triton.md)")
    try:
        module = import_file(py.resolve())
    except Exception as exc:
        raise CudaImplError(f"--impl {ref!r}: {py} failed to import "
                            f"({type(exc).__name__}: {exc})") from exc
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise CudaImplError(f"--impl {ref!r}: {py} defines no function {fn_name!r}")
    return CudaSourceImplementation(source.resolve(), fn)
