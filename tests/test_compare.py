"""Tests for harness.core.compare: metrics, tolerance kinds at their boundaries, NaN/inf rules,
chunking, merging across ranks, serialisation and the per-dtype defaults.

Every expected number below is worked out by hand (dyadic values, so float64 arithmetic on
them is exact) or recomputed in plain Python; none is pasted from the code under test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness.core import compare
from harness.core.compare import Tolerance
from harness.core.metrics import Metrics

INF = math.inf
NAN = math.nan


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def t32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def tbf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def passes(actual, expected, tol: Tolerance) -> bool:
    return compare.check(actual, expected, tol).passed


# ------------------------------------------------------------------------------------ metrics
def test_elementwise_and_global_metrics_by_hand():
    a = t64([3.0, 4.5, -1.0])
    e = t64([2.0, 4.0, -1.0])
    m = compare.measure(a, e, compare.allclose(0.0, 0.0))
    # |a-e| = 1, 0.5, 0 ; |a-e|/|e| = 0.5, 0.125, 0
    assert m.max_abs == 1.0
    assert m.max_rel == 0.5
    # ||a-e||^2 = 1.25, ||e||^2 = 21
    assert m.rel_l2 == pytest.approx(math.sqrt(1.25 / 21), rel=1e-15)
    # <a,e> = 6 + 18 + 1 = 25; |a|^2 = 9 + 20.25 + 1 = 30.25; |e|^2 = 21
    assert m.cos_diff == pytest.approx(1 - 50 / 51.25, rel=1e-12)
    assert m.numel == 3 and m.n_mismatch == 2
    assert m.mismatch_frac == pytest.approx(2 / 3)
    assert m.n_nan == 0 and m.n_inf == 0
    assert m.first_bad_index == 0
    assert (m.first_bad_actual, m.first_bad_expected) == (3.0, 2.0)


def test_rel_l2_and_cos_diff_exact_values():
    # ||a-e|| / ||e|| = 1 / 2 ; cos_diff = 1 - 2*5/(7+4) = 1/11
    m = compare.measure(t64([2.0, 1.0, 1.0, 1.0]), t64([1.0, 1.0, 1.0, 1.0]), compare.rel_l2(1))
    assert m.rel_l2 == 0.5
    assert m.cos_diff == pytest.approx(1 / 11, rel=1e-12)
    # orthogonal: 1; opposite: 2; identical: 0
    assert compare.measure(t64([1.0, 0.0]), t64([0.0, 1.0]), compare.exact()).cos_diff == 1.0
    assert compare.measure(t64([1.0, -2.0]), t64([-1.0, 2.0]), compare.exact()).cos_diff == 2.0
    assert compare.measure(t64([1.0, -2.0]), t64([1.0, -2.0]), compare.exact()).cos_diff == 0.0


def test_cos_diff_is_zero_when_both_all_zero_deepgemm_convention():
    z = torch.zeros(5, dtype=torch.float32)
    m = compare.measure(z, z.clone(), compare.cos_diff(0.0))
    assert m.cos_diff == 0.0 and m.rel_l2 == 0.0
    assert compare.verdict(m, compare.cos_diff(0.0))[0]
    # only one side zero: <a,e> = 0 so cos_diff = 1, and rel_l2 is infinite
    m = compare.measure(t32([0.0, 1.0]), t32([0.0, 0.0]), compare.cos_diff(0.5))
    assert m.cos_diff == 1.0
    assert m.rel_l2 == INF
    assert not compare.verdict(m, compare.cos_diff(0.5))[0]


def test_nan_and_inf_counts():
    a = t32([NAN, INF, -INF, 1.0, NAN])
    e = t32([NAN, INF, 1.0, 1.0, 2.0])
    m = compare.measure(a, e, compare.allclose(1e-3, 1e-3))
    assert m.n_nan == 2  # NaNs in the output, matched or not
    assert m.n_inf == 2
    assert m.n_mismatch == 2  # -inf vs 1, NaN vs 2
    assert m.first_bad_index == 2
    assert m.max_abs == INF


def test_first_bad_index_and_position_2d():
    e = torch.zeros(3, 4)
    a = e.clone()
    a[1, 2] = 1.0
    a[2, 0] = 5.0
    m = compare.measure(a, e, compare.exact(), rank=3)
    assert m.first_bad_index == 1 * 4 + 2
    assert m.first_bad_position() == [1, 2]
    assert m.first_bad_rank == 3
    assert (m.first_bad_actual, m.first_bad_expected) == (1.0, 0.0)
    assert m.n_mismatch == 2
    assert m.shape == [3, 4]
    # 3-D: flat 2*12 + 1*4 + 3 = 31 -> [2, 1, 3]
    e3 = torch.zeros(3, 3, 4)
    a3 = e3.clone()
    a3[2, 1, 3] = -1.0
    m3 = compare.measure(a3, e3, compare.exact())
    assert m3.first_bad_index == 31
    assert m3.first_bad_position() == [2, 1, 3]
    assert compare.measure(e3, e3.clone(), compare.exact()).first_bad_position() is None


# ------------------------------------------------------------------------------------ exact
def test_exact_float32_one_ulp_off_fails():
    e = t32([1.0, 2.0, 3.0])
    assert passes(e.clone(), e, compare.exact())
    a = t32([1.0, 2.0 + 2.0**-22, 3.0])  # the float32 after 2.0
    c = compare.check(a, e, compare.exact())
    assert not c.passed
    assert c.metrics.n_mismatch == 1 and c.metrics.first_bad_index == 1
    assert c.metrics.max_abs == 2.0**-22
    assert "bitwise" in c.reason


def test_exact_is_bitwise_signed_zero_differs():
    assert not passes(t32([-0.0]), t32([0.0]), compare.exact())


def test_exact_casts_float64_expected_to_actual_dtype():
    # float32(0.1) is the rounding of the float64 0.1: "the reference, rounded once"
    assert passes(t32([0.1]), t64([0.1]), compare.exact())
    # 1 + 2**-24 is a tie between 1 and 1 + 2**-23: even mantissa wins -> 1.0
    assert passes(t32([1.0]), t64([1.0 + 2.0**-24]), compare.exact())
    assert not passes(t32([1.0 + 2.0**-23]), t64([1.0 + 2.0**-24]), compare.exact())
    # 1 + 3*2**-24 lies between 1 + 2**-23 (odd) and 1 + 2**-22 (even): rounds up to even
    assert passes(t32([1.0 + 2.0**-22]), t64([1.0 + 3 * 2.0**-24]), compare.exact())
    assert not passes(t32([1.0 + 2.0**-23]), t64([1.0 + 3 * 2.0**-24]), compare.exact())


def test_exact_keeps_a_nans_sign_and_payload_unless_any_nan():
    def bf16(*bits: int) -> torch.Tensor:
        return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)

    e = bf16(0x7FC1, 0xFFC0, 0x7FC0)  # a payload, a negative NaN, the plain one
    canonical = bf16(0x7FC0, 0x7FC0, 0x7FC0)
    assert passes(e.clone(), e, compare.exact())
    c = compare.check(canonical, e, compare.exact())
    assert not c.passed and c.metrics.n_mismatch == 2
    assert "sign and payload" in c.reason
    assert passes(canonical, e, compare.exact(any_nan=True))
    assert not passes(t32([1.0]), t32([math.nan]), compare.exact(any_nan=True))
    tol = compare.exact(any_nan=True)
    assert compare.Tolerance.from_dict(tol.to_dict()) == tol
    assert compare.Tolerance.from_dict(compare.exact().to_dict()) == compare.exact()


def test_exact_integers():
    e = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert passes(e.clone(), e, compare.exact())
    assert not passes(torch.tensor([1, 2, 4], dtype=torch.int32), e, compare.exact())


# ------------------------------------------------------------------------------------ allclose
def test_allclose_boundary_is_inclusive():
    # bound = atol + rtol*|e| = 0.5 + 0.25*2 = 1.0 exactly
    tol = compare.allclose(rtol=0.25, atol=0.5)
    e = t64([2.0])
    assert passes(t64([3.0]), e, tol)
    assert passes(t64([1.0]), e, tol)
    assert not passes(t64([math.nextafter(3.0, INF)]), e, tol)
    # below: 2 - (1 - 2**-52) = 1 + 2**-52 is exact in float64 (1 - 2**-53 would round to 1)
    assert not passes(t64([1.0 - 2.0**-52]), e, tol)
    # |e| is used: e = -2 has the same bound
    assert passes(t64([-3.0]), t64([-2.0]), tol)
    assert not passes(t64([math.nextafter(-3.0, -INF)]), t64([-2.0]), tol)


def test_max_tol_ratio_is_the_worst_share_of_the_allclose_allowance():
    # allowances atol + rtol*|e| = 0.11, 0.21, 0.41, 0.01; diffs use 1/2, 0, 1/2 and 2 of them
    e = t64([1.0, 2.0, -4.0, 0.0])
    a = e + t64([0.055, 0.0, -0.205, 0.02])
    m = compare.measure(a, e, compare.allclose(0.1, 0.01), chunk_elems=2)
    assert m.max_tol_ratio == pytest.approx(2.0, rel=1e-12)
    assert m.n_mismatch == 1 and m.first_bad_index == 3
    inside = compare.measure(a[:3], e[:3], compare.allclose(0.1, 0.01))
    assert inside.max_tol_ratio == pytest.approx(0.5, rel=1e-12) and inside.n_mismatch == 0
    # identical outputs use none of it; other tolerance kinds do not measure it
    assert compare.measure(e, e.clone(), compare.allclose(0.1, 0.01)).max_tol_ratio == 0.0
    assert compare.measure(a, e, compare.rel_l2(1.0)).max_tol_ratio == 0.0
    # ranks merge by taking the worst, and the JSON form carries it
    merged = Metrics.merge([inside, m])
    assert merged.max_tol_ratio == pytest.approx(2.0, rel=1e-12)
    assert Metrics.from_dict(merged.to_dict()).max_tol_ratio == merged.max_tol_ratio


def test_allclose_float32_actual_against_float64_expected():
    # e = 1: bound 2**-20 + 2**-20 = 2**-19; float32 1 + 2**-19 is exactly on it
    tol = compare.allclose(rtol=2.0**-20, atol=2.0**-20)
    assert passes(t32([1.0 + 2.0**-19]), t64([1.0]), tol)
    assert not passes(t32([1.0 + 2.0**-19 + 2.0**-23]), t64([1.0]), tol)


def test_allclose_mismatch_budget():
    e = torch.zeros(8, dtype=torch.float64)
    tol = compare.allclose(0.0, 0.1, max_mismatch_frac=0.25)  # 2 of 8 may be off
    two_bad = e.clone()
    two_bad[[1, 5]] = 1.0
    three_bad = e.clone()
    three_bad[[1, 5, 6]] = 1.0
    assert passes(two_bad, e, tol)
    c = compare.check(three_bad, e, tol)
    assert not c.passed
    assert c.metrics.n_mismatch == 3 and c.metrics.mismatch_frac == 3 / 8
    assert "allclose" in c.reason and "3/8" in c.reason
    # without a budget one is already too many
    assert not passes(two_bad, e, compare.allclose(0.0, 0.1))


# ------------------------------------------------------------------------------------ ulp
F32_ULP_AT_1 = 2.0**-23
BF16_ULP_AT_1 = 2.0**-7


@pytest.mark.parametrize("make,u", [(t32, F32_ULP_AT_1), (tbf, BF16_ULP_AT_1)])
def test_ulp_one_two_three_off(make, u):
    e = make([1.0, 1.0])
    tol = compare.ulp(2)
    assert passes(make([1.0, 1.0 + u]), e, tol)
    assert passes(make([1.0 + 2 * u, 1.0 + 2 * u]), e, tol)
    c = compare.check(make([1.0, 1.0 + 3 * u]), e, tol)
    assert not c.passed and c.metrics.max_ulp == 3.0
    assert "ulp" in c.reason
    assert passes(make([1.0 + u]), make([1.0]), compare.ulp(1))
    assert not passes(make([1.0 + 2 * u]), make([1.0]), compare.ulp(1))


@pytest.mark.parametrize("make,p", [(t32, 24), (tbf, 8)])
def test_ulp_near_powers_of_two(make, p):
    """The unit is the spacing of the expected value's binade [2**k, 2**(k+1))."""
    tol = compare.ulp(2)
    for k in (-3, 0, 5):
        big = 2.0 ** (k + 1 - p)  # spacing in [2**k, 2**(k+1))
        small = big / 2  # spacing just below 2**k
        top = 2.0**k - small  # largest value below 2**k
        # at 2**k, 2 units above pass, 3 fail
        assert passes(make([2.0**k + 2 * big]), make([2.0**k]), tol)
        assert not passes(make([2.0**k + 3 * big]), make([2.0**k]), tol)
        # just below 2**k the unit is the smaller spacing
        assert passes(make([top - 2 * small]), make([top]), tol)
        assert not passes(make([top - 3 * small]), make([top]), tol)
        # crossing the power of two: one step either way is within 1 ulp
        assert passes(make([2.0**k]), make([top]), compare.ulp(1))
        assert passes(make([top]), make([2.0**k]), compare.ulp(1))
        # negative values behave like their magnitude
        assert passes(make([-(2.0**k) - 2 * big]), make([-(2.0**k)]), tol)
        assert not passes(make([-(2.0**k) - 3 * big]), make([-(2.0**k)]), tol)


