"""Reference strided copy: ``storage.as_strided(size, stride, offset)`` made contiguous,
computed with explicit int64 index arithmetic rather than torch's own strided copy.

Output element i (row-major over ``size``) has coordinates c_d = (i // prod(size[d+1:])) %
size[d] and reads ``storage[offset + sum_d c_d * stride_d]``. Every product and sum is int64,
so views with more than 2**31 elements, or strides and offsets beyond 2**31 (the large-tensor
class, where 32-bit index arithmetic wraps) come out right. The work is done in chunks of
output elements, so the index tensors stay small whatever the view's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

CHUNK = 1 << 22
#: the integer dtype of each element width: a copy moves bits, and torch.take has no kernel
#: for some dtypes (float8), so elements are gathered as integers of their width
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def source_span(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """Elements of storage the view can touch: offset + sum (size_d - 1) * stride_d + 1
    (0 for an empty view)."""
    if any(s == 0 for s in size):
        return 0
    return offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) + 1


def strided_copy(storage: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                 offset: int = 0, chunk: int = CHUNK) -> torch.Tensor:
    """A new contiguous tensor of shape ``size`` holding the strided view of the 1-D
    ``storage``."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    if storage.dim() != 1:
        raise ValueError(f"storage must be 1-D, got shape {tuple(storage.shape)}")
    if len(size) != len(stride):
        raise ValueError(f"size {size} and stride {stride} differ in length")
    if any(s < 0 for s in size) or any(s < 0 for s in stride) or offset < 0:
        raise ValueError(f"negative size, stride or offset: {size}, {stride}, {offset}")
    if source_span(size, stride, offset) > storage.numel():
        raise ValueError(f"the view reaches element {source_span(size, stride, offset) - 1} "
                         f"of a storage of {storage.numel()}")
    numel = math.prod(size)
    out = torch.empty(numel, dtype=storage.dtype)
    if numel == 0:
        return out.view(size)
    if not size:  # 0-d: the one element at the offset
        return storage[offset].clone()
    # The outer coordinates are worked out once per row of the innermost dim, and each row's
    # elements are that row's start plus j * stride[-1]; a row longer than a chunk is split.
    bits = _BITS.get(storage.element_size())  # none for 16-byte complex, which take has
    source_bits = storage if bits is None else storage.view(bits)
    out_bits = out if bits is None else out.view(bits)
    *outer_size, inner = size
    *outer_stride, inner_step = stride
    rows = numel // inner
    piece = min(inner, chunk)
    rows_per_chunk = max(1, chunk // inner)
    # whole rows per chunk of a view whose rows lie closer together in storage than a row's
    # own elements (a transpose): gather column by column, reading storage in order, and
    # transpose in the chunk. The same elements; 2x faster on a 2**31-element view
    by_column = piece == inner and bool(outer_stride) and outer_stride[-1] < inner_step
    # one index buffer for every chunk: a fresh 32 MB index per chunk cost more in page
    # faults than the gather itself (torch.take: input read as 1-D, result shaped as the index)
    index = torch.empty(min(rows, rows_per_chunk) * piece, dtype=torch.int64)
    for row0 in range(0, rows, rows_per_chunk):
        row = torch.arange(row0, min(rows, row0 + rows_per_chunk), dtype=torch.int64)
        start = torch.full_like(row, offset)
        rest = row
        for extent, step in zip(reversed(outer_size), reversed(outer_stride), strict=True):
            start += (rest % extent) * step
            rest = rest // extent
        whole = out_bits[row0 * inner : (row0 + row.numel()) * inner]
        for j0 in range(0, inner, piece):  # a row's element offsets, a piece at a time
            along = torch.arange(j0, min(inner, j0 + piece), dtype=torch.int64) * inner_step
            if by_column:
                source = torch.add(along[:, None], start[None, :],             # [inner, rows]
                                   out=index[: along.numel() * row.numel()].view(-1, row.numel()))
                whole.view(-1, inner).copy_(torch.take(source_bits, source).t())
                continue
            source = torch.add(start[:, None], along[None, :],                 # [rows, piece]
                               out=index[: row.numel() * along.numel()].view(row.numel(), -1))
            if piece == inner:  # whole rows: one contiguous run of the output
                whole[:] = torch.take(source_bits, source).view(-1)
            else:  # one row, split
                whole[j0 : j0 + source.shape[1]] = torch.take(source_bits, source[0])
    return out.view(size)
