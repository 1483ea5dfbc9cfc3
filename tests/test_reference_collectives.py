"""Tests for reference_kernels.collectives and the exact-by-construction inputs of the allreduce
suite (SEMANTICS.md "Collectives").

Expected values come from closed forms, plain-Python float64 arithmetic on the inputs, and, for
the data-movement collectives, element-by-element constructions from inputs that encode each
element's (rank, index).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from reference_kernels import collectives as ref
from suites._collectives import allreduce as suite

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
WORLD_SIZES = list(range(1, 9))

#: significant bits: every integer of magnitude <= 2**p is exact in the dtype
PRECISION_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
DTYPE_OF = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
            "i32": torch.int32}


def rank_plus_one(world_size: int, dtype: torch.dtype, n: int = 5) -> list[torch.Tensor]:
    return [torch.full((n,), r + 1, dtype=dtype) for r in range(world_size)]


def values(t: torch.Tensor) -> list[float]:
    return t.to(torch.float64).tolist()


# ------------------------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("w", WORLD_SIZES)
def test_sum_min_max_closed_forms(dtype, w):
    xs = rank_plus_one(w, dtype)
    for op, want in (("sum", w * (w + 1) // 2), ("min", 1), ("max", w)):
        out = ref.allreduce(xs, op)
        assert out.dtype == dtype
        assert values(out) == [float(want)] * 5, op


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("w", WORLD_SIZES)
def test_prod_closed_form(dtype, w):
    want = math.factorial(w)
    if dtype == torch.bfloat16 and w >= 7:
        # 7! = 315 * 2**4 and 8! = 315 * 2**7; 315 needs 9 bits, bf16 keeps 8: 315 is halfway
        # between 314 (mantissa ...01, odd) and 316 (...10, even) -> ties to even gives 316
        want = 316 * 2 ** (4 if w == 7 else 7)
    out = ref.allreduce(rank_plus_one(w, dtype), "prod")
    assert out.dtype == dtype
    assert values(out) == [float(want)] * 5


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("w", WORLD_SIZES)
def test_avg_closed_form(dtype, w):
    out = ref.allreduce(rank_plus_one(w, dtype), "avg")
    assert out.dtype == dtype
    assert values(out) == [(w + 1) / 2] * 5


def test_out_dtype_float64_keeps_precision():
    # 256 + 1 = 257 needs 9 bits: bf16 rounds it (tie) to the even 256, float64 keeps it
    xs = [torch.tensor([256.0], dtype=torch.bfloat16), torch.tensor([1.0], dtype=torch.bfloat16)]
    assert ref.allreduce(xs, "sum").dtype == torch.bfloat16
    assert values(ref.allreduce(xs, "sum")) == [256.0]
    out64 = ref.allreduce(xs, "sum", out_dtype=torch.float64)
    assert out64.dtype == torch.float64 and out64.tolist() == [257.0]
    # float32: 2**24 + 1 is not representable, in float64 it is
    xs = [torch.tensor([2.0**24]), torch.tensor([1.0])]
    assert ref.allreduce(xs, "sum").tolist() == [2.0**24]
    assert ref.allreduce(xs, "sum", out_dtype=torch.float64).tolist() == [2.0**24 + 1]
    # avg of bf16 1, 2, 2 = 5/3, kept in float64
    xs = [torch.tensor([v], dtype=torch.bfloat16) for v in (1.0, 2.0, 2.0)]
    assert ref.allreduce(xs, "avg", out_dtype=torch.float64).tolist() == [5.0 / 3.0]


def test_accumulates_wider_than_the_data():
    # bf16 running sum 256 + 1 + 1 would stay at 256 (each +1 is a tie that rounds to even);
    # one rounding of the exact 258 = 129 * 2 (8 bits) gives 258
    xs = [torch.tensor([v], dtype=torch.bfloat16) for v in (256.0, 1.0, 1.0)]
    assert values(ref.allreduce(xs, "sum")) == [258.0]


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_default_result_dtype_is_input_dtype(dtype):
    xs = rank_plus_one(3, dtype)
    for op in ref.REDUCE_OPS:
        if op == "avg" and not dtype.is_floating_point:
            continue
        assert ref.allreduce(xs, op).dtype == dtype


@pytest.mark.parametrize("dtype", INTS + [torch.int8, torch.uint8], ids=str)
def test_integer_avg_raises(dtype):
    with pytest.raises(ValueError, match="avg"):
        ref.allreduce(rank_plus_one(2, dtype), "avg")


def test_unknown_op_and_no_inputs_raise():
    with pytest.raises(ValueError, match="median"):
        ref.allreduce(rank_plus_one(2, torch.float32), "median")
    with pytest.raises(ValueError):
        ref.allreduce([], "sum")


# ----------------------------------------------------------------------------------- tagged inputs
# Inputs encode their origin: element i of rank r holds r * BASE + i, so every output element
# says which rank and which input index it came from. Expected outputs are built element by
# element from the definitions, never from the functions under test.
BASE = 1000
NARROW_BASE = 32  # bf16 keeps every integer up to 256 exact: 7 * 32 + 31 = 255
SPREAD_WORLD_SIZES = [1, 2, 4, 8]


def tagged(numels: Sequence[int], dtype: torch.dtype = torch.float64,
           base: int = BASE) -> list[torch.Tensor]:
    """Rank r's input: numels[r] values r * base + i."""
    assert all(n <= base for n in numels)
    return [torch.tensor([r * base + i for i in range(n)], dtype=dtype)
            for r, n in enumerate(numels)]


