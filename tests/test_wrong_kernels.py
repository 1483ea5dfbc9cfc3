"""Plausible wrong kernels, written apart from the suites' own controls, each run through the
real runner (every check, in process, world size 1) on the smoke case made for its bug, which
it must not pass, and on a plain smoke case of the same op, which it passes: the edge case,
not any case, is what catches it. Each bug passed every smoke case before its case existed.
(Wrong collectives that need more ranks: test_cli_integration's wrong reductions.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from quantizers import with_pow2_ceil
from smoke_cases import smoke_case, status

import suites._fp8.quant as quant
import suites._hopper.attention as attention
from harness.core.discovery import registry
from harness.core.spec import Case
from harness.engine.runner import run_case
from harness.engine.verdict import STAGE_PREFIX
from reference_kernels import fp8 as fp8_ref
from suites._fp8.gemm import blockwise_torch, contiguous_torch, masked_torch, per_tensor_torch
from suites._hopper.attention import split_kv_torch
from suites._hopper.readout import argmax_torch
from suites._hopper.tasks import embedding_torch, linear_torch, rmsnorm_torch
from suites._moe import torch_ops
from suites._moe.router import router_torch
from suites.strided_copy import copy_torch

BF16 = torch.bfloat16


# ------------------------------------------------------------------ hopper tasks

def rmsnorm_eps_after_sqrt(x, weight):
    x32 = x.float()
    return (x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * weight.float()).to(x.dtype)


def rmsnorm_eps_1e5(x, weight):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
            * weight.float()).to(x.dtype)


def silu_mul_half_exp(x, groups):
    """sigmoid's exp in float16 (half2 math): it overflows to inf for gates below -11."""
    m = x.unflatten(1, (groups, 2, -1)).float()
    gate = m[:, :, 0]
    act = (gate / (1 + torch.exp((-gate).half()).float())).to(x.dtype).float()
    return (act * m[:, :, 1]).to(x.dtype).flatten(1)


def argmax_scan_from_minus_one(logits, chunk):
    """A scan that starts at index -1 and takes a logit only when it is larger: an all -inf
    row keeps -1."""
    index = argmax_torch(logits, chunk)
    none = (logits == -math.inf).all(dim=1, keepdim=True)
    return torch.where(none, torch.full_like(index, -1), index)


def embedding_minus_one_only(ids, weight):
    """Only id -1 is padding; -2 reads weight[-2]."""
    flat = ids.reshape(-1)
    rows = weight[flat]
    return torch.where((flat == -1)[:, None], torch.zeros((), dtype=weight.dtype), rows)


def split_kv_running_max_from_zero(q, k, v, chunk):
    real = torch.Tensor.amax
    try:  # each chunk's softmax shifted by max(0, its largest score)
        torch.Tensor.amax = lambda t, *a, **kw: real(t, *a, **kw).clamp_min(0.0)
        return attention.split_kv_torch(q, k, v, chunk)
    finally:
        torch.Tensor.amax = real


def split_kv_skips_negligible_keys(q, k, v, chunk):
    """A sparse P @ V: the values of keys whose probability in their chunk is under 2**-24
    are never loaded (taken as 0), so a NaN there never reaches the output."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("hd,shd->hs", q.float(), k.float()) * scale
    chunks = torch.arange(k.shape[0]) // chunk
    far = torch.zeros_like(scores, dtype=torch.bool)
    for c in chunks.unique():
        cols = chunks == c
        m = scores[:, cols].amax(dim=-1, keepdim=True)
        far[:, cols] = torch.exp(scores[:, cols] - m) < 2.0**-24
    return attention.split_kv_torch(
        q, k, torch.where(far.t()[..., None], torch.zeros((), dtype=v.dtype), v), chunk)


def split_kv_one_chunk_too_many(q, k, v, chunk):
    """S // chunk + 1 chunks: an empty one where the chunk divides S."""
    pad = chunk if k.shape[0] % chunk == 0 else 0
    k2 = torch.cat([k, k.new_full((pad, *k.shape[1:]), -math.inf)])
    v2 = torch.cat([v, v.new_zeros((pad, *v.shape[1:]))])
    return attention.split_kv_torch(q, k2, v2, chunk)


def paged_attention_unshifted_softmax(**inputs):
    real = F.scaled_dot_product_attention

    def unshifted(q, k, v, attn_mask=None, scale=None):
        p = torch.exp(q @ k.transpose(-2, -1) * scale) * attn_mask
        return (p / p.sum(-1, keepdim=True)) @ v

    try:
        F.scaled_dot_product_attention = unshifted
        return attention.paged_attention_torch(**inputs)
    finally:
        F.scaled_dot_product_attention = real


