"""Inputs and tolerances of the FP8 suites.

Distributions: ``uniform`` in [-1, 1); ``logmag``, magnitudes 10**U(-3, 3) with random signs
(six decades: subnormals after scaling, values near the group max); ``blocky``, uniform
times a power of two in [2**-8, 2**8] per 128x128 block (so block scales differ and a scale
read from the wrong block shows); ``edge``, logmag with the
first 128x128 block all zero (the 1e-4 amax clamp) and the block below it with an amax of
exactly fmax / 2**k (a power-of-two scale, UE8M0's boundary); ``wide``, uniform in [-2 fmax, 2 fmax)
for a static scale of 1 (saturation), its second row zero (a padding token)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness.api import (
    DEFAULT_RTOL_ATOL,
    Tolerance,
    allclose,
    cos_diff,
    generate,
    hash32,
    rounding,
    seed_from,
)
from reference_kernels import fp8 as ref

BF16 = torch.bfloat16
OUT_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def values(tag: str, params: Mapping[str, Any], name: str, shape: tuple[int, ...]
           ) -> torch.Tensor:
    """A bf16 input of ``shape`` drawn from the case's ``dist`` (default uniform)."""
    key = ",".join(f"{k}={params[k]}" for k in sorted(params))
    seed = seed_from(tag, key, name)
    dist = params.get("dist", "uniform")
    if dist == "uniform":
        return generate(shape, BF16, seed=seed, low=-1.0, high=1.0)
    if dist == "wide":
        fmax = ref.FMAX[params.get("fmt", "e4m3")]
        x = generate(shape, BF16, seed=seed, low=-2 * fmax, high=2 * fmax)
        if shape[0] > 1:  # a padding token: its products and outputs are exactly 0
            x[1] = 0
        return x
    if dist == "blocky":
        rows = torch.arange(shape[0])[:, None] // 128
        cols = torch.arange(shape[1])[None, :] // 128
        exponent = hash32(rows * 4096 + cols, seed + 2) % 17 - 8
        base = generate(shape, torch.float32, seed=seed, low=-1.0, high=1.0)
        return (base * torch.exp2(exponent.float())).to(BF16)
    if dist not in ("logmag", "edge", "nan"):
        raise ValueError(f"dist {dist!r}: use uniform, blocky, logmag, edge, nan or wide")
    exponent = generate(shape, torch.float64, seed=seed, low=-3.0, high=3.0)
    sign = generate(shape, torch.float64, seed=seed + 1, dist="sign")
    x = (sign * torch.pow(10.0, exponent)).to(BF16)
    if dist == "nan":
        # non-finite values in three groups of the first rows (reference_kernels.fp8 says
        # what each makes): a NaN, a +inf, and a -inf beside a NaN
        x[0, 5] = math.nan
        x[1, min(130, shape[1] - 1)] = math.inf
        x[2, 3], x[2, 9] = -math.inf, math.nan
    if dist == "edge":
        x[:128, :128] = 0  # an all-zero group
        # groups below it whose amax is 56 = 448 / 2**3 = 57344 / 2**10: the scale is a
        # power of two exactly, which UE8M0 rounding must keep (not round up once more)
        x[128:256, :128] = x[128:256, :128].clamp(-55.0, 55.0)
        x[128:256, 0] = 56.0
        # groups beside the zero one whose amax is above 0 but below the 1e-4 floor (a floor
        # applied to zero alone misses them), and the largest value in the last row and column
        # (a per-tensor amax over whole 128-row tiles misses it)
        x[:128, 128:256] = (x[:128, 128:256].double() * 1e-8).to(BF16)
        x[-1, -1] = 4096.0
    return x


def unquantized_bound(fmt: str) -> float:
    """calc_diff against the unquantized float32 product: DeepGEMM's 1e-3 for e4m3; e5m2 has
    one mantissa bit less, so twice the rounding error and four times the bound."""
    return 1e-3 if fmt == "e4m3" else 4e-3


#: the share of an element's magnitude sum_k |a_ik| |b_jk| an FP8 GEMM may be off by: the
#: rounding of an accumulator with about 14 mantissa bits (what Hopper's FP8 tensor cores keep
#: between promotions, DeepSeek-V3 report 3.3.2). cuBLAS on an H200 used 6.2e-6 of it; the
#: bf16-accumulation controls are about 1.4e-4 off, so they still fail
ACCUMULATION_RTOL = 2.0**-14


#: the precision lens's share for an FP8 GEMM's output: an epilogue that rounds twice (to
#: bf16, then scaled in bf16) leaves 31-33% of the smoke outputs off the float64 value rounded
#: once, a float32 accumulation on the CPU under 0.1%. A GPU's accumulator is off by more:
#: every element off by 2**-17 of its magnitude (the H200's worst element) moves 3-5% of them,
#: by 2**-14 (the allclose's allowance) 16-24% (uniform noise of that size added to the float64
#: value of the smoke cases, measured once); tests/test_fp8_gemm_accumulation.py holds a 13-bit
#: accumulator and the twice-rounding epilogue to it
GEMM_LENS_OFF = 0.15


def gemm_tolerances(fmt: str = "e4m3", out: str = "bf16") -> dict[str, Tolerance]:
    """allclose against the dequantized reference, plus ``ACCUMULATION_RTOL`` of each
    element's magnitude, and calc_diff against the unquantized product. The allclose is
    gpu-mode fp8-mm's (rtol 2e-2, atol 1e-3) for a bf16 output, whose own rounding is 2**-9;
    a float32 output takes float32's defaults, as its rounding is 2**-24: at rtol 2e-2 an
    epilogue that rounds it through bf16 passed. Where the spec gives the float64 value
    (``exact``), the precision lens at ``GEMM_LENS_OFF``: the allclose's rtol hides a second
    bf16 rounding."""
    rtol, atol = (2e-2, 1e-3) if out == "bf16" else DEFAULT_RTOL_ATOL[OUT_DTYPES[out]]
    return {"out": allclose(rtol=rtol, atol=atol, magnitude_rtol=ACCUMULATION_RTOL),
            "out:unquantized": cos_diff(unquantized_bound(fmt)),
            "out:exact": rounding(GEMM_LENS_OFF)}