def origins(t: torch.Tensor, base: int = BASE) -> list[tuple[int, int]]:
    """(rank, index) of every element of a result built from tagged() inputs."""
    return [divmod(int(v), base) for v in values(t.reshape(-1))]


def uneven_counts(w: int) -> list[list[int]]:
    """send_counts[j][r] in 0..3 with zeros scattered; the last rank (w > 1) sends nothing."""
    counts = [[(2 * j + 3 * r + j * r) % 4 for r in range(w)] for j in range(w)]
    if w > 1:
        counts[-1] = [0] * w
    return counts


def small_ints(w: int, numel: int, seed: int) -> list[torch.Tensor]:
    """Rank inputs of small signed integers (int64): sums and products stay exact."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-3, 4, (numel,), generator=gen, dtype=torch.int64) for _ in range(w)]


# --------------------------------------------------------------------------------------- allgather
@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
@pytest.mark.parametrize("splits", [None, "whole"])
def test_allgather_is_rank_order_concatenation(w, splits):
    """Without splits (or with one split of n) the output is rank 0's input, then rank 1's..."""
    n = 6
    xs = [x.reshape(2, 3) for x in tagged([n] * w)]  # flattened in row-major order
    out = ref.allgather(xs, None if splits is None else [n])
    assert out.shape == (w * n,) and out.dtype == torch.float64
    assert origins(out) == [(r, i) for r in range(w) for i in range(n)]


@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
@pytest.mark.parametrize("splits", [(3, 0, 1, 4), (0, 8), (8, 0), (1, 1, 1, 1, 1, 1, 1, 1),
                                    (0, 0, 5, 0, 3, 0)], ids=str)
def test_allgather_splits_zero3_layout(w, splits):
    """Parameter i's gathered tensor is contiguous, in order, and holds shard i of every rank."""
    n = sum(splits)
    out = ref.allgather(tagged([n] * w), splits)
    want, offset = [], 0
    for count in splits:
        for r in range(w):
            for k in range(count):
                want.append((r, offset + k))
        offset += count
    assert out.shape == (w * n,)
    assert origins(out) == want


@pytest.mark.parametrize("splits", [None, (2, 0, 3)], ids=str)
def test_allgather_one_rank_is_its_input(splits):
    """W=1: the gathered output is the rank's own flat input, whatever the splits."""
    x = torch.tensor([5.0, -1.0, 7.0, 0.5, 2.0])
    assert ref.allgather([x], splits).tolist() == [5.0, -1.0, 7.0, 0.5, 2.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32], ids=str)
def test_allgather_keeps_dtype_and_values(dtype):
    """bf16 and int32 pass through unconverted and unrounded."""
    w, n = 8, 31
    out = ref.allgather(tagged([n] * w, dtype, NARROW_BASE), (10, 0, 21))
    assert out.dtype == dtype
    want = [(r, off + k) for off, c in ((0, 10), (10, 21)) for r in range(w) for k in range(c)]
    assert origins(out, NARROW_BASE) == want


