"""Triton strided copy: out = storage.as_strided(size, stride, offset).contiguous(), bitwise.

One program per BLOCK output elements; each element's source position is the storage offset
plus its coordinates (peeled off the output index, innermost dim first) times the strides.
The output index and the position are int64: a view can hold more than 2**31 elements, sit
past 2**31 in its storage, or step by more than 2**31. The control does the same in int32,
as a kernel written from ``tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)`` does: its
positions wrap past 2**31, and the bounds mask both kernels carry turns the wrapped ones into
missing elements, not a read outside the storage. A second control's store mask reaches one
element past the output.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from suites._triton import raw_bits

#: elements per program: 32 per thread at 4 warps on a GPU, and few programs for the
#: interpreter, whose cost is per program
BLOCK = 4096


@triton.jit
def _strided_copy(src_ptr, out_ptr, numel, storage_numel, offset, sizes_ptr, strides_ptr,
                  NDIM: tl.constexpr, BLOCK: tl.constexpr, INDEX_32: tl.constexpr,
                  PAST: tl.constexpr):
    if INDEX_32:  # the control
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        pos = tl.zeros([BLOCK], dtype=tl.int32) + offset.to(tl.int32)
    else:
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        pos = tl.zeros([BLOCK], dtype=tl.int64) + offset
    rest = i
    for d in tl.static_range(NDIM):
        n = tl.load(sizes_ptr + (NDIM - 1 - d))
        s = tl.load(strides_ptr + (NDIM - 1 - d))
        if INDEX_32:
            n = n.to(tl.int32)
            s = s.to(tl.int32)
        pos += (rest % n) * s
        rest = rest // n
    inside = (i >= 0) & (i < numel)
    value = tl.load(src_ptr + pos, mask=inside & (pos >= 0) & (pos < storage_numel))
    tl.store(out_ptr + i, value, mask=(i >= 0) & (i < numel + PAST))  # PAST = 1: a control


def _copy(storage, size, stride, offset, out, index_32: bool, past: int = 0):
    numel = math.prod(size)
    if numel == 0:
        return out
    # a 0-d view is one element at the offset: one dim of size 1
    sizes = torch.tensor(list(size) or [1], dtype=torch.int64, device=storage.device)
    strides = torch.tensor(list(stride) or [0], dtype=torch.int64, device=storage.device)
    _strided_copy[(triton.cdiv(numel, BLOCK),)](
        raw_bits(storage), raw_bits(out), numel, storage.numel(), offset, sizes, strides,
        NDIM=sizes.numel(), BLOCK=BLOCK, INDEX_32=index_32, PAST=past)
    return out


def strided_copy(storage, size, stride, offset, out):
    """64-bit output index and source position."""
    return _copy(storage, size, stride, offset, out, False)


def strided_copy_int32_index(storage, size, stride, offset, out):
    """Control: the output index and source position in int32."""
    return _copy(storage, size, stride, offset, out, True)


def strided_copy_store_one_past(storage, size, stride, offset, out):
    """Control: the store mask is ``i < numel + 1``: the last program writes one element past
    the output wherever numel is not a multiple of BLOCK. Every element of the output is
    right; only the bytes after it say so."""
    return _copy(storage, size, stride, offset, out, False, past=1)
