"""Wrong FP8 quantizers for the tests: the suite's torch quantizer with its UE8M0 rounding
swapped for another (suites._fp8.quant keeps its own ``_pow2_ceil`` for this)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import suites._fp8.quant as quant


def with_pow2_ceil(rounding: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., object]:
    """``quantize_torch`` rounding its UE8M0 scales with ``rounding``."""
    def quantize(x, fmt, granularity, ue8m0, scale):
        saved = quant._pow2_ceil
        quant._pow2_ceil = rounding
        try:
            return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
        finally:
            quant._pow2_ceil = saved
    return quantize
