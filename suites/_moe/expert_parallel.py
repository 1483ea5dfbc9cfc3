"""Expert parallelism: the MoE layer with the experts split across ranks.

Rank r holds experts [r*E/W, (r+1)*E/W) and its own tokens. Dispatch: route locally, order
the (token, expert) pairs by expert (so the rows for each rank are contiguous), exchange the
per-expert counts, then the rows (fp8 bytes and their scales for FP8, as an FP8 dispatch sends
them) and their probs with uneven all_to_all. Each rank regroups what it received into padded
per-expert segments, runs its experts, weights each row by its prob and sends it back
(combine, the reverse all_to_all); the owner sums each token's rows in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import torch_ops
from .torch_ops import BF16


def _all_to_all(world: Any, rows: torch.Tensor, send: Sequence[int], recv: Sequence[int]
                ) -> torch.Tensor:
    """Rows exchanged along dim 0 with uneven splits (fp8 travels as bytes)."""
    import torch.distributed as dist

    raw = torch_ops.raw_bytes(rows).contiguous()
    out = torch.empty((sum(recv), *raw.shape[1:]), dtype=raw.dtype, device=raw.device)
    dist.all_to_all_single(out, raw, list(map(int, recv)), list(map(int, send)),
                           group=world.group)
    return out.view(rows.dtype) if raw.dtype != rows.dtype else out


def layer_ep(world: Any, hidden, logits, w13, w13_scale, w2, w2_scale, topk, renormalize,
             padding_alignment, *, drop_one: bool = False):
    """The MoE layer of this rank's tokens, its experts spread over the ranks."""
    n_ranks = world.size
    s, h = hidden.shape
    num_experts, local = logits.shape[1], w13.shape[0]
    if local * n_ranks != num_experts:
        raise ValueError(f"{num_experts} experts over {n_ranks} ranks, but {local} local ones")
    dev = hidden.device

    # ---- dispatch
    probs, routemap = torch_ops.route(logits, topk, renormalize)
    x, x_scale = (torch_ops.quantize_tokens(hidden) if w13_scale is not None
                  else (hidden, None))
    pos, experts, tokens = torch_ops.sort_by_expert(routemap)
    if drop_one:
        # bug: the last pair bound for the last rank that gets any is not sent (an
        # off-by-one in its send count)
        keep = torch.ones(pos.numel(), dtype=torch.bool, device=dev)
        keep[-1] = False
        pos, experts, tokens = pos[keep], experts[keep], tokens[keep]
    send_counts = torch.bincount(experts, minlength=num_experts).view(n_ranks, local)
    recv_counts = _all_to_all(world, send_counts, [1] * n_ranks, [1] * n_ranks)  # [src, e]
    send_rows, recv_rows = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    rx = _all_to_all(world, x[tokens], send_rows, recv_rows)
    rp = _all_to_all(world, probs.reshape(-1)[pos].float(), send_rows, recv_rows)
    rs = None if x_scale is None else _all_to_all(world, x_scale[tokens], send_rows, recv_rows)

    # ---- local experts: received rows are ordered (source, expert, token); regroup them by
    # expert (stable, so source then token within an expert) into padded segments
    row_expert = torch.arange(local, device=dev).repeat(n_ranks).repeat_interleave(
        recv_counts.flatten())
    regroup = torch.argsort(row_expert, stable=True)
    tpe = recv_counts.sum(0).tolist()
    dest, rows = torch_ops.padded_destinations(row_expert[regroup], tpe, padding_alignment)
    xin = torch.zeros(rows, h, dtype=torch_ops.raw_bytes(rx).dtype, device=dev)
    xin[dest] = torch_ops.raw_bytes(rx)[regroup]
    xin = xin.view(rx.dtype)
    sin = None
    if rs is not None:
        sin = torch.zeros(rows, rs.shape[1], dtype=rs.dtype, device=dev)
        sin[dest] = rs[regroup]
    y = torch_ops.expert_ffn(xin, sin, w13, w13_scale, w2, w2_scale, tpe, padding_alignment,
                             torch.empty(rows, h, dtype=BF16, device=dev))
    weighted = torch.empty(regroup.numel(), h, dtype=BF16, device=dev)
    weighted[regroup] = (y[dest].float() * rp[regroup][:, None]).to(BF16)

    # ---- combine: each row back to its owner, which sums its token's rows in float32
    back = _all_to_all(world, weighted, recv_rows, send_rows)
    out = torch.zeros(s, h, dtype=torch.float32, device=dev)
    return torch_ops.ordered_index_add(out, tokens, back.float()).to(BF16)
