"""Triton FP8 per-token (1x128) quantization, as DeepSeek-V3's inference ``act_quant``: one
program per ROWS rows and 128-column group takes each row's group amax, the scale
amax / fmax (rounded up to a power of two with UE8M0 scales), and stores x / scale saturated
to the format's range.

The quotient is rounded to the format's grid by hand (to nearest, ties to even, on the
float32 bits; subnormals with the add-and-subtract trick) before the conversion, which then
only moves exact values: Triton 3.9's interpreter converts float32 to fp8 by truncation, and
its round-to-nearest loses the carry when the mantissa overflows (runtime/interpreter.py
``_convert_float``), so ``.to(fp8)`` of an unrounded value would make a CPU run disagree with
the GPU's ``cvt.rn.satfinite``.

Compiled and interpreted kernels must agree bit for bit, so every step is exact on both:
- divisions are ``tl.math.div_rn``: Triton compiles a float32 ``/`` to ``div.full.f32``, an
  approximation up to 2 ulp off (third_party/nvidia's ``FDivOpConversion``), while the
  interpreter divides exactly;
- the sign is copied as a bit: Triton before 3.9 compiles unary minus as ``0 - x``
  (``semantic.minus``), which turns -0.0 into +0.0;
- the UE8M0 scale, the smallest power of two at or above amax / fmax, is read off the
  float32 bits, not through ``log2`` (a float32 log2 of a value one ulp above a power of
  two rounds to the integer, and ``lg2.approx`` is an approximation);
- the grid's constants are powers of two passed as compile-time floats, not ``exp2``.
These rules were found on an H200, where the first version of this kernel failed its
per-token cases. The control's column mask is off by one: each row's last column is left
out of its group's amax and never stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels import fp8 as ref

GROUP = 128
#: rows per program
ROWS = 16
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: (mantissa bits, exponent of the smallest normal) of each format
GRID = {"e4m3": (3, -6), "e5m2": (2, -14)}


def grid_constants(fmt: str) -> dict[str, float | int]:
    """The kernel's compile-time grid: mantissa bits, the smallest normal, and the power of
    two whose float32 ulp is the subnormal step (2**(min_exp - mant + 23))."""
    mant, min_exp = GRID[fmt]
    return {"MANT": mant, "SMALLEST_NORMAL": 2.0 ** min_exp,
            "SUBNORMAL_MAGIC": 2.0 ** (min_exp - mant + 23)}


@triton.jit
def _round_to_fp8(y, MANT: tl.constexpr, SMALLEST_NORMAL: tl.constexpr,
                  SUBNORMAL_MAGIC: tl.constexpr):
    """float32 ``y`` (finite, within the format's range) -> the nearest value with MANT
    mantissa bits and subnormals below SMALLEST_NORMAL, ties to even, as float32, with y's
    sign (-0.0 stays -0.0)."""
    bits = y.to(tl.uint32, bitcast=True)
    abits = bits & 0x7FFFFFFF
    a = abits.to(tl.float32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MANT
    KEEP: tl.constexpr = (0xFFFFFFFF >> SHIFT) << SHIFT
    normal = ((abits + ((1 << (SHIFT - 1)) - 1) + ((abits >> SHIFT) & 1))
              & KEEP).to(tl.float32, bitcast=True)
    # below the smallest normal the grid step is fixed: adding SUBNORMAL_MAGIC (a power of
    # two whose float32 ulp is that step) rounds to it, to nearest even
    sub = (a + SUBNORMAL_MAGIC) - SUBNORMAL_MAGIC
    r = tl.where(a < SMALLEST_NORMAL, sub, normal)
    return (r.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def _pow2_at_least(s):
    """The smallest power of two >= s, for positive normal float32 s, exactly."""
    bits = s.to(tl.uint32, bitcast=True)
    exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.uint32)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_1x128(x_ptr, q_ptr, s_ptr, m, k, groups, floor, FMAX: tl.constexpr,
                    UE8M0: tl.constexpr,
                    MANT: tl.constexpr, SMALLEST_NORMAL: tl.constexpr,
                    SUBNORMAL_MAGIC: tl.constexpr, ROWS: tl.constexpr,
                    GROUP: tl.constexpr, TAIL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = (row < m)[:, None] & (cols < k - TAIL)[None, :]  # TAIL = 1: the control
    offsets = row[:, None] * k + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # a NaN in the group makes its amax, scale and values NaN; an infinity makes the scale
    # inf (reference_kernels.fp8). tl.max's compare skips NaN, so NaN is found apart (a
    # NaN-keeping tl.reduce would do it in one pass, but the interpreter runs a custom
    # combine element by element: 30 s for the smoke cases instead of 1)
    has_nan = tl.max((x != x).to(tl.int32), axis=1) > 0
    amax = tl.where(has_nan, float("nan"), tl.maximum(tl.max(tl.abs(x), axis=1), floor))
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
    if UE8M0:
        finite = (scale == scale) & (scale < float("inf"))
        scale = tl.where(finite, _pow2_at_least(scale), scale)
    y = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FMAX), FMAX))
    q = _round_to_fp8(y, MANT, SMALLEST_NORMAL, SUBNORMAL_MAGIC).to(q_ptr.dtype.element_ty)
    # NaN stored by its bits (0x7F is NaN in e4m3fn and e5m2): the interpreter's float32 to
    # fp8 conversion does not keep it. A uint8 <-> fp8 bitcast is one Triton's own library
    # makes (triton/language/extra/hip/utils.py, convert_fp8e4b15_to_float16)
    nan = tl.full(q.shape, 0x7F, tl.uint8).to(q_ptr.dtype.element_ty, bitcast=True)
    tl.store(q_ptr + offsets, tl.where(y != y, nan, q), mask=mask)
    tl.store(s_ptr + row * groups + g, scale, mask=row < m)


def _quantize(x, fmt, granularity, ue8m0, scale, tail: int):
    x = x.contiguous()
    m, k = x.shape
    groups = triton.cdiv(k, GROUP)
    q = torch.empty((m, k), dtype=FP8[fmt], device=x.device)
    scales = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    _quantize_1x128[(triton.cdiv(m, ROWS), groups)](
        x, q, scales, m, k, groups, ref.AMAX_FLOOR, FMAX=ref.FMAX[fmt], UE8M0=bool(ue8m0),
        ROWS=ROWS, GROUP=GROUP, TAIL=tail, **grid_constants(fmt))
    return q, scales


def quantize_per_token(x, fmt, granularity, ue8m0, scale):
    """(q [M, K] fp8, scales [M, ceil(K/128)] float32)."""
    return _quantize(x, fmt, granularity, ue8m0, scale, 0)


def quantize_tail_mask_off_by_one(x, fmt, granularity, ue8m0, scale):
    """Control: the column mask is ``cols < k - 1``."""
    return _quantize(x, fmt, granularity, ue8m0, scale, 1)