def test_ulp_at_zero_uses_smallest_subnormal():
    d = 2.0**-149  # float32's smallest subnormal
    tol = compare.ulp(2)
    assert passes(t32([2 * d]), t32([0.0]), tol)
    assert not passes(t32([3 * d]), t32([0.0]), tol)


# ------------------------------------------------------------------------------------ global kinds
def test_cos_diff_bound():
    a, e = t64([1.0, 1.0, 1.0, 1.0]), t64([1.0, 1.0, 1.0, -1.0])  # 1 - 2*2/8 = 0.5
    assert passes(a, e, compare.cos_diff(0.5))
    c = compare.check(a, e, compare.cos_diff(math.nextafter(0.5, 0.0)))
    assert not c.passed and "cos_diff" in c.reason


def test_rel_l2_bound():
    a, e = t64([2.0, 1.0, 1.0, 1.0]), t64([1.0, 1.0, 1.0, 1.0])  # sqrt(1/4) = 0.5
    assert passes(a, e, compare.rel_l2(0.5))
    c = compare.check(a, e, compare.rel_l2(math.nextafter(0.5, 0.0)))
    assert not c.passed and "rel_l2" in c.reason


# ------------------------------------------------------------------------------------ all_of
def test_all_of_enforces_every_part():
    tol = compare.all_of(compare.allclose(0.0, 0.5), compare.cos_diff(1e-3))
    # every element within 0.2 but pointing the other way: cos_diff = 1 - 2(-0.04)/0.08 = 2
    e = t64([0.1, 0.1, 0.1, 0.1])
    c = compare.check(-e, e, tol)
    assert not c.passed and "cos_diff" in c.reason
    # global metric tiny (1/(2e6+5)) but one element off by 1 > 0.5
    e = t64([100.0] * 100 + [1.0])
    a = e.clone()
    a[-1] = 2.0
    c = compare.check(a, e, tol)
    assert c.metrics.cos_diff < 1e-6
    assert not c.passed and "allclose" in c.reason
    # both parts hold
    assert passes(e.clone(), e, tol)


