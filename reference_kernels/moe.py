"""Reference Mixture-of-Experts kernels: router, permute / unpermute (Paddle's semantics), the
expert SwiGLU FFN as a grouped GEMM (bf16 or FP8 blockwise), and the whole layer.

Layout of the permuted rows (Paddle's ``moe_permute``): expert e owns the rows
``[offset[e], offset[e] + ceil(tpe[e] / align) * align)`` with ``offset[e]`` the sum of the
padded counts of the experts before it; its first ``tpe[e]`` rows are its tokens in ascending
token order, the rest are padding rows, zero in data, probs and scales. ``rowmap[s, e]`` is the
row of token s in expert e's segment, or -1. A routemap slot of -1 is unused.

Written for reading, not speed: loops over experts, float32 (or float64 where noted)
arithmetic with the rounding points spelled out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from reference_kernels import fp8

BF16 = torch.bfloat16


# ---------------------------------------------------------------- router
def router(logits: torch.Tensor, topk: int, renormalize: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [S, topk] float32, routemap [S, topk] int32) from expert logits [S, E].

    probs = softmax(logits) in float32, the topk largest per token in descending order;
    equal logits are taken lower expert first. Softmax is monotonic, so the choice is made on
    the logits themselves: it never depends on how the softmax rounds. ``renormalize``
    divides the k probabilities by their sum (DeepSeek's norm_topk_prob). A NaN logit counts
    as the largest (torch.sort's and torch.topk's order, and argmax's): its expert comes first
    (NaNs lower expert first), and the token's softmax, so each of its k probs, is NaN."""
    s, e = logits.shape
    if not 1 <= topk <= e:
        raise ValueError(f"topk={topk} must be in [1, num_experts={e}]")
    x = logits.float()
    # a stable descending sort: ties by ascending expert index, NaN before every number
    order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :topk]
    probs = torch.softmax(x, dim=1).gather(1, order)
    if renormalize:
        probs = probs / probs.sum(dim=1, keepdim=True)
    return probs, order.to(torch.int32)


def tokens_per_expert(routemap: torch.Tensor, num_experts: int) -> list[int]:
    """How many tokens each expert receives (slots of -1 are unused)."""
    if (routemap < -1).any():
        raise ValueError(f"routemap holds {int(routemap.min())}; unused slots are -1")
    used = routemap[routemap >= 0].long()
    if used.numel() and int(used.max()) >= num_experts:
        raise ValueError(f"routemap names expert {int(used.max())} of only {num_experts}")
    return torch.bincount(used, minlength=num_experts).tolist()


