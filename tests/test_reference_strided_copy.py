"""Independent tests of reference_kernels.strided_copy.

Expected values come from a pure-Python gather over coordinates (itertools.product), from
torch.as_strided(...).contiguous(), or from views built with ordinary torch slicing ops; the
code under test is never used to produce its own expectation. Results are compared bitwise
(uint8 views), so NaN payloads and float8 formats are covered exactly.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from reference_kernels.strided_copy import CHUNK, source_span, strided_copy

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.float8_e4m3fn, torch.float8_e5m2]


def random_storage(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """n elements of dtype with random bit patterns (bool: 0 or 1 only)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of t's elements in row-major order, shape (numel, itemsize)."""
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.reshape(-1))  # strides of size-1 dims may be anything in a contiguous tensor
    return flat.view(torch.uint8).reshape(flat.numel(), flat.element_size())


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    assert torch.equal(as_bytes(actual), as_bytes(expected))


def loop_gather(storage: torch.Tensor, size, stride, offset) -> list:
    """Each output element's bytes, gathered one coordinate at a time in plain Python."""
    rows = as_bytes(storage).tolist()
    out = []
    for coord in itertools.product(*(range(s) for s in size)):
        out.append(rows[offset + sum(c * st for c, st in zip(coord, stride, strict=True))])
    return out


def torch_reference(storage, size, stride, offset) -> torch.Tensor:
    return torch.as_strided(storage, tuple(size), tuple(stride), offset).contiguous()