def test_all_of_with_two_global_parts():
    tol = compare.all_of(compare.cos_diff(1.0), compare.rel_l2(0.25))
    a, e = t64([2.0, 1.0, 1.0, 1.0]), t64([1.0, 1.0, 1.0, 1.0])  # rel_l2 0.5, cos_diff 1/11
    c = compare.check(a, e, tol)
    assert not c.passed and "rel_l2" in c.reason


def test_all_of_rejects_two_elementwise_parts():
    with pytest.raises(ValueError):
        compare.all_of(compare.allclose(1e-3, 1e-3), compare.ulp(1))
    with pytest.raises(ValueError):
        compare.all_of(compare.exact(), compare.exact())
    with pytest.raises(ValueError):
        Tolerance("roughly")


# ------------------------------------------------------------------------------------ NaN / inf
ALL_KINDS = [
    compare.exact(),
    compare.allclose(1e-3, 1e-3),
    compare.allclose(1e-3, 1e-3, max_mismatch_frac=0.5),  # a budget must not cover NaN
    compare.ulp(2),
    compare.cos_diff(1.0),
    compare.rel_l2(10.0),
    compare.all_of(compare.allclose(1e-3, 1e-3, max_mismatch_frac=0.5), compare.cos_diff(1.0)),
    compare.all_of(compare.cos_diff(1.0), compare.rel_l2(10.0)),
]