def padded_counts(tokens: Sequence[int], align: int) -> list[int]:
    """Each expert's row count rounded up to the alignment."""
    if align < 1:
        raise ValueError(f"padding_alignment={align} must be >= 1")
    return [-(-int(t) // align) * align for t in tokens]


def expert_offsets(tokens: Sequence[int], align: int) -> list[int]:
    """offset[e] = sum over i < e of ceil(tokens[i] / align) * align."""
    offsets, total = [], 0
    for count in padded_counts(tokens, align):
        offsets.append(total)
        total += count
    return offsets


# ---------------------------------------------------------------- permute / unpermute
def moe_permute(hidden: torch.Tensor, scale: torch.Tensor | None, routemap: torch.Tensor,
                probs: torch.Tensor, num_experts: int, tokens_per_expert_: Sequence[int],
                padding_alignment: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(permuted rows [R, H], rowmap [S, E] int32, permuted probs [R] float32, permuted scales
    [R, ceil(H/128)] or None). Rows are copied bit for bit (bf16 or fp8 with its scales)."""
    s = hidden.shape[0]
    if routemap.shape[0] != s or probs.shape != routemap.shape:
        raise ValueError(f"routemap {tuple(routemap.shape)} and probs {tuple(probs.shape)} "
                         f"must both be [{s}, topk]")
    counted = tokens_per_expert(routemap, num_experts)
    if list(map(int, tokens_per_expert_)) != counted:
        raise ValueError(f"tokens_per_expert {list(tokens_per_expert_)} does not match the "
                         f"routemap's counts {counted}")
    offsets = expert_offsets(counted, padding_alignment)
    rows = sum(padded_counts(counted, padding_alignment))
    permuted = torch.zeros(rows, hidden.shape[1], dtype=hidden.dtype)
    out_probs = torch.zeros(rows, dtype=torch.float32)
    out_scale = None if scale is None else torch.zeros(rows, scale.shape[1],
                                                       dtype=scale.dtype)
    rowmap = torch.full((s, num_experts), -1, dtype=torch.int32)
    for e in range(num_experts):
        hits = routemap == e                                  # [S, topk]
        if (hits.sum(dim=1) > 1).any():
            raise ValueError(f"a token names expert {e} twice in its routemap")
        tokens = hits.any(dim=1).nonzero().flatten()          # ascending token order
        dest = offsets[e] + torch.arange(tokens.numel())
        permuted[dest] = hidden[tokens]
        out_probs[dest] = probs[hits].float()                 # row-major: in token order
        if out_scale is not None:
            out_scale[dest] = scale[tokens]
        rowmap[tokens, e] = dest.to(torch.int32)
    return permuted, rowmap, out_probs, out_scale


def moe_unpermute(permuted: torch.Tensor, rowmap: torch.Tensor, routemap: torch.Tensor,
                  permuted_probs: torch.Tensor, num_tokens: int, num_experts: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [S, H] in permuted's dtype, probs [S, topk] float32).

    out[s] = sum over experts e (ascending) with rowmap[s, e] >= 0 of permuted[rowmap[s, e]],
    accumulated in float32 and rounded once. Paddle does not re-weight: the caller has already
    multiplied each row by its prob. probs[s, j] gives back each slot's prob (0 for -1 slots)."""
    if rowmap.shape != (num_tokens, num_experts):
        raise ValueError(f"rowmap {tuple(rowmap.shape)} must be [{num_tokens}, {num_experts}]")
    acc = torch.zeros(num_tokens, permuted.shape[1], dtype=torch.float32)
    for e in range(num_experts):
        rows = rowmap[:, e].long()
        has = rows >= 0
        acc[has] += permuted[rows[has]].float()
    probs = torch.zeros(routemap.shape, dtype=torch.float32)
    used = routemap >= 0
    tokens = used.nonzero()[:, 0]
    rows = rowmap[tokens, routemap[used].long()].long()
    if (rows < 0).any():
        raise ValueError("the routemap names an expert whose rowmap entry is -1")
    probs[used] = permuted_probs.float()[rows]
    return acc.to(permuted.dtype), probs


# ---------------------------------------------------------------- expert FFN
def segments(tokens: Sequence[int], align: int) -> list[slice]:
    """The rows of each expert's tokens (padding excluded) in the permuted layout."""
    return [slice(o, o + int(t)) for o, t in zip(expert_offsets(tokens, align), tokens,
                                                 strict=True)]


def expert_ffn(x: torch.Tensor, x_scale: torch.Tensor | None, w13: torch.Tensor,
               w13_scale: torch.Tensor | None, w2: torch.Tensor, w2_scale: torch.Tensor | None,
               tokens_per_expert_: Sequence[int], padding_alignment: int,
               fmt: str = "e4m3") -> torch.Tensor:
    """SwiGLU per expert on the permuted rows, as a grouped GEMM; [R, H] bf16, padding rows 0.

    w13 [E, 2I, H] is gate then up (nn.Linear layout), w2 [E, H, I]. Per expert:
    gu = bf16(x @ w13.T) (float32 accumulation), h = silu(g) * u in float32, out =
    bf16(h' @ w2.T) where h' is bf16(h), or for FP8 the per-token (1x128) quantization of h.
    FP8 (scales given): x is fp8 with 1x128 scales, the weights fp8 with 128x128 block scales
    [E, ceil(N/128), ceil(K/128)], dequantized before each float32 GEMM."""
    quantized = x_scale is not None
    rows = sum(padded_counts(tokens_per_expert_, padding_alignment))
    if x.shape[0] != rows:
        raise ValueError(f"x has {x.shape[0]} rows; the padded layout of {list(tokens_per_expert_)}"
                         f" at alignment {padding_alignment} has {rows}")
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=BF16)
    for e, seg in enumerate(segments(tokens_per_expert_, padding_alignment)):
        if seg.stop == seg.start:
            continue
        if quantized:
            xe = fp8.dequantize(x[seg], x_scale[seg], "token")
            we13 = fp8.dequantize(w13[e], w13_scale[e], "block")
            we2 = fp8.dequantize(w2[e], w2_scale[e], "block")
        else:
            xe, we13, we2 = x[seg].float(), w13[e].float(), w2[e].float()
        gu = (xe @ we13.T).to(BF16).float()
        h = F.silu(gu[:, :inter]) * gu[:, inter:]
        if quantized:
            h = fp8.dequantize(*fp8.quantize(h, fmt, "token"), "token")
        else:
            h = h.to(BF16).float()
        out[seg] = (h @ we2.T).to(BF16)
    return out


# ---------------------------------------------------------------- the layer
def moe_layer(hidden: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor,
              w13_scale: torch.Tensor | None, w2: torch.Tensor, w2_scale: torch.Tensor | None,
              topk: int, renormalize: bool, padding_alignment: int, fmt: str = "e4m3"
              ) -> torch.Tensor:
    """Route, permute, expert FFN, weight each row by its prob, unpermute: [S, H] bf16.

    The router takes the logits (the gate GEMM is an ordinary GEMM, tested elsewhere) so that
    the discrete routing choice cannot hinge on rounding. With weight scales given, the tokens
    are quantized per token (1x128) before the permute, as an FP8 dispatch sends them."""
    probs, routemap = router(logits, topk, renormalize)
    num_experts = logits.shape[1]
    tpe = tokens_per_expert(routemap, num_experts)
    x, x_scale = (fp8.quantize(hidden, fmt, "token") if w13_scale is not None
                  else (hidden, None))
    permuted, rowmap, permuted_probs, permuted_scale = moe_permute(
        x, x_scale, routemap, probs, num_experts, tpe, padding_alignment)
    y = expert_ffn(permuted, permuted_scale, w13, w13_scale, w2, w2_scale, tpe,
                   padding_alignment, fmt)
    weighted = (y.float() * permuted_probs[:, None]).to(BF16)
    return moe_unpermute(weighted, rowmap, routemap, permuted_probs, hidden.shape[0],
                         num_experts)[0]
