"""Launch of strided_copy.cu: out = storage.as_strided(size, stride, offset).contiguous()."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import cuda_launch

MAX_DIMS = 8
BLOCK = 128  # strided_copy.cu's BLOCK (its __launch_bounds__) and UNROLL: torch's 128 x 4
UNROLL = 4
WAVES = 4  # grid-stride over at most four waves of resident blocks (2048 threads an SM)
UNITS = (16, 8, 4, 2)  # the widest first
INDEX_LIMIT = 1 << 31  # 32-bit indices below this many units (the magic division's bound)


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


def divider(d: int) -> int:
    """torch's IntDivider for a 32-bit n < 2**31, packed as (shift << 32) | multiplier:
    n // d == (umulhi(n, multiplier) + n) >> shift, with the shift the least s with
    2**s >= d and multiplier = 2**32 * (2**s - d) // d + 1 (which fits 32 bits)."""
    if not 1 <= d < INDEX_LIMIT:
        raise ValueError(f"a 32-bit divisor is 1 to 2**31 - 1, not {d}")
    shift = (d - 1).bit_length()
    multiplier = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return (shift << 32) | multiplier


@dataclass(frozen=True)
class Plan:
    """What strided_copy.cu is launched with: the view in units of ``unit`` bytes, its dims
    innermost first, and the index widths (``kernel`` names the entry point)."""

    unit: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    numel: int
    tail: int  # bytes of a one-dim view past its last whole unit
    kernel: str


def _widest_unit(sizes: list[int], strides: list[int], offset: int, width: int, src_addr: int,
                 out_addr: int) -> int:
    """The most bytes a unit can hold with every unit's load and store aligned to its size:
    the innermost stride 1, the pointers, the offset and the outer strides multiples of it,
    and rows whole units (a one-dim view's last bytes are its tail)."""
    if not sizes or strides[-1] != 1:
        return width
    for unit in UNITS:
        per = unit // width
        if unit <= width or sizes[-1] < per:
            continue
        rows_whole = len(sizes) == 1 or sizes[-1] % per == 0
        if (rows_whole and src_addr % unit == 0 and out_addr % unit == 0
                and offset * width % unit == 0
                and all(s * width % unit == 0 for s in strides[:-1])):
            return unit
    return width


def plan(size: Sequence[int], stride: Sequence[int], offset: int, width: int, *,
         src_addr: int = 0, out_addr: int = 0, widen: bool = True) -> Plan:
    """The launch of a view of ``width``-byte elements whose storage starts at ``src_addr``
    and output at ``out_addr``. ``widen=False`` (the int32 control) keeps units of one
    element."""
    sizes, strides = merge_dims(size, stride)
    unit = _widest_unit(sizes, strides, offset, width, src_addr, out_addr) if widen else width
    per, tail = unit // width, 0
    if per > 1:
        tail = sizes[-1] % per * width
        sizes[-1] //= per
        strides = [s // per for s in strides[:-1]] + [1]
        offset //= per
    if not sizes:  # a 0-d view, or every dim of size 1
        sizes, strides = [1], [0]
    numel = math.prod(sizes)
    span = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
    index = "i" if numel < INDEX_LIMIT else "l"
    at = "i" if index == "i" and span < INDEX_LIMIT else "l"
    return Plan(unit, tuple(reversed(sizes)), tuple(reversed(strides)), offset, numel, tail,
                f"strided_copy_{unit}_{index}{at}")


def _launch(kernels: Any, storage, size, stride, offset, out, *, widen: bool = True,
            index: str | None = None) -> Any:
    """``index`` ("il" or "ll") takes wider index arithmetic than the plan's: the tests run
    the 64-bit paths on small views."""
    if storage.dim() != 1 or storage.stride(0) != 1 or not out.is_contiguous():
        raise ValueError("strided_copy.cu reads a dense 1-D storage into a contiguous out")
    if out.numel() != math.prod(size) or out.element_size() != storage.element_size():
        raise ValueError(f"out holds {out.numel()} elements of {out.element_size()} bytes; the "
                         f"view has {math.prod(size)} of {storage.element_size()}")
    why = outside_storage(size, stride, offset, storage.numel())
    if why:
        raise ValueError(f"strided_copy.cu: {why}")
    if math.prod(size) == 0:
        return out
    p = plan(size, stride, offset, storage.element_size(), src_addr=storage.data_ptr(),
             out_addr=out.data_ptr(), widen=widen)
    pad = MAX_DIMS - len(p.sizes)
    magic = [divider(n) if p.numel < INDEX_LIMIT else 0 for n in p.sizes]
    dims = [np.int64(v) for v in (*p.sizes, *[1] * pad, *p.strides, *[0] * pad,
                                  *magic, *[divider(1)] * pad)]
    blocks = min(-(-p.numel // (BLOCK * UNROLL)), kernels.sm_count * (2048 // BLOCK) * WAVES)
    storage_units = storage.numel() * storage.element_size() // p.unit
    kernels[f"strided_copy_{p.unit}_{index}" if index else p.kernel](
        grid=blocks, block=BLOCK,
        args=(out, storage, np.int64(p.numel), np.int64(storage_units), np.int64(p.offset),
              *dims, np.int32(len(p.sizes)), np.int32(p.tail)))
    return out


@cuda_launch(unsupported=unsupported)
def launch_strided_copy(kernels: Any, storage, size, stride, offset, out) -> Any:
    """32-bit index arithmetic where the view allows it, 64-bit past 2**31: right past 2**31
    elements, strides and offsets."""
    return _launch(kernels, storage, size, stride, offset, out)


@cuda_launch(options={"define_macro": "INDEX_32BIT"}, unsupported=unsupported)
def launch_strided_copy_int32(kernels: Any, storage, size, stride, offset, out) -> Any:
    """Negative control: the same kernel with the source position in a 32-bit int, in units
    of one element."""
    return _launch(kernels, storage, size, stride, offset, out, widen=False)