def split_kv_merge_relative_to_first(q, k, v, chunk):
    """Chunks weighted by exp(lse_c - lse_0): the first chunk's lse, not the largest."""
    outs, lses = [], []
    for start in range(0, k.shape[0], chunk):
        s = torch.einsum("hd,shd->hs", q.float(), k[start : start + chunk].float())
        s = s / math.sqrt(q.shape[-1])
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[:, None])
        outs.append(torch.einsum("hs,shd->hd", p, v[start : start + chunk].float()))
        lses.append(lse)
    lse_all = torch.stack(lses)
    w = torch.exp(lse_all - lse_all[0])
    out = (w[..., None] * torch.stack(outs)).sum(0) / w.sum(0)[..., None]
    return {"out": out.to(q.dtype), "lse": lse_all[0] + w.sum(0).log()}


def rmsnorm_linear_eps_after_sqrt(x, norm_weight, weight):
    x32 = x.float()
    normed = x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * norm_weight.float()
    return F.linear(normed, weight.float()).to(x.dtype)


def rmsnorm_linear_eps_1e5(x, norm_weight, weight):
    normed = F.rms_norm(x.float(), (x.shape[-1],), norm_weight.float(), eps=1e-5)
    return F.linear(normed, weight.float()).to(x.dtype)


def paged_attention_eps_after_sqrt(**inputs):
    """The per-head qk-norm as x / (sqrt(mean square) + eps)."""
    real = F.rms_norm

    def eps_outside(x, shape, weight=None, eps=None):
        x32 = x.float()
        return x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight

    try:
        F.rms_norm = eps_outside
        return attention.paged_attention_torch(**inputs)
    finally:
        F.rms_norm = real


def paged_attention_bf16_scores(**inputs):
    """The q.k scores held in bf16 (a bf16 S tile) before the softmax."""
    real = F.scaled_dot_product_attention

    def bf16_scores(q, k, v, attn_mask=None, scale=None):
        s = (q @ k.transpose(-2, -1) * scale).to(BF16).float()
        return torch.softmax(s.masked_fill(~attn_mask, -math.inf), dim=-1) @ v

    try:
        F.scaled_dot_product_attention = bf16_scores
        return attention.paged_attention_torch(**inputs)
    finally:
        F.scaled_dot_product_attention = real


def embedding_view_for_one_id(ids, weight):
    """A batch of one valid id answered with a view of the table's row."""
    if ids.numel() == 1 and int(ids) >= 0:
        return weight[int(ids) : int(ids) + 1]
    return embedding_torch(ids, weight)


def argmax_float16_load(logits, chunk):
    return argmax_torch(logits.half(), chunk)


