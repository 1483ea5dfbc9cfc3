"""Attention tasks: paged decode attention (grouped-query, per-head qk RMSNorm, NeoX RoPE,
paged KV cache written back) and split-KV attention merged by log-sum-exp.

The ``torch`` implementations are vectorised (pages gathered at once, one masked softmax per
request) where the reference loops token by token: two independent formulations."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness.api import OpSpec, Work, allclose, default_for, exact, hash32, seed_from
from reference_kernels import hopper_tasks as ref

from .common import ATTENTION_LENS, ATTENTION_TOLERANCE, BF16, near_eps_rows, norm_weight, tensor

FAMILY = "hopper_tasks"


# ---------------------------------------------------------------- paged decode attention
def paged_layout(params: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                     int]:
    """kv_indptr, kv_indices (a shuffled, non-contiguous page assignment), last_page_len and
    the pool size for ``requests`` requests of 1..max_pages pages each."""
    requests, page_size, max_pages = params["requests"], params["page_size"], params["max_pages"]
    seed = seed_from("paged_layout", requests, page_size, max_pages)
    draws = hash32(torch.arange(2 * requests), seed).tolist()
    pages = [1 + draws[r] % max_pages for r in range(requests)]
    last = [1 + draws[requests + r] % page_size for r in range(requests)]
    if params.get("last") == "edges":
        # a full last page (its final slot written, the next token needs a new page) and a
        # last page holding one token: a kernel that takes last_page_len % page_size for
        # the slots used reads no key of the full page
        last[0], last[-1] = page_size, 1
    for r in range(requests):  # room for the new tokens
        if (pages[r] - 1) * page_size + last[r] < params["tokens"]:
            pages[r] = max(pages[r], 1 + math.ceil(params["tokens"] / page_size))
    pool = sum(pages) + 3  # a few pages that belong to nobody (must stay untouched)
    order = torch.argsort(hash32(torch.arange(pool), seed + 1))
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    return indptr, order[: sum(pages)].to(torch.int32), torch.tensor(last, dtype=torch.int32), pool


def paged_attention_inputs(params: Mapping[str, Any], rank: int, world_size: int
                           ) -> dict[str, Any]:
    hq, hkv, d, t = params["hq"], params["hkv"], params["d"], params["tokens"]
    indptr, indices, last, pool = paged_layout(params)
    rows = (indptr.numel() - 1) * t
    cos, sin = ref.rope_tables(pool * params["page_size"], d, params.get("rope_base", 1e4))
    cache_shape = (pool, params["page_size"], hkv, d)
    # scores=wide: qk-norm weights times 16 (exact), scores of a few hundred, where a softmax
    # that does not subtract the row's maximum overflows float32
    boost = 16.0 if params.get("scores") == "wide" else 1.0
    qkv = tensor("paged_attention", params, "qkv", (rows, hkv * (hq // hkv + 2) * d), -2.0, 2.0)
    if params.get("rows") == "zero":  # the per-head qk-norm's eps, as in hopper_tasks.rmsnorm
        near_eps_rows(qkv, 0, rows - 1)
    return {
        "qkv": qkv,
        "k_cache": tensor("paged_attention", params, "k_cache", cache_shape),
        "v_cache": tensor("paged_attention", params, "v_cache", cache_shape),
        "kv_indptr": indptr, "kv_indices": indices, "last_page_len": last,
        "q_norm_weight": norm_weight("paged_attention", params, "qn", d) * boost,
        "k_norm_weight": norm_weight("paged_attention", params, "kn", d) * boost,
        "cos": cos, "sin": sin, "num_q_heads": hq, "num_kv_heads": hkv, "tokens": t,
    }


def _head_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight.float(), eps=ref.EPS)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def torch_paged_attention(qkv, k_cache, v_cache, kv_indptr, kv_indices, last_page_len,
                     q_norm_weight, k_norm_weight, cos, sin, num_q_heads, num_kv_heads, tokens,
                     *, rope_first: bool = False, see_self: bool = True):
    """The torch implementation; the flags plant the negative controls' bugs."""
    page_size, _, d = k_cache.shape[1:]
    group = num_q_heads // num_kv_heads
    rows = qkv.view(-1, num_kv_heads, group + 2, d).float()
    q = rows[:, :, :group].flatten(1, 2)                       # (R*T, Hq, D)
    k, v = rows[:, :, group], rows[:, :, group + 1]            # (R*T, Hkv, D)
    out = torch.empty(qkv.shape[0], num_q_heads, d, dtype=qkv.dtype, device=qkv.device)
    indptr, indices = kv_indptr.tolist(), kv_indices.to(torch.int64)
    for r in range(len(indptr) - 1):
        pages = indices[indptr[r] : indptr[r + 1]]
        seq_len = (pages.numel() - 1) * page_size + int(last_page_len[r])
        positions = torch.arange(seq_len - tokens, seq_len, device=qkv.device)
        rows_r = slice(r * tokens, (r + 1) * tokens)
        c, s = cos[positions].float()[:, None], sin[positions].float()[:, None]
        if rope_first:  # bug: RoPE before the per-head norm
            q_r = _head_norm(_rope(q[rows_r], c, s), q_norm_weight)
            k_r = _head_norm(_rope(k[rows_r], c, s), k_norm_weight)
        else:
            q_r = _rope(_head_norm(q[rows_r], q_norm_weight), c, s)
            k_r = _rope(_head_norm(k[rows_r], k_norm_weight), c, s)
        flat_k = k_cache[pages].flatten(0, 1)                  # views of the pages, in order
        flat_v = v_cache[pages].flatten(0, 1)
        flat_k[positions] = k_r.to(k_cache.dtype)
        flat_v[positions] = v[rows_r].to(v_cache.dtype)
        k_cache[pages] = flat_k.view(-1, page_size, *flat_k.shape[1:])
        v_cache[pages] = flat_v.view(-1, page_size, *flat_v.shape[1:])
        keys = flat_k[:seq_len].float().repeat_interleave(group, dim=1)    # (S, Hq, D)
        values = flat_v[:seq_len].float().repeat_interleave(group, dim=1)
        key_pos = torch.arange(seq_len, device=qkv.device)
        visible = (key_pos[None, :] <= positions[:, None]) if see_self else (
            key_pos[None, :] < positions[:, None])
        q_bf = q_r.to(qkv.dtype).float()
        attn = F.scaled_dot_product_attention(
            q_bf.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=visible[None], scale=1.0 / math.sqrt(d))            # (Hq, T, D)
        out[rows_r] = attn.transpose(0, 1).to(qkv.dtype)
    return {"out": out.flatten(1), "k_cache": k_cache, "v_cache": v_cache}


