"""The router: softmax over the expert logits, top-k, optional renormalisation.

The chosen experts (routemap) are checked bitwise; the probs against float32's default
tolerance. Logits come without ties (float32 uniform draws), so the choice is well defined
whatever order an implementation sorts in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness import compare
from harness.spec import OpSpec, Work
from reference_kernels import moe as ref

from . import torch_ops
from .common import FAMILY, logits


def router_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return {"logits": logits("router", params, params["tokens"]), "topk": params["topk"],
            "renormalize": params["renormalize"]}


def router_torch(logits, topk, renormalize):
    return torch_ops.route(logits, topk, renormalize)


def router_softmax_after_topk(logits, topk, renormalize):
    """Bug: the softmax is taken over the k chosen logits only. With renormalisation that is
    the same thing; without it the probs are too large."""
    top, experts = torch.topk(logits.float(), topk, dim=-1)
    return torch.softmax(top, dim=-1), experts.to(torch.int32)


def _case(tokens, experts, topk, renormalize) -> dict:
    return {"tokens": tokens, "experts": experts, "topk": topk, "renormalize": renormalize}


ROUTER = OpSpec(
    name="moe.router", family=FAMILY, reference=ref.router,
    description="softmax over expert logits, top-k (descending), optional renormalisation.",
    make_inputs=router_inputs, outputs=("probs", "routemap"),
    tolerance={"probs": compare.default_for(torch.float32), "routemap": compare.exact()},
    work=lambda p, w: Work(bytes=p["tokens"] * (p["experts"] * 4 + p["topk"] * 8)),
    grid={"smoke": [_case(300, 8, 4, True), _case(300, 8, 4, False), _case(77, 64, 8, True),
                    _case(77, 64, 8, False)],
          "nightly": [_case(16384, e, k, r) for e in (8, 64, 256) for k in (4, 8)
                      for r in (True, False)]},
    implementations={"torch": router_torch},
    negative_controls={"softmax_after_topk": router_softmax_after_topk},
)

SPECS = [ROUTER]