def test_allgather_errors():
    """Splits that miss the count, negative splits, unequal counts and no ranks raise."""
    xs = tagged([4, 4])
    with pytest.raises(ValueError, match="splits"):
        ref.allgather(xs, (1, 2))
    with pytest.raises(ValueError, match="splits"):
        ref.allgather(xs, (2, 3))
    with pytest.raises(ValueError, match="splits"):
        ref.allgather(xs, (5, -1))  # sums to 4 but a count is negative
    with pytest.raises(ValueError, match="same count"):
        ref.allgather(tagged([4, 3]))
    with pytest.raises(ValueError):
        ref.allgather([])


# ---------------------------------------------------------------------------------- reduce_scatter
PY_REDUCE = {"sum": sum, "prod": math.prod, "min": min, "max": max}


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_reduce_scatter_matches_loop(w, op):
    """Rank r gets, for k < n, the reduction over ranks j of input j's element r * n + k."""
    n = 3
    xs = small_ints(w, w * n, seed=w)
    rows = [x.tolist() for x in xs]
    for r in range(w):
        out = ref.reduce_scatter(xs, op, r)
        assert out.dtype == torch.int64 and out.shape == (n,)
        want = [PY_REDUCE[op]([rows[j][r * n + k] for j in range(w)]) for k in range(n)]
        assert out.tolist() == want, r


@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_reduce_scatter_avg_matches_loop(w):
    """avg on floats: the float64 sum over ranks divided by W, per element of piece r."""
    n = 2
    xs = [x.to(torch.float64) for x in small_ints(w, w * n, seed=10 + w)]
    rows = [x.tolist() for x in xs]
    for r in range(w):
        want = [sum(rows[j][r * n + k] for j in range(w)) / w for k in range(n)]
        assert ref.reduce_scatter(xs, "avg", r).tolist() == want


@pytest.mark.parametrize("op", ref.REDUCE_OPS)
@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_reduce_scatter_pieces_concatenate_to_allreduce(w, op):
    """Concatenating every rank's reduce_scatter output gives the allreduce of the inputs."""
    xs = [x.to(torch.float32) for x in small_ints(w, w * 5, seed=20 + w)]
    pieces = torch.cat([ref.reduce_scatter(xs, op, r) for r in range(w)])
    assert pieces.dtype == torch.float32
    assert pieces.tolist() == ref.allreduce(xs, op).tolist()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_reduce_scatter_one_rank_is_its_input(op):
    """W=1: the single piece is the whole input, reduced over one rank: unchanged."""
    x = torch.tensor([3.0, -2.0, 0.5, 8.0])
    assert ref.reduce_scatter([x], op, 0).tolist() == [3.0, -2.0, 0.5, 8.0]


def test_reduce_scatter_rounds_once_to_out_dtype():
    """Accumulates wider than bf16 and rounds once; out_dtype=float64 keeps the exact value."""
    # W=3, n=1: piece 0 is (256, 1, 1) -> exact 258 (8 bits), a bf16 running sum stays at 256;
    # piece 1 is (256, 1, 0) -> 257 rounds (tie to even) to 256 in bf16, stays 257 in float64
    cols = [(256.0, 1.0, 1.0), (256.0, 1.0, 0.0), (1.0, 2.0, 3.0)]
    xs = [torch.tensor([c[j] for c in cols], dtype=torch.bfloat16) for j in range(3)]
    assert ref.reduce_scatter(xs, "sum", 0).dtype == torch.bfloat16
    assert values(ref.reduce_scatter(xs, "sum", 0)) == [258.0]
    assert values(ref.reduce_scatter(xs, "sum", 1)) == [256.0]
    out64 = ref.reduce_scatter(xs, "sum", 1, out_dtype=torch.float64)
    assert out64.dtype == torch.float64 and out64.tolist() == [257.0]
    assert ref.reduce_scatter(xs, "avg", 2, out_dtype=torch.float64).tolist() == [2.0]


