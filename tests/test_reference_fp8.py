"""Tests for reference_kernels.fp8 (FP8 quantization and scaled GEMMs).

Every expected value comes from an independent construction: a pure-Python encoder/decoder
built from the bit-level definitions of float8_e4m3fn and float8_e5m2 (round to nearest even
by choosing between the enumerated representable values), scales from explicit Python loops
over the groups (float32 division emulated with ``struct``), dequantization by a decode table
and explicit index arithmetic, and float64 matmuls. Nothing is compared with values the
function under test produced itself.
"""

from __future__ import annotations

import bisect
import math
import random
import struct
from itertools import pairwise

import pytest
import torch

from reference_kernels import fp8 as ref

FMTS = ("e4m3", "e5m2")
DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: format maxima from the format definitions (not read from the module under test)
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
#: (exponent bits, mantissa bits, exponent bias)
SPECS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}
BF16 = torch.bfloat16
G = 128


def f32(v: float) -> float:
    """v rounded to float32 (round to nearest even)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def f32_floor_1e4() -> float:
    return f32(1e-4)


# ------------------------------------------------------------------ independent format model
def decode_code(fmt: str, code: int) -> float:
    """Value of an 8-bit code from the bit fields (sign, exponent, mantissa)."""
    ebits, mbits, bias = SPECS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if fmt == "e4m3" and e == 15 and m == 7:       # e4m3fn: only S.1111.111 is NaN, no inf
        return math.nan
    if fmt == "e5m2" and e == 31:                   # IEEE-like: inf (m == 0) / NaN
        return sign * math.inf if m == 0 else math.nan
    if e == 0:                                      # subnormal
        mag = (m / (1 << mbits)) * 2.0 ** (1 - bias)
    else:
        mag = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
    return sign * mag


DECODE = {f: [decode_code(f, c) for c in range(256)] for f in FMTS}
FINITE_CODES = {f: [c for c in range(256) if math.isfinite(DECODE[f][c])] for f in FMTS}
_POS = {f: sorted((DECODE[f][c], c) for c in range(128) if math.isfinite(DECODE[f][c]))
        for f in FMTS}
POS_VALUES = {f: [v for v, _ in _POS[f]] for f in FMTS}
POS_CODES = {f: [c for _, c in _POS[f]] for f in FMTS}


def encode(fmt: str, v: float) -> int:
    """Code of v rounded to nearest (ties to the even mantissa code); beyond max -> +-max."""
    assert not math.isnan(v)
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    vals, codes = POS_VALUES[fmt], POS_CODES[fmt]
    if a >= vals[-1]:
        return sign | codes[-1]
    i = bisect.bisect_right(vals, a)                # vals[i - 1] <= a < vals[i]
    lo, hi = vals[i - 1], vals[i]
    if a - lo < hi - a:
        code = codes[i - 1]
    elif a - lo > hi - a:
        code = codes[i]
    else:
        code = codes[i - 1] if codes[i - 1] % 2 == 0 else codes[i]
    return sign | code


def pow2_ceil(s: float) -> float:
    """Smallest power of two >= s (s > 0)."""
    m, e = math.frexp(s)                            # s = m * 2**e, 0.5 <= m < 1
    return math.ldexp(1.0, e - 1 if m == 0.5 else e)


def expected_scale(amax: float, fmt: str, ue8m0: bool) -> float:
    s = f32(max(amax, f32_floor_1e4()) / FMAX[fmt])
    return pow2_ceil(s) if ue8m0 else s


def codes_of(q: torch.Tensor) -> list:
    return q.view(torch.uint8).tolist()


def dequant64(q: torch.Tensor, scales: torch.Tensor, rows: int, cols: int, fmt: str
              ) -> torch.Tensor:
    """float64 dequantization via the decode table; scales indexed by (i // rows, j // cols)."""
    table = torch.tensor(DECODE[fmt], dtype=torch.float64)
    vals = table[q.view(torch.uint8).long()]
    if scales.dim() == 0:
        return vals * float(scales)
    ri = torch.arange(q.shape[0]) // rows
    ci = torch.arange(q.shape[1]) // cols
    return vals * scales.double()[ri[:, None], ci[None, :]]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_fp8(shape: tuple, fmt: str, seed: int) -> torch.Tensor:
    """Random finite codes of the format (independent of quantize)."""
    finite = torch.tensor(FINITE_CODES[fmt], dtype=torch.uint8)
    idx = torch.randint(0, len(finite), shape, generator=gen(seed))
    return finite[idx].view(DTYPES[fmt])


def random_scales(shape: tuple, seed: int) -> torch.Tensor:
    return torch.exp2(torch.randn(shape, generator=gen(seed)) * 2 - 6).float()


def assert_gemm_close(out: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor,
                      out_dtype: torch.dtype) -> None:
    """out == a64 @ b64.T up to float32 accumulation (rigorous gamma_K bound) and one rounding
    to out_dtype."""
    assert out.dtype == out_dtype
    exp = a64 @ b64.T
    mag = a64.abs() @ b64.abs().T
    k = a64.shape[1]
    rel = {BF16: 2.0**-8, torch.float32: 2.0**-24, torch.float16: 2.0**-11}[out_dtype]
    bound = rel * exp.abs() + (k + 2) * 2.0**-23 * mag * (1 + rel)
    err = (out.double() - exp).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


# ------------------------------------------------------------------------ format definitions
@pytest.mark.parametrize("fmt, n_finite, min_sub, min_norm",
                         [("e4m3", 254, 2.0**-9, 2.0**-6), ("e5m2", 248, 2.0**-16, 2.0**-14)])
def test_format_model_and_module_constants(fmt, n_finite, min_sub, min_norm):
    assert len(FINITE_CODES[fmt]) == n_finite
    assert POS_VALUES[fmt][-1] == FMAX[fmt] and POS_VALUES[fmt][:2] == [0.0, min_sub]
    assert min(v for v in POS_VALUES[fmt] if v >= min_norm) == min_norm
    assert POS_CODES[fmt] == sorted(POS_CODES[fmt])     # magnitude is monotone in the code
    assert ref.FORMATS[fmt] is DTYPES[fmt] and ref.FMAX[fmt] == FMAX[fmt]
    assert ref.AMAX_FLOOR == 1e-4 and ref.BLOCK == 128
    if fmt == "e4m3":
        assert math.isnan(DECODE[fmt][0x7F]) and math.isnan(DECODE[fmt][0xFF])
        assert not any(math.isinf(v) for v in DECODE[fmt])
    else:
        assert DECODE[fmt][0x7C] == math.inf and DECODE[fmt][0xFC] == -math.inf
    # sanity of the table itself against torch's dtype decoding
    torch_vals = torch.arange(256, dtype=torch.uint8).view(DTYPES[fmt]).double().tolist()
    for c in FINITE_CODES[fmt]:
        assert torch_vals[c] == DECODE[fmt][c], c


def test_encoder_known_values():
    assert encode("e4m3", 1.0625) == 0x38                # tie 1.0 | 1.125 -> even code (1.0)
    assert encode("e4m3", 1.1875) == 0x3A                # tie 1.125 | 1.25 -> 1.25
    assert encode("e4m3", 464.0) == 0x7E                 # beyond max -> 448
    assert encode("e4m3", -1e9) == 0xFE
    assert encode("e4m3", 2.0**-10) == 0x00              # tie 0 | 2^-9 -> 0
    assert encode("e4m3", -2.0**-11) == 0x80
    assert encode("e5m2", 61440.0) == 0x7B               # beyond max -> 57344
    assert encode("e5m2", 2.0**-16 * 1.5) == 0x02        # tie 1 | 2 (subnormal codes) -> 2


# ------------------------------------------------------------------------ (1)-(2) bit-exactness
@pytest.mark.parametrize("fmt", FMTS)
def test_roundtrip_every_finite_value_is_bit_exact(fmt):
    codes = FINITE_CODES[fmt]
    x = torch.tensor([DECODE[fmt][c] for c in codes], dtype=torch.float32)
    q, s = ref.quantize(x, fmt, "tensor", scale=1.0)
    assert q.dtype == DTYPES[fmt] and q.shape == x.shape
    assert float(s) == 1.0
    assert codes_of(q) == codes                         # includes -0 (0x80) and +-max


def _float32_neighbours(v: float) -> list[float]:
    t = torch.tensor([v], dtype=torch.float32)
    up = torch.nextafter(t, torch.tensor([math.inf])).item()
    down = torch.nextafter(t, torch.tensor([-math.inf])).item()
    return [down, v, up]


@pytest.mark.parametrize("fmt", FMTS)
def test_midpoints_and_their_float32_neighbours_round_to_nearest_even(fmt):
    vals = POS_VALUES[fmt]
    points = []
    for lo, hi in pairwise(vals):
        mid = (lo + hi) / 2
        assert f32(mid) == mid
        points += _float32_neighbours(mid)
    top_gap = vals[-1] - vals[-2]
    points += [vals[-1] + top_gap / 2, vals[-1] + top_gap, 2 * vals[-1], 1e30, 3.4e38]
    points = [f32(p) for p in points]
    points += [-p for p in points]
    x = torch.tensor(points, dtype=torch.float32)
    q, _ = ref.quantize(x, fmt, "tensor", scale=1.0)
    want = [encode(fmt, p) for p in points]
    got = codes_of(q)
    bad = [(p, g, w) for p, g, w in zip(points, got, want, strict=True) if g != w]
    assert not bad, bad[:10]


@pytest.mark.parametrize("fmt", FMTS)
def test_random_values_incl_subnormal_and_beyond_max(fmt):
    ebits, mbits, bias = SPECS[fmt]
    rng = random.Random(11)
    lo_exp, hi_exp = 1 - bias - mbits - 3, int(math.log2(FMAX[fmt])) + 4
    points = [f32(rng.choice((-1, 1)) * 2.0 ** rng.uniform(lo_exp, hi_exp))
              for _ in range(4000)]
    assert any(abs(p) < 2.0 ** (1 - bias) for p in points)          # subnormal range hit
    assert any(abs(p) > FMAX[fmt] for p in points)                  # saturation hit
    for static in (1.0, 0.375):
        x = torch.tensor(points, dtype=torch.float32)
        q, s = ref.quantize(x, fmt, "tensor", scale=static)
        assert float(s) == static
        want = [encode(fmt, f32(p / static)) for p in points]
        assert codes_of(q) == want


def test_static_scale_only_per_tensor():
    with pytest.raises(ValueError):
        ref.quantize(torch.ones(2, 128), "e4m3", "token", scale=1.0)


# --------------------------------------------------------------- (3)-(4) scales and q values
def _group_data(m: int, k: int, seed: int) -> torch.Tensor:
    """float32 data with per-row magnitudes over many decades, one all-zero group (rows 0..m,
    cols 128..255 of the first 128-row block) and one tiny group (amax < 1e-4)."""
    x = torch.randn(m, k, generator=gen(seed)) * torch.exp2(
        torch.randn(m, 1, generator=gen(seed + 1)) * 4)
    x[: min(m, G), G: 2 * G] = 0.0
    x[-1:, 2 * G:] *= 1e-7 / x[-1:, 2 * G:].abs().max()
    return x.float()


def _expected_groups(x: torch.Tensor, rows: int, cols: int, fmt: str, ue8m0: bool):
    """Loop over the groups: scales[gi][gj] and codes[i][j]."""
    xs = x.tolist()
    m, k = len(xs), len(xs[0])
    scales = []
    for gi in range(math.ceil(m / rows)):
        srow = []
        for gj in range(math.ceil(k / cols)):
            amax = 0.0
            for i in range(gi * rows, min(m, (gi + 1) * rows)):
                for j in range(gj * cols, min(k, (gj + 1) * cols)):
                    amax = max(amax, abs(xs[i][j]))
            srow.append(expected_scale(amax, fmt, ue8m0))
        scales.append(srow)
    codes = [[encode(fmt, f32(xs[i][j] / scales[i // rows][j // cols])) for j in range(k)]
             for i in range(m)]
    return scales, codes


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("gran, shape, rows, cols", [
    ("tensor", (7, 300), 7, 300),
    ("token", (5, 300), 1, G),
    ("block", (150, 300), G, G),
])
def test_scales_and_quantized_values_match_group_loops(gran, shape, rows, cols, fmt, ue8m0):
    x = _group_data(*shape, seed=5)
    q, s = ref.quantize(x, fmt, gran, ue8m0=ue8m0)
    want_s, want_codes = _expected_groups(x, rows, cols, fmt, ue8m0)
    assert s.dtype == torch.float32
    if gran == "tensor":
        assert s.shape == ()
        assert float(s) == want_s[0][0]
    else:
        assert tuple(s.shape) == (math.ceil(shape[0] / rows), math.ceil(shape[1] / cols))
        assert s.tolist() == want_s
    assert q.dtype == DTYPES[fmt] and q.shape == x.shape
    assert codes_of(q) == want_codes
    if ue8m0:
        for v in s.reshape(-1).tolist():
            mant, _ = math.frexp(v)
            assert mant == 0.5                                      # a power of two


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("gran", ["token", "block"])
def test_all_zero_group_gets_floor_scale_and_zero_codes(gran, fmt, ue8m0):
    x = _group_data(130, 300, seed=9)
    q, s = ref.quantize(x, fmt, gran, ue8m0=ue8m0)
    floor = f32(f32(1e-4) / FMAX[fmt])
    assert math.isclose(floor, 1e-4 / FMAX[fmt], rel_tol=1e-7)
    want = pow2_ceil(floor) if ue8m0 else floor
    zero_scales = s[:G, 1] if gran == "token" else s[0, 1:2]
    assert zero_scales.tolist() == [want] * zero_scales.numel()
    assert bool((q[:G, G: 2 * G].view(torch.uint8) == 0).all())


def test_ragged_shapes_and_scale_shapes():
    x = _group_data(129, 257, seed=4)
    q, s = ref.quantize(x, "e4m3", "token")
    assert tuple(s.shape) == (129, 3)
    q, s = ref.quantize(x, "e4m3", "block")
    assert tuple(s.shape) == (2, 3)
    # the 1 x 1 corner block only sees x[128, 256]
    assert float(s[1, 2]) == expected_scale(abs(float(x[128, 256])), "e4m3", False)


@pytest.mark.parametrize("fmt", FMTS)
def test_ue8m0_is_smallest_power_of_two_at_least_amax_over_fmax(fmt):
    rng = random.Random(3)
    amaxes = [f32(2.0 ** rng.uniform(-12, 20)) for _ in range(200)]
    amaxes += [f32(FMAX[fmt] * 2.0**k) for k in range(-20, 6)]      # exact powers of two
    x = torch.zeros(len(amaxes), G)
    x[:, 3] = torch.tensor(amaxes)
    _, s = ref.quantize(x, fmt, "token", ue8m0=True)
    assert s[:, 0].tolist() == [pow2_ceil(f32(a / FMAX[fmt])) for a in amaxes]


@pytest.mark.parametrize("fmt", FMTS)
def test_ue8m0_scale_just_above_power_of_two_rounds_up(fmt):
    base = FMAX[fmt] * 2.0**-9                                      # 0.875 (e4m3), 112 (e5m2)
    amax = torch.nextafter(torch.tensor(base), torch.tensor(math.inf)).item()
    s32 = f32(amax / FMAX[fmt])
    assert s32 > 2.0**-9                                            # precondition
    x = torch.zeros(1, G)
    x[0, 0] = amax
    _, s = ref.quantize(x, fmt, "token", ue8m0=True)
    assert float(s[0, 0]) == pow2_ceil(s32) == 2.0**-8


# ----------------------------------------------------------------------- (5) dequantization
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("gran, rows, cols", [("tensor", 0, 0), ("token", 1, G),
                                              ("block", G, G)])
def test_dequantize_within_half_ulp_times_scale(gran, rows, cols, fmt):
    x = _group_data(140, 300, seed=21)
    q, s = ref.quantize(x, fmt, gran)
    deq = ref.dequantize(q, s, gran)
    assert deq.dtype == torch.float32 and deq.shape == x.shape
    x64 = x.double()
    if gran == "tensor":
        s_full = torch.full_like(x64, float(s))
    else:
        ri = torch.arange(x.shape[0]) // rows
        ci = torch.arange(x.shape[1]) // cols
        s_full = s.double()[ri[:, None], ci[None, :]]
    vals = torch.tensor(POS_VALUES[fmt], dtype=torch.float64)
    gaps = torch.cat([vals[1:] - vals[:-1], (vals[-1:] - vals[-2:-1])])
    v = (x64.abs() / s_full)
    assert bool((v <= FMAX[fmt] * (1 + 2.0**-22)).all())           # inside the range
    idx = (torch.searchsorted(vals, v.reshape(-1), right=True) - 1).clamp(max=len(vals) - 1)
    half_gap = (gaps[idx] / 2).reshape(x.shape)
    bound = half_gap * s_full * (1 + 2.0**-22) + 2.0**-23 * x64.abs()
    err = (deq.double() - x64).abs()
    assert bool((err <= bound).all())
    # and it is exactly the decoded codes times the scales (one float32 product)
    want = (dequant64(q, s, rows or 1, cols or 1, fmt)).float()
    assert torch.equal(deq, want)


# ------------------------------------------------------------------------------- (6) GEMMs
@pytest.mark.parametrize("out_dtype", [BF16, torch.float32])
@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_per_tensor_matches_float64(fmt, out_dtype):
    m, n, k = 67, 200, 300
    a = random_fp8((m, k), fmt, seed=1)
    b = random_fp8((n, k), fmt, seed=2)
    sa, sb = torch.tensor(0.0123), torch.tensor(3.5e-3)
    out = ref.gemm_per_tensor(a, sa, b, sb, out_dtype=out_dtype)
    assert out.shape == (m, n)
    assert_gemm_close(out, dequant64(a, sa, 1, 1, fmt), dequant64(b, sb, 1, 1, fmt), out_dtype)


@pytest.mark.parametrize("out_dtype", [BF16, torch.float32])
@pytest.mark.parametrize("fmt", FMTS)
def test_gemm_blockwise_matches_float64(fmt, out_dtype):
    m, n, k = 67, 200, 300
    a = random_fp8((m, k), fmt, seed=3)
    b = random_fp8((n, k), fmt, seed=4)
    sa = random_scales((m, 3), seed=5)
    sb = random_scales((2, 3), seed=6)
    out = ref.gemm_blockwise(a, sa, b, sb, out_dtype=out_dtype)
    assert out.shape == (m, n)
    assert_gemm_close(out, dequant64(a, sa, 1, G, fmt), dequant64(b, sb, G, G, fmt), out_dtype)


def test_gemm_default_out_dtype_is_bf16():
    a = random_fp8((3, 130), "e4m3", seed=7)
    b = random_fp8((5, 130), "e4m3", seed=8)
    assert ref.gemm_per_tensor(a, torch.tensor(1.0), b, torch.tensor(1.0)).dtype == BF16
    out = ref.gemm_blockwise(a, torch.ones(3, 2), b, torch.ones(1, 2))
    assert out.dtype == BF16


def test_e4m3_gemms_close_to_unquantized_product():
    x = torch.randn(67, 300, generator=gen(31))
    w = torch.randn(200, 300, generator=gen(32))
    full = x @ w.T
    xa, sxa = ref.quantize(x, "e4m3", "tensor")
    wa, swa = ref.quantize(w, "e4m3", "tensor")
    d_tensor = ref.calc_diff(ref.gemm_per_tensor(xa, sxa, wa, swa), full)
    xb, sxb = ref.quantize(x, "e4m3", "token")
    wb, swb = ref.quantize(w, "e4m3", "block")
    d_block = ref.calc_diff(ref.gemm_blockwise(xb, sxb, wb, swb), full)
    assert 0 < d_tensor < 1e-3 and 0 < d_block < 1e-3, (d_tensor, d_block)


# ---------------------------------------------------------------------- (7) grouped, contiguous
def test_grouped_gemm_contiguous_layout():
    fmt, n, k, align = "e4m3", 200, 300, 128
    counts = [70, 0, 130]
    group_index, segments, start = [], [], 0
    for g, c in enumerate(counts):
        padded = math.ceil(c / align) * align
        group_index += [g] * c + [-1] * (padded - c)
        segments.append((start, start + c))
        start += padded
    m = len(group_index)
    assert m == 384
    a = random_fp8((m, k), fmt, seed=41)
    sa = random_scales((m, 3), seed=42)
    b = torch.stack([random_fp8((n, k), fmt, seed=43 + g) for g in range(3)])
    sb = random_scales((3, 2, 3), seed=47)
    sb[1] = math.nan                                # the empty expert's weights must be unused
    gi = torch.tensor(group_index, dtype=torch.int32)
    out = ref.grouped_gemm_contiguous(a, sa, b, sb, gi)
    assert out.shape == (m, n) and out.dtype == BF16
    pad = gi == -1
    assert int(pad.sum()) == 58 + 126
    assert torch.equal(out[pad], torch.zeros(int(pad.sum()), n, dtype=BF16))
    assert not bool(out.isnan().any())
    a64 = dequant64(a, sa, 1, G, fmt)
    for g, (lo, hi) in enumerate(segments):
        if hi == lo:
            continue
        assert_gemm_close(out[lo:hi], a64[lo:hi], dequant64(b[g], sb[g], G, G, fmt), BF16)


# ------------------------------------------------------------------------ (8) grouped, masked
@pytest.mark.parametrize("masked", [[0, 7, 20], [0, 0, 0], [20, 20, 20]])
def test_grouped_gemm_masked_writes_only_valid_rows(masked):
    fmt, n, k, max_m = "e5m2", 200, 300, 20
    a = torch.stack([random_fp8((max_m, k), fmt, seed=51 + g) for g in range(3)])
    sa = random_scales((3, max_m, 3), seed=55)
    b = torch.stack([random_fp8((n, k), fmt, seed=56 + g) for g in range(3)])
    sb = random_scales((3, 2, 3), seed=60)
    for g, mg in enumerate(masked):
        sa[g, mg:] = math.nan                       # invalid rows must not be read
    out = torch.full((3, max_m, n), math.nan, dtype=BF16)
    out_bits = out.view(torch.int16).clone()
    res = ref.grouped_gemm_masked(a, sa, b, sb, torch.tensor(masked, dtype=torch.int32), out)
    assert res.shape == out.shape and res.dtype == BF16
    assert torch.equal(out.view(torch.int16), out_bits)             # out itself untouched
    for g, mg in enumerate(masked):
        assert torch.equal(res[g, mg:].view(torch.int16), out_bits[g, mg:])   # NaN stays
        if mg:
            assert_gemm_close(res[g, :mg], dequant64(a[g, :mg], sa[g, :mg], 1, G, fmt),
                              dequant64(b[g], sb[g], G, G, fmt), BF16)


# ------------------------------------------------------------------ (9) transpose-split-quant
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("fmt", FMTS)
def test_transpose_split_quant_matches_column_block_loop(fmt, ue8m0):
    k, counts = 40, [128, 0, 256]
    x = (torch.randn(sum(counts), k, generator=gen(71)) *
         torch.exp2(torch.randn(1, k, generator=gen(72)) * 3)).to(BF16)
    x[128 + 128: 128 + 256, 5] = 0                  # an all-zero (column, token block) group
    outs, scales = ref.transpose_split_quant(x, counts, fmt, ue8m0)
    assert len(outs) == len(scales) == len(counts)
    xs = x.float().tolist()
    start = 0
    for piece, (q, s) in enumerate(zip(outs, scales, strict=True)):
        mi = counts[piece]
        assert q.dtype == DTYPES[fmt] and tuple(q.shape) == (k, mi)
        assert s.dtype == torch.float32 and tuple(s.shape) == (mi // G, k)
        want_s = [[0.0] * k for _ in range(mi // G)]
        want_q = [[0] * mi for _ in range(k)]
        for col in range(k):
            for blk in range(mi // G):
                toks = range(start + blk * G, start + (blk + 1) * G)
                sc = expected_scale(max(abs(xs[t][col]) for t in toks), fmt, ue8m0)
                want_s[blk][col] = sc
                for t in toks:
                    want_q[col][t - start] = encode(fmt, f32(xs[t][col] / sc))
        assert s.tolist() == want_s, piece
        assert codes_of(q) == want_q, piece
        start += mi
    floor = f32(f32(1e-4) / FMAX[fmt])
    assert float(scales[2][1, 5]) == (pow2_ceil(floor) if ue8m0 else floor)


@pytest.mark.parametrize("counts", [[100, 284], [128, 128], [128, 384]])
def test_transpose_split_quant_rejects_bad_counts(counts):
    with pytest.raises(ValueError):
        ref.transpose_split_quant(torch.ones(384, 8), counts)


# ---------------------------------------------------------------------------- (10) calc_diff
def test_calc_diff_reference_points():
    x = torch.randn(50, 70, generator=gen(81))
    assert ref.calc_diff(x, x.clone()) == 0.0
    assert ref.calc_diff(torch.zeros(3, 4), torch.zeros(3, 4)) == 0.0
    assert abs(ref.calc_diff(x, -x) - 2.0) < 1e-12
    assert abs(ref.calc_diff(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) - 1.0) < 1e-15
    # 1 - 2<x,y>/(|x|^2+|y|^2) in float64 for an arbitrary pair
    y = x + 0.1 * torch.randn(50, 70, generator=gen(82))
    x64, y64 = x.double().reshape(-1).tolist(), y.double().reshape(-1).tolist()
    dot = math.fsum(p * q for p, q in zip(x64, y64, strict=True))
    nrm = math.fsum(p * p for p in x64) + math.fsum(q * q for q in y64)
    assert math.isclose(ref.calc_diff(x, y), 1 - 2 * dot / nrm, rel_tol=1e-9)
    assert isinstance(ref.calc_diff(x.to(BF16), y.to(BF16)), float)
