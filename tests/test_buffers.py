"""Poison, overlap and relocation of input buffers; poison in free device memory."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from harness.core.buffers import (
    ALIGN_BYTES,
    CANARY_BYTE,
    REDZONE_BYTES,
    Redzones,
    free_blocks_to_poison,
    fresh_memory_poisoned,
    lies_within,
    nbytes,
    overlaps,
    pad_rows,
    poison_,
    poison_free_device_memory,
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


@pytest.mark.parametrize("elements, offsets", [
    # (bytes, int32 words, int64 ids, a bf16 slice one element into its storage) mod 16
    (1, (4, 4, 8, 4)), (2, (8, 8, 8, 6)), (4, (4, 4, 8, 10))])
def test_relocate_misaligned_moves_each_storage_by_its_widest_elements(elements, offsets):
    # one, two or four of a storage's widest elements, or one where that is 16 bytes
    raw = torch.arange(64, dtype=torch.uint8)
    words = raw.view(torch.int32)  # the same storage seen as bytes and as 4-byte words
    ids = torch.arange(5, dtype=torch.int64)
    halves = torch.ones(9, dtype=torch.bfloat16)
    zones = Redzones()
    moved = relocate({"raw": raw, "words": words, "ids": ids, "h": [halves[1:]]},
                     shift_bytes=ALIGN_BYTES, misalign=elements, redzones=zones)
    got = tuple(t.data_ptr() % 16 for t in (moved["raw"], moved["words"], moved["ids"],
                                            moved["h"][0]))
    assert got == offsets
    assert moved["words"].data_ptr() == moved["raw"].data_ptr()
    for k, t in (("raw", raw), ("words", words), ("ids", ids)):
        assert torch.equal(moved[k], t)
    assert torch.equal(moved["h"][0], halves[1:])
    # the canaries sit right around the moved data
    assert zones.damage() is None
    start = moved["ids"].data_ptr() - moved["ids"].untyped_storage().data_ptr()
    moved["ids"].untyped_storage()[start + 40] = 7  # one byte past the ids' end
    assert "'ids' (1 byte past its end)" in zones.damage()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn,
                                   torch.int32, torch.bool])
def test_pad_rows_holds_the_same_values_at_strides_of_a_wider_buffer(dtype):
    x = torch.arange(24).reshape(2, 3, 4).to(dtype)
    v = torch.arange(5).to(dtype)
    padded = pad_rows({"x": x, "v": v, "n": 3}, ["x", "v"])
    px, pv = padded["x"], padded["v"]
    assert padded["n"] == 3 and padded["x"] is not x
    size = x.element_size()
    pitch = {1: 32, 2: 32, 4: 32}[size] // size  # 4 elements rounded up to 16 bytes, + 16
    assert px.stride() == (4 * pitch, pitch, 1) and pv.stride() == (2,)
    assert px.data_ptr() % 16 == 0 and px.stride(1) * x.element_size() % 16 == 0
    # the same bits (float8 has no equality on the CPU), read through the strides
    assert torch.equal(px.contiguous().view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(pv.contiguous().view(torch.uint8), v.view(torch.uint8))
    between = torch.empty(0, dtype=torch.uint8).set_(px.untyped_storage(), 4 * size,
                                                     ((pitch - 4) * size,))
    assert (between == (0xFF if dtype.is_floating_point else 0)).all()


def test_pad_rows_spaces_the_matrices_of_a_batch_apart_too():
    """A kernel that takes the batch stride as rows x row stride (w13 of experts sliced from
    a taller fused weight breaks it) reads the wrong matrix."""
    w = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    p = pad_rows({"w": w}, ["w"])["w"]
    assert torch.equal(p, w) and p.stride(0) != p.shape[1] * p.stride(1)


def test_relocate_rejects_unaligned_shifts_and_counts_storage_bytes():
    with pytest.raises(ValueError, match="multiple of 256"):
        relocate({"x": torch.zeros(3)}, shift_bytes=4)
    base = torch.zeros(10)
    assert nbytes({"a": base, "b": base[2:5], "c": torch.zeros(2, dtype=torch.float64)}) == 56


def _segment(device=0, expandable=False, pool=(0, 0), blocks=()):
    return {"device": device, "address": 4096, "total_size": 1 << 20, "stream": 0,
            "segment_type": "large", "segment_pool_id": pool, "is_expandable": expandable,
            "blocks": [{"address": a, "size": n, "requested_size": n, "state": st}
                       for a, n, st in blocks]}


def _beside(t: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """``count`` elements of ``t``'s storage from element ``first`` (relative to ``t``'s start):
    what a kernel whose index runs past the buffer touches."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset() + first,
                                              (count,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.bfloat16])
