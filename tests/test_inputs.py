"""Tests for harness.core.inputs: determinism, shard addressing, the documented hash, statistics."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
import torch

from harness.core import inputs as inputs_module
from harness.core.inputs import (
    GENERATOR_VERSION,
    dtype_from_name,
    dtype_name,
    generate,
    hash32,
    nudged,
    reseeded,
    seed_from,
    special_values,
    uniform01,
)

FLOATS = ["f64", "f32", "f16", "bf16", "e4m3", "e5m2"]
SIGNED_INTS = ["i8", "i16", "i32", "i64"]
COMBOS = (
    [(dt, dist) for dt in FLOATS for dist in ("uniform", "normal", "int", "sign")]
    + [(dt, dist) for dt in SIGNED_INTS for dist in ("int", "sign")]
    + [("u8", "int"), ("bool", "int")]
)


def kwargs_for(dtype: str, dist: str) -> dict:
    # u8 cannot hold the default int range [-1, 1]
    return {"low": 0, "high": 200} if dtype == "u8" else {}


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so comparisons are bitwise (NaN == NaN, -0 != +0)."""
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point():
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
        return t.view(width[t.element_size()])
    return t


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a.cpu()), bits(b.cpu()))


# ---------------------------------------------------------------- independent reference

M32 = 0xFFFFFFFF


def py_lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x846CA68B) % 2**32
    x ^= x >> 16
    return x


def py_hash(i: int, seed: int, stream: int) -> int:
    k0 = py_lowbias32(seed ^ py_lowbias32((2 * stream + 1) % 2**32))
    k1 = py_lowbias32(k0 ^ 0x9E3779B9)
    lo, hi = i % 2**32, i // 2**32
    return py_lowbias32(py_lowbias32(lo ^ k0) ^ ((hi * 0x9E3779B9) % 2**32 ^ k1))


def py_u(h: int) -> float:
    return (h >> 8) / 2**24


def py_value(i: int, seed: int, dist: str, *, low=-1.0, high=1.0, mean=0.0, std=1.0) -> float:
    """The documented float64 value of flat element i (stream 0, no rounding to a dtype)."""
    if dist == "uniform":
        return low + (high - low) * py_u(py_hash(i, seed, 0))
    if dist == "normal":
        s = py_u(py_hash(i, seed, 0))
        for j in (1, 2, 3):
            s += py_u(py_hash(i, seed, j))
        return (s - 2.0) * 1.7320508075688772 * std + mean
    if dist == "int":
        return int(low) + py_hash(i, seed, 0) % (int(high) - int(low) + 1)
    if dist == "sign":
        return 1 - 2 * (py_hash(i, seed, 0) >> 31)
    raise AssertionError(dist)


def flat_indices(shape: tuple[int, ...], region: tuple) -> list[int]:
    """Row-major flat indices of whole[region], by plain enumeration (small regions only)."""
    per_dim = []
    for d, n in enumerate(shape):
        r = region[d] if d < len(region) else slice(None)
        per_dim.append(range(n)[r] if isinstance(r, slice) else [r % n])
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    out = [0]
    for idx, stride in zip(per_dim, strides, strict=True):
        out = [base + k * stride for base in out for k in idx]
    return out


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("dtype,dist", COMBOS)
def test_regeneration_is_bit_identical(dtype: str, dist: str) -> None:
    kw = kwargs_for(dtype, dist)
    a = generate((37, 53), dtype, seed=1234, dist=dist, **kw)
    b = generate((37, 53), dtype, seed=1234, dist=dist, **kw)
    assert a.dtype == dtype_from_name(dtype) and a.shape == (37, 53)
    assert_bits_equal(a, b)
    c = generate((37, 53), dtype, seed=1235, dist=dist, **kw)
    assert not torch.equal(bits(a), bits(c)), "a different seed must change the tensor"


