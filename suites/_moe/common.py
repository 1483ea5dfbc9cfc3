"""Inputs and tolerances shared by the MoE suites.

Routing is fabricated the way Paddle's own permute test does it (each token picks 1..topk
distinct experts, unused slots are -1) but from counter-based hashes, so it is the same on
every machine and torch version; the -1 slots sit at hashed positions, not only at the end.
Every fifth expert (e % 5 == 2) is idle: it receives no token, in fabricated routings and in
router-made ones (its logits are pushed far down), so zero-token experts are in every case.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness.api import all_of, allclose, cos_diff, cos_diff_per_row, generate, hash32, seed_from
from reference_kernels import fp8
from reference_kernels import moe as ref

FAMILY = "moe"
BF16 = torch.bfloat16
FMT = "e4m3"

#: Expert FFN and layer outputs (unit order by construction). Sized for legitimate arithmetic
#: that differs from the reference's (gate/up kept in float32 instead of rounded to bf16, as an
#: epilogue-fused SwiGLU does), measured over 5.5M and 10M outputs: bf16 calc_diff 8.6e-6 and
#: max |diff| 0.0156 (two GEMMs with a bf16 round trip between them, so looser than a single
#: GEMM's 1e-5); FP8 calc_diff 1e-4 and max |diff| 0.078, because requantizing the activation
#: per 1x128 group moves whole groups when their amax moves by one rounding. With blocky
#: scales an element moved 0.28 on other input values (0.05% of the outputs, the check after
#: timing), so FP8 allows 0.1% of elements past the elementwise bound; calc_diff holds them all.
#: Neither sees one token gone wrong at scale (a zeroed row of 7168 in 40000 rows: global
#: calc_diff 2.5e-5, 0.0025% of elements), so each token's row has a calc_diff bound of its
#: own: the epilogue-fused SwiGLU's worst row on the smoke cases is 1.04e-3 (hidden 256; wider
#: rows average more), a row with 14% of its norm wrong is 1e-2.
BF16_FFN_TOLERANCE = all_of(cos_diff(5e-5), allclose(2e-2, 2e-2))
FP8_ROW_BOUND = 1e-2
FP8_FFN_TOLERANCE = all_of(cos_diff(1e-3), cos_diff_per_row(FP8_ROW_BOUND),
                           allclose(0.125, 0.125, max_mismatch_frac=1e-3))


def _key(params: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def idle(expert: int) -> bool:
    """Experts that never receive a token."""
    return expert % 5 == 2


def active_experts(num_experts: int) -> list[int]:
    return [e for e in range(num_experts) if not idle(e)]


def hidden(tag: str, params: Mapping[str, Any], tokens: int, size: int,
           region: object = None) -> torch.Tensor:
    """bf16 activations, roughly N(0, 1) (Paddle's test uses randn); with ``scales=blocky``
    each token's 1x128 groups scaled by 2**-1, 1 or 2 (``blocky_factors``)."""
    x = generate((tokens, size), BF16, seed=seed_from(tag, _key(params), "hidden"),
                 dist="normal", region=region)
    if params.get("scales") == "blocky" and region is None:
        x *= blocky_factors(tokens, size, 1, 128)
    return x


def blocky_factors(rows: int, cols: int, block_rows: int, block_cols: int, salt: int = 0
                   ) -> torch.Tensor:
    """(rows, cols) bf16 powers of two, 2**-1, 1 or 2, one per (block_rows x block_cols)
    block: exact to multiply by, and different from each neighbouring block's, so that an
    FP8 scale read from the wrong group, block or expert is off by a factor of 2 or 4 (with
    N(0, 1) data every group's scale is about the same, and such a read passes)."""
    r = torch.arange(rows)[:, None] // block_rows
    c = torch.arange(cols)[None, :] // block_cols
    return torch.exp2(((r + 2 * c + salt) % 3 - 1).float()).to(BF16)


def routing(tag: str, params: Mapping[str, Any], tokens: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(routemap [S, topk] int32 with -1 slots, probs [S, topk] float32 summing to 1 per
    token, 0 on -1 slots). Token s uses 1..min(topk, active) distinct active experts; with
    ``unrouted`` in the params every fourth token (s % 4 == 1) uses none: all its slots are
    -1 and its probs 0 (a dropped token: no row in the permuted layout, a zero row back)."""
    if params.get("counts"):
        return _routing_with_counts(params, tokens)
    num_experts, topk = params["experts"], params["topk"]
    active = torch.tensor(active_experts(num_experts))
    seed = seed_from(tag, _key(params), "routing")
    s = torch.arange(tokens)[:, None]
    # a random order of the active experts per token: argsort of hashed keys
    keys = hash32(s * num_experts + active[None, :], seed)
    ranked = active[torch.argsort(keys, dim=1)]
    limit = min(topk, active.numel())
    count = 1 + hash32(torch.arange(tokens), seed, stream=1) % limit
    # which slots hold the chosen experts: a random order of the topk slots per token
    slot_order = torch.argsort(hash32(s * topk + torch.arange(topk)[None, :], seed, stream=2),
                               dim=1)
    routemap = torch.full((tokens, topk), -1, dtype=torch.int32)
    weights = torch.zeros(tokens, topk, dtype=torch.float64)
    draws = 1 + hash32(s * topk + torch.arange(topk)[None, :], seed, stream=3) % 1000
    for j in range(limit):
        used = count > j
        slot = slot_order[used, j]
        rows = used.nonzero().flatten()
        routemap[rows, slot] = ranked[used, j].to(torch.int32)
        weights[rows, slot] = draws[used, j].double()
    if params.get("unrouted"):
        dropped = torch.arange(tokens) % 4 == 1
        routemap[dropped] = -1
        weights[dropped] = 0.0
    total = weights.sum(dim=1, keepdim=True)
    probs = (weights / torch.where(total > 0, total, 1.0)).float()
    return routemap, probs


def counts_rotated(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with their tokens per expert (``counts``) in another order, for the twin
    case (``OpSpec.twin``): a routing made from the params is the same under any seed."""
    if not params.get("counts"):
        return dict(params)
    counts = str(params["counts"]).split("x")
    return {**params, "counts": "x".join(counts[1:] + counts[:1])}


def _routing_with_counts(params: Mapping[str, Any], tokens: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``counts`` ("0x1x15x16x17": tokens per expert): expert e takes tokens 0..counts[e]-1,
    each token's experts in ascending slots, equal probs; tokens past the largest count are
    routed to no expert. Counts one below, at and one above the alignment, and 1, are where a
    padded size rounds wrong."""
    counts = [int(c) for c in str(params["counts"]).split("x")]
    routemap = torch.full((tokens, params["topk"]), -1, dtype=torch.int32)
    filled = [0] * tokens
    for e, c in enumerate(counts):
        for t in range(c):
            routemap[t, filled[t]] = e
            filled[t] += 1
    used = (routemap >= 0).float()
    probs = used / used.sum(dim=1, keepdim=True).clamp_min(1.0)
    return routemap, probs


def logits(tag: str, params: Mapping[str, Any], tokens: int, region: object = None
           ) -> torch.Tensor:
    """Router logits [S, E] float32, uniform in [-4, 4) (no ties in practice), idle experts
    pushed down by 64 so the router never picks them while enough others are left. With
    ``route=even`` each token's top-k logits are within 0.5 of each other and the rest 6
    below them: every (token, expert) pair carries about 1/k of its token's output, so a
    pair dropped or weighted wrong moves its token by that much (with logits spread over
    [-4, 4) the pair a kernel loses may carry 0.1% of it, inside FP8's own noise)."""
    num_experts = params["experts"]
    x = generate((tokens, num_experts), torch.float32,
                 seed=seed_from(tag, _key(params), "logits"), low=-4.0, high=4.0,
                 region=region)
    penalty = torch.tensor([64.0 if idle(e) else 0.0 for e in range(num_experts)])
    x = x - penalty
    if params.get("route") == "even":
        chosen = torch.zeros_like(x, dtype=torch.bool).scatter_(
            1, x.topk(params["topk"], dim=1).indices, True)
        x = torch.where(chosen, x / 16, torch.where(x > -32, x / 2 - 8, x))
    return x


def expert_weights(tag: str, params: Mapping[str, Any], experts: slice | None = None,
                   quantized: bool | None = None) -> dict[str, torch.Tensor | None]:
    """w13 [E, 2I, H] (gate then up) and w2 [E, H, I], bf16, scaled so every GEMM output
    has unit-order entries; for ``precision=fp8`` quantized per 128x128 block, with scales.
    ``experts`` takes a slice of the experts (each rank's share under expert parallelism):
    the values are those of the full tensor. ``quantized=False`` gives the bf16 weights of
    an fp8 case."""
    e, h, i = params["experts"], params["hidden"], params["inter"]
    region = None if experts is None else (experts,)
    key = seed_from(tag, _key(params))
    b13, b2 = math.sqrt(3.0 / h), math.sqrt(3.0 / i)
    w13 = generate((e, 2 * i, h), BF16, seed=key, low=-b13, high=b13, region=region)
    w2 = generate((e, h, i), BF16, seed=key, stream=1, low=-b2, high=b2, region=region)
    if params.get("scales") == "blocky":  # per expert and 128x128 block (see blocky_factors)
        first = 0 if experts is None else experts.start or 0
        for j in range(w13.shape[0]):
            w13[j] *= blocky_factors(2 * i, h, 128, 128, salt=first + j)
            w2[j] *= blocky_factors(h, i, 128, 128, salt=2 * (first + j))
    if not (params["precision"] == "fp8" if quantized is None else quantized):
        return {"w13": w13, "w13_scale": None, "w2": w2, "w2_scale": None}
    q13, s13 = _quantize_per_expert(w13)
    q2, s2 = _quantize_per_expert(w2)
    return {"w13": q13, "w13_scale": s13, "w2": q2, "w2_scale": s2}


def _quantize_per_expert(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [fp8.quantize(we, FMT, "block") for we in w]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def layout(routemap: torch.Tensor, params: Mapping[str, Any]) -> tuple[list[int], int]:
    """(tokens per expert, rows of the padded permuted layout)."""
    tpe = ref.tokens_per_expert(routemap, params["experts"])
    return tpe, sum(ref.padded_counts(tpe, params["align"]))
