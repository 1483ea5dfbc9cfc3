"""Poison, overlap and relocation of input buffers."""

from __future__ import annotations

import math

import pytest
import torch

from harness.buffers import (
    ALIGN_BYTES,
    lies_within,
    nbytes,
    overlaps,
    poison_,
    poison_value,
    poisoned,
    relocate,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16,
                                   torch.float8_e4m3fn])
def test_float_poison_is_nan(dtype):
    assert poisoned(5, dtype).float().isnan().all()


@pytest.mark.parametrize("dtype, value", [(torch.int32, -(2**31)), (torch.int8, -128),
                                          (torch.uint8, 255), (torch.int64, -(2**63))])
def test_integer_poison_is_the_extreme_value(dtype, value):
    assert poison_value(dtype) == value
    assert (poison_(torch.zeros(3, dtype=dtype)) == value).all()


def test_overlap_and_containment_of_views():
    base = torch.arange(100, dtype=torch.float32)
    a, b, c = base[0:10], base[9:20], base[10:20]
    assert overlaps(a, b) and not overlaps(a, c)
    assert lies_within(c, base) and not lies_within(base, c)
    assert not overlaps(base, torch.arange(100, dtype=torch.float32))
    strided = base[::10]  # touches bytes 0..90*4+4
    assert overlaps(strided, base[90:91]) and not overlaps(strided, base[91:])
    assert not overlaps(base[5:5], base)  # empty views touch nothing


def test_relocate_copies_into_fresh_shifted_memory_keeping_aliasing():
    out = torch.full((12,), math.nan)
    x = out[4:8]
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    y = torch.arange(6, dtype=torch.int32).view(2, 3).t()  # non-contiguous view
    inputs = {"x": x, "out": out, "same": out, "y": y, "splits": (4, 8), "op": "sum",
              "parts": [x, 7]}
    moved = relocate(inputs, shift_bytes=2 * ALIGN_BYTES)
    # values, shapes and strides are kept; non-tensors pass through
    assert torch.equal(moved["x"], x) and torch.equal(moved["y"], y)
    assert moved["y"].stride() == y.stride() and moved["splits"] == (4, 8)
    assert moved["op"] == "sum" and moved["parts"][1] == 7
    # fresh memory: writing the copy leaves the original alone
    moved["out"].zero_()
    assert out.isnan().any()
    # aliasing is kept: x is still out's slice, the same object maps to one object
    assert moved["x"].data_ptr() == moved["out"].data_ptr() + 4 * 4
    assert moved["same"] is moved["out"] and moved["parts"][0] is moved["x"]
    # the storage starts shift_bytes before the first element
    assert moved["out"].storage_offset() * 4 == 2 * ALIGN_BYTES


def test_relocate_rejects_unaligned_shifts_and_counts_storage_bytes():
    with pytest.raises(ValueError, match="multiple of 256"):
        relocate({"x": torch.zeros(3)}, shift_bytes=4)
    base = torch.zeros(10)
    assert nbytes({"a": base, "b": base[2:5], "c": torch.zeros(2, dtype=torch.float64)}) == 56