@pytest.mark.parametrize("tol", ALL_KINDS, ids=lambda t: t.describe())
def test_nan_never_passes_unless_expected_nan_there(tol):
    ones = [1.0, 1.0, 1.0, 1.0]
    assert passes(t32(ones), t32(ones), tol)
    # NaN in the output where the reference is finite
    assert not passes(t32([1.0, NAN, 1.0, 1.0]), t32(ones), tol)
    # a finite output where the reference has NaN
    assert not passes(t32(ones), t32([1.0, NAN, 1.0, 1.0]), tol)
    # NaN in both at the same place passes; at different places it does not
    assert passes(t32([1.0, NAN, 1.0, 1.0]), t32([1.0, NAN, 1.0, 1.0]), tol)
    assert not passes(t32([NAN, 1.0, 1.0, 1.0]), t32([1.0, NAN, 1.0, 1.0]), tol)


@pytest.mark.parametrize("tol", ALL_KINDS, ids=lambda t: t.describe())
def test_infinity_only_matches_the_same_infinity(tol):
    assert passes(t32([INF, 1.0, -INF, 1.0]), t32([INF, 1.0, -INF, 1.0]), tol)
    assert not passes(t32([INF, 1.0, 1.0, 1.0]), t32([-INF, 1.0, 1.0, 1.0]), tol)
    assert not passes(t32([INF, 1.0, 1.0, 1.0]), t32([1.0, 1.0, 1.0, 1.0]), tol)
    assert not passes(t32([1.0, 1.0, 1.0, 1.0]), t32([INF, 1.0, 1.0, 1.0]), tol)


def test_nan_reason_mentions_non_finite():
    c = compare.check(t32([NAN, 1.0, 1.0, 1.0]), t32([1.0] * 4),
                      compare.allclose(1e-3, 1e-3, max_mismatch_frac=0.5))
    assert not c.passed and "NaN" in c.reason


# ------------------------------------------------------------------------------------ shapes
def test_shape_mismatch_fails_with_message():
    c = compare.check(torch.zeros(2, 3), torch.zeros(3, 2), compare.allclose(1.0, 1.0))
    assert not c.passed
    assert "shape" in c.reason and "(2, 3)" in c.reason and "(3, 2)" in c.reason
    c = compare.check(torch.zeros(6), torch.zeros(2, 3), compare.cos_diff(1.0))
    assert not c.passed and "shape" in c.reason


def test_non_tensor_output_fails_with_message():
    c = compare.check([0.0, 0.0], torch.zeros(2), compare.exact())
    assert not c.passed and "not a tensor" in c.reason