def test_reduce_scatter_int32():
    """int32 in, int32 out, values as the plain-Python sum."""
    xs = [torch.tensor([1, -2, 30_000, 4], dtype=torch.int32),
          torch.tensor([10, 20, 30_000, -40], dtype=torch.int32)]
    out0, out1 = (ref.reduce_scatter(xs, "sum", r) for r in range(2))
    assert out0.dtype == out1.dtype == torch.int32
    assert out0.tolist() == [11, 18] and out1.tolist() == [60_000, -36]


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_reduce_scatter_integer_avg_raises(dtype):
    with pytest.raises(ValueError, match="avg"):
        ref.reduce_scatter(rank_plus_one(2, dtype, n=4), "avg", 0)


def test_reduce_scatter_errors():
    """A count not divisible by W, a rank outside the world and an unknown op raise."""
    xs = rank_plus_one(3, torch.float32, n=4)
    with pytest.raises(ValueError, match="equal pieces"):
        ref.reduce_scatter(xs, "sum", 0)
    xs = rank_plus_one(2, torch.float32, n=4)
    for rank in (-1, 2):
        with pytest.raises(ValueError, match="outside"):
            ref.reduce_scatter(xs, "sum", rank)
    with pytest.raises(ValueError, match="median"):
        ref.reduce_scatter(xs, "median", 0)


def test_reduce_scatter_unequal_counts_raise():
    with pytest.raises(ValueError):
        ref.reduce_scatter([torch.ones(4), torch.ones(6)], "sum", 0)


# -------------------------------------------------------------------------------------- all_to_all
def expected_all_to_all(counts: Sequence[Sequence[int]], rank: int) -> list[tuple[int, int]]:
    """Origins of what ``rank`` receives: from each j in order, j's elements addressed to it."""
    want = []
    for j, row in enumerate(counts):
        start = sum(row[:rank])
        want.extend((j, start + k) for k in range(row[rank]))
    return want


@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_all_to_all_equal_splits(w):
    """Equal splits: rank r receives elements r*n..(r+1)*n-1 of every rank, in rank order."""
    n = 3
    xs = tagged([w * n] * w)
    for r in range(w):
        out = ref.all_to_all(xs, [[n] * w for _ in range(w)], r)
        assert origins(out) == [(j, r * n + k) for j in range(w) for k in range(n)]


@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_all_to_all_uneven_splits(w):
    """Uneven counts, zeros and a rank that sends nothing: every element from the right place."""
    counts = uneven_counts(w)
    xs = tagged([sum(row) for row in counts])
    for r in range(w):
        out = ref.all_to_all(xs, counts, r)
        assert out.numel() == sum(counts[j][r] for j in range(w))
        assert origins(out) == expected_all_to_all(counts, r), r


def test_all_to_all_hand_written_matrix():
    """A 3-rank example spelled out: rank 1 sends nothing, rank 2 receives nothing."""
    counts = [[1, 2, 0],
              [0, 0, 0],
              [3, 1, 0]]
    xs = [torch.tensor([10.0, 11.0, 12.0]), torch.tensor([]), torch.tensor([20.0, 21, 22, 23])]
    assert ref.all_to_all(xs, counts, 0).tolist() == [10.0, 20.0, 21.0, 22.0]
    assert ref.all_to_all(xs, counts, 1).tolist() == [11.0, 12.0, 23.0]
    assert ref.all_to_all(xs, counts, 2).tolist() == []


@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_all_to_all_round_trip(w):
    """Sending the received data back with the transposed counts restores every input."""
    counts = uneven_counts(w)
    xs = tagged([sum(row) for row in counts])
    received = [ref.all_to_all(xs, counts, r) for r in range(w)]
    transposed = [[counts[j][r] for j in range(w)] for r in range(w)]
    for r in range(w):
        assert ref.all_to_all(received, transposed, r).tolist() == xs[r].tolist(), r


def test_all_to_all_one_rank_is_its_input():
    """W=1: the rank sends all of its input to itself."""
    x = torch.tensor([4.0, 5.0, 6.0])
    assert ref.all_to_all([x], [[3]], 0).tolist() == [4.0, 5.0, 6.0]
    assert ref.all_to_all([torch.tensor([])], [[0]], 0).tolist() == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32], ids=str)
