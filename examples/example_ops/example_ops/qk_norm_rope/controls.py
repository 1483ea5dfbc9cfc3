"""Negative controls: plausible wrong kernels the checks must fail."""

from __future__ import annotations

from .reference import qk_norm_rope


def rope_before_norm(qkv, positions, q_norm_weight, k_norm_weight, cos, sin, num_q_heads,
                     num_kv_heads):
    """Rotates first, then norms: the RMS is unchanged (a rotation), but the norm weight then
    scales the rotated halves, which differ wherever w[i] != w[i + d/2]."""
    ones = q_norm_weight.new_ones(q_norm_weight.shape)
    rotated = qk_norm_rope(qkv, positions, ones, ones, cos, sin, num_q_heads, num_kv_heads)
    return {"q": (rotated["q"].float() * q_norm_weight.float()).to(qkv.dtype),
            "k": (rotated["k"].float() * k_norm_weight.float()).to(qkv.dtype)}


def k_normed_with_q_weight(qkv, positions, q_norm_weight, k_norm_weight, cos, sin,
                           num_q_heads, num_kv_heads):
    """Normalises k with q's weight (one weight pointer for both)."""
    return qk_norm_rope(qkv, positions, q_norm_weight, q_norm_weight, cos, sin, num_q_heads,
                        num_kv_heads)