# ------------------------------------------------------------------------------------ chunking
def _dyadic_pair(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values k/8 with small k: every square, product and sum below is exact in float64."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-64, 64, (n,), generator=g).to(torch.float32) / 8
    a = e.clone()
    for i, d in ((5, 0.125), (23, -1.0), (40, 0.5), (41, 0.25), (69, 2.0)):
        if i < n:
            a[i] += d
    return a, e


@pytest.mark.parametrize("tol", [compare.exact(), compare.allclose(1e-2, 0.2), compare.ulp(1),
                                 compare.cos_diff(1e-3), compare.rel_l2(1e-3)],
                         ids=lambda t: t.describe())
def test_chunked_equals_unchunked(tol):
    a, e = _dyadic_pair(71, seed=1)
    a[30] = NAN
    e[50] = INF
    a[50] = INF
    whole = compare.measure(a, e, tol)
    chunked = compare.measure(a, e, tol, chunk_elems=7)
    # via JSON text, so that a NaN first_bad_actual compares equal to itself
    assert json.dumps(chunked.to_dict(), sort_keys=True) == json.dumps(whole.to_dict(),
                                                                       sort_keys=True)
    assert whole.n_mismatch > 0 and whole.first_bad_index is not None


def test_chunked_random_data_matches_within_rounding():
    g = torch.Generator().manual_seed(7)
    e = torch.randn(1000, generator=g, dtype=torch.float64)
    a = (e + 1e-3 * torch.randn(1000, generator=g, dtype=torch.float64)).to(torch.float32)
    tol = compare.allclose(1e-3, 1e-3)
    whole = compare.measure(a, e, tol)
    chunked = compare.measure(a, e, tol, chunk_elems=7)
    for k in ("numel", "n_mismatch", "max_abs", "max_rel", "first_bad_index"):
        assert getattr(chunked, k) == getattr(whole, k)
    for k in ("sum_sq_diff", "sum_sq_expected", "sum_sq_actual", "sum_dot"):
        assert getattr(chunked, k) == pytest.approx(getattr(whole, k), rel=1e-12)
    # and the sums are the plain-Python ones
    ad, ed = a.double().tolist(), e.tolist()
    pairs = list(zip(ad, ed, strict=True))
    assert whole.sum_dot == pytest.approx(math.fsum(x * y for x, y in pairs), rel=1e-12)
    assert whole.sum_sq_diff == pytest.approx(math.fsum((x - y) ** 2 for x, y in pairs),
                                              rel=1e-12)


# ------------------------------------------------------------------------------------ per row
def _row_calc_diff(a: list[float], e: list[float]) -> float:
    """DeepGEMM's calc_diff of one row, in plain Python."""
    denom = math.fsum(x * x for x in a) + math.fsum(y * y for y in e)
    return 0.0 if denom == 0 else 1 - 2 * math.fsum(x * y for x, y in zip(a, e,
                                                                          strict=True)) / denom


@pytest.mark.parametrize("chunk", [compare.CHUNK_ELEMS, 7, 3])
def test_cos_diff_per_row_is_the_worst_rows_own_whatever_the_chunking(chunk):
    g = torch.Generator().manual_seed(11)
    e = torch.randn(6, 5, generator=g, dtype=torch.float64)
    a = e + 1e-3 * torch.randn(6, 5, generator=g, dtype=torch.float64)
    a[4] = e[4] * 0.5 + 0.25  # row 4 wrong; every row spans a chunk edge at chunk 7 or 3
    a[2] = e[2]  # a row bitwise equal to its reference
    m = compare.measure(a, e, compare.cos_diff_per_row(1e-2), chunk_elems=chunk)
    by_hand = [_row_calc_diff(a[r].tolist(), e[r].tolist()) for r in range(6)]
    assert m.worst_row == 4 and m.worst_row_rank == 0
    assert m.max_row_cos_diff == pytest.approx(max(by_hand), rel=1e-9)
    assert by_hand[4] > 1e-2 > max(by_hand[:4] + by_hand[5:])
    ok, why = compare.verdict(m, compare.cos_diff_per_row(1e-2))
    assert not ok and why.startswith("row 4 (rank 0) has calc_diff")
    assert compare.verdict(compare.measure(a[:4], e[:4], compare.cos_diff_per_row(1e-2)),
                           compare.cos_diff_per_row(1e-2))[0]


def test_cos_diff_per_row_merges_to_the_worst_rank_and_rows_of_zeros_are_right():
    e = t64([[1.0, 2.0], [0.0, 0.0], [4.0, 0.0]])
    ranks = [(t64([[1.0, 2.0], [0.0, 0.0], [4.0, 0.0]]), 0),  # all right, a zero row
             (t64([[1.0, 2.0], [0.0, 0.0], [2.0, 0.0]]), 1),  # row 2 halved: 1 - 16/20
             (t64([[1.0, 1.0], [0.0, 0.0], [4.0, 0.0]]), 2)]  # row 0: 1 - 6/7
    tol = compare.cos_diff_per_row(0.1)
    parts = [compare.measure(a, e, tol, rank=r) for a, r in ranks]
    assert parts[0].max_row_cos_diff == 0.0
    merged = Metrics.merge(parts)
    assert (merged.worst_row_rank, merged.worst_row) == (1, 2)
    assert merged.max_row_cos_diff == pytest.approx(0.2)
    assert Metrics.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged


def test_one_wrong_token_at_scale_passes_the_global_fp8_bounds_but_not_its_rows():
    # the FP8 MoE tolerance on a nightly layer's 5000 tokens (rows of 512 here), one token
    # zeroed (a padding write one row early); FP8-sized noise everywhere else
    from suites._moe.common import FP8_FFN_TOLERANCE

    g = torch.Generator().manual_seed(5)
    e = torch.randn(5000, 512, generator=g, dtype=torch.float32).to(torch.bfloat16)
    noise = 1 + 0.02 * torch.randn(5000, 512, generator=g, dtype=torch.float32)
    a = (e.float() * noise).to(torch.bfloat16)
    assert compare.check(a, e, FP8_FFN_TOLERANCE).passed
    a[3123] = 0
    without_rows = compare.all_of(*(p for p in FP8_FFN_TOLERANCE.parts
                                    if p.kind != "cos_diff_per_row"))
    assert compare.check(a, e, without_rows).passed
    result = compare.check(a, e, FP8_FFN_TOLERANCE)
    assert not result.passed and result.reason.startswith("row 3123 (rank 0) has calc_diff 1")


# ------------------------------------------------------------------------------------ merge
def test_merge_of_ranks_equals_concatenation():
    a, e = _dyadic_pair(30, seed=3)
    a[:10] = e[:10]  # rank 0 clean
    a[13] = e[13] + 4.0  # rank 1: local index 3
    a[17] = e[17] - 4.0
    a[20] = e[20] + 8.0  # rank 2: local index 0
    a[25] = NAN
    tol = compare.allclose(0.0, 1.0)
    parts = [compare.measure(a[10 * r: 10 * (r + 1)], e[10 * r: 10 * (r + 1)], tol, rank=r)
             for r in range(3)]
    merged = Metrics.merge(parts)
    whole = compare.measure(a, e, tol)
    for k in ("numel", "n_mismatch", "n_nan", "n_inf", "n_bad_special", "max_abs", "max_rel",
              "sum_sq_diff", "sum_sq_expected", "sum_sq_actual", "sum_dot"):
        assert getattr(merged, k) == getattr(whole, k), k
    assert merged.numel == 30
    # the first bad element is rank 1's local index 3 (global 13)
    assert merged.first_bad_rank == 1 and merged.first_bad_index == 3
    assert whole.first_bad_index == 1 * 10 + merged.first_bad_index
    assert merged.first_bad_actual == whole.first_bad_actual
    assert compare.verdict(merged, tol)[0] is compare.verdict(whole, tol)[0] is False


def test_merge_keeps_sums_and_maxima():
    p0 = Metrics(numel=4, n_mismatch=1, n_nan=1, max_abs=2.0, max_rel=0.5, sum_dot=1.5,
                 sum_sq_diff=3.0, sum_sq_expected=4.0, sum_sq_actual=5.0, max_ulp=3.0)
    p1 = Metrics(numel=6, n_mismatch=2, n_inf=2, max_abs=1.0, max_rel=0.75, sum_dot=2.5,
                 sum_sq_diff=1.0, sum_sq_expected=12.0, sum_sq_actual=6.0, max_ulp=1.0,
                 first_bad_index=4, first_bad_rank=1, first_bad_actual=1.0,
                 first_bad_expected=0.0, shape=[2, 3])
    m = Metrics.merge([p0, p1])
    assert (m.numel, m.n_mismatch, m.n_nan, m.n_inf) == (10, 3, 1, 2)
    assert (m.max_abs, m.max_rel, m.max_ulp) == (2.0, 0.75, 3.0)
    assert (m.sum_dot, m.sum_sq_diff, m.sum_sq_expected, m.sum_sq_actual) == (4.0, 4.0, 16.0,
                                                                              11.0)
    assert m.rel_l2 == 0.5  # sqrt(4/16)
    assert m.cos_diff == pytest.approx(1 - 8 / 27)
    assert (m.first_bad_rank, m.first_bad_index, m.first_bad_position()) == (1, 4, [1, 1])


# ------------------------------------------------------------------------------------ to/from dict
def test_metrics_round_trip():
    a, e = _dyadic_pair(20, seed=5)
    a = a.reshape(4, 5)
    e = e.reshape(4, 5)
    a[3, 4] = NAN
    m = compare.measure(a, e, compare.ulp(1), rank=2)
    assert m.n_mismatch and m.first_bad_index is not None
    assert Metrics.from_dict(m.to_dict()) == m
    assert Metrics.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    d = m.to_dict()
    assert d["first_bad_position"] == m.first_bad_position()
    assert d["mismatch_frac"] == m.n_mismatch / 20


@pytest.mark.parametrize("tol", [
    compare.exact(),
    compare.allclose(1.6e-2, 1e-5),
    compare.allclose(1e-3, 1e-5, max_mismatch_frac=0.01),
    compare.ulp(2),
    compare.cos_diff(1e-3),
    compare.rel_l2(1e-5),
    compare.cos_diff_per_row(1e-2),
    compare.all_of(compare.allclose(1e-2, 1e-2), compare.cos_diff(1e-3), compare.rel_l2(0.1)),
], ids=lambda t: t.describe())
def test_tolerance_round_trip(tol):
    assert Tolerance.from_dict(tol.to_dict()) == tol
    assert Tolerance.from_dict(json.loads(json.dumps(tol.to_dict()))) == tol


# ------------------------------------------------------------------------------------ defaults
# SEMANTICS.md "Default tolerances", written out here.
SEMANTICS_TABLE = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float8_e4m3fn: (0.125, 0.0675),
    torch.float8_e5m2: (0.25, 0.125),
}


