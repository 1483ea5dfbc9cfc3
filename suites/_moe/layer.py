"""The whole MoE layer (router, permute, expert FFN, prob weighting, unpermute) on one device,
and the same layer with expert parallelism across ranks.

The layer takes the router logits, not a gate weight: the gate GEMM is an ordinary GEMM, and a
rounding difference in it could flip a near-tied top-k choice, which would be a spurious
failure. Under expert parallelism every rank owns a different, uneven number of tokens (rows
of one global batch) and E/W experts; its output must equal the single-device layer on its
tokens (the layer is per token), within the layer tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Work
from reference_kernels import moe as ref

from . import torch_ops
from .common import (
    BF16_FFN_TOLERANCE,
    FAMILY,
    FMT,
    FP8_FFN_TOLERANCE,
    expert_weights,
    hidden,
    logits,
)
from .expert_parallel import layer_ep


def layer_tolerance(params: Mapping[str, Any], world_size: int):
    return BF16_FFN_TOLERANCE if params["precision"] == "bf16" else FP8_FFN_TOLERANCE


def layer_reference(hidden, logits, w13, w13_scale, w2, w2_scale, topk, renormalize,
                    padding_alignment):
    return ref.moe_layer(hidden, logits, w13, w13_scale, w2, w2_scale, topk, renormalize,
                         padding_alignment, FMT)


def _layer_work(tokens: float, params: Mapping[str, Any]) -> Work:
    """Expert GEMM flops of ``tokens`` tokens (every one routed to topk experts)."""
    h, i = params["hidden"], params["inter"]
    return Work(flops=2.0 * tokens * params["topk"] * h * 3 * i,
                flops_dtype=params["precision"])


def _args(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"topk": params["topk"], "renormalize": params["renormalize"],
            "padding_alignment": params["align"]}


# ---------------------------------------------------------------- single device
def _skewed(x: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    """With ``skew``, experts 0 and 1 first for every token: each gets every token, past any
    capacity (a kernel that drops tokens over one loses them; the op drops none)."""
    if params.get("skew"):
        x[:, :2] += 16.0
    return x


def layer_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    s = params["tokens"]
    return {"hidden": hidden("layer", params, s, params["hidden"]),
            "logits": _skewed(logits("layer", params, s), params),
            **expert_weights("layer", params), **_args(params)}


def layer_torch(**kw):
    return torch_ops.layer(**kw)


def layer_probs_applied_twice(**kw):
    """Bug: the rows are weighted by their probs before the unpermute and again inside it."""
    return torch_ops.layer(**kw, probs_twice=True)


def layer_fp8_last_pair_lost(**kw):
    """Bug (FP8 path only): the fused quantize-and-permute dispatch's tail mask is one short
    over the expert-sorted (token, expert) pairs, so the last pair is never dispatched."""
    return torch_ops.layer(**kw, fp8_last_pair_lost=True)


def layer_not_renormalized(**kw):
    """Bug: the top-k probs are not renormalised (norm_topk_prob ignored)."""
    return torch_ops.layer(**kw, skip_renormalize=True)


def _case(tokens, hidden_size, inter, experts, topk, align, precision, renormalize=True,
          **extra) -> dict:
    return {"tokens": tokens, "hidden": hidden_size, "inter": inter, "experts": experts,
            "topk": topk, "align": align, "precision": precision, "renormalize": renormalize,
            **extra}


LAYER = OpSpec(
    name="moe.layer", family=FAMILY, reference=layer_reference,
    description="Router, permute, SwiGLU experts, prob weighting, unpermute (bf16 or FP8).",
    make_inputs=layer_inputs, tolerance=layer_tolerance,
    work=lambda p, w: _layer_work(p["tokens"], p),
    grid={"smoke": [_case(300, 256, 128, 8, 4, 128, "bf16"),
                    _case(200, 256, 128, 16, 4, 128, "fp8", skew=True),
                    _case(120, 128, 128, 4, 2, 16, "bf16", renormalize=False),
                    # a decode batch: fewer tokens than experts, the last expert idle
                    _case(3, 128, 128, 8, 2, 16, "bf16"),
                    # top-1, not renormalised, fewer tokens than experts: the prob weighs
                    _case(3, 128, 128, 8, 1, 16, "bf16", renormalize=False),
                    _case(100, 128, 128, 8, 4, 16, "fp8", renormalize=False),
                    # every pair about half its token's output: one lost shows in FP8 too
                    _case(64, 128, 128, 8, 2, 16, "fp8", renormalize=False, route="even")],
          "nightly": [_case(s, 7168, 2048, e, k, 128, p) for s in (5000,) for e in (8, 64)
                      for k in (4, 8) for p in ("bf16", "fp8")]
          + [_case(5000, 7168, 2048, 64, 8, 128, p, renormalize=False) for p in ("bf16", "fp8")]
          + [_case(5000, 7168, 2048, 64, 8, 128, "fp8", skew=True),
             _case(5000, 7168, 2048, 64, 8, 128, "fp8", renormalize=False, route="even"),
             _case(3, 7168, 2048, 64, 1, 128, "bf16", renormalize=False)]},
    implementations={"torch": layer_torch},
    negative_controls={"probs_applied_twice": layer_probs_applied_twice,
                       "not_renormalized": layer_not_renormalized,
                       "fp8_last_pair_lost": layer_fp8_last_pair_lost},
    deadline_s=900.0,
)


# ---------------------------------------------------------------- expert parallel
def rank_tokens(params: Mapping[str, Any], rank: int, world_size: int) -> slice:
    """This rank's rows of the global batch: uneven counts between tokens/2 and tokens."""
    base = params["tokens"]
    counts = [base // 2 + (base * ((3 * r) % world_size)) // (2 * world_size)
              for r in range(world_size)]
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])


