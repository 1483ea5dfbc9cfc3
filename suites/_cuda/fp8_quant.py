"""Launch of fp8_quant.cu: per-token (1x128) FP8 quantization of a bf16 [M, K] matrix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from harness.api import cuda_launch

WARPS_PER_BLOCK = 8
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def unsupported(params: Mapping[str, Any]) -> str | None:
    if params.get("granularity") != "token" or params.get("static"):
        return "fp8_quant.cu quantizes per token (1x128 groups, scales from amax) only"
    return None


@cuda_launch(unsupported=unsupported)
def launch_quantize_per_token(kernels: Any, x, fmt, granularity, ue8m0, scale) -> Any:
    """(q [M, K] fp8, scales [M, ceil(K/128)] float32), one warp per 128-column group."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise ValueError(f"fp8_quant.cu takes a 2-D bf16 matrix, not {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    m, k = x.shape
    groups = -(-k // 128)
    q = torch.empty((m, k), dtype=FP8[fmt], device=x.device)
    scales = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    tasks = m * groups
    blocks = min(-(-tasks // WARPS_PER_BLOCK), kernels.sm_count * 32)
    kernels[f"quantize_1x128_{fmt}"](
        grid=blocks, block=32 * WARPS_PER_BLOCK,
        args=(x, q, scales, np.int64(m), np.int64(k), np.int32(bool(ue8m0))))
    return q, scales
