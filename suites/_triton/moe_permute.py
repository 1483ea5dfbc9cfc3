"""Triton MoE permute (Paddle's moe_permute semantics, suites/_moe/permute.py).

The routing bookkeeping (pairs sorted by expert, each pair's padded destination row, the
rowmap) is index math on the routemap, done with torch as a serving engine does it in a
kernel of its own; the Triton kernel moves the data: one program per ROWS destination rows
and column block copies the source token's row bit for bit (or zeros on a padding row), and the
first column block also writes the row's prob and fp8 scales. The control's column mask is
off by one: the last column of every row is never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from suites._moe.torch_ops import padded_destinations, sort_by_expert
from suites._triton import raw_bits

#: destination rows per program
ROWS = 32


@triton.jit
def _permute_rows(src_ptr, out_ptr, source_ptr, pair_ptr, probs_ptr, out_probs_ptr,
                  scale_ptr, out_scale_ptr, rows, hidden, groups, ROWS: tl.constexpr,
                  BLOCK: tl.constexpr, GROUPS_BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr,
                  TAIL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    block = tl.program_id(1)
    real = row < rows
    token = tl.load(source_ptr + row, mask=real, other=-1)  # -1 on a padding row
    cols = block * BLOCK + tl.arange(0, BLOCK)
    inside = real[:, None] & (cols < hidden - TAIL)[None, :]  # TAIL = 1: the control
    values = tl.load(src_ptr + token[:, None] * hidden + cols[None, :],
                     mask=inside & (token >= 0)[:, None], other=0)
    tl.store(out_ptr + row[:, None] * hidden + cols[None, :], values, mask=inside)
    if block == 0:
        pair = tl.load(pair_ptr + row, mask=real, other=-1)
        prob = tl.load(probs_ptr + pair, mask=pair >= 0, other=0.0).to(tl.float32)
        tl.store(out_probs_ptr + row, prob, mask=real)
        if HAS_SCALE:
            g = tl.arange(0, GROUPS_BLOCK)
            ok = real[:, None] & (g < groups)[None, :]
            scales = tl.load(scale_ptr + token[:, None] * groups + g[None, :],
                             mask=ok & (token >= 0)[:, None], other=0.0)
            tl.store(out_scale_ptr + row[:, None] * groups + g[None, :], scales, mask=ok)


def _permute(hidden, scale, routemap, probs, num_experts, tokens_per_expert,
             padding_alignment, out, out_rowmap, out_probs, out_scale, tail: int):
    pos, experts, tokens = sort_by_expert(routemap)
    dest, rows = padded_destinations(experts, tokens_per_expert, padding_alignment)
    device = hidden.device
    source = torch.full((rows,), -1, dtype=torch.int64, device=device)
    source[dest] = tokens
    pair = torch.full((rows,), -1, dtype=torch.int64, device=device)
    pair[dest] = pos
    out_rowmap.fill_(-1)
    out_rowmap[tokens, experts] = dest.to(torch.int32)
    if rows == 0:
        return out, out_rowmap, out_probs, out_scale
    width = hidden.shape[1]
    block = min(256, triton.next_power_of_2(width))
    has_scale = out_scale is not None
    groups = scale.shape[1] if has_scale else 1
    _permute_rows[(triton.cdiv(rows, ROWS), triton.cdiv(width, block))](
        raw_bits(hidden.contiguous()), raw_bits(out), source, pair,
        probs.contiguous().reshape(-1), out_probs, scale.contiguous() if has_scale else out_probs,
        out_scale if has_scale else out_probs, rows, width, groups, ROWS=ROWS, BLOCK=block,
        GROUPS_BLOCK=triton.next_power_of_2(groups), HAS_SCALE=has_scale, TAIL=tail)
    return out, out_rowmap, out_probs, out_scale


def permute(**kw):
    """Rows, probs and scales moved by the Triton kernel into the given buffers."""
    return _permute(**kw, tail=0)


def permute_tail_mask_off_by_one(**kw):
    """Control: the column mask is ``cols < hidden - 1``."""
    return _permute(**kw, tail=1)