def test_pinned_values_match_generator_version() -> None:
    # Changing the generated values without bumping GENERATOR_VERSION would silently break
    # every stored golden; these literals pin version 2.
    assert GENERATOR_VERSION == 2
    bf16 = special_values(torch.bfloat16).view(torch.int16).tolist()
    assert [b & 0xFFFF for b in bf16] == [0x8000, 0x7F7F, 0xFF7F, 0x0080, 0x0001, 0x007F, 0x8001,
                                          0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7FC1]
    idx = torch.tensor([0, 1, 2, 2**32, 2**40 + 5])
    assert hash32(idx, 0).tolist() == [py_hash(int(i), 0, 0) for i in idx]
    assert hash32(idx, 0).tolist() == [2957369479, 261164412, 349713808, 4090471117, 2071073926]
    assert generate(4, "f64", seed=7).tolist() == [py_value(i, 7, "uniform") for i in range(4)]


def test_the_cpu_hash_in_32_bit_words_is_the_int64_one() -> None:
    # the CPU's numpy path against the torch ops every other device runs, on indices whose
    # words take every kind of value: 0, the edges of each word, and random ones up to 2**63
    from harness.core.inputs import _hash32_np, _hash32_torch, _keys

    rng = np.random.default_rng(5)
    edges = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**62, 2**63 - 1]
    idx = torch.tensor(edges + rng.integers(0, 2**63 - 1, 4000, dtype=np.int64).tolist()
                       + rng.integers(0, 2**33, 4000, dtype=np.int64).tolist())
    for seed, stream in ((0, 0), (0xFFFFFFFF, 3), (1234, 17)):
        k0, k1 = _keys(seed, stream)
        fast = torch.from_numpy(_hash32_np(idx.numpy(), k0, k1))
        assert torch.equal(fast, _hash32_torch(idx, k0, k1))
        assert fast.dtype == torch.int64 and int(fast.min()) >= 0 and int(fast.max()) < 2**32
    strided = idx[::3]  # a view: numpy reads it by its strides
    assert torch.equal(hash32(strided, 9), _hash32_torch(strided, *_keys(9, 0)))


# ---------------------------------------------------------------- regions

SHAPES_AND_REGIONS = [
    ((101,), (slice(3, 90, 7),)),
    ((101,), (slice(None, None, 2),)),
    ((101,), (-1,)),
    ((101,), 17),
    ((101,), slice(-20, None)),
    ((101,), (slice(50, 50),)),
    ((5, 7, 9), (slice(1, 4), slice(None, None, 3), slice(2, 9, 2))),
    ((5, 7, 9), (2,)),
    ((5, 7, 9), (slice(None), 3)),
    ((5, 7, 9), (4, slice(1, 6, 4), -2)),
    ((5, 7, 9), (slice(0, 5, 5),)),
    ((5, 7, 9), ()),
    ((3, 1, 11, 2), (slice(None), 0, slice(3, None, 3))),
    ((13, 17), (slice(12, None), slice(None, None, 16))),
    ((), ()),
]


@pytest.mark.parametrize("shape,region", SHAPES_AND_REGIONS)
@pytest.mark.parametrize("dtype,dist", [("f32", "uniform"), ("bf16", "normal"), ("i16", "int")])
def test_region_equals_slice_of_whole(shape, region, dtype: str, dist: str) -> None:
    whole = generate(shape, dtype, seed=99, dist=dist, low=-50, high=50)
    part = generate(shape, dtype, seed=99, dist=dist, low=-50, high=50, region=region)
    expected = whole[region]
    assert part.is_contiguous()
    assert_bits_equal(part, expected.contiguous())


def test_region_none_is_whole_tensor() -> None:
    assert_bits_equal(generate((4, 6), "f16", seed=3, region=None), generate((4, 6), "f16", seed=3))