def test_redzones_name_the_buffer_written_past_and_by_how_much(dtype):
    out, x = torch.zeros(37, dtype=dtype), torch.ones(5, dtype=dtype)
    zones = Redzones()
    moved = relocate({"x": x, "out": out}, shift_bytes=ALIGN_BYTES, redzones=zones)
    assert zones.damage() is None
    moved["out"].fill_(3)  # the whole buffer: inside
    assert zones.damage() is None
    _beside(moved["out"], 37, 1).fill_(7)  # one element past the end
    size = out.element_size()
    past = f"{size} byte past" if size == 1 else f"{size} bytes past"
    assert zones.damage() == (
        f"wrote outside the buffers it was given: 'out' ({past} its end) (a store mask or an "
        "index one too far: on a GPU such a write lands in another allocation or is lost)")
    _beside(moved["x"], -2, 1).fill_(7)  # two elements before the start of x
    why = zones.damage()
    assert f"'x' ({2 * size} bytes before its start)" in why and "'out'" in why


def test_redzones_cover_a_storage_shared_by_views_and_the_far_end_of_the_zone():
    base = torch.zeros(64)
    x, out = base[:32], base[32:]
    zones = Redzones()
    moved = relocate({"x": x, "out": out}, redzones=zones)  # no shift: nothing before
    storage = moved["x"].untyped_storage()
    assert storage.nbytes() == 64 * 4 + REDZONE_BYTES
    raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
    assert bool((raw[64 * 4:] == CANARY_BYTE).all())
    raw[-1] = 0  # the last byte of the zone
    assert "'x' / 'out' (4096 bytes past its end)" in zones.damage()
    # without redzones a relocation is as big as the storage it copies
    assert relocate({"x": x})["x"].untyped_storage().nbytes() == 64 * 4


def test_only_the_default_pools_free_blocks_on_this_device_are_poisoned():
    blocks = [(4096, 512, "active_allocated"), (4608, 1024, "inactive"),
              (5632, 256, "active_pending_free"), (5888, 2048, "inactive"), (7936, 0, "inactive")]
    segments = [_segment(blocks=blocks),
                _segment(device=1, blocks=[(1 << 30, 512, "inactive")]),
                _segment(expandable=True, blocks=[(1 << 31, 512, "inactive")]),  # maybe unmapped
                _segment(pool=(1, 0), blocks=[(1 << 32, 512, "inactive")])]  # a graph's pool
    assert free_blocks_to_poison(segments, 0) == [(4608, 1024), (5888, 2048)]
    assert free_blocks_to_poison(segments, 1) == [(1 << 30, 512)]
    assert free_blocks_to_poison([], 0) == []
    assert poison_free_device_memory(torch.device("cpu")) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_freed_right_answer_is_poison_when_the_allocator_hands_it_back():
    """On CUDA the caching allocator returns the block just freed: an output allocated and
    never written would hold the last result of that size, often the right one."""
    right = torch.arange(4096, dtype=torch.float32, device="cuda")
    address = right.data_ptr()
    del right
    poisoned_bytes = poison_free_device_memory(torch.device("cuda"))
    again = torch.empty(4096, dtype=torch.float32, device="cuda")
    assert again.data_ptr() == address and poisoned_bytes >= again.nbytes
    assert again.view(torch.uint8).eq(0xFF).all() and again.isnan().all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's M_PERTURB")
def test_on_the_cpu_what_a_checked_call_allocates_is_poison_not_the_freed_block():
    # large bins, past the mmap threshold: poison inside the block, malloc left as it was
    # outside it, and a huge case left alone. Blocks of up to 1032 bytes may come from glibc's
    # per-thread cache, which skips the perturbation: not asserted
    for n in (300, 70000, 3000000):
        torch.full((n,), 1.5)
        with fresh_memory_poisoned(torch.device("cpu")):
            fresh = torch.empty(n)
        after = torch.empty(n)
        assert fresh.view(torch.uint8).eq(0xFE).all(), n
        assert not after.view(torch.uint8).eq(0xFE).all(), n
    with fresh_memory_poisoned(torch.device("cpu"), case_bytes=1 << 30):
        assert not torch.empty(300).view(torch.uint8).eq(0xFE).all()