def chunks_for(size) -> list[int]:
    """Chunk sizes to try: tiny, odd, bigger than the view, below the innermost extent."""
    numel = math.prod(size)
    out = {1, 3, 7, numel + 5, CHUNK}
    if size and size[-1] > 1:
        out |= {size[-1] - 1, max(1, size[-1] // 2)}
    return sorted(out)


# ------------------------------------------------------------------------------------------
# source_span

@pytest.mark.parametrize("size, stride, offset, span", [
    ((), (), 0, 1),
    ((), (), 5, 6),
    ((3,), (1,), 0, 3),
    ((3,), (2,), 0, 5),
    ((3,), (2,), 4, 9),
    ((2, 3), (3, 1), 0, 6),
    ((2, 3), (3, 1), 4, 10),
    ((3, 2), (1, 3), 0, 6),          # transpose of (2, 3)
    ((2, 3, 4), (12, 4, 1), 0, 24),
    ((4,), (0,), 2, 3),              # broadcast: one element
    ((2, 2), (1, 1), 0, 3),          # overlapping
    ((5, 7), (0, 0), 9, 10),
    ((0,), (1,), 0, 0),
    ((0, 5), (5, 1), 100, 0),        # empty, offset does not matter
    ((3, 0, 2), (7, 1, 1), 3, 0),
    ((1, 1, 1), (1000, 1000, 1000), 2, 3),
])
def test_source_span_literal(size, stride, offset, span):
    assert source_span(size, stride, offset) == span


# ------------------------------------------------------------------------------------------
# small views against the Python loop gather, every dtype

SMALL_VIEWS = [
    ((), (), 0),
    ((), (), 4),
    ((0,), (1,), 0),
    ((2, 0, 3), (0, 3, 1), 2),
    ((5,), (1,), 0),
    ((5,), (2,), 1),
    ((3, 4), (4, 1), 0),
    ((4, 3), (1, 4), 0),             # transpose
    ((2, 3, 4), (1, 8, 2), 1),       # permuted and stepped
    ((3, 4), (0, 1), 2),             # broadcast rows
    ((3, 4), (1, 0), 2),             # broadcast innermost
    ((4, 5), (1, 1), 0),             # overlapping sliding window
    ((3, 3), (2, 3), 1),             # overlapping, inner stride larger than outer
    ((2, 2, 2, 2), (8, 4, 2, 1), 3),
    ((1, 2, 1, 3, 1, 2), (50, 9, 7, 3, 11, 1), 5),
    ((2, 3), (0, 0), 6),             # every element is one storage element
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size, stride, offset", SMALL_VIEWS, ids=str)
def test_matches_python_loop_gather(dtype, size, stride, offset):
    n = max(source_span(size, stride, offset), offset + 1) + 3
    storage = random_storage(n, dtype, seed=n)
    expected = loop_gather(storage, size, stride, offset)
    for chunk in chunks_for(size):
        out = strided_copy(storage, size, stride, offset, chunk=chunk)
        assert out.dtype == dtype
        assert tuple(out.shape) == tuple(size)
        assert out.is_contiguous()
        assert as_bytes(out).tolist() == expected, f"chunk={chunk}"


def test_int64_values_literal():
    storage = torch.arange(10, 30, dtype=torch.int64)
    out = strided_copy(storage, (2, 3), (1, 4), 2)
    assert out.tolist() == [[12, 16, 20], [13, 17, 21]]
    assert strided_copy(storage, (), (), 7).tolist() == 17
    assert strided_copy(storage, (3, 2), (0, 5), 1).tolist() == [[11, 16]] * 3


# ------------------------------------------------------------------------------------------
# random views against torch.as_strided, every dtype

def random_view(rng: random.Random):
    """A random (size, stride, offset) of one of several shapes of view."""
    ndim = rng.randint(0, 6)
    size = [rng.randint(1, 5 if ndim <= 3 else 3) for _ in range(ndim)]
    if ndim and rng.random() < 0.1:
        size[rng.randrange(ndim)] = 0
    kind = rng.choice(["contiguous", "permuted", "stepped", "broadcast", "overlap", "mixed"])
    # row-major strides of the (possibly padded) base shape
    base = [s + (rng.randint(0, 2) if kind in ("stepped", "mixed") else 0) for s in size]
    stride = [math.prod(base[d + 1:]) for d in range(ndim)]
    if kind in ("stepped", "mixed"):
        stride = [st * rng.randint(1, 3) for st in stride]
    if kind in ("permuted", "mixed") and ndim > 1:
        perm = list(range(ndim))
        rng.shuffle(perm)
        stride = [stride[p] for p in perm]
    if kind in ("broadcast", "mixed") and ndim:
        for d in rng.sample(range(ndim), rng.randint(1, ndim)):
            if kind == "broadcast" or rng.random() < 0.5:
                stride[d] = 0
    if kind == "overlap":
        stride = [rng.randint(0, 3) for _ in range(ndim)]
    offset = rng.randint(0, 9)
    return size, stride, offset


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_views_match_torch_as_strided(dtype):
    rng = random.Random(1234)
    for case in range(60):
        size, stride, offset = random_view(rng)
        n = max(source_span(size, stride, offset), offset + 1) + rng.randint(0, 4)
        storage = random_storage(n, dtype, seed=case)
        expected = torch_reference(storage, size, stride, offset)
        for chunk in chunks_for(size):
            out = strided_copy(storage, size, stride, offset, chunk=chunk)
            assert_bitwise(out, expected)


def test_views_from_real_slicing_ops():
    """Views made by permute / transpose / slicing / expand, whose own .contiguous() is the
    expectation."""
    storage = random_storage(3 * 4 * 5 * 2, torch.float32, seed=7)
    base = storage.view(3, 4, 5, 2)
    views = [
        base.permute(2, 0, 3, 1),
        base.transpose(0, 3)[:, 1:, ::2],
        base[1:, ::3, 1::2, 1],
        base[2, 3, 4, 1],                      # 0-d
        base[:, :0],                           # empty
        base[::2, :, :, :1].expand(2, 4, 5, 3),
        base.view(-1)[5:].unfold(0, 7, 3),     # overlapping windows
        base[:, 1].narrow(1, 1, 3).movedim(0, 2),
    ]
    for v in views:
        assert v.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
        size, stride, offset = tuple(v.shape), v.stride(), v.storage_offset()
        for chunk in chunks_for(size):
            assert_bitwise(strided_copy(storage, size, stride, offset, chunk=chunk),
                           v.contiguous())


@pytest.mark.parametrize("size, stride", [
    ((1, 25), (25, 1)),      # one long row split into pieces
    ((3, 10), (10, 1)),
    ((2, 3, 11), (1, 2, 6)),
    ((4, 9), (0, 3)),
    ((7, 2), (1, 0)),
    ((5, 7), (1, 5)),        # a transpose: gathered column by column when rows fit a chunk
])
def test_chunk_never_changes_the_result(size, stride):
    storage = random_storage(source_span(size, stride, 2) + 1, torch.int16, seed=3)
    expected = torch_reference(storage, size, stride, 2)
    numel = math.prod(size)
    for chunk in range(1, numel + 8):
        assert_bitwise(strided_copy(storage, size, stride, 2, chunk=chunk), expected)


def test_output_is_a_new_tensor():
    storage = torch.arange(12, dtype=torch.int32)
    for size, stride in [((3, 4), (4, 1)), ((), ())]:
        out = strided_copy(storage, size, stride, 0)
        out.fill_(-1)
        assert storage.tolist() == list(range(12))


def test_storage_is_indexed_by_element_not_by_base_storage():
    """A 1-D storage that is itself a view (storage offset, step) is read by its own element
    index: strided_copy(s, ...) equals the Python gather over s's elements."""
    base = torch.arange(100, dtype=torch.int64)
    for storage in (base[10:], base[3::2]):
        size, stride, offset = (3, 4), (1, 5), 2
        expected = [[storage[offset + i + 5 * j].item() for j in range(4)] for i in range(3)]
        assert strided_copy(storage, size, stride, offset).tolist() == expected


# ------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("storage, size, stride, offset", [
    (torch.zeros(2, 3), (2,), (1,), 0),                  # storage 2-D
    (torch.zeros(()), (), (), 0),                        # storage 0-d
    (torch.zeros(10), (2, 3), (3,), 0),                  # length mismatch
    (torch.zeros(10), (2,), (3, 1), 0),
    (torch.zeros(10), (-1,), (1,), 0),                   # negative size
    (torch.zeros(10), (2, 2), (2, -1), 2),               # negative stride
    (torch.zeros(10), (2,), (1,), -1),                   # negative offset
    (torch.zeros(10), (2, 5), (5, 1), 1),                # span 11 > 10
    (torch.zeros(10), (11,), (1,), 0),
    (torch.zeros(10), (), (), 10),                       # 0-d one past the end
    (torch.zeros(10), (4,), (3,), 1),                    # reads index 10
    (torch.zeros(10), (2, 2), (0, 9), 1),                # reads index 10 via a 0 stride
])
def test_errors(storage, size, stride, offset):
    with pytest.raises(ValueError):
        strided_copy(storage, size, stride, offset)


def test_views_that_exactly_fit_are_accepted():
    storage = torch.arange(10)
    assert strided_copy(storage, (2, 5), (5, 1), 0).reshape(-1).tolist() == list(range(10))
    assert strided_copy(storage, (4,), (3,), 0).tolist() == [0, 3, 6, 9]
    assert strided_copy(storage, (), (), 9).item() == 9
    assert strided_copy(storage, (0, 3), (1, 1), 0).shape == (0, 3)


# ------------------------------------------------------------------------------------------
# the large-index class: offsets and strides beyond 2**31

def mem_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def marker(i: int) -> int:
    """A nonzero int8 value that depends on the index i in a scrambled way."""
    v = ((i * 2654435761) >> 7) % 254 - 127
    return v + 1 if v >= 0 else v


def test_offsets_and_strides_beyond_2_31():
    avail = mem_available_bytes()
    if avail < 8 * 2**30:
        pytest.skip(f"needs 8 GiB of MemAvailable for a 2 GiB storage, have "
                    f"{avail / 2**30:.1f} GiB")
    n = 2**31 + 64
    big = 2**31
    views = [
        ((2, 16), (big + 1, 1), 3),               # span 2**31 + 20
        ((4, 8), (8, 1), big + 5),                # offset past 2**31
        ((3, 5), (1, 2), big - 4),                # straddles 2**31
        ((2, 3, 5), (big + 1, 7, 2), 1),          # span 2**31 + 25
        ((2, 4), (big + 3, 0), 40),               # broadcast inner dim, big outer stride
        ((5, 2), (1, big + 30), 0),               # big innermost stride
        ((), (), n - 1),                          # the last element
        ((5,), (big // 4 + 1,), 7),               # span 2**31 + 12
        ((2, 2, 2), (big + 40, 2**30 + 1, 3), 9),  # span 2**31 + 2**30 + 53 > n: error
    ]
    # A zero storage (cheap: the kernel hands out zero pages) with a scrambled nonzero marker
    # written at every element some view reads. A read from a wrong (e.g. 32-bit wrapped)
    # index finds 0 or another index's marker, never the expected value everywhere.
    storage = torch.zeros(n, dtype=torch.int8)
    reads = {}
    for size, stride, offset in views:
        if source_span(size, stride, offset) > n:
            continue
        for coord in itertools.product(*(range(s) for s in size)):
            i = offset + sum(c * st for c, st in zip(coord, stride, strict=True))
            reads[i] = marker(i)
    storage[torch.tensor(list(reads), dtype=torch.int64)] = torch.tensor(
        list(reads.values()), dtype=torch.int8)

    for size, stride, offset in views:
        if source_span(size, stride, offset) > n:
            with pytest.raises(ValueError):
                strided_copy(storage, size, stride, offset)
            continue
        expected_values = [
            marker(offset + sum(c * st for c, st in zip(coord, stride, strict=True)))
            for coord in itertools.product(*(range(s) for s in size))]
        expected = torch_reference(storage, size, stride, offset)
        assert expected.reshape(-1).tolist() == expected_values
        for chunk in (1, 3, 7, CHUNK):
            out = strided_copy(storage, size, stride, offset, chunk=chunk)
            assert_bitwise(out, expected)


@pytest.mark.parametrize("chunk", [0, -3])
def test_a_chunk_below_one_is_a_clear_error(chunk):
    with pytest.raises(ValueError, match="chunk"):
        strided_copy(torch.arange(10), (2, 3), (3, 1), 0, chunk=chunk)