@pytest.mark.parametrize(
    "shape,region",
    [
        ((2**33,), (slice(2**33 - 40, None, 3),)),
        ((2**33,), (2**32 + 1,)),
        ((70000, 70000), (slice(69990, None, 4), slice(-9, None, 2))),
        ((70000, 70000), (61357,)),  # a whole row past 2**32: 70000 elements
        ((3, 2**31 + 7, 4), (2, slice(2**31 - 2, None), slice(1, 3))),
    ],
)
def test_huge_global_region_matches_python_reference(shape, region) -> None:
    start = time.perf_counter()
    uni = generate(shape, "f64", seed=2024, region=region, low=-2.0, high=3.0)
    nrm = generate(shape, "f64", seed=2024, region=region, dist="normal", mean=1.0, std=0.5)
    ints = generate(shape, "i64", seed=2024, region=region, dist="int", low=-7, high=9)
    elapsed = time.perf_counter() - start
    # Making 2**33+ elements would take minutes and tens of GiB; the region alone is instant.
    assert elapsed < 10.0

    if shape == (70000, 70000) and isinstance(region[0], int):  # a long row: check its ends
        row = region[0]
        picks = [0, 1, 2, 69997, 69998, 69999]
        idx = [row * 70000 + k for k in picks]
        got = [(uni[k].item(), nrm[k].item(), ints[k].item()) for k in picks]
    else:
        idx = flat_indices(shape, region)
        columns = (uni.flatten().tolist(), nrm.flatten().tolist(), ints.flatten().tolist())
        got = list(zip(*columns, strict=True))
    assert max(idx) >= 2**32, "the check must reach indices past 2**32"
    assert len(idx) == len(got) > 0
    for i, (u, n, k) in zip(idx, got, strict=True):
        assert u == py_value(i, 2024, "uniform", low=-2.0, high=3.0)
        assert n == py_value(i, 2024, "normal", mean=1.0, std=0.5)
        assert k == py_value(i, 2024, "int", low=-7, high=9)


@pytest.mark.parametrize(
    "shape,region", SHAPES_AND_REGIONS[:10] + [((20, 30), (slice(1, None, 3),))]
)
@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunking_does_not_change_values(shape, region, chunk: int) -> None:
    ref = generate(shape, "f32", seed=5, dist="normal", region=region)
    assert_bits_equal(
        generate(shape, "f32", seed=5, dist="normal", region=region, chunk_elems=chunk), ref
    )


@pytest.mark.parametrize("dtype,dist", COMBOS)
def test_a_nudge_changes_a_few_elements_the_same_in_every_region(dtype: str, dist: str) -> None:
    """The near twin's values: the tensor's own but at 1 to 4 elements, which take values of
    the same distribution (those of the salted seed there); every region, chunking and
    reseeding agrees on which (ranks make their shards alone)."""
    kw = kwargs_for(dtype, dist)
    plain = generate((6, 50), dtype, seed=17, dist=dist, **kw)
    with nudged(99):
        near = generate((6, 50), dtype, seed=17, dist=dist, **kw)
        rows = [generate((6, 50), dtype, seed=17, dist=dist, region=(r,), chunk_elems=7, **kw)
                for r in range(6)]
    moved = (bits(near) != bits(plain)).reshape(-1).nonzero().reshape(-1)
    assert 1 <= len(moved) <= 4
    assert_bits_equal(torch.stack(rows), near)
    other = generate((6, 50), dtype, seed=17 ^ 99, dist=dist, **kw).reshape(-1)
    assert_bits_equal(near.reshape(-1)[moved], other[moved])
    with nudged(0):
        assert_bits_equal(generate((6, 50), dtype, seed=17, dist=dist, **kw), plain)
    with reseeded(5):  # a twin's near values are near the twin's
        twin = generate((6, 50), dtype, seed=17, dist=dist, **kw)
        with nudged(99):
            assert (bits(generate((6, 50), dtype, seed=17, dist=dist, **kw))
                    != bits(twin)).sum() in range(1, 5)


def test_a_nudge_moves_other_elements_under_another_salt_or_seed() -> None:
    plain = generate((4096,), "f32", seed=3)

    def moved(salt: int, seed: int = 3) -> set[int]:
        with nudged(salt):
            near = generate((4096,), "f32", seed=seed)
        return set((near != generate((4096,), "f32", seed=seed)).nonzero().reshape(-1).tolist())

    assert len(moved(1)) == 4 and moved(1) != moved(2) and moved(1) != moved(1, seed=4)
    assert moved(1) == moved(1)  # deterministic
    assert plain.equal(generate((4096,), "f32", seed=3))


