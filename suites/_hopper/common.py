"""Inputs and tolerances shared by the Hopper task suites.

Weights are scaled so that outputs have unit-order magnitude at every shape (x uniform in
[-1, 1), a (N, K) weight uniform in [-sqrt(3/K), sqrt(3/K))), so one absolute tolerance means
the same thing at hidden 256 and at hidden 7168.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness.api import all_of, allclose, cos_diff, generate, seed_from

BF16 = torch.bfloat16

#: GEMM-like outputs (a reduction over K): DeepGEMM's bf16 GEMM bound on calc_diff, and
#: elementwise one bf16 ulp at unit magnitude (2**-7) plus the output's own rounding
GEMM_TOLERANCE = all_of(cos_diff(1e-5), allclose(rtol=1.6e-2, atol=8e-3))
#: decode attention in bf16 (published threshold: rtol 2e-2, atol 8e-3)
ATTENTION_TOLERANCE = allclose(rtol=2e-2, atol=8e-3)
#: the precision lens of attention's output, against its float64 value. FlashAttention-style
#: kernels round P to bf16 for the P @ V MMA (each term off by up to 2**-8 of p_j |v_j|, bf16's
#: unit roundoff), some store each split's partial output in bf16 (as much again), then the
#: output is rounded once (2**-8 of |out|): such a kernel is within 2**-8 |out| + 2**-7
#: sum_j p_j |v_j| (the magnitude) of it, not the value rounded once; the bound, 2**-7 of
#: each, leaves 2**-8 |out| for second-order terms. A score rounded to bf16 before exp, or
#: weights or a probability lost, is far outside; an accumulation in bf16 only at some shapes
ATTENTION_LENS = allclose(rtol=2**-7, atol=0.0, magnitude_rtol=2**-7)


def tensor(tag: str, params: Mapping[str, Any], name: str, shape: tuple[int, ...],
           low: float = -1.0, high: float = 1.0, dtype: torch.dtype = BF16,
           region: object = None) -> torch.Tensor:
    """A deterministic input named ``name`` of a case (or a region of it), uniform in
    [low, high)."""
    key = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return generate(shape, dtype, seed=seed_from(tag, key, name), dist="uniform", low=low,
                    high=high, region=region)


def weight(tag: str, params: Mapping[str, Any], name: str, out_features: int,
           in_features: int, region: object = None) -> torch.Tensor:
    """An (out, in) weight scaled so that x @ W.T has unit-order entries."""
    bound = math.sqrt(3.0 / in_features)
    return tensor(tag, params, name, (out_features, in_features), -bound, bound, region=region)


def norm_weight(tag: str, params: Mapping[str, Any], name: str, size: int) -> torch.Tensor:
    return tensor(tag, params, name, (size,), 0.5, 1.5)


def near_eps_rows(x: torch.Tensor, zero: int, tiny: int) -> torch.Tensor:
    """``x`` with row ``zero`` all zero and row ``tiny`` scaled by 2**-10 (exact), for a
    norm's eps: 0 * rsqrt(0 + eps) is 0, while without the eps (or with it outside the square
    root, rsqrt(0) + eps) it is NaN; a row of 1e-3 magnitude has a mean square (~1e-6) the
    size of eps, where eps added after the square root, or another eps, is off by a third
    (and by less than a rounding on rows of ordinary size)."""
    x[zero] = 0
    x[tiny] = (x[tiny].double() * 2.0**-10).to(x.dtype)
    return x


def linear_bf16_accumulation(x: torch.Tensor, weight: torch.Tensor, k_step: int = 16
                             ) -> torch.Tensor:
    """The bug of a kernel that keeps its K-loop accumulator in bf16: every k_step slice of
    the product is added to a bf16 running sum."""
    acc = torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    for k in range(0, x.shape[1], k_step):
        part = x[:, k : k + k_step].float() @ weight[:, k : k + k_step].float().T
        acc = (acc.float() + part).to(x.dtype)
    return acc