def paged_attention_torch(**inputs: Any) -> dict[str, torch.Tensor]:
    return torch_paged_attention(**inputs)


def paged_attention_rope_before_norm(**inputs: Any) -> dict[str, torch.Tensor]:
    """Bug: RoPE is applied before the per-head RMSNorm of q and k."""
    return torch_paged_attention(**inputs, rope_first=True)


def paged_attention_visibility_off_by_one(**inputs: Any) -> dict[str, torch.Tensor]:
    """Bug: the causal mask uses j < pos, so a new token does not see its own key."""
    return torch_paged_attention(**inputs, see_self=False)


def paged_attention_full_last_page_empty(**inputs: Any) -> dict[str, torch.Tensor]:
    """Bug: the tokens of the last page are taken as last_page_len % page_size, so a full last
    page counts as empty: the sequence is a page short and every position shifts."""
    size = inputs["k_cache"].shape[1]
    return torch_paged_attention(**{**inputs, "last_page_len": inputs["last_page_len"] % size})


def paged_attention_magnitude(**inputs: Any) -> dict[str, torch.Tensor]:
    """sum_j p_j |v_j| of each output element (float64): the attention of |v|, new values
    and cache alike (the lens's bound grows with it)."""
    hkv, group = inputs["num_kv_heads"], inputs["num_q_heads"] // inputs["num_kv_heads"]
    qkv = inputs["qkv"].clone()
    rows = qkv.view(qkv.shape[0], hkv, group + 2, -1)
    rows[:, :, group + 1].abs_()
    wide = ref.paged_attention_decode(**{**inputs, "qkv": qkv, "v_cache": inputs["v_cache"].abs()},
                                      wide=True)
    # the cache: |k| where a new token's key is written, 0 on every slot the call must leave
    # as it was (exact there: a stray write, however close to the old value, fails)
    written = torch.zeros(inputs["k_cache"].shape[:2], dtype=torch.bool)
    indptr, pages_of = inputs["kv_indptr"].tolist(), inputs["kv_indices"].tolist()
    page_size, tokens = inputs["k_cache"].shape[1], inputs["tokens"]
    for r, last in enumerate(inputs["last_page_len"].tolist()):
        pages = pages_of[indptr[r]:indptr[r + 1]]
        seq_len = (len(pages) - 1) * page_size + int(last)
        for pos in range(seq_len - tokens, seq_len):
            written[pages[pos // page_size], pos % page_size] = True
    k_cache = wide["k_cache"].double().abs() * written[:, :, None, None]
    return {"out:exact": wide["out"], "k_cache": k_cache}


def paged_attention_work(params: Mapping[str, Any], world_size: int) -> Work:
    """Keys read per token: the mean sequence length; 4*S*Hq*D flops per token (qk and pv)."""
    indptr, _, last, _ = paged_layout(params)
    pages = (indptr[1:] - indptr[:-1]).float()
    seq = ((pages - 1) * params["page_size"] + last.float()).sum().item()
    hq, hkv, d = params["hq"], params["hkv"], params["d"]
    return Work(flops=4.0 * seq * params["tokens"] * hq * d, bytes=2.0 * 2 * seq * hkv * d,
                flops_dtype="bf16")


def _attention_case(requests, tokens, hq, hkv, d, page_size, max_pages, last=None,
                    scores=None, rows=None) -> dict:
    case = {"requests": requests, "tokens": tokens, "hq": hq, "hkv": hkv, "d": d,
            "page_size": page_size, "max_pages": max_pages}
    extra = {"last": last, "scores": scores, "rows": rows}
    return {**case, **{k: v for k, v in extra.items() if v is not None}}


PAGED_ATTENTION = OpSpec(
    name="hopper_tasks.paged_attention", family=FAMILY, reference=ref.paged_attention_decode,
    description="Decode attention over a paged KV cache (GQA, qk-norm, NeoX RoPE, write-back).",
    make_inputs=paged_attention_inputs,
    outputs=("out", "k_cache", "v_cache"),
    tolerance={"out": ATTENTION_TOLERANCE, "out:exact": ATTENTION_LENS,
               # bf16's allclose where a key is written, exact elsewhere (the magnitude)
               "k_cache": allclose(rtol=0.0, atol=default_for(BF16).atol,
                                   magnitude_rtol=default_for(BF16).rtol),
               "v_cache": exact()},
    exact=lambda **inputs: {"out": ref.paged_attention_decode(**inputs, wide=True)["out"]},
    magnitude=paged_attention_magnitude,
    out_buffers={"k_cache": "k_cache", "v_cache": "v_cache"},
    readwrite_inputs=("k_cache", "v_cache"),
    # the call on other values gets other RoPE tables (Llama 3's base): cos and sin are made
    # from the params, and a kernel that keeps them by shape would pass on reseeded values
    twin=lambda p: {**p, "rope_base": 5e5},
    work=paged_attention_work,
    grid={"smoke": [_attention_case(3, 1, 4, 2, 32, 16, 3), _attention_case(2, 3, 4, 4, 16, 8, 4),
                    _attention_case(3, 1, 4, 2, 32, 16, 3, last="edges"),
                    _attention_case(2, 3, 4, 4, 16, 8, 4, last="edges"),
                    # a head of 48: the per-head RMSNorm over a row that is no power of two
                    _attention_case(2, 2, 4, 2, 48, 8, 3, last="edges"),
                    # one page per request, scores of a few hundred either way: some token's
                    # every visible score is far below 0 (a running max started at 0 gives
                    # 0/0 there)
                    _attention_case(8, 1, 4, 2, 32, 8, 1, scores="wide"),
                    _attention_case(2, 3, 4, 2, 32, 8, 3, rows="zero"),
                    # pages of 12 tokens: a page and slot found by shift and mask are wrong;
                    # groups of 8 q heads per KV head (64 over 8), past one 4-head warp
                    _attention_case(2, 2, 16, 2, 32, 12, 4)],
          "nightly": [_attention_case(b, t, 32, 8, 128, 64, 64) for b in (1, 4, 16)
                      for t in (1, 4)]
          + [_attention_case(4, t, 32, 8, 128, 64, 64, last="edges") for t in (1, 4)]
          + [_attention_case(4, 1, 32, 8, 96, 64, 64, last="edges"),
             _attention_case(4, 1, 32, 8, 128, 64, 64, scores="wide"),
             _attention_case(4, 4, 32, 8, 128, 64, 64, rows="zero"),
             _attention_case(4, 1, 32, 8, 128, 12, 64),
             _attention_case(16, 1, 64, 8, 128, 64, 1, scores="wide")]},
    implementations={"torch": paged_attention_torch},
    negative_controls={"rope_before_norm": paged_attention_rope_before_norm,
                       "visibility_off_by_one": paged_attention_visibility_off_by_one,
                       "full_last_page_empty": paged_attention_full_last_page_empty},
)


# ---------------------------------------------------------------- split-KV attention
def split_kv_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    h, d, s = params["heads"], params["d"], params["seq"]
    q = tensor("split_kv", params, "q", (h, d), -2.0, 2.0)
    low = {"wide": 1, "low_first": 0}.get(params.get("scores"))
    if low is not None:
        # q * 32 (exact in bf16): scores spread over ~200, so exp(score - anything but the
        # max) overflows float32: only the max-subtracted softmax stays finite
        q = q * 32
    k = tensor("split_kv", params, "k", (s, h, d), -2.0, 2.0)
    if low is not None:
        # one chunk's keys opposite to q: every score of that chunk near -360. The second
        # (wide): a running max started at 0 (not -inf) underflows its exp to 0 and its sum
        # to 0/0. The first (low_first): a merge that weighs each chunk by exp(lse_c - lse_0),
        # relative to the first chunk rather than the largest, overflows
        c = params["chunk"]
        k[low * c : (low + 1) * c] = -2.0 * torch.sign(q)[None].expand(c, h, d)
    v = tensor("split_kv", params, "v", (s, h, d))
    if params.get("scores") == "nan":
        # a NaN key in head 0 (its every score NaN: out and lse NaN for the head) in the last
        # chunk, and a NaN value in head 1 (out[1, 3] NaN, its lse finite)
        k, v = k.clone(), v.clone()
        k[s - 1, 0, 0] = math.nan
        v[s // 3, 1, 3] = math.nan
    if params.get("v") == "nan_far":
        # a NaN value at the key of the first chunk whose score is lowest for head 1, far
        # below its chunk's maximum (scores spread over ~200): its probability is ~0, and 0 *
        # NaN is NaN, so out[1, 3] is NaN; a kernel that skips the V loads of keys whose
        # probability is negligible returns it finite
        v = v.clone()
        far = int((k[: params["chunk"], 1].float() @ q[1].float()).argmin())
        v[far, 1, 3] = math.nan
    return {"q": q, "k": k, "v": v, "chunk": params["chunk"]}


def _split_kv(q, k, v, chunk, *, rescale: bool = True, shift_by_max: bool = True,
              nan_as_masked: bool = False, one_chunk_lse_max: bool = False
              ) -> dict[str, torch.Tensor]:
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for start in range(0, k.shape[0], chunk):
        scores = torch.einsum("hd,shd->hs", q.float(), k[start : start + chunk].float()) * scale
        if nan_as_masked:
            scores = scores.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        top = scores.amax(-1, keepdim=True) if shift_by_max else scores.amin(-1, keepdim=True)
        p = torch.exp(scores - top)
        total = p.sum(-1, keepdim=True)
        outs.append(torch.einsum("hs,shd->hd", p / total, v[start : start + chunk].float()))
        lses.append((top + total.log()).squeeze(-1))
    lse_all = torch.stack(lses)                                   # (C, H)
    lse = torch.logsumexp(lse_all, dim=0)
    weights = torch.exp(lse_all - lse) if rescale else torch.full_like(lse_all,
                                                                       1.0 / len(outs))
    out = (weights[..., None] * torch.stack(outs)).sum(0)
    if one_chunk_lse_max and len(lses) == 1:  # bug: nothing to merge, the max kept as lse
        lse = scores.amax(-1)
    return {"out": out.to(q.dtype), "lse": lse}


def split_kv_torch(q, k, v, chunk) -> dict[str, torch.Tensor]:
    return _split_kv(q, k, v, chunk)


def split_kv_one_chunk_lse_max(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """Bug: with one chunk there is no merge, and the lse returned is the running max alone
    (its log-sum left out): the output right, the lse wrong."""
    return _split_kv(q, k, v, chunk, one_chunk_lse_max=True)


def split_kv_merge_without_rescale(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """Bug: the merge averages the chunks' outputs instead of weighting them by
    exp(lse_c - lse)."""
    return _split_kv(q, k, v, chunk, rescale=False)


def split_kv_min_shift(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """Bug: each chunk's softmax is shifted by its smallest score, not its largest: the same
    math until a chunk's scores span more than ~88, where exp overflows float32."""
    return _split_kv(q, k, v, chunk, shift_by_max=False)


def split_kv_nan_as_masked(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """Bug: a NaN score is taken for a masked one (-inf), as a kernel that guards its running
    max against NaN does: the head's output stays finite."""
    return _split_kv(q, k, v, chunk, nan_as_masked=True)


def split_kv_exact(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """The float64 attention (a log-sum-exp merge of chunks is exact arithmetic): the
    precision lens's value of ``out`` before its one rounding, and of ``lse``."""
    scores = torch.einsum("hd,shd->hs", q.double(), k.double()) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hs,shd->hd", torch.exp(scores - lse[:, None]), v.double())
    return {"out": out, "lse": lse}


def split_kv_magnitude(q, k, v, chunk) -> dict[str, torch.Tensor]:
    """sum_j p_j |v_j| of each output element (float64; ``ATTENTION_LENS``)."""
    return {"out:exact": split_kv_exact(q, k, v.abs(), chunk)["out"]}


SPLIT_KV = OpSpec(
    name="hopper_tasks.attention_split_kv", family=FAMILY, reference=ref.attention_split_kv,
    description="One token's attention in KV chunks, merged by log-sum-exp.",
    make_inputs=split_kv_inputs, outputs=("out", "lse"),
    tolerance={"out": ATTENTION_TOLERANCE, "out:exact": ATTENTION_LENS,
               "lse": allclose(rtol=1e-5, atol=1e-4)},
    exact=split_kv_exact, magnitude=split_kv_magnitude,
    work=lambda p, w: Work(flops=4.0 * p["seq"] * p["heads"] * p["d"],
                           bytes=2.0 * 2 * p["seq"] * p["heads"] * p["d"], flops_dtype="bf16"),
    # a chunk of 256: past one 128-key tile, where a kernel runs an online softmax of its own
    grid={"smoke": [{"heads": 4, "d": 64, "seq": 600, "chunk": 256},
                    {"heads": 2, "d": 32, "seq": 77, "chunk": 32},
                    # seq a multiple of the chunk: no empty last chunk (0/0)
                    {"heads": 2, "d": 32, "seq": 96, "chunk": 32, "scores": "wide"},
                    {"heads": 2, "d": 32, "seq": 96, "chunk": 32, "scores": "wide",
                     "v": "nan_far"},
                    {"heads": 2, "d": 32, "seq": 80, "chunk": 32, "scores": "low_first"},
                    {"heads": 2, "d": 32, "seq": 77, "chunk": 32, "scores": "nan"},
                    {"heads": 4, "d": 64, "seq": 130, "chunk": 64, "scores": "nan"},
                    # one chunk: nothing to merge, the log-sum-exp still the whole one
                    {"heads": 2, "d": 32, "seq": 20, "chunk": 32}],
          "nightly": [{"heads": 32, "d": 128, "seq": s, "chunk": 512}
                      for s in (4096, 32768, 131072)]
          + [{"heads": 32, "d": 128, "seq": 4100, "chunk": 512, "scores": "nan"},
             {"heads": 32, "d": 128, "seq": 4096, "chunk": 512, "scores": "wide"},
             {"heads": 32, "d": 128, "seq": 4000, "chunk": 512, "scores": "low_first"}]},
    implementations={"torch": split_kv_torch},
    negative_controls={"merge_without_rescale": split_kv_merge_without_rescale,
                       "min_shift": split_kv_min_shift,
                       "nan_as_masked": split_kv_nan_as_masked,
                       "one_chunk_lse_max": split_kv_one_chunk_lse_max},
)

SPECS = [PAGED_ATTENTION, SPLIT_KV]