def test_large_tensor_spans_many_cpu_chunks() -> None:
    # 3 * 2**15 + 5 elements: the CPU chunk cap splits it; values must match the reference
    shape = (3 * 2**15 + 5,)
    t = generate(shape, "f64", seed=11, dist="int", low=0, high=1000)
    for i in (0, 2**15 - 1, 2**15, 2 * 2**15 + 17, shape[0] - 1):
        assert t[i].item() == py_value(i, 11, "int", low=0, high=1000)


@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_chunks_give_every_thread_a_grain(monkeypatch, threads: int) -> None:
    # each hash pass is one torch op per chunk, split between the intra-op threads a grain
    # (32768 elements) at a time: a chunk of fewer grains than threads leaves cores idle
    sizes: list[int] = []
    real = inputs_module.hash32

    def counted(index, seed, stream=0):
        sizes.append(index.numel())
        return real(index, seed, stream)

    monkeypatch.setattr(inputs_module, "hash32", counted)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 7 * 2**15 + 3
        t = generate((n,), "f64", seed=4, low=-100.0, high=100.0)
    finally:
        torch.set_num_threads(before)
    assert max(sizes) == threads * 2**15
    assert sum(sizes) == n
    for i in (0, threads * 2**15 - 1, threads * 2**15, n - 1):
        assert t[i].item() == py_value(i, 4, "uniform", low=-100.0, high=100.0)


# ---------------------------------------------------------------- streams and statistics


def test_seeds_and_streams_are_independent() -> None:
    n = 100_000
    base = generate(n, "f64", seed=1)
    others = [
        generate(n, "f64", seed=2),
        generate(n, "f64", seed=1, stream=1),
        generate(n, "f64", seed=1, stream=2),
        generate(n, "f64", seed=seed_from("case", "x")),
    ]
    for other in others:
        assert (base == other).float().mean() < 1e-3
        corr = torch.corrcoef(torch.stack([base, other]))[0, 1].abs().item()
        assert corr < 0.02
    # neighbouring elements, and blocks 2**32 apart, are not correlated either
    assert torch.corrcoef(torch.stack([base[:-1], base[1:]]))[0, 1].abs() < 0.02
    far = generate(2**33, "f64", seed=1, region=(slice(2**32, 2**32 + n),))
    assert (base == far).float().mean() < 1e-3


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_stays_in_range_with_midpoint_mean(dtype: str) -> None:
    for low, high in ((-1.0, 1.0), (2.0, 5.0), (0.1, 0.3)):
        x = generate(100_000, dtype, seed=8, low=low, high=high).double()
        assert x.min() >= low and x.max() < high
        # fp8 rounding biases the mean by up to about one spacing near `high`
        slack = torch.finfo(dtype_from_name(dtype)).eps * high if dtype.startswith("e") else 0.0
        assert abs(x.mean().item() - (low + high) / 2) < 0.02 * (high - low) + slack
    # bf16 rounds ~1e-3 of the values in [1 - 2**-9, 1) up to 1.0: the range must still hold
    x = generate(100_000, "bf16", seed=8)
    assert (x == 1.0).sum() == 0 and (x == -1.0).sum() > 0


@pytest.mark.parametrize("dtype", ["i8", "u8", "i32", "i64", "f32", "bf16", "e4m3"])
def test_int_covers_range_and_stays_inside(dtype: str) -> None:
    low, high = (0, 9) if dtype == "u8" else (-4, 5)
    x = generate(5000, dtype, seed=3, dist="int", low=low, high=high)
    assert x.dtype == dtype_from_name(dtype)
    values = x.to(torch.int64)
    assert torch.equal(values.double(), x.double()), "floats must hold exact integers"
    assert sorted(values.unique().tolist()) == list(range(low, high + 1))


def test_bool_is_a_fair_coin() -> None:
    x = generate(100_000, "bool", seed=4, dist="int")
    assert abs(x.double().mean().item() - 0.5) < 0.01


