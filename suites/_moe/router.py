"""The router: softmax over the expert logits, top-k, optional renormalisation.

The chosen experts (routemap) are checked bitwise; the probs against float32's default
tolerance. Logits come without ties (float32 uniform draws), except in the case
``values=ties``, where equal logits must go to the lower expert first, and in the bf16 logits
of ``logits=bf16`` (a router GEMM's output), whose probs are float32 all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Work, default_for, exact
from reference_kernels import moe as ref

from . import torch_ops
from .common import FAMILY, logits


def router_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Logits without ties; with ``values=ties`` rounded to halves, so that most tokens hold
    equal logits among and around their top k (the order the op defines: the lower expert
    first)."""
    x = logits("router", params, params["tokens"])
    if params.get("values") == "ties":
        x = torch.round(x * 2) / 2
    if params.get("values") == "shifted":
        # every logit past 90 (exp overflows float32 there): only a softmax that subtracts
        # the row's maximum stays finite, as the op's does
        x = x + 96.0
    if params.get("values") == "spread":
        # logits spread over more than 88 within a row (x 16, exact): a softmax shifted by
        # anything but the row's maximum (its first logit, its mean) overflows exp
        x = x * 16.0
    if params.get("values") == "masked":
        # every expert but three per token at -inf (group-limited routing masks so): with
        # top-4 the fourth is the lowest masked expert at prob 0, never one taken twice
        # (renormalised: a softmax over the top k alone is the same here)
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.topk(3, dim=1).indices, True)
        x = torch.where(keep, x, float("-inf"))
    if params.get("values") == "low_tile":
        # the first 64 experts 200 below the rest: a softmax shifted by one tile's maximum
        # (a kernel that reduces 64 experts at a time) overflows exp in the others
        x[:, :64] -= 200.0
    if params.get("values") == "nan":
        # a NaN logit in every third token, at an expert that moves along: it is chosen
        # first and makes the token's probs NaN (reference_kernels.moe.router); two NaNs in
        # token 1, the lower expert first
        rows = torch.arange(0, x.shape[0], 3)
        x[rows, (rows * 5) % x.shape[1]] = float("nan")
        x[1, [x.shape[1] - 1, 2]] = float("nan")
    if params.get("logits") == "bf16":
        # a router GEMM's bf16 output: the softmax still runs in float32 (probs are float32
        # whatever the logits), and bf16's 8 bits make ties among 64 experts common
        x = x.to(torch.bfloat16)
    return {"logits": x, "topk": params["topk"], "renormalize": params["renormalize"]}


def router_torch(logits, topk, renormalize):
    return torch_ops.route(logits, topk, renormalize)


def router_softmax_after_topk(logits, topk, renormalize):
    """Bug: the softmax is taken over the k chosen logits only. With renormalisation that is
    the same thing; without it the probs are too large."""
    x = logits.float()
    # the experts chosen as the op defines them (ties lower first): this control's one bug is
    # the softmax (torch.topk would add a second one on ties, its order being unspecified)
    experts = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :topk]
    return torch.softmax(x.gather(-1, experts), dim=-1), experts.to(torch.int32)