def _global_rows(params: Mapping[str, Any], world_size: int) -> int:
    return rank_tokens(params, world_size - 1, world_size).stop


def _ep_tokens(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's hidden rows and router logits, with the layer's scalar arguments."""
    rows = rank_tokens(params, rank, world_size)
    total = _global_rows(params, world_size)
    return {"hidden": hidden("layer_ep", params, total, params["hidden"], region=(rows,)),
            "logits": _skewed(logits("layer_ep", params, total, region=(rows,)), params),
            **_args(params)}


def ep_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    experts = params["experts"]
    if experts % world_size:
        raise ValueError(f"experts={experts} do not split over {world_size} ranks; use a "
                         f"multiple of the world size")
    local = experts // world_size
    return {**_ep_tokens(params, rank, world_size),
            **expert_weights("layer_ep", params, slice(rank * local, (rank + 1) * local))}


def ep_expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """The single-device layer on this rank's tokens, with every expert's weights."""
    return layer_reference(**_ep_tokens(params, rank, world_size),
                           **expert_weights("layer_ep", params))


def ep_torch(world: Any, **kw):
    return layer_ep(world, **kw)


def ep_dropped_token(world: Any, **kw):
    """Bug: one (token, expert) pair is missing from the dispatch (a send count one short),
    so that token lacks one expert's contribution."""
    return layer_ep(world, **kw, drop_one=True)


def _ep_work(params: Mapping[str, Any], world_size: int) -> Work:
    return _layer_work(_global_rows(params, world_size) / world_size, params)


LAYER_EP = OpSpec(
    name="moe.layer_ep", family=FAMILY, reference=layer_reference,
    description="The MoE layer with experts split across ranks: uneven all_to_all dispatch "
                "and combine; each rank's output equals the single-device layer's.",
    make_inputs=ep_inputs, expected=ep_expected, tolerance=layer_tolerance, work=_ep_work,
    grid={"smoke": [_case(96, 256, 128, 8, 4, 128, "bf16"),
                    _case(64, 256, 128, 16, 4, 32, "fp8"),
                    _case(48, 128, 128, 8, 2, 16, "bf16", renormalize=False),
                    # every token to the ranks of experts 0 and 1 (whose probs, renormalised
                    # or not, are nearly the same: the case above is the one without); ranks
                    # of 100 to 200 tokens: past 128 rows from one rank to one expert, a
                    # low-latency dispatch's fixed slots per (rank, expert)
                    _case(200, 128, 128, 8, 2, 16, "bf16", skew=True)],
          "nightly": [_case(5000, 7168, 2048, e, 8, 128, p) for e in (8, 64)
                      for p in ("bf16", "fp8")]
          + [_case(5000, 7168, 2048, 64, 8, 128, "fp8", renormalize=False),
             _case(5000, 7168, 2048, 64, 8, 128, "fp8", skew=True)]},
    implementations={"torch": ep_torch},
    negative_controls={"dropped_token": ep_dropped_token},
    distributed=True,
    requires=lambda p, w, device: (f"experts={p['experts']} do not split over {w} ranks "
                                   "(expert parallel: a multiple of the world size)"
                                   if p["experts"] % w else None),
    deadline_s=900.0,
)

SPECS = [LAYER, LAYER_EP]