def test_sign_is_plus_or_minus_one() -> None:
    x = generate(100_000, "f32", seed=4, dist="sign")
    assert sorted(x.unique().tolist()) == [-1.0, 1.0]
    assert abs(x.double().mean().item()) < 0.02
    assert torch.equal(generate(100, "i8", seed=4, dist="sign").float(), x[:100])


def test_normal_moments_and_bounds() -> None:
    x = generate(100_000, "f64", seed=6, dist="normal")
    assert abs(x.mean().item()) < 0.02
    assert abs(x.std().item() - 1.0) < 0.02
    assert x.abs().max() <= 2 * 3**0.5  # Irwin-Hall of 4 is bounded
    assert (x.abs() > 2).float().mean() > 0.02  # and still has tails
    y = generate(100_000, "f64", seed=6, dist="normal", mean=3.0, std=0.25)
    assert abs(y.mean().item() - 3.0) < 0.01 and abs(y.std().item() - 0.25) < 0.01


def test_uniform01_from_top_24_bits() -> None:
    h = torch.tensor([0, 255, 256, M32])
    assert uniform01(h).tolist() == [0.0, 0.0, 2.0**-24, 1.0 - 2.0**-24]
    assert uniform01(h).dtype == torch.float64


# ---------------------------------------------------------------- seeds and names


def test_seed_from_is_stable_and_unambiguous() -> None:
    expected = int.from_bytes(hashlib.sha256(b"4:case1:7").digest()[:4], "little")
    assert seed_from("case", 7) == expected
    assert seed_from("case", 7) == seed_from("case", "7")
    assert seed_from("ab", "c") != seed_from("a", "bc")
    assert seed_from("x") != seed_from("x", "")
    assert 0 <= seed_from("anything") < 2**32
    with pytest.raises(TypeError):
        seed_from(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "short,torch_name",
    [
        ("f64", "float64"),
        ("f32", "float32"),
        ("f16", "float16"),
        ("bf16", "bfloat16"),
        ("e4m3", "float8_e4m3fn"),
        ("e5m2", "float8_e5m2"),
        ("i8", "int8"),
        ("i16", "int16"),
        ("i32", "int32"),
        ("i64", "int64"),
        ("u8", "uint8"),
        ("bool", "bool"),
    ],
)
def test_dtype_names_round_trip(short: str, torch_name: str) -> None:
    dt = dtype_from_name(short)
    assert dt is getattr(torch, torch_name)
    assert dtype_from_name(torch_name) is dt
    assert dtype_from_name(f"torch.{torch_name}") is dt
    assert dtype_name(dt) == short
    assert generate(3, short, seed=0, dist="int", low=0, high=1).dtype is dt


def test_dtype_name_errors() -> None:
    with pytest.raises(ValueError, match="valid names: f64, f32"):
        dtype_from_name("float128")
    with pytest.raises(ValueError, match="unsupported dtype"):
        dtype_name(torch.complex64)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"dist": "gaussian"}, "unknown dist 'gaussian'"),
        ({"region": (5,)}, "out of bounds"),
        ({"region": (-6,)}, "out of bounds"),
        ({"region": (slice(0, 6),)}, "out of bounds"),
        ({"region": (slice(None), slice(-7, None))}, "out of bounds"),
        ({"region": (slice(None, None, -1),)}, "step > 0"),
        ({"region": (0, 0, 0)}, "more entries"),
        ({"region": ([0, 1],)}, "int or a slice"),
        ({"dtype": "i32"}, "needs a float dtype"),
        ({"dtype": "u8", "dist": "sign"}, "signed dtype"),
        ({"dtype": "bool", "dist": "sign"}, "signed dtype"),
        ({"dtype": "i8", "dist": "int", "low": 0, "high": 300}, "does not fit i8"),
        ({"dist": "int", "low": 0.5}, "integral"),
        ({"low": 1.0, "high": 1.0}, "low < high"),
        ({"dtype": "e4m3", "high": 1000.0}, "e4m3"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"stream": -1}, "stream"),
        ({"chunk_elems": 0}, "chunk_elems"),
    ],
)
def test_bad_arguments_raise_one_clear_line(kwargs: dict, message: str) -> None:
    args = {"dtype": "f32", "seed": 1} | kwargs
    dtype = args.pop("dtype")
    with pytest.raises(ValueError, match=message) as info:
        generate((5, 6), dtype, **args)
    assert "\n" not in str(info.value)


