"""The ``torch`` implementations of the MoE ops: vectorised candidates (sorts, scatters,
ordered row sums), written independently of the loop-per-expert reference. Keyword switches
plant the bugs the negative controls need, so each control differs from the real thing in one
place. Every one gives the same bits on every run and device (no float atomics), as the ops'
``deterministic`` flag promises.

fp8 rows move as uint8 views: index_put has no float8 kernel on every device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from suites._fp8.gemm import dequant
from suites._fp8.quant import quantize_torch

from .common import FMT

BF16 = torch.bfloat16


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A byte view of 8-bit float data (index_put-able everywhere), else ``t``."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (1x128) e4m3 quantization: (fp8 rows, float32 scales [S, ceil(H/128)])."""
    return quantize_torch(x, FMT, "token", False, None)


def route(logits: torch.Tensor, topk: int, renormalize: bool, *, stable: bool = True
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [S, topk] float32, routemap [S, topk] int32): softmax, and the k largest
    logits, equal logits lower expert first (the op's semantics). Not torch.topk, whose order
    of ties is unspecified (the nightly's 256-expert logits hold ties), and not on the probs:
    the softmax can round two different logits to one probability."""
    x = logits.float()
    # a stable descending sort keeps equal elements in their original (expert) order
    experts = torch.sort(x, dim=-1, descending=True, stable=stable).indices[:, :topk]
    probs = torch.softmax(x, dim=-1).gather(-1, experts)
    if renormalize:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs, experts.to(torch.int32)


def segment_offsets(tokens_per_expert: Sequence[int] | torch.Tensor, align: int,
                    device: torch.device) -> tuple[torch.Tensor, int]:
    """(start row of each expert's padded segment, total rows)."""
    counts = torch.as_tensor(tokens_per_expert, dtype=torch.int64, device=device)
    padded = (counts + align - 1) // align * align
    return torch.cumsum(padded, 0) - padded, int(padded.sum())


def padded_destinations(experts: torch.Tensor, tokens_per_expert: Sequence[int], align: int
                        ) -> tuple[torch.Tensor, int]:
    """The row of each expert-sorted pair in the padded layout (its expert's segment start
    plus its place within the expert), and the layout's total rows."""
    offsets, rows = segment_offsets(tokens_per_expert, align, experts.device)
    counts = torch.bincount(experts, minlength=offsets.numel())
    first = torch.cumsum(counts, 0) - counts           # first sorted pair of each expert
    place = torch.arange(experts.numel(), device=experts.device) - first[experts]
    return offsets[experts] + place, rows


def sort_by_expert(routemap: torch.Tensor, *, reverse_one_expert: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routed (token, slot) pairs ordered by expert, ascending token within an expert:
    (flat slot positions, experts, tokens)."""
    topk = routemap.shape[1]
    flat = routemap.reshape(-1).long()
    pos = (flat >= 0).nonzero().flatten()
    order = torch.argsort(flat[pos], stable=True)
    pos = pos[order]
    experts = flat[pos]
    if reverse_one_expert:
        # bug: the first expert with two or more tokens lists them in descending order (with
        # no such expert there is no order to get wrong)
        counts = torch.bincount(experts)
        several = (counts >= 2).nonzero()
        if several.numel():
            e = int(several[0])
            start = int(counts[:e].sum())
            pos[start : start + int(counts[e])] = pos[start : start + int(counts[e])].flip(0)
    return pos, experts, pos // topk


def permute_into(hidden, scale, routemap, probs, num_experts, tokens_per_expert,
                 padding_alignment, out, out_rowmap, out_probs, out_scale, *,
                 reverse_one_expert: bool = False, zero_padding: bool = True,
                 copy_scales: bool = True):
    """moe_permute writing into the given buffers: sort the routed pairs by expert, compute
    each pair's destination row, scatter rows, probs and scales, zero the padding rows."""
    pos, experts, tokens = sort_by_expert(routemap, reverse_one_expert=reverse_one_expert)
    dest, _ = padded_destinations(experts, tokens_per_expert, padding_alignment)
    if zero_padding:
        raw_bytes(out).zero_()
        out_probs.zero_()
        if out_scale is not None:
            out_scale.zero_()
    raw_bytes(out)[dest] = raw_bytes(hidden)[tokens]
    out_probs[dest] = probs.reshape(-1)[pos].float()
    if out_scale is not None and copy_scales:
        out_scale[dest] = scale[tokens]
    out_rowmap.fill_(-1)
    out_rowmap[tokens, experts] = dest.to(torch.int32)
    return out, out_rowmap, out_probs, out_scale


def ordered_index_add(acc: torch.Tensor, index: torch.Tensor, src: torch.Tensor
                      ) -> torch.Tensor:
    """``acc[index[i]] += src[i]`` for each i in order, as the CPU's ``index_add_`` does, with
    the same bits on every device: on CUDA ``index_add_`` adds floating-point rows with
    atomics, in whatever order they land (torch's reproducibility notes list it), which would
    change the output's bits from night to night. Each step adds one occurrence per target
    row, so no row is written twice in a step, and a row's sum runs in index order."""
    if index.numel() == 0:
        return acc
    order = torch.argsort(index, stable=True)
    targets = index[order]
    counts = torch.bincount(targets, minlength=acc.shape[0])
    first = torch.cumsum(counts, 0) - counts
    occurrence = torch.arange(targets.numel(), device=index.device) - first[targets]
    for j in range(int(counts.max())):
        pick = occurrence == j
        rows = targets[pick]
        acc[rows] = acc[rows] + src[order[pick]]
    return acc


def unpermute(permuted, rowmap, routemap, permuted_probs, num_tokens, num_experts, *,
              reweight: bool = False, bf16_accumulation: bool = False,
              truncated: bool = False):
    """moe_unpermute: gather each token's rows and add them in float32, in expert order; give
    back each slot's prob."""
    rows = rowmap.long()
    tokens, experts = (rows >= 0).nonzero(as_tuple=True)
    src = rows[tokens, experts]
    gathered = permuted[src].float()
    if reweight:  # bug: the caller already multiplied by the probs
        gathered = gathered * permuted_probs[src].float()[:, None]
    if bf16_accumulation:  # bug: a bf16 running sum, one expert at a time
        acc = torch.zeros(num_tokens, permuted.shape[1], dtype=BF16, device=permuted.device)
        for e in range(num_experts):
            pick = experts == e
            acc[tokens[pick]] += gathered[pick].to(BF16)
        out = acc.to(permuted.dtype)
    else:
        acc = torch.zeros(num_tokens, permuted.shape[1], dtype=torch.float32,
                          device=permuted.device)
        acc = ordered_index_add(acc, tokens, gathered)
        if truncated and permuted.dtype == BF16:  # bug: the low 16 bits dropped, not rounded
            acc = (acc.view(torch.int32) & ~0xFFFF).view(torch.float32)
        out = acc.to(permuted.dtype)
    used = routemap >= 0
    slot_tokens = used.nonzero()[:, 0]
    probs = torch.zeros(routemap.shape, dtype=torch.float32, device=routemap.device)
    probs[used] = permuted_probs.float()[rows[slot_tokens, routemap[used].long()]]
    return out, probs


def expert_ffn(x, x_scale, w13, w13_scale, w2, w2_scale, tokens_per_expert, padding_alignment,
               out, *, fused_epilogue: bool = False, gate_up_swapped: bool = False,
               zero_padding: bool = True):
    """SwiGLU per expert over its segment of rows; FP8 inputs are dequantized per block and
    the activation is requantized per token before the down projection.
    ``fused_epilogue`` keeps gate and up in float32 (an epilogue-fused SwiGLU), a legitimate
    variant whose rounding differs from the reference's."""
    quantized = x_scale is not None
    if zero_padding:
        out.zero_()
    starts, _ = segment_offsets(tokens_per_expert, padding_alignment, torch.device("cpu"))
    for e, (start, count) in enumerate(zip(starts.tolist(), tokens_per_expert, strict=True)):
        if count == 0:
            continue
        rows = slice(start, start + count)
        if quantized:
            xe = dequant(x[rows], x_scale[rows], 1, 128)
            we13 = dequant(w13[e], w13_scale[e], 128, 128)
            we2 = dequant(w2[e], w2_scale[e], 128, 128)
        else:
            xe, we13, we2 = x[rows].float(), w13[e].float(), w2[e].float()
        gu = xe @ we13.T
        if not fused_epilogue:
            gu = gu.to(BF16).float()
        gate, up = gu.chunk(2, dim=-1)
        if gate_up_swapped:  # bug: silu applied to the up half
            gate, up = up, gate
        h = F.silu(gate) * up
        h = dequant(*quantize_tokens(h), 1, 128) if quantized else h.to(BF16).float()
        out[rows] = (h @ we2.T).to(out.dtype)
    return out


def layer(hidden, logits, w13, w13_scale, w2, w2_scale, topk, renormalize, padding_alignment,
          *, probs_twice: bool = False, skip_renormalize: bool = False,
          fp8_last_pair_lost: bool = False):
    """Route, permute, FFN, weight by probs, unpermute."""
    s, h = hidden.shape
    num_experts = logits.shape[1]
    probs, routemap = route(logits, topk, renormalize and not skip_renormalize)
    if fp8_last_pair_lost and w13_scale is not None:
        routemap = routemap.clone()
        routemap.view(-1)[int(sort_by_expert(routemap)[0][-1])] = -1
    routed = routemap.reshape(-1).long()
    tpe = torch.bincount(routed[routed >= 0], minlength=num_experts).tolist()
    x, x_scale = quantize_tokens(hidden) if w13_scale is not None else (hidden, None)
    _, rows = segment_offsets(tpe, padding_alignment, torch.device("cpu"))
    dev = hidden.device
    permuted, rowmap, pprobs, pscale = permute_into(
        x, x_scale, routemap, probs, num_experts, tpe, padding_alignment,
        torch.empty(rows, h, dtype=x.dtype, device=dev),
        torch.empty(s, num_experts, dtype=torch.int32, device=dev),
        torch.empty(rows, dtype=torch.float32, device=dev),
        None if x_scale is None else torch.empty(rows, x_scale.shape[1], device=dev))
    y = expert_ffn(permuted, pscale, w13, w13_scale, w2, w2_scale, tpe, padding_alignment,
                   torch.empty(rows, h, dtype=BF16, device=dev))
    weighted = (y.float() * pprobs[:, None]).to(BF16)
    return unpermute(weighted, rowmap, routemap, pprobs, s, num_experts,
                     reweight=probs_twice)[0]
