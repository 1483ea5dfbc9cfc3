"""Triton FP8 per-token (1x128) quantization, as DeepSeek-V3's inference ``act_quant``: one
program per ROWS rows and 128-column group takes each row's group amax, the scale
amax / fmax (rounded up to a power of two with UE8M0 scales), and stores x / scale saturated
to the format's range.

The quotient is rounded to the format's grid by hand (to nearest, ties to even, on the
float32 bits; subnormals with the add-and-subtract trick) before the conversion, which then
only moves exact values: Triton 3.9's interpreter converts float32 to fp8 by truncation, and
its round-to-nearest loses the carry when the mantissa overflows (runtime/interpreter.py
``_convert_float``), so ``.to(fp8)`` of an unrounded value would make a CPU run disagree with
the GPU's ``cvt.rn.satfinite``. The control's column mask is off by one: each row's last
column is left out of its group's amax and never stored.
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


@triton.jit
def _round_to_fp8(y, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """float32 ``y`` (finite, within the format's range) -> the nearest value with MANT
    mantissa bits and subnormals below 2**MIN_EXP, ties to even, as float32."""
    a = tl.abs(y)
    bits = a.to(tl.uint32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MANT
    KEEP: tl.constexpr = (0xFFFFFFFF >> SHIFT) << SHIFT
    normal = ((bits + ((1 << (SHIFT - 1)) - 1) + ((bits >> SHIFT) & 1))
              & KEEP).to(tl.float32, bitcast=True)
    # below the smallest normal the grid step is fixed: adding 2**(MIN_EXP - MANT + 23)
    # leaves float32 exactly that step, so the addition rounds to it (to nearest even)
    magic = tl.math.exp2(tl.full(a.shape, MIN_EXP - MANT + 23, tl.float32))
    sub = (a + magic) - magic
    r = tl.where(a < tl.math.exp2(tl.full(a.shape, MIN_EXP, tl.float32)), sub, normal)
    return tl.where(y < 0, -r, r)


@triton.jit
def _quantize_1x128(x_ptr, q_ptr, s_ptr, m, k, groups, fmax, floor, UE8M0: tl.constexpr,
                    MANT: tl.constexpr, MIN_EXP: tl.constexpr, ROWS: tl.constexpr,
                    GROUP: tl.constexpr, TAIL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = (row < m)[:, None] & (cols < k - TAIL)[None, :]  # TAIL = 1: the control
    offsets = row[:, None] * k + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), floor)
    scale = amax / fmax
    if UE8M0:
        scale = tl.math.exp2(tl.math.ceil(tl.math.log2(scale)))
    y = tl.minimum(tl.maximum(x / scale[:, None], -fmax), fmax)
    tl.store(q_ptr + offsets, _round_to_fp8(y, MANT, MIN_EXP).to(q_ptr.dtype.element_ty),
             mask=mask)
    tl.store(s_ptr + row * groups + g, scale, mask=row < m)


def _quantize(x, fmt, granularity, ue8m0, scale, tail: int):
    x = x.contiguous()
    m, k = x.shape
    groups = triton.cdiv(k, GROUP)
    q = torch.empty((m, k), dtype=FP8[fmt], device=x.device)
    scales = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    _quantize_1x128[(triton.cdiv(m, ROWS), groups)](
        x, q, scales, m, k, groups, ref.FMAX[fmt], ref.AMAX_FLOOR, UE8M0=bool(ue8m0),
        MANT=GRID[fmt][0], MIN_EXP=GRID[fmt][1], ROWS=ROWS, GROUP=GROUP, TAIL=tail)
    return q, scales


def quantize_per_token(x, fmt, granularity, ue8m0, scale):
    """(q [M, K] fp8, scales [M, ceil(K/128)] float32)."""
    return _quantize(x, fmt, granularity, ue8m0, scale, 0)


def quantize_tail_mask_off_by_one(x, fmt, granularity, ue8m0, scale):
    """Control: the column mask is ``cols < k - 1``."""
    return _quantize(x, fmt, granularity, ue8m0, scale, 1)