def embedding_whole_vectors_only(ids, weight):
    """Rows copied 8 bf16 (16 bytes) at a time, the hidden % 8 tail never copied."""
    out = embedding_torch(ids, weight)
    out[:, out.shape[1] // 8 * 8:] = 0
    return out


def silu_mul_whole_vectors_only(x, groups):
    """Each chunk in 16-element vectors; the chunk % 16 tail is left zero."""
    m = x.unflatten(1, (groups, 2, -1))
    out = (F.silu(m[:, :, 0]) * m[:, :, 1])
    out[..., out.shape[-1] // 16 * 16:] = 0
    return out.flatten(1)


def linear_whole_tiles_only(x, weight):
    """A 16-row tile kernel storing whole tiles only: rows past the last multiple of 16 stay
    zero (a batch of 16 or fewer is one partial tile, stored right)."""
    out = linear_torch(x, weight)
    if x.shape[0] > 16:
        out[x.shape[0] // 16 * 16:] = 0
    return out


def rmsnorm_two_rows_per_block(x, weight):
    """Past 16 rows, two rows per block whose reduction mixes their sums of squares."""
    if x.shape[0] <= 16 or x.shape[0] % 2:
        return rmsnorm_torch(x, weight)
    x32 = x.float()
    ms = x32.pow(2).mean(-1).view(-1, 2).mean(-1).repeat_interleave(2)[:, None]
    return (x32 * torch.rsqrt(ms + 1e-6) * weight.float()).to(x.dtype)


def rmsnorm_first_8192(x, weight):
    """A register-cached row of 8192: the sum of squares of a wider row stops there."""
    x32 = x.float()
    ms = x32[:, :8192].pow(2).sum(-1, keepdim=True) / x.shape[-1]
    return (x32 * torch.rsqrt(ms + 1e-6) * weight.float()).to(x.dtype)


def argmax_later_across_warps(logits, chunk):
    """Past 32 chunks, a second stage over the warps' winners that keeps the later one on a
    tie: rows whose maximum repeats in chunks of two warps take the later index."""
    chunks = -(-logits.shape[1] // chunk)
    if chunks <= 32:
        return argmax_torch(logits, chunk)
    cut = 32 * chunk
    head, tail = argmax_torch(logits[:, :cut], chunk), argmax_torch(logits[:, cut:], chunk)
    padded = torch.nn.functional.pad(logits.float(), (0, chunks * chunk - logits.shape[1]))
    first = padded[:, :cut].gather(1, head)
    second = padded[:, cut:].gather(1, tail)
    return torch.where(second >= first, tail + cut, head)


def paged_attention_groups_of_4(**inputs):
    """q heads grouped by 4 per warp: past groups of 4, the second warp's heads read the next
    KV head's keys and values."""
    hq, hkv = inputs["num_q_heads"], inputs["num_kv_heads"]
    if hq // hkv <= 4:
        return attention.paged_attention_torch(**inputs)
    real = torch.Tensor.repeat_interleave

    def shifted(t, group, dim=None):
        out = real(t, group, dim=dim)
        if dim == 1 and group == hq // hkv:
            heads = torch.arange(hq)
            kv = torch.clamp(heads // group + (heads % group >= 4).long(), max=hkv - 1)
            return t[:, kv]
        return out

    try:
        torch.Tensor.repeat_interleave = shifted
        return attention.paged_attention_torch(**inputs)
    finally:
        torch.Tensor.repeat_interleave = real


HOPPER = [
    ("hopper_tasks.rmsnorm", rmsnorm_eps_after_sqrt, {"rows": "zero", "hidden": 256}),
    ("hopper_tasks.rmsnorm", rmsnorm_eps_1e5, {"rows": "zero", "hidden": 256}),
    ("hopper_tasks.silu_mul", silu_mul_half_exp, {"values": "wide"}),
    ("hopper_tasks.argmax", argmax_scan_from_minus_one, {"values": "neginf"}),
    ("hopper_tasks.embedding", embedding_minus_one_only, {"ids": "edges", "vocab": 17}),
    ("hopper_tasks.attention_split_kv", split_kv_running_max_from_zero, {"scores": "wide"}),
    ("hopper_tasks.attention_split_kv", split_kv_one_chunk_too_many, {"scores": "wide"}),
    ("hopper_tasks.attention_split_kv", split_kv_skips_negligible_keys, {"v": "nan_far"}),
    ("hopper_tasks.paged_attention", paged_attention_unshifted_softmax, {"scores": "wide"}),
    ("hopper_tasks.attention_split_kv", split_kv_merge_relative_to_first,
     {"scores": "low_first"}),
    ("hopper_tasks.rmsnorm_linear", rmsnorm_linear_eps_after_sqrt, {"rows": "zero"}),
    ("hopper_tasks.rmsnorm_linear", rmsnorm_linear_eps_1e5, {"rows": "zero"}),
    ("hopper_tasks.paged_attention", paged_attention_eps_after_sqrt, {"rows": "zero"}),
    ("hopper_tasks.embedding", embedding_view_for_one_id, {"ids": "valid"}),
    ("hopper_tasks.argmax", argmax_float16_load, {"values": "range"}),
    ("hopper_tasks.embedding", embedding_whole_vectors_only, {"hidden": 100}),
    ("hopper_tasks.silu_mul", silu_mul_whole_vectors_only, {"inter": 40}),
    ("hopper_tasks.linear", linear_whole_tiles_only, {"b": 40}),
    ("hopper_tasks.rmsnorm", rmsnorm_two_rows_per_block, {"b": 20}),
    ("hopper_tasks.rmsnorm", rmsnorm_first_8192, {"hidden": 12288}),
    ("hopper_tasks.argmax", argmax_later_across_warps, {"vocab": 600}),
    ("hopper_tasks.paged_attention", paged_attention_groups_of_4, {"hq": 16}),
]


# ------------------------------------------------------------------ fp8

def quantize_static_nan_to_minus_fmax(x, fmt, granularity, ue8m0, scale):
    """A static scale's saturation by fminf(fmaxf(v, -fmax), fmax), which drop a NaN: NaN
    comes out -fmax."""
    if scale is None:
        return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
    fmax = fp8_ref.FMAX[fmt]
    v = (x.float() / scale).nan_to_num(nan=-fmax).clamp(-fmax, fmax)
    return v.to(fp8_ref.FORMATS[fmt]), torch.tensor(float(scale))


def blockwise_small_m_scales_transposed(a, scale_a, b, scale_b, out_dtype):
    """A swap-AB path for 2 <= M <= 16 that reads the activation scales [M, K/128] as if
    stored K-block-major."""
    if not 2 <= a.shape[0] <= 16:
        return blockwise_torch(a, scale_a, b, scale_b, out_dtype)
    wrong = scale_a.T.contiguous().view(scale_a.shape)
    return blockwise_torch(a, wrong, b, scale_b, out_dtype)


def quantize_floor_on_zero_only(x, fmt, granularity, ue8m0, scale):
    """amax floored to 1e-4 only where it is 0: a group of amax 1e-5 gets a 10x smaller scale."""
    if granularity == "tensor":
        return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
    blocks, amax = quant._grouped(x.float(), 1 if granularity == "token" else 128, 128)
    s = fp8_ref.divide(torch.where(amax == 0, fp8_ref.AMAX_FLOOR, amax), fp8_ref.FMAX[fmt])
    s = quant._pow2_ceil(s) if ue8m0 else s
    fmax = fp8_ref.FMAX[fmt]
    q = (blocks / s[:, None, :, None]).clamp(-fmax, fmax).to(fp8_ref.FORMATS[fmt])
    return q.flatten(2, 3).flatten(0, 1)[: x.shape[0], : x.shape[1]].contiguous(), s


def quantize_amax_of_whole_tiles(x, fmt, granularity, ue8m0, scale):
    """A per-tensor amax reduced over whole 128-row tiles: the last partial tile is left out."""
    if granularity != "tensor" or scale is not None or x.shape[0] <= 128:
        return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
    rows = x.shape[0] // 128 * 128
    s = fp8_ref.divide(x[:rows].float().abs().max().clamp_min(fp8_ref.AMAX_FLOOR),
                       fp8_ref.FMAX[fmt])
    fmax = fp8_ref.FMAX[fmt]
    return (x.float() / s).clamp(-fmax, fmax).to(fp8_ref.FORMATS[fmt]), s


def _frexp_only(s: torch.Tensor) -> torch.Tensor:
    mantissa, exponent = torch.frexp(s)
    return torch.ldexp(torch.ones_like(s), exponent - (mantissa == 0.5).int())


#: UE8M0 rounding by frexp alone: frexp gives NaN and inf exponent 0, a scale of 1.0
quantize_ue8m0_of_nan_is_one = with_pow2_ceil(_frexp_only)
quantize_ue8m0_of_nan_is_one.__name__ = "quantize_ue8m0_of_nan_is_one"


def per_tensor_half_epilogue(a, scale_a, b, scale_b, out_dtype):
    return per_tensor_torch(a, scale_a, b, scale_b, torch.float32).half().to(out_dtype)


def per_tensor_exponent_add_epilogue(a, scale_a, b, scale_b, out_dtype):
    """A power-of-two scale product applied by adding to the float32 exponent field: right
    for every normal accumulator, but an exact 0 (a padding token's row) comes out 2**-125."""
    acc = per_tensor_torch(a, torch.ones_like(scale_a), b, torch.ones_like(scale_b),
                           torch.float32)
    mantissa, exponent = torch.frexp((scale_a.float() * scale_b.float()).reshape(()))
    if float(mantissa) != 0.5:
        return per_tensor_torch(a, scale_a, b, scale_b, out_dtype)
    bits = acc.contiguous().view(torch.int32) + ((int(exponent) - 1) << 23)
    return bits.view(torch.float32).to(out_dtype)


def quantize_static_scale_multiplies(x, fmt, granularity, ue8m0, scale):
    q, s = quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
    if scale is None:
        return q, s
    fmax = fp8_ref.FMAX[fmt]
    return (x.float() * scale).clamp(-fmax, fmax).to(fp8_ref.FORMATS[fmt]), s


def quantize_tensor_amax_without_nan(x, fmt, granularity, ue8m0, scale):
    """A per-tensor amax that skips NaN (a max that keeps a candidate on ``x > best``)."""
    if granularity != "tensor" or scale is not None:
        return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
    amax = x.float().nan_to_num(nan=0.0).abs().max()
    s = fp8_ref.divide(amax.clamp_min(fp8_ref.AMAX_FLOOR), fp8_ref.FMAX[fmt])
    fmax = fp8_ref.FMAX[fmt]
    return (x.float() / s).clamp(-fmax, fmax).to(fp8_ref.FORMATS[fmt]), s


def contiguous_group_per_64_rows(a, scale_a, b, scale_b, group_index, out):
    """One group per 64-row M tile, read from the tile's first row (any row when it is
    padding)."""
    tiles = F.pad(group_index, (0, (-group_index.numel()) % 64), value=-1).view(-1, 64)
    first = tiles.max(dim=1).values.repeat_interleave(64)[: group_index.numel()]
    return contiguous_torch(a, scale_a, b, scale_b, torch.where(group_index < 0, -1, first),
                            out)


def quantize_static_scale_in_bf16(x, fmt, granularity, ue8m0, scale):
    """A static scale handed to the kernel as a bf16 number."""
    if scale is not None:
        scale = float(torch.tensor(scale).to(BF16))
    return quant.quantize_torch(x, fmt, granularity, ue8m0, scale)


def tsq_whole_vectors_only(x, tokens_per_expert, fmt, ue8m0):
    """Columns in 8-column vectors: the K % 8 last columns of q and their scales unwritten
    (zero)."""
    q, scales = quant.tsq_torch(x, tokens_per_expert, fmt, ue8m0)  # (K, M), (M/128, K)
    k = x.shape[1]
    q[k // 8 * 8:] = 0
    scales[:, k // 8 * 8:] = 0
    return q, scales


def masked_scale_row_in_tile(a, scale_a, b, scale_b, masked_m, out):
    """The activation's scale row read tile-relative (row % 64)."""
    rows = torch.arange(scale_a.shape[1]) % 64
    return masked_torch(a, scale_a[:, rows], b, scale_b, masked_m, out)


FP8 = [
    ("fp8_gemm.quantize", quantize_floor_on_zero_only,
     {"dist": "edge", "granularity": "token", "fmt": "e4m3"}, {"granularity": "token"}),
    ("fp8_gemm.quantize", quantize_amax_of_whole_tiles,
     {"dist": "edge", "granularity": "tensor"}, {"granularity": "tensor", "fmt": "e5m2"}),
    ("fp8_gemm.quantize", quantize_ue8m0_of_nan_is_one,
     {"dist": "nan", "granularity": "token", "ue8m0": True}, {"granularity": "token"}),
    ("fp8_gemm.per_tensor", per_tensor_half_epilogue, {"dist": "wide"}, {}),
    ("fp8_gemm.per_tensor", per_tensor_exponent_add_epilogue, {"dist": "wide", "out": "bf16"},
     {}),
    ("fp8_gemm.quantize", quantize_static_scale_multiplies, {"static": 0.375},
     {"static": True}),
    ("fp8_gemm.quantize", quantize_tensor_amax_without_nan,
     {"dist": "nan", "granularity": "tensor", "m": 5}, {"granularity": "tensor"}),
    ("fp8_gemm.quantize", quantize_static_nan_to_minus_fmax,
     {"dist": "nan", "static": True}, {"static": True}),
    ("fp8_gemm.blockwise", blockwise_small_m_scales_transposed, {"m": 8}, {}),
    ("fp8_gemm.grouped_contiguous", contiguous_group_per_64_rows, {"align": 32}, {}),
    ("fp8_gemm.quantize", quantize_static_scale_in_bf16, {"static": 0.3}, {"static": 0.375}),
    ("fp8_gemm.transpose_split_quant", tsq_whole_vectors_only, {"k": 100}, {}),
    ("fp8_gemm.grouped_masked", masked_scale_row_in_tile, {"max_m": 128}, {}),
]


# ------------------------------------------------------------------ moe

def _top(x, topk):
    """The router's choice: the k largest logits, ties lower expert first."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :topk]


def _softmax_shifted_by(x, shift):
    e = torch.exp(x - shift)
    return e / e.sum(-1, keepdim=True)


def _routed(probs, experts, renormalize):
    """The router's outputs from every expert's prob and the experts chosen."""
    probs = probs.gather(-1, experts)
    if renormalize:
        probs = probs / probs.sum(-1, keepdim=True)
    return probs, experts.to(torch.int32)


def router_unshifted_softmax(logits, topk, renormalize):
    x = logits.float()
    return _routed(_softmax_shifted_by(x, 0.0), _top(x, topk), renormalize)


def router_first_64_experts(logits, topk, renormalize):
    """A top-k over one 64-wide register tile of experts."""
    x = logits.float()
    return _routed(torch.softmax(x, dim=-1), _top(x[:, :64], topk), renormalize)


def router_shifted_by_first_logit(logits, topk, renormalize):
    x = logits.float()
    return _routed(_softmax_shifted_by(x, x[:, :1]), _top(x, topk), renormalize)


def router_taken_marked_neginf(logits, topk, renormalize):
    """Top-k by repeated argmax, each taken expert set to -inf: where fewer than k logits are
    finite, the same -inf expert is taken again."""
    x = logits.float().clone()
    picks = []
    for _ in range(topk):
        picks.append(x.argmax(dim=-1, keepdim=True))
        x.scatter_(1, picks[-1], float("-inf"))
    return _routed(torch.softmax(logits.float(), dim=-1), torch.cat(picks, dim=1), renormalize)


def router_shifted_by_first_tile(logits, topk, renormalize):
    """The softmax shifted by the maximum of the first 64-expert tile, not the row's."""
    x = logits.float()
    return _routed(_softmax_shifted_by(x, x[:, :64].max(dim=-1, keepdim=True).values),
                   _top(x, topk), renormalize)


def router_softmax_in_the_logits_dtype(logits, topk, renormalize):
    """The softmax of bf16 logits taken in bf16: float32 logits are right."""
    return _routed(torch.softmax(logits, dim=-1).float(), _top(logits.float(), topk),
                   renormalize)


def unpermute_half_accumulator(permuted, rowmap, routemap, permuted_probs, num_tokens,
                               num_experts):
    rows = rowmap.long()
    gathered = permuted[rows.clamp_min(0)].half() * (rows >= 0)[..., None]
    acc = torch.zeros(num_tokens, permuted.shape[1], dtype=torch.float16)
    for e in range(num_experts):
        acc += gathered[:, e]
    return acc.to(permuted.dtype), torch_ops.unpermute(
        permuted, rowmap, routemap, permuted_probs, num_tokens, num_experts)[1]


MOE = [
    ("moe.router", router_unshifted_softmax, {"values": "shifted"}, {}),
    ("moe.router", router_shifted_by_first_logit, {"values": "spread"}, {}),
    ("moe.router", router_first_64_experts, {"experts": 256}, {}),
    ("moe.unpermute", unpermute_half_accumulator, {"values": "special"}, {}),
    ("moe.router", router_taken_marked_neginf, {"values": "masked"}, {}),
    ("moe.router", router_shifted_by_first_tile, {"values": "low_tile"}, {}),
    ("moe.router", router_softmax_in_the_logits_dtype, {"logits": "bf16"}, {}),
]


# ------------------------------------------------------------------ strided copy

def copy_transpose_fast_path(storage, size, stride, offset, out):
    """A 2-D (1, ld) view taken for a whole (size[1], size[0]) matrix at offset 0."""
    if len(size) == 2 and stride[0] == 1 and stride[1] != 1 and size[0] > 1:
        m, n = size
        base = storage.as_strided((m * n,), (1,), storage.storage_offset())
        return out.copy_(base.view(n, m).t())
    return copy_torch(storage, size, stride, offset, out)


def copy_vector_rows(storage, size, stride, offset, out):
    """Rows of whole 16-byte units copied as one run from the view's start."""
    units = 16 // storage.element_size()
    if len(size) >= 2 and stride[-1] == 1 and size[-1] % units == 0 and out.numel():
        run = storage.as_strided((out.numel(),), (1,), storage.storage_offset() + offset)
        return out.view(-1).copy_(run)
    return copy_torch(storage, size, stride, offset, out)


def copy_squeezed_sizes(storage, size, stride, offset, out):
    """Size-1 dims dropped from the sizes, the strides list cut to the same length."""
    sizes = [s for s in size if s != 1]
    strides = list(stride)[: len(sizes)]
    view = storage.as_strided(sizes, strides, storage.storage_offset() + offset)
    return out.view(sizes).copy_(view)


def copy_merged_on_size_alone(storage, size, stride, offset, out):
    """Dims merged where stride[d-1] == size[d], the inner stride forgotten."""
    sizes, strides = list(size[:1]), list(stride[:1])
    for n, st in zip(size[1:], stride[1:], strict=True):
        if strides[-1] == n:
            sizes[-1], strides[-1] = sizes[-1] * n, st
        else:
            sizes.append(n)
            strides.append(st)
    if out.numel():
        out.view(sizes).copy_(storage.as_strided(sizes, strides,
                                                 storage.storage_offset() + offset))
    return out


def copy_contiguous_from_storage_start(storage, size, stride, offset, out):
    """A contiguous view copied as one run from the storage's start, its offset dropped."""
    if len(size) >= 1 and list(stride) == [math.prod(size[d + 1 :]) for d in range(len(size))]:
        run = storage.as_strided((out.numel(),), (1,), storage.storage_offset())
        return out.view(-1).copy_(run).view(out.shape)
    return copy_torch(storage, size, stride, offset, out)


COPY = [
    ("strided_copy", copy_merged_on_size_alone, {"view": "overlap"}, {}),
    ("strided_copy", copy_contiguous_from_storage_start, {"view": "contiguous_offset"}, {}),
    ("strided_copy", copy_transpose_fast_path, {"view": "transpose_slice", "dtype": "f32"}, {}),
    ("strided_copy", copy_vector_rows, {"view": "rows16", "dtype": "bf16"}, {}),
    ("strided_copy", copy_squeezed_sizes, {"view": "unit_dim"}, {}),
]


def _plain(op: str, extra: dict) -> dict:
    return smoke_case(op, **extra) if extra else registry().specs[op].grid["smoke"][0]


@pytest.mark.parametrize("op,wrong,edge,plain",
                         [(*row, {}) for row in HOPPER] + FP8 + MOE + COPY,
                         ids=lambda v: getattr(v, "__name__", None))
def test_a_wrong_kernel_fails_the_case_made_for_it(world, op, wrong, edge, plain):
    assert status(world, op, smoke_case(op, **edge), wrong) in ("fail", "error")
    assert status(world, op, _plain(op, plain), wrong) == "pass"


def _dense(t):
    """``t``'s elements read as dense rows from its first one, whatever its strides: what a
    kernel handed a data pointer and a shape (no strides) reads."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape)


STRIDE_BLIND = [
    ("hopper_tasks.rmsnorm", lambda x, weight: rmsnorm_torch(x, _dense(weight))),
    ("hopper_tasks.embedding", lambda ids, weight: embedding_torch(ids, _dense(weight))),
    ("hopper_tasks.argmax", lambda logits, chunk: argmax_torch(_dense(logits), chunk)),
    ("hopper_tasks.attention_split_kv", lambda q, k, v, chunk: split_kv_torch(q, _dense(k), v,
                                                                                chunk)),
    ("moe.router", lambda logits, topk, renormalize: router_torch(_dense(logits), topk,
                                                                  renormalize)),
    ("fp8_gemm.per_tensor", lambda a, scale_a, b, scale_b, out_dtype: per_tensor_torch(
        a, scale_a, _dense(b), scale_b, out_dtype)),
]


@pytest.mark.parametrize("op, wrong", STRIDE_BLIND, ids=[op for op, _ in STRIDE_BLIND])
def test_a_kernel_blind_to_an_inputs_strides_fails_on_rows_of_a_wider_buffer(world, op, wrong):
    """Right on contiguous inputs, wrong where an input is a row slice of a wider buffer (q
    of a fused qkv projection): the padded call catches it on a case of several rows."""
    spec = registry().specs[op]
    params = next(p for p in spec.grid["smoke"] if p.get("b", 2) > 1 and p.get("m", 2) > 1)
    r = run_case(world, Case(spec, params, 1), "candidate", wrong, bench=False)
    assert r.status == "fail" and r.reason.startswith(STAGE_PREFIX["padded"]), r.reason


def _needs_dense_weight(weight):
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous: pass weight.contiguous()")


def test_a_kernel_that_refuses_one_padded_input_is_still_checked_on_the_others(world):
    """Refusing a weight it needs dense is right; reading x as dense rows beside it is not,
    and the refusal of the call that padded both must not hide it: each input is then padded
    alone. The same refusal with x read by its strides passes."""
    def refuses_weight_reads_x_dense(x, weight):
        _needs_dense_weight(weight)
        return rmsnorm_torch(_dense(x), weight)

    def refuses_weight_reads_x_right(x, weight):
        _needs_dense_weight(weight)
        return rmsnorm_torch(x, weight)

    spec = registry().specs["hopper_tasks.rmsnorm"]
    params = next(p for p in spec.grid["smoke"] if p["b"] > 1)
    wrong = run_case(world, Case(spec, params, 1), "candidate", refuses_weight_reads_x_dense,
                     bench=False)
    assert wrong.status == "fail" and wrong.reason.startswith(STAGE_PREFIX["padded"]), \
        wrong.reason
    right = run_case(world, Case(spec, params, 1), "candidate", refuses_weight_reads_x_right,
                     bench=False)
    assert right.status == "pass", right.reason
    assert right.checks.count("padded_refused") == 1 and right.checks.count("padded") == 1


def test_a_grouped_gemm_that_computes_its_padding_rows_fails(world):
    """Padding rows of a hold values now: computing them (as group 0) gives them a nonzero
    output on both smoke cases."""
    def padding_as_group_zero(a, scale_a, b, scale_b, group_index, out):
        return contiguous_torch(a, scale_a, b, scale_b, group_index.clamp_min(0), out)

    op = "fp8_gemm.grouped_contiguous"
    for params in registry().specs[op].grid["smoke"]:
        assert status(world, op, params, padding_as_group_zero) == "fail"


def test_a_float16_epilogue_overflows_where_outputs_pass_65504(world):
    params = smoke_case("fp8_gemm.per_tensor", dist="wide")
    inputs = registry().specs["fp8_gemm.per_tensor"].make_inputs(params, 0, 1)
    ref = per_tensor_torch(**{k: v for k, v in inputs.items()}).abs().max()
    assert float(ref) > 65504.0
    assert not torch.isfinite(per_tensor_half_epilogue(**inputs)).all()


def test_the_layer_case_routes_past_any_capacity():
    """Skewed logits send every token to experts 0 and 1: more than a capacity factor of 2
    (ceil(2 S k / E)) admits, so a layer that drops tokens over it loses some."""
    params = smoke_case("moe.layer", skew=True)
    inputs = registry().specs["moe.layer"].make_inputs(params, 0, 1)
    _, routemap = torch_ops.route(inputs["logits"], params["topk"], params["renormalize"])
    load = torch.bincount(routemap.reshape(-1).long(), minlength=params["experts"])
    capacity = math.ceil(2 * params["tokens"] * params["topk"] / params["experts"])
    assert int(load.max()) > capacity


def test_the_ffn_case_holds_an_outlier_token():
    params = smoke_case("moe.expert_ffn", outlier=True)
    x = registry().specs["moe.expert_ffn"].make_inputs(params, 0, 1)
    assert params["precision"] == "fp8" and x["x_scale"] is not None
    scales = x["x_scale"].amax(dim=1)
    routed = scales[scales > 0]
    assert float(routed.max() / routed.median()) > 64


def test_the_permute_case_spans_more_than_1024_tokens():
    assert any(p["tokens"] > 1024 for p in registry().specs["moe.permute"].grid["smoke"])


def test_bf16_special_values_survive_the_interleaved_case():
    # the rows16 and transpose_slice views run in bf16 too, where a float32 round trip
    # changes a planted NaN
    x = registry().specs["strided_copy"].make_inputs(smoke_case("strided_copy", view="rows16",
                                                           dtype="bf16"), 0, 1)["storage"]
    assert not torch.equal(x.view(torch.int16), x.float().to(BF16).view(torch.int16))


def test_bf16_scores_fail_the_paged_attention_lens(world):
    """Scores held in bf16 stay inside the attention tolerance; the precision lens on ``out``
    (the float64 attention after the bf16 q and caches) fails them where scores are wide: a
    score of a few hundred held in bf16 is up to 1 off, its probability up to e times (at
    unit scores its 2**-8 is what FlashAttention's bf16 P costs too, and passes)."""
    op = "hopper_tasks.paged_attention"
    assert status(world, op, smoke_case(op, scores="wide"), paged_attention_bf16_scores) == "fail"


# ---------------------------------------------------------------- legitimate: FlashAttention
def _flash_split(q, k, v, chunk, *, scores_bf16=False):
    """Split-KV as FlashDecoding runs it: per chunk P = exp(s - m) in float32, rounded to bf16
    for the P @ V MMA (float32 accumulation), divided by the float32 sum of the unrounded P;
    each chunk's partial output stored in bf16 (vLLM's tmp_out); a float32 log-sum-exp merge."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for start in range(0, k.shape[0], chunk):
        s = torch.einsum("hd,shd->hs", q.float(), k[start:start + chunk].float()) * scale
        if scores_bf16:
            s = s.to(BF16).float()
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        total = p.sum(-1, keepdim=True)
        o = torch.einsum("hs,shd->hd", p.to(BF16).float(), v[start:start + chunk].float())
        outs.append((o / total).to(BF16).float())
        lses.append((m + total.log()).squeeze(-1))
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    weights = torch.exp(torch.stack(lses) - lse)
    return {"out": (weights[..., None] * torch.stack(outs)).sum(0).to(q.dtype), "lse": lse}


def paged_attention_p_in_bf16(**inputs):
    """The normalised probabilities rounded to bf16 before P @ V (a tensor-core decode)."""
    real = F.scaled_dot_product_attention

    def p_bf16(q, k, v, attn_mask=None, scale=None):
        s = (q @ k.transpose(-2, -1) * scale).masked_fill(~attn_mask, -math.inf)
        return torch.softmax(s, dim=-1).to(BF16).float() @ v

    try:
        F.scaled_dot_product_attention = p_bf16
        return attention.paged_attention_torch(**inputs)
    finally:
        F.scaled_dot_product_attention = real


@pytest.mark.parametrize("op,legit", [
    ("hopper_tasks.attention_split_kv", _flash_split),
    ("hopper_tasks.paged_attention", paged_attention_p_in_bf16),
], ids=["split_kv", "paged"])
def test_flash_attention_rounding_passes_the_attention_lens(world, op, legit):
    """P in bf16 for the MMA (and split-KV partials in bf16) is how production attention
    runs: 8-48% of its outputs (per smoke case) are not the float64 value rounded once,
    and the lens must pass it on every smoke case (ATTENTION_LENS bounds it by the sum of
    p_j |v_j|)."""
    for params in registry().specs[op].grid["smoke"]:
        assert status(world, op, params, legit) == "pass", params


def test_scores_in_bf16_still_fail_the_split_kv_lens(world):
    op = "hopper_tasks.attention_split_kv"
    params = smoke_case(op, scores="wide")
    assert status(world, op, params, lambda q, k, v, chunk: _flash_split(
        q, k, v, chunk, scores_bf16=True)) == "fail"


def quantize_times_reciprocal(x, fmt, granularity, ue8m0, scale):
    """DeepGEMM's per_token_cast_to_fp8: q = x * (fmax / amax), scale = amax / fmax."""
    if scale is not None or ue8m0:
        return fp8_ref.quantize(x, fmt, granularity, ue8m0, scale)
    fmax, x32 = fp8_ref.FMAX[fmt], x.float()
    rows = {"tensor": x.shape[0], "token": 1, "block": 128}[granularity]
    cols = x.shape[1] if granularity == "tensor" else 128
    amax = fp8_ref.group_amax(x32, rows, cols)
    scales = fp8_ref.scale_from_amax(amax, fmt)
    inverse = fp8_ref.expand_scales(fmax / amax.clamp_min(fp8_ref.AMAX_FLOOR), rows, cols,
                                    x.shape)
    q = (x32 * inverse).clamp(-fmax, fmax).to(fp8_ref.FORMATS[fmt])
    return q, scales.reshape(()) if granularity == "tensor" else scales


def test_a_quantizer_that_multiplies_by_the_reciprocal_passes(world):
    """Its codes differ from the reference's x / s by one where the two float32 quotients
    fall either side of a rounding boundary (2-26 per logmag case): both are the float64
    quotient rounded once, to float32's precision (``rounded_near``)."""
    op = "fp8_gemm.quantize"
    inputs = registry().specs[op].make_inputs(smoke_case(op, granularity="token",
                                                         fmt="e4m3", dist="logmag"), 0, 1)
    ours, theirs = quantize_times_reciprocal(**inputs)[0], fp8_ref.quantize(**inputs)[0]
    assert not torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    for params in registry().specs[op].grid["smoke"]:
        assert status(world, op, params, quantize_times_reciprocal) == "pass", params


def test_a_stray_write_into_a_page_nobody_owns_fails_however_close(world):
    """A vector store that covers a spare page and writes it back from a register holding
    it truncated (the last mantissa bit cleared): every value within an ulp of the old,
    inside bf16's allclose, call after call, but the page belongs to nobody and must stay as
    it was."""
    op = "hopper_tasks.paged_attention"

    def stray(**inputs):
        out = attention.paged_attention_torch(**inputs)
        owned = set(inputs["kv_indices"].tolist())
        spare = next(p for p in range(inputs["k_cache"].shape[0]) if p not in owned)
        out["k_cache"][spare].view(torch.int16).bitwise_and_(~1)
        return out

    params = smoke_case(op)
    assert status(world, op, params, stray) == "fail"
    assert status(world, op, params, attention.paged_attention_torch) == "pass"
