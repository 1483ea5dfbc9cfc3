"""The implementation under test: torch's fused RMSNorm and a RoPE that rotates the two
halves in place of concatenating them (a different formulation from the reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import EPS


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[..., :half], sin[..., :half]  # NeoX tables repeat the angle in both halves
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def qk_norm_rope_torch(qkv, positions, q_norm_weight, k_norm_weight, cos, sin, num_q_heads,
                       num_kv_heads):
    tokens, d = qkv.shape[0], q_norm_weight.numel()
    q, k, _ = qkv.view(tokens, -1, d).split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    q = F.rms_norm(q.float(), (d,), q_norm_weight.float(), eps=EPS)
    k = F.rms_norm(k.float(), (d,), k_norm_weight.float(), eps=EPS)
    return {"q": _rope(q, c, s).to(qkv.dtype), "k": _rope(k, c, s).to(qkv.dtype)}