def test_bad_shape_raises() -> None:
    with pytest.raises(ValueError, match="negative"):
        generate((3, -1), "f32", seed=0)


# ---------------------------------------------------------------- CPU/CUDA identity


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype,dist", COMBOS)
def test_cuda_is_bit_identical_to_cpu(dtype: str, dist: str) -> None:
    kw = kwargs_for(dtype, dist)
    shape, region = (70000, 70000), (slice(69000, None, 3), slice(5, None, 2))
    cpu = generate(shape, dtype, seed=77, dist=dist, region=region, **kw)
    gpu = generate(shape, dtype, seed=77, dist=dist, region=region, device="cuda", **kw)
    assert gpu.device.type == "cuda"
    assert_bits_equal(gpu, cpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype,dist", COMBOS)
def test_a_nudge_on_cuda_changes_the_cpus_elements(dtype: str, dist: str) -> None:
    kw = kwargs_for(dtype, dist)
    with nudged(seed_from("near twin")):
        cpu = generate((600, 7), dtype, seed=77, dist=dist, region=(slice(3, None),), **kw)
        gpu = generate((600, 7), dtype, seed=77, dist=dist, region=(slice(3, None),),
                       device="cuda", **kw)
    assert_bits_equal(gpu, cpu)
    plain = generate((600, 7), dtype, seed=77, dist=dist, region=(slice(3, None),), **kw)
    assert 1 <= int((bits(plain) != bits(cpu)).sum()) <= 4  # nudged: not the plain values


# ---------------------------------------------------------------- the memo of recent tensors
def test_a_tensor_asked_for_again_is_a_copy_of_the_same_bits() -> None:
    from harness.core.inputs import RECENT, nudged, reseeded

    RECENT.clear()
    first = generate((64, 33), "bf16", seed=5)
    first.fill_(0)  # the caller's to write: what is kept is not this tensor
    again = generate((64, 33), "bf16", seed=5)
    RECENT.clear()
    made = generate((64, 33), "bf16", seed=5)
    assert torch.equal(again.view(torch.int16), made.view(torch.int16))
    assert again.untyped_storage().data_ptr() != made.untyped_storage().data_ptr()
    # everything the values depend on is part of what is asked for
    for other in (generate((64, 33), "bf16", seed=6), generate((64, 33), "f16", seed=5),
                  generate((64, 33), "bf16", seed=5, low=-2.0),
                  generate((64, 33), "bf16", seed=5, stream=1),
                  generate((64, 33), "bf16", seed=5, region=(slice(1, 3),))):
        assert other.shape != made.shape or not torch.equal(other.float(), made.float())
    with reseeded(3):
        assert not torch.equal(generate((64, 33), "bf16", seed=5).float(), made.float())
    with nudged(3):
        assert not torch.equal(generate((64, 33), "bf16", seed=5).float(), made.float())
    assert torch.equal(generate((64, 33), "bf16", seed=5).view(torch.int16),
                       made.view(torch.int16))


def test_the_memo_keeps_the_newest_tensors_within_its_budget() -> None:
    from harness.core.recent import Recent

    memo = Recent(budget=3 * 400, largest=400)
    for k in range(4):
        memo.put(k, torch.full((100,), float(k)))  # 400 bytes each
    assert memo.get(0) is None  # the oldest went
    assert float(memo.get(1)[0]) == 1.0  # and 1 is now the newest
    memo.put(4, torch.zeros(100))
    assert memo.get(2) is None and memo.get(1) is not None
    memo.put("big", torch.zeros(101))  # past the largest kept
    assert memo.get("big") is None
    got = memo.get(4)
    got.fill_(9)
    assert float(memo.get(4)[0]) == 0.0
