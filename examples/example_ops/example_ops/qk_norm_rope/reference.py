"""Reference: per-head RMSNorm of q and k, then NeoX RoPE at each token's position.

Mirage's paged-attention task starts with this prologue before it touches the KV cache. The
fused qkv row of a token holds ``hq`` q heads, then ``hkv`` k heads, then ``hkv`` v heads of
``d`` elements each. Both steps run in float32; the results are rounded to the input's dtype
once, at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import case_tensor, hash32, seed_from

OP = "example.qk_norm_rope"
EPS = 1e-6
MAX_POSITION = 4096


def rope_tables(max_pos: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, ...]:
    """NeoX cos/sin tables (max_pos, dim) in float32: angle p * base**(-2i/dim), the same for
    both halves of a head."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def make_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """qkv in [-2, 2), norm weights in [0.5, 1.5), positions spread by a hash over the table;
    ``rows=zero`` makes token 0's q and k all zero (RMSNorm must give 0 there, not NaN)."""
    t, hq, hkv, d = params["tokens"], params["hq"], params["hkv"], params["d"]
    qkv = case_tensor(OP, params, "qkv", (t, (hq + 2 * hkv) * d), low=-2.0, high=2.0)
    if params.get("rows") == "zero":
        qkv[0, : (hq + hkv) * d] = 0.0
    cos, sin = rope_tables(MAX_POSITION, d)
    positions = hash32(torch.arange(t), seed_from(OP, "positions", t)) % MAX_POSITION
    return {"qkv": qkv, "positions": positions.to(torch.int64),
            "q_norm_weight": case_tensor(OP, params, "qn", (d,), low=0.5, high=1.5),
            "k_norm_weight": case_tensor(OP, params, "kn", (d,), low=0.5, high=1.5),
            "cos": cos, "sin": sin, "num_q_heads": hq, "num_kv_heads": hkv}


def rms_norm(x32: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x**2) + eps) * weight over the last dim, in float32."""
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, q_norm_weight: torch.Tensor,
                 k_norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 num_q_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """{"q": (T, hq, d), "k": (T, hkv, d)}, normed per head then rotated by position."""
    tokens, d = qkv.shape[0], q_norm_weight.numel()
    heads = qkv.float().view(tokens, num_q_heads + 2 * num_kv_heads, d)
    q = rms_norm(heads[:, :num_q_heads], q_norm_weight)
    k = rms_norm(heads[:, num_q_heads : num_q_heads + num_kv_heads], k_norm_weight)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]  # (T, 1, d)
    return {"q": (q * c + rotate_half(q) * s).to(qkv.dtype),
            "k": (k * c + rotate_half(k) * s).to(qkv.dtype)}
