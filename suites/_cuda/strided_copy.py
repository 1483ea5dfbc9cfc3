"""Launch of strided_copy.cu: out = storage.as_strided(size, stride, offset).contiguous()."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.cuda_impl import cuda_launch

MAX_DIMS = 8
BLOCK = 256
BLOCKS_PER_SM = 16  # grid-stride: enough blocks to fill the machine, no more


def merge_dims(size: Sequence[int], stride: Sequence[int]) -> tuple[list[int], list[int]]:
    """The same view with size-1 dims dropped and each dim merged into the one before it
    when they are contiguous with each other (stride[d-1] == size[d] * stride[d])."""
    sizes: list[int] = []
    strides: list[int] = []
    for n, s in zip(size, stride, strict=True):
        if n == 1:
            continue
        if sizes and strides[-1] == n * s:
            sizes[-1] *= n
            strides[-1] = s
        else:
            sizes.append(n)
            strides.append(s)
    return sizes, strides


def unsupported(params: Mapping[str, Any]) -> str | None:
    dims = len(merge_dims(params["size"], params["stride"])[0])
    if dims > MAX_DIMS:
        return f"the view has {dims} dims after merging; strided_copy.cu takes {MAX_DIMS}"
    return None


def _launch(kernels: Any, storage, size, stride, offset, out) -> Any:
    if storage.dim() != 1 or storage.stride(0) != 1 or not out.is_contiguous():
        raise ValueError("strided_copy.cu reads a dense 1-D storage into a contiguous out")
    sizes, strides = merge_dims(size, stride)
    numel = math.prod(size)
    pad = MAX_DIMS - len(sizes)
    view = [np.int64(v) for v in [*sizes, *[1] * pad, *strides, *[0] * pad]]
    blocks = min(-(-numel // BLOCK), kernels.sm_count * BLOCKS_PER_SM)
    kernels[f"strided_copy_{storage.element_size()}"](
        grid=blocks, block=BLOCK,
        args=(out, storage, np.int64(numel), np.int64(storage.numel()), np.int64(offset),
              *view, np.int32(len(sizes))))
    return out


@cuda_launch(unsupported=unsupported)
def launch_strided_copy(kernels: Any, storage, size, stride, offset, out) -> Any:
    """64-bit source positions: right past 2**31 elements, strides and offsets."""
    return _launch(kernels, storage, size, stride, offset, out)


@cuda_launch(options={"define_macro": "INDEX_32BIT"}, unsupported=unsupported)
def launch_strided_copy_int32(kernels: Any, storage, size, stride, offset, out) -> Any:
    """Negative control: the same kernel with the source position in a 32-bit int."""
    return _launch(kernels, storage, size, stride, offset, out)