@pytest.mark.parametrize("dtype", list(SEMANTICS_TABLE), ids=str)
def test_default_for_float_dtypes_matches_semantics(dtype):
    tol = compare.default_for(dtype)
    rtol, atol = SEMANTICS_TABLE[dtype]
    assert (tol.kind, tol.rtol, tol.atol, tol.max_mismatch_frac) == ("allclose", rtol, atol, 0.0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool], ids=str)
def test_default_for_integers_is_exact(dtype):
    assert compare.default_for(dtype).kind == "exact"


# ------------------------------------------------------------------------------------ reasons
def test_verdict_reasons_name_the_metric_and_place():
    e = torch.zeros(2, 3)
    a = e.clone()
    a[1, 1] = 1.0
    why = compare.check(a, e, compare.allclose(0.0, 0.5)).reason
    assert "allclose" in why and "max_abs=1" in why and "[1, 1]" in why
    assert "ulp" in compare.check(a, e, compare.ulp(1)).reason
    assert "bitwise" in compare.check(a, e, compare.exact()).reason
    assert "rel_l2" in compare.check(a, e, compare.rel_l2(0.1)).reason
    assert "cos_diff" in compare.check(a, e, compare.cos_diff(0.1)).reason
    ok = compare.check(e.clone(), e, compare.exact())
    assert ok.passed and ok.reason == ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8,
                                   torch.float8_e4m3fn])
