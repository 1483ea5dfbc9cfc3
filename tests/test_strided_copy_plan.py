"""How the strided-copy launcher prepares a view for strided_copy.cu (suites/_cuda/
strided_copy.py `plan`, `divider`): the unit widened as far as alignment allows, the tail of a
one-dim view, the index widths around 2**31, and the magic numbers of the 32-bit division,
checked against Python's own integer division. No GPU and no compiler needed: the kernel's
bytes are checked in tests/test_cuda_kernels_on_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from suites._cuda.strided_copy import INDEX_LIMIT, divider, plan

BIG = 1 << 31


def test_the_magic_division_is_python_division_below_2_31():
    rng = np.random.default_rng(7)
    divisors = [1, 2, 3, 5, 6, 7, 10, 37, 53, 4097, 4099, 65537, 1 << 20, (1 << 20) + 1,
                BIG - 1, BIG - 2, (1 << 30) + 1, *(1 << k for k in range(31)),
                *rng.integers(1, BIG, 60).tolist()]
    for d in divisors:
        packed = divider(d)
        multiplier, shift = packed & 0xFFFFFFFF, packed >> 32
        assert 0 < multiplier < (1 << 32) and shift <= 31
        near = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, BIG - 1, BIG - 2, BIG - d]
        n = np.array([v for v in near if 0 <= v < BIG] + rng.integers(0, BIG, 4000).tolist(),
                     dtype=np.uint64)
        high = (n * np.uint64(multiplier)) >> np.uint64(32)  # __umulhi(n, multiplier)
        quotient = ((high + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)
        assert np.array_equal(quotient, n // np.uint64(d)), d


def test_a_divisor_outside_32_bits_is_refused():
    for d in (0, -3, BIG):
        with pytest.raises(ValueError, match="32-bit divisor"):
            divider(d)


def test_a_contiguous_view_is_a_copy_of_16_byte_units():
    p = plan((64, 40), (40, 1), 0, 4)
    assert (p.unit, p.sizes, p.strides, p.numel, p.tail) == (16, (640,), (1,), 640, 0)
    assert p.kernel == "strided_copy_16_ii"
    # the nightly bool view: an odd number of bytes, its last three the tail
    p = plan((4099, 4097), (4097, 1), 0, 1)
    assert (p.unit, p.numel, p.tail) == (16, 4099 * 4097 // 16, 4099 * 4097 % 16)


@pytest.mark.parametrize("size,stride,offset,width,addrs,unit", [
    ((64, 40), (40, 1), 1, 4, (0, 0), 4),        # the offset misaligns every unit
    ((64, 40), (40, 1), 2, 4, (0, 0), 8),        # ... but for 8 bytes
    ((64, 40), (40, 1), 0, 4, (0, 4), 4),        # the output is misaligned
    ((64, 40), (40, 1), 0, 4, (8, 0), 8),        # the storage is 8-byte aligned
    ((4, 8), (10, 1), 0, 4, (0, 0), 8),          # rows 40 bytes apart
    ((5, 6), (6, 1), 0, 1, (0, 0), 16),          # contiguous: 30 bytes, one unit and 14
    ((5, 6), (8, 1), 0, 1, (0, 0), 2),           # rows of 6 bytes: 2-byte units
    ((5, 7), (9, 1), 0, 1, (0, 0), 1),           # rows of 7 bytes: no unit fits
    ((40, 64), (1, 40), 0, 4, (0, 0), 4),        # transposed: elements
    ((6, 4), (2, 3), 0, 2, (0, 0), 2),           # stepped inner dim: elements
    ((64, 40), (0, 1), 16, 4, (0, 0), 16),       # a broadcast row
    ((3,), (1,), 0, 1, (0, 0), 2),               # shorter than 16 bytes: the widest that fits
    ((1,), (1,), 0, 1, (0, 0), 1),
    ((), (), 9, 4, (0, 0), 4),                   # 0-d
])
def test_the_unit_is_the_widest_every_access_is_aligned_to(size, stride, offset, width, addrs,
                                                           unit):
    p = plan(size, stride, offset, width, src_addr=addrs[0], out_addr=addrs[1])
    assert p.unit == unit, p
    per = unit // width
    total = int(np.prod(size)) if size else 1
    assert p.numel * per * width + p.tail == total * width
    assert p.offset * per == offset or unit == width
    assert p.tail == 0 or len(p.sizes) == 1
    # the dims in units, innermost first, address the same bytes
    assert p.offset * unit % unit == 0 and all(s * unit % unit == 0 for s in p.strides)


def test_the_control_keeps_units_of_one_element():
    p = plan((64, 40), (40, 1), 0, 4, widen=False)
    assert (p.unit, p.numel, p.kernel) == (4, 2560, "strided_copy_4_ii")


@pytest.mark.parametrize("size,stride,offset,width,widen,kernel", [
    # the stress tier's views: 64-bit index arithmetic where 32 bits would wrap
    ((32769, 65537), (1, 32769), 0, 1, True, "strided_copy_1_ll"),    # 2**31 + 65537 elements
    ((3, 4096), (BIG + 1, 1), 5, 1, True, "strided_copy_1_il"),       # a stride past 2**31
    ((1024, 1000), (1000, 1), BIG + 17, 1, True, "strided_copy_1_ii"),  # offset: the pointer
    ((BIG + 1,), (1,), 0, 4, True, "strided_copy_16_ii"),             # 2**29 16-byte units
    ((BIG + 1,), (1,), 0, 4, False, "strided_copy_4_ll"),             # the control: elements
    ((INDEX_LIMIT - 1,), (1,), 0, 1, False, "strided_copy_1_ii"),
    ((INDEX_LIMIT,), (1,), 0, 1, False, "strided_copy_1_ll"),
    ((2, 1 << 30), (1 << 30, 1), 0, 1, False, "strided_copy_1_ll"),
    ((2, 3), (BIG - 3, 1), 0, 1, False, "strided_copy_1_ii"),          # spans 2**31 - 1
    ((2, 3), (BIG - 2, 1), 0, 1, False, "strided_copy_1_il"),          # spans 2**31
])
def test_index_widths_around_2_31(size, stride, offset, width, widen, kernel):
    assert plan(size, stride, offset, width, widen=widen).kernel == kernel


def test_the_launcher_and_the_kernel_agree_on_block_and_unroll():
    """The launcher's grid assumes the kernel's UNROLL, and a block larger than the kernel's
    __launch_bounds__ fails to launch."""
    import re
    from pathlib import Path

    from suites._cuda import strided_copy

    source = (Path(strided_copy.__file__).parent / "strided_copy.cu").read_text()
    defines = dict(re.findall(r"^#define (\w+) (\d+)$", source, re.MULTILINE))
    assert int(defines["BLOCK"]) == strided_copy.BLOCK
    assert int(defines["UNROLL"]) == strided_copy.UNROLL
    assert int(defines["MAX_DIMS"]) == strided_copy.MAX_DIMS