def _chosen(softmax: torch.Tensor, experts: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """The chosen experts' probabilities, divided by their sum when renormalised."""
    probs = softmax.gather(-1, experts)
    return probs / probs.sum(dim=-1, keepdim=True) if renormalize else probs


def router_ties_higher_first(logits, topk, renormalize):
    """Bug: equal logits go to the higher expert first (a sort keyed on (logit, expert) in
    one descending order); the probs are the same values, in another order."""
    x = logits.float()
    num_experts = x.shape[-1]
    flipped = torch.sort(x.flip(-1), dim=-1, descending=True, stable=True).indices[:, :topk]
    experts = num_experts - 1 - flipped
    return _chosen(torch.softmax(x, dim=-1), experts, renormalize), experts.to(torch.int32)


def router_unstable_sort(logits, topk, renormalize):
    """Bug: the experts come from a sort that does not keep equal logits in expert order. A
    real unstable sort may keep them so by chance (torch sorts short CPU rows, and every CUDA
    row, stably whether asked or not: such a control never fails on a GPU), so this one
    orders ties explicitly as an unstable sort may: by a fixed scramble of the experts,
    neither lower nor higher first, the same on every device."""
    x = logits.float()
    num_experts = x.shape[-1]
    scramble = torch.randperm(num_experts, generator=torch.Generator().manual_seed(num_experts))
    scramble = scramble.to(x.device)
    # a stable sort of the scrambled columns keeps ties in the scramble's order
    picked = torch.sort(x[:, scramble], dim=-1, descending=True, stable=True).indices[:, :topk]
    experts = scramble[picked]
    return _chosen(torch.softmax(x, dim=-1), experts, renormalize), experts.to(torch.int32)


def _case(tokens, experts, topk, renormalize, **extra) -> dict:
    return {"tokens": tokens, "experts": experts, "topk": topk, "renormalize": renormalize,
            **extra}


def router_padded_softmax(logits: torch.Tensor, topk: int, renormalize: bool
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Bug: the softmax runs over a block padded to a power of two with zeros, not -inf
    (60 experts in a block of 64): the padding takes probability from every expert."""
    _, routemap = router_torch(logits, topk, renormalize)
    x = logits.float()
    block = 1 << (x.shape[-1] - 1).bit_length()
    padded = torch.nn.functional.pad(x, (0, block - x.shape[-1]))
    softmax = torch.softmax(padded, dim=-1)[:, : x.shape[-1]]
    return _chosen(softmax, routemap.long(), renormalize), routemap


def router_probs_through_bf16(logits: torch.Tensor, topk: int, renormalize: bool
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Bug: float32 probabilities computed through a bf16 buffer (within float32's tolerance
    where they are small; caught by the precision lens)."""
    probs, routemap = router_torch(logits, topk, renormalize)
    return probs.to(torch.bfloat16).float(), routemap


def router_exact(logits: torch.Tensor, topk: int, renormalize: bool) -> dict[str, torch.Tensor]:
    """The probabilities in float64, for the precision lens: float32 probs computed through
    bf16 fail it."""
    _, order = ref.router(logits, topk, renormalize)
    return {"probs": _chosen(torch.softmax(logits.double(), dim=-1), order.long(), renormalize)}


ROUTER = OpSpec(
    name="moe.router", family=FAMILY, reference=ref.router,
    description="softmax over expert logits, top-k (descending), optional renormalisation.",
    make_inputs=router_inputs, outputs=("probs", "routemap"),
    tolerance={"probs": default_for(torch.float32), "routemap": exact()},
    exact=router_exact,
    work=lambda p, w: Work(bytes=p["tokens"] * (p["experts"] * 4 + p["topk"] * 8)),
    grid={"smoke": [_case(300, 8, 4, True), _case(300, 8, 4, False), _case(77, 64, 8, True),
                    _case(77, 64, 8, False), _case(64, 8, 4, True, values="ties"),
                    # ties in a longer row too, without renormalisation
                    _case(48, 64, 8, False, values="ties"),
                    # 60 experts (Qwen1.5-MoE): a softmax over a block padded to 64 with
                    # zeros instead of -inf spreads probability to the padding
                    _case(50, 60, 4, True), _case(50, 60, 4, False),
                    _case(48, 64, 8, False, values="nan"), _case(30, 8, 4, True, values="nan"),
                    # 256 experts (DeepSeek-V3: a top-k over more than one 64-wide tile) and
                    # logits past exp's range
                    _case(40, 256, 8, True, values="shifted"),
                    _case(64, 60, 4, False, values="spread"),
                    # top-1 without renormalisation: the prob is the softmax's, not 1; and
                    # ties across 64-expert tiles (the lower expert first, whichever tile)
                    _case(40, 8, 1, False), _case(24, 256, 8, False, values="ties"),
                    _case(32, 16, 4, True, values="masked"),
                    _case(24, 256, 8, True, values="low_tile"),
                    _case(64, 64, 8, False, logits="bf16")],
          "nightly": [_case(16384, e, k, r) for e in (8, 60, 64, 256) for k in (4, 8)
                      for r in (True, False)]
          + [_case(16384, e, 8, False, values="ties") for e in (64, 256)]
          + [_case(16384, 256, 8, True, values="nan"),
             _case(16384, 256, 8, True, values="shifted"),
             _case(16384, 256, 8, False, values="spread"),
             _case(16384, 256, 8, True, values="masked"),
             _case(16384, 256, 8, True, values="low_tile")]},
    implementations={"torch": router_torch},
    negative_controls={"softmax_after_topk": router_softmax_after_topk,
                       "ties_higher_first": router_ties_higher_first,
                       "unstable_sort": router_unstable_sort,
                       "probs_through_bf16": router_probs_through_bf16,
                       "padded_softmax": router_padded_softmax},
    any_alignment=True,
)

SPECS = [ROUTER]