def test_identical_chunks_take_a_fast_path_with_the_same_metrics(dtype):
    # the fast path (bitwise-identical chunk) must report exactly what the full path does:
    # an expected of another dtype holding the same values forces the full path
    x = (torch.arange(-500, 500, dtype=torch.float64) * 0.37).to(dtype)
    if dtype.is_floating_point and dtype != torch.float8_e4m3fn:
        x[3], x[7] = float("nan"), float("inf")
    tol = compare.allclose(rtol=1e-3, atol=0.0)
    fast = compare.measure(x, x.clone(), tol, chunk_elems=64).to_dict()
    full = compare.measure(x, x.to(torch.float64), tol, chunk_elems=64).to_dict()
    assert fast == full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_a_memo_of_the_reference_gives_the_metrics_measuring_afresh_gives(dtype):
    g = torch.Generator().manual_seed(3)
    e = (torch.randn(1000, generator=g) * 50).to(dtype)
    if dtype.is_floating_point:
        e[7], e[300], e[901] = math.nan, math.inf, -math.inf
    same = e.clone()
    off = e.clone()
    off[650] = off[650] + 1  # chunk 650-699 differs, the others match bitwise
    tol = compare.exact()
    memo: dict = {}
    for actual in (same, off, same, off):
        with_memo = compare.measure(actual, e, tol, chunk_elems=50, memo=memo)
        afresh = compare.measure(actual, e, tol, chunk_elems=50)
        assert json.dumps(with_memo.to_dict(), sort_keys=True) == json.dumps(
            afresh.to_dict(), sort_keys=True)
    assert len(memo) == 20  # one entry per chunk that matched, the differing one never
    # a memo answers by chunk position: a wrong chunk is measured, never looked up
    bad = e.clone()
    bad[0] = bad[0] + 1
    assert compare.measure(bad, e, tol, chunk_elems=50, memo=memo).n_mismatch == 1


# ---------------------------------------------------------------- the precision lens
def test_correctly_rounded_rounds_float64_once_where_torch_rounds_twice():
    e = torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-30),
                      -0.0, math.inf, math.nan], dtype=torch.float64)
    assert e[:1].to(torch.bfloat16).item() == 1.0  # torch: through float32, a tie, to even
    got = compare.correctly_rounded(e, torch.bfloat16).double()
    assert got[:4].tolist() == [1 + 2**-7, 1.0, 1 + 2**-6, -(1 + 2**-7)]
    assert torch.signbit(got[4]) and got[5] == math.inf and torch.isnan(got[6])
    half = torch.tensor([1 + 2**-11 + 2**-40], dtype=torch.float64)
    assert compare.correctly_rounded(half, torch.float16).item() == 1 + 2**-10


def _orders(x32, w32):
    """float32 GEMM results in orders correct kernels use: BLAS, split-K 4, 64-wide K tiles."""
    split = sum((xp @ wp.T for xp, wp in zip(x32.chunk(4, 1), w32.chunk(4, 1), strict=True)),
                torch.zeros(x32.shape[0], w32.shape[0]))
    tiles = torch.zeros(x32.shape[0], w32.shape[0])
    for s in range(0, x32.shape[1], 64):
        tiles = tiles + x32[:, s : s + 64] @ w32[:, s : s + 64].T
    return [x32 @ w32.T, split, tiles]


def test_the_lens_passes_any_float32_order_and_fails_a_second_rounding():
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(8, 1344, generator=g) * 2 - 1).bfloat16()
    w = ((torch.rand(96, 1344, generator=g) * 2 - 1) * (3 / 1344) ** 0.5).bfloat16()
    r = (torch.rand(8, 96, generator=g) * 2 - 1).bfloat16()
    exact = x.double() @ w.double().T + r.double()
    lens = compare.rounding(0.02)
    for acc in _orders(x.float(), w.float()):
        assert compare.check((acc + r.float()).bfloat16(), exact, lens).passed
    twice = ((x.float() @ w.float().T).bfloat16().float() + r.float()).bfloat16()
    bad = compare.check(twice, exact, lens)
    assert not bad.passed and "rounded once" in bad.reason
    # the same output passes the GEMM tolerance the op had before the lens
    gemm = compare.all_of(compare.cos_diff(1e-5), compare.allclose(rtol=1.6e-2, atol=8e-3))
    assert compare.check(twice, exact.bfloat16(), gemm).passed