def test_all_to_all_keeps_dtype_and_values(dtype):
    counts = uneven_counts(8)
    xs = tagged([sum(row) for row in counts], dtype, NARROW_BASE)
    for r in range(8):
        out = ref.all_to_all(xs, counts, r)
        assert out.dtype == dtype
        assert origins(out, NARROW_BASE) == expected_all_to_all(counts, r)


def test_all_to_all_errors():
    """A count matrix of the wrong shape, or a row not summing to the input's count, raises."""
    xs = tagged([2, 2])
    for counts in ([[1, 1]], [[1, 1], [1, 1], [1, 1]], [[1, 1], [2]], [[1, 1], [1, 1, 0]]):
        with pytest.raises(ValueError, match="2 x 2"):
            ref.all_to_all(xs, counts, 0)
    with pytest.raises(ValueError, match="rank 1 sends 3"):
        ref.all_to_all(xs, [[1, 1], [2, 1]], 0)


@pytest.mark.parametrize("rank", [-1, 2])
def test_all_to_all_rank_out_of_range_raises(rank):
    with pytest.raises(ValueError):
        ref.all_to_all(tagged([2, 2]), [[1, 1], [1, 1]], rank)


def test_all_to_all_negative_count_raises():
    with pytest.raises(ValueError):
        ref.all_to_all(tagged([2, 2]), [[3, -1], [1, 1]], 0)


# --------------------------------------------------------------------------------------- broadcast
@pytest.mark.parametrize("w", SPREAD_WORLD_SIZES)
def test_broadcast_every_root(w):
    """Every root: the result is root's input, element by element, shape and dtype kept."""
    xs = [x.reshape(2, 3) for x in tagged([6] * w)]
    for root in range(w):
        out = ref.broadcast(xs, root)
        assert out.shape == (2, 3) and out.dtype == torch.float64
        assert origins(out) == [(root, i) for i in range(6)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32], ids=str)
def test_broadcast_keeps_dtype_and_values(dtype):
    xs = tagged([5] * 4, dtype, NARROW_BASE)
    out = ref.broadcast(xs, 2)
    assert out.dtype == dtype
    assert origins(out, NARROW_BASE) == [(2, i) for i in range(5)]


def test_broadcast_ignores_other_ranks():
    """Non-root inputs are not read: their shapes and dtypes may differ from root's."""
    xs = [torch.zeros(7, dtype=torch.int32), torch.tensor([1.5, 2.5]), torch.ones(2, 2)]
    assert ref.broadcast(xs, 1).tolist() == [1.5, 2.5]


def test_broadcast_returns_a_copy():
    """The result shares no memory with root's input: writing either leaves the other alone."""
    xs = tagged([4, 4])
    out = ref.broadcast(xs, 1)
    assert out.untyped_storage().data_ptr() != xs[1].untyped_storage().data_ptr()
    out.fill_(-1.0)
    assert origins(xs[1]) == [(1, i) for i in range(4)]
    out = ref.broadcast(xs, 1)
    xs[1].zero_()
    assert origins(out) == [(1, i) for i in range(4)]


def test_broadcast_root_out_of_range_raises():
    xs = tagged([3, 3])
    for root in (-1, 2, 5):
        with pytest.raises(ValueError, match="outside"):
            ref.broadcast(xs, root)


# ------------------------------------------------------------------------------------ suite inputs
EXACT_SMOKE = [p for p in suite.ALLREDUCE.grid["smoke"] if p["mode"] == "exact"]
RANDOM_SMOKE = [p for p in suite.ALLREDUCE.grid["smoke"] if p["mode"] == "random"]


def _limit(dtype: torch.dtype) -> tuple[int, int]:
    """Largest positive and negative magnitudes up to which every integer is exact."""
    if dtype in PRECISION_BITS:
        return 2 ** PRECISION_BITS[dtype], 2 ** PRECISION_BITS[dtype]
    bits = torch.iinfo(dtype).bits
    return 2 ** (bits - 1) - 1, 2 ** (bits - 1)


def _case_name(p) -> str:
    return ",".join(f"{k}={p[k]}" for k in sorted(p))


