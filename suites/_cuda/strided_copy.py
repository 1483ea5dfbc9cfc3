"""Launch of strided_copy.cu: out = storage.as_strided(size, stride, offset).contiguous()."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.api import cuda_launch

MAX_DIMS = 8
BLOCK = 256
BLOCKS_PER_SM = 16  # grid-stride: enough blocks to fill the machine, no more
UNROLL = 4  # chunks a thread takes per pass (strided_copy.cu's UNROLL)


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


def outside_storage(size: Sequence[int], stride: Sequence[int], offset: int,
                    storage_numel: int) -> str | None:
    """Why the view reads outside a storage of ``storage_numel`` elements, or None. The
    kernel trusts its positions (64-bit, unchecked): a view past the storage's end would read
    another allocation's bytes or fault, and a fault is sticky for the whole process."""
    if math.prod(size) == 0:
        return None
    if offset < 0 or any(s < 0 for s in stride):
        return f"offset {offset} and strides {tuple(stride)} must not be negative"
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= storage_numel:
        return (f"the view's last element is at {last}, past the storage's {storage_numel} "
                "elements")
    return None


def _launch(kernels: Any, storage, size, stride, offset, out) -> Any:
    if storage.dim() != 1 or storage.stride(0) != 1 or not out.is_contiguous():
        raise ValueError("strided_copy.cu reads a dense 1-D storage into a contiguous out")
    if out.numel() != math.prod(size) or out.element_size() != storage.element_size():
        raise ValueError(f"out holds {out.numel()} elements of {out.element_size()} bytes; the "
                         f"view has {math.prod(size)} of {storage.element_size()}")
    why = outside_storage(size, stride, offset, storage.numel())
    if why:
        raise ValueError(f"strided_copy.cu: {why}")
    sizes, strides = merge_dims(size, stride)
    numel = math.prod(size)
    pad = MAX_DIMS - len(sizes)
    view = [np.int64(v) for v in [*sizes, *[1] * pad, *strides, *[0] * pad]]
    # chunks of 16 bytes of one row (the kernel's V elements), UNROLL of them a thread
    per_chunk = 16 // storage.element_size()
    inner = sizes[-1] if sizes else 1
    chunks = numel // inner * -(-inner // per_chunk) if numel else 0
    blocks = min(-(-chunks // (BLOCK * UNROLL)), kernels.sm_count * BLOCKS_PER_SM)
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