def test_the_lens_fails_a_float32_output_computed_through_bf16_and_one_off_by_two_ulps():
    g = torch.Generator().manual_seed(4)
    e = torch.randn(4096, generator=g, dtype=torch.float64)
    assert compare.check(e.float(), e, compare.rounding(0.02)).passed
    through = compare.check(e.bfloat16().float(), e, compare.rounding(0.02))
    assert not through.passed and "4096/4096" in through.reason
    once = compare.correctly_rounded(e, torch.bfloat16)
    assert compare.check(once, e, compare.rounding(0.0)).passed
    nudged = once.clone()
    nudged[7] = (nudged[7].view(torch.int16) + 2).view(torch.bfloat16)  # 2 ulp: none beyond 1
    assert compare.check(nudged, e, compare.rounding(0.02)).passed  # no ulps bound by default
    beyond = compare.check(nudged, e, compare.rounding(0.02, ulps=1))
    assert not beyond.passed and "ulp from the float64 value" in beyond.reason


def test_max_rel_against_an_expected_zero_is_infinite_not_a_huge_number():
    m = compare.measure(torch.tensor([1e-3, 2.0]), torch.tensor([0.0, 1.0]), compare.exact())
    assert m.max_rel == math.inf and m.max_abs == 1.0
    same = compare.measure(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 1.0]), compare.exact())
    assert same.max_rel == 1.0


def test_rounded_near_takes_either_float32_quotient_and_nothing_else():
    """A quantizer's x / s and x * (fmax / amax) (DeepGEMM's) are each a float32 rounding or
    two off the float64 quotient: near an e4m3 rounding boundary they give neighbouring codes,
    and both pass; a conversion rounding toward zero, or +0 for a quotient of -0, fails."""
    g = torch.Generator().manual_seed(5)
    # values whose quotient lands within a float32 rounding of an e4m3 midpoint, either sign
    codes = torch.randint(1, 126, (20000,), generator=g, dtype=torch.uint8)
    mid = (codes.view(torch.float8_e4m3fn).double()
           + (codes + 1).view(torch.float8_e4m3fn).double()) / 2
    amax = torch.tensor(3.7)
    s = amax / 448.0
    sign = torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    x = (mid * s.double()).float() * sign
    x[:5] = -1e-12  # quotients that round to -0
    exact64 = (x.double() / s.double()).clamp(-448, 448)
    by_div = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    by_mul = (x * (448.0 / amax)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert not torch.equal(by_div.view(torch.uint8), by_mul.view(torch.uint8))  # they differ
    tol = compare.rounded_near(2.0**-22)
    for q in (by_div, by_mul):
        assert compare.check(q, exact64, tol).passed
        assert not compare.check(q, exact64, compare.rounded_near(0.0)).passed  # ties
    # on values anywhere, rounded toward zero: where the nearest code is larger in
    # magnitude, the one below it (sign-magnitude codes)
    anywhere = torch.randn(20000, generator=g, dtype=torch.float64) * 100
    nearest = anywhere.clamp(-448, 448).to(torch.float8_e4m3fn)
    codes = nearest.view(torch.uint8).clone()
    away = nearest.double().abs() > anywhere.clamp(-448, 448).abs()
    codes[away & ((codes & 0x7F) > 0)] -= 1
    assert compare.check(nearest, anywhere.clamp(-448, 448), tol).passed
    assert not compare.check(codes.view(torch.float8_e4m3fn), anywhere.clamp(-448, 448),
                             tol).passed
    positive_zero = by_div.clone()
    positive_zero[:5] = 0.0
    check = compare.check(positive_zero, exact64, tol)
    assert not check.passed and check.metrics.n_mismatch == 5


def test_allclose_is_exact_where_the_magnitude_is_zero():
    """Every term of a zero-magnitude element has a zero factor, so no arithmetic order makes
    it anything but the expected value: the atol and rtol allow nothing there."""
    tol = compare.allclose(rtol=2e-2, atol=1e-3, magnitude_rtol=2.0**-14)
    expected = t64([0.0, 0.0, 0.5, 3.0])
    magnitude = t64([0.0, 1.0, 0.0, 4.0])
    tiny = 2.0**-125  # 0 with an exponent added to its bits
    for actual, bad in (([0.0, tiny, 0.5, 3.0], 0), ([-0.0, 0.0, 0.5, 3.0], 0),
                        ([tiny, 0.0, 0.5, 3.0], 1), ([0.0, 0.0, 0.5 + 2.0**-20, 3.0], 1),
                        ([0.0, 0.0, 0.5, 3.0 + 2.0**-20], 0)):
        m = compare.measure(torch.tensor(actual, dtype=torch.float32), expected, tol,
                            magnitude=magnitude)
        assert m.n_mismatch == bad, actual
        ok, why = compare.verdict(m, tol)
        assert ok is (bad == 0)
        assert bad == 0 or "(exact where the magnitude is 0)" in why
    # without a magnitude from the op, the atol holds everywhere as before
    m = compare.measure(torch.tensor([tiny, 0.0, 0.5, 3.0]), expected, tol)
    assert m.n_mismatch == 0
