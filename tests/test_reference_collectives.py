"""Tests for reference_kernels.collectives and the exact-by-construction inputs of the allreduce
suite (SEMANTICS.md "Collectives").

Expected values come from closed forms and plain-Python float64 arithmetic on the inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from reference_kernels import collectives as ref
from suites import collectives as suite

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
    elif op == "prod":
        # factors +-1, +-2: any partial product is +-2**k with k <= w, exact everywhere
        assert {abs(v) for row in rows for v in row} <= {1.0, 2.0}
        assert 2**w <= pos_limit
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
    tol = suite.allreduce_tolerance(params, 8)
    if params["op"] == "avg":
        assert (tol.kind, tol.ulps) == ("ulp", 2)  # nccl-tests allows 2 ulp for float avg
    else:
        assert tol.kind == "exact"


@pytest.mark.parametrize("params", RANDOM_SMOKE, ids=_case_name)
def test_random_mode_tolerance_grows_with_world_size(params):
    assert RANDOM_SMOKE
    t1 = suite.allreduce_tolerance(params, 1)
    t8 = suite.allreduce_tolerance(params, 8)
    assert t1.kind == t8.kind == "allclose"
    assert t8.atol > t1.atol
    assert t8.rtol >= t1.rtol
    # random mode compares with a float64 reference
    assert suite.allreduce_expected(params, 0, 4).dtype == torch.float64
