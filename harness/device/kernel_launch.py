"""A compiled kernel launched through ``cuda.core.launch`` on torch's current stream: its
arguments (a tensor becomes its data pointer, a scalar must say its C type) and its grid and
block as cuda.core takes them, with what one launch can reuse from the last."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.device.cuda_compile import CompiledModule


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