@pytest.mark.parametrize("w", [1, 4, 8])
@pytest.mark.parametrize("params", EXACT_SMOKE, ids=_case_name)
def test_exact_inputs_make_every_summation_order_exact(params, w):
    dtype = DTYPE_OF[params["dtype"]]
    xs = [suite.allreduce_inputs(params, r, w)["x"] for r in range(w)]
    assert all(x.dtype == dtype and x.shape == (params["n"],) for x in xs)
    rows = [values(x) for x in xs]
    pos_limit, neg_limit = _limit(dtype)
    op = params["op"]
    assert any(v != 0 for row in rows for v in row), "inputs are all zero"
    if w > 1:
        assert rows[0] != rows[1], "ranks got the same input"
    assert all(map(float.is_integer, (v for row in rows for v in row)))
    if op in ("sum", "avg"):
        # every partial sum, in any order, lies in [-(sum of negatives), sum of positives];
        # with integers (exact in float64 here) pos = (s + |s|_1)/2 and neg = (|s|_1 - s)/2
        for column in zip(*rows, strict=True):
            total, total_abs = sum(column), sum(map(abs, column))
            pos, neg = (total_abs + total) / 2, (total_abs - total) / 2
            assert pos <= pos_limit and neg <= neg_limit, column
            assert total_abs <= max(pos_limit, neg_limit), column
    elif op == "prod" and dtype.is_floating_point:
        # factors +-1, +-2: any partial product is +-2**k with k <= w, exact everywhere
        assert {abs(v) for row in rows for v in row} <= {1.0, 2.0}
        assert 2**w <= pos_limit
    elif op == "prod":
        # integer factors up to the w-th root of 2**31 - 1: every product fits int32, and
        # some pass 2**24, where a float32 accumulator would round them
        products = [abs(math.prod(column)) for column in zip(*rows, strict=True)]
        assert max(products) <= 2**31 - 1 and max(products) > 2**24
        assert 0.0 not in {v for row in rows for v in row}
    # plain-Python reduction, and the same reduction done in the dtype in two orders
    if op == "avg":
        return
    py = {"sum": lambda c: sum(c), "prod": math.prod, "min": min, "max": max}[op]
    want = [float(py(column)) for column in zip(*rows, strict=True)]
    expected = suite.allreduce_expected(params, 0, w)
    assert expected.dtype == dtype
    assert values(expected) == want
    torch_op = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum,
                "max": torch.maximum}[op]
    for order in (xs, xs[::-1]):
        acc = order[0].clone()
        for x in order[1:]:
            acc = torch_op(acc, x)  # in the dtype, one rounding per step
        assert acc.dtype == dtype
        assert values(acc) == want


@pytest.mark.parametrize("params", EXACT_SMOKE, ids=_case_name)
def test_exact_mode_tolerance(params):
    tol = suite.ALLREDUCE.tolerance(params, 8)
    if params["op"] == "avg":
        assert (tol.kind, tol.ulps) == ("ulp", 2)  # nccl-tests allows 2 ulp for float avg
    else:
        assert tol.kind == "exact"


@pytest.mark.parametrize("params", RANDOM_SMOKE, ids=_case_name)
def test_random_mode_tolerance_grows_with_world_size(params):
    assert RANDOM_SMOKE
    t1 = suite.ALLREDUCE.tolerance(params, 1)
    t8 = suite.ALLREDUCE.tolerance(params, 8)
    assert t1.kind == t8.kind == "allclose"
    if params["op"] == "prod":  # each of the W-1 products rounds: a relative bound
        assert t8.rtol > t1.rtol and t8.atol == t1.atol
    else:
        assert t8.atol > t1.atol and t8.rtol >= t1.rtol
    # random mode compares with a float64 reference
    assert suite.allreduce_expected(params, 0, 4).dtype == torch.float64


def test_a_sum_of_negative_zeros_is_negative_zero_as_ieee_and_nccl_add():
    # torch.sum starts from +0.0 and returns +0.0 here; a ring or tree adds rank by rank
    out = ref.allreduce([torch.tensor([-0.0, -0.0, 1.0]), torch.tensor([-0.0, 0.0, -1.0])])
    assert torch.equal(torch.signbit(out), torch.tensor([True, False, False]))
    out = ref.allreduce([torch.tensor([float("inf"), float("nan")]),
                         torch.tensor([float("-inf"), 1.0])])
    assert torch.isnan(out).all()
