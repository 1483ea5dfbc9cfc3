"""Reference semantics of the task types of a persistent megakernel on Hopper (Mirage).

bf16 data, float32 arithmetic, one rounding to the output dtype at the end of each task (the
task writes its output tile once). eps is 1e-6 in every norm. The functions whose output is
rounded once take ``wide=True`` to return the float64 value before that rounding: what the
precision lens (harness.core.compare.rounding) holds an implementation to. Weights use
nn.Linear's layout (out_features, in_features). Every function is a plain torch function of its
inputs, written for reading, not for speed.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-6


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out[b] = weight[ids[b, 0]] for ids of shape (B, 1); a negative id gives a zero row."""
    flat = ids.reshape(-1).to(torch.int64)
    out = torch.zeros(flat.numel(), weight.shape[1], dtype=weight.dtype)
    valid = flat >= 0
    out[valid] = weight[flat[valid]]
    return out


def _rms_scale(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


def _acc(wide: bool) -> torch.dtype:
    return torch.float64 if wide else torch.float32


def _once(value: torch.Tensor, dtype: torch.dtype, wide: bool) -> torch.Tensor:
    """The task's one rounding, or (wide) the float64 value before it."""
    return value if wide else value.to(dtype)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, *, wide: bool = False
            ) -> torch.Tensor:
    """bf16(x32 * rsqrt(mean(x32^2) + eps) * w32) over the last dim, rounded once."""
    x32 = x.to(_acc(wide))
    return _once(x32 * _rms_scale(x32, eps) * weight.to(x32.dtype), x.dtype, wide)


def linear(x: torch.Tensor, weight: torch.Tensor, *, wide: bool = False) -> torch.Tensor:
    """x @ weight.T with float32 accumulation, rounded once."""
    acc = _acc(wide)
    return _once(x.to(acc) @ weight.to(acc).T, x.dtype, wide)


def linear_with_residual(x: torch.Tensor, weight: torch.Tensor,
                         residual: torch.Tensor, *, wide: bool = False) -> torch.Tensor:
    """x @ weight.T + residual, accumulated in float32, rounded once. Under tensor parallelism
    only rank 0 adds the residual, so it counts once after the sum allreduce."""
    acc = _acc(wide)
    return _once(x.to(acc) @ weight.to(acc).T + residual.to(acc), x.dtype, wide)


def rmsnorm_linear(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                   eps: float = EPS, *, wide: bool = False) -> torch.Tensor:
    """rmsnorm(x) * norm_weight, kept in float32 inside the fused task, then @ weight.T."""
    x32 = x.to(_acc(wide))
    normed = x32 * _rms_scale(x32, eps) * norm_weight.to(x32.dtype)
    return _once(normed @ weight.to(x32.dtype).T, x.dtype, wide)


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor, groups: int) -> torch.Tensor:
    """The fused gate/up weight of the silu_mul tasks: cat over g of (w_gate.chunk(G)[g],
    w_up.chunk(G)[g]), so each of the G task chunks holds its own [gate | up] rows."""
    gates, ups = w_gate.chunk(groups), w_up.chunk(groups)
    return torch.cat([t for g in range(groups) for t in (gates[g], ups[g])])


def silu_mul(x: torch.Tensor, groups: int, *, wide: bool = False) -> torch.Tensor:
    """x (B, 2I) holds G interleaved [gate | up] chunks: out = bf16(silu(gate32)) * up, (B, I)."""
    b = x.shape[0]
    m = x.view(b, groups, 2, -1)
    gate = torch.nn.functional.silu(m[:, :, 0].float()).to(x.dtype)
    return _once(gate.to(_acc(wide)) * m[:, :, 1].to(_acc(wide)), x.dtype, wide).reshape(b, -1)


def silu_mul_linear_with_residual(x: torch.Tensor, weight: torch.Tensor,
                                  residual: torch.Tensor, *, wide: bool = False
                                  ) -> torch.Tensor:
    """(silu(x[:, :I]) * x[:, I:]) @ weight.T + residual: the product stays in float32 inside
    the fused task; the residual is added by rank 0 only under tensor parallelism."""
    half, acc = x.shape[1] // 2, _acc(wide)
    h = torch.nn.functional.silu(x[:, :half].to(acc)) * x[:, half:].to(acc)
    return _once(h @ weight.to(acc).T + residual.to(acc), x.dtype, wide)


def argmax_partial(logits: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chunk of ``chunk`` columns: the max value and its chunk-relative index (the first
    one on ties). The vocab is padded with zero columns to a multiple of the chunk, as the
    LM head's weight is padded with zero rows (so a padded 0 can win over negative logits:
    that is the kernel's behaviour, and the reference keeps it). NaN counts as the largest
    value (torch.argmax's and numpy.argmax's rule): a chunk holding one has the value NaN
    and the index of its first NaN; +inf and -inf compare as numbers."""
    b, v = logits.shape
    padded = math.ceil(v / chunk) * chunk
    full = torch.zeros(b, padded, dtype=logits.dtype)
    full[:, :v] = logits
    blocks = full.view(b, -1, chunk).float()
    values = blocks.amax(dim=-1)  # NaN where the chunk holds one
    # torch.max's index on ties is not documented to be the first; argmax's is
    first = _is_max(blocks, values.unsqueeze(-1)).int().argmax(dim=-1)
    return values.to(logits.dtype), first.to(torch.int64)


def _is_max(x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Where x equals its maximum ``top``, NaN equal to NaN (NaN is the largest value)."""
    return (x == top) | (torch.isnan(x) & torch.isnan(top))


def argmax_reduce(values: torch.Tensor, index: torch.Tensor, chunk: int) -> torch.Tensor:
    """Global index (B, 1) int64: the first chunk holding the max (a NaN chunk first of all),
    offset by chunk * c."""
    v = values.float()
    best = _is_max(v, v.amax(dim=-1, keepdim=True)).int().argmax(-1)
    return (best * chunk + index.gather(1, best.unsqueeze(1)).squeeze(1)).unsqueeze(1)


def argmax(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax over the (padded) vocab through the partial and reduce tasks: (B, 1) int64."""
    values, index = argmax_partial(logits, chunk)
    return argmax_reduce(values, index, chunk)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE's rotation: (x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope(x32: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with cos/sin rows for each token's absolute position."""
    return x32 * cos.float() + rotate_half(x32) * sin.float()


def rope_tables(max_pos: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, ...]:
    """NeoX cos/sin tables (max_pos, dim) in float32: angle p * base**(-2i/dim), repeated for
    both halves."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def paged_attention_decode(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    last_page_len: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    tokens: int,
    eps: float = EPS,
    *,
    wide: bool = False,
) -> dict[str, torch.Tensor]:
    """Decode attention over a paged KV cache, for R requests of ``tokens`` new tokens each.

    qkv: (R*T, Hkv*(G+2)*D), per KV group g the row holds [G q heads | k | v] (G = Hq/Hkv).
    Caches: (max_pages, page_size, Hkv, D); request r owns pages
    kv_indices[kv_indptr[r]:kv_indptr[r+1]] and holds seq_len = (pages-1)*page_size +
    last_page_len[r] tokens, its new ones included; new token t sits at position
    seq_len - T + t. q and k get a per-head RMSNorm over D, then NeoX RoPE by absolute
    position; the cache receives the normed and roped k (bf16) and the raw v. Key j is visible
    to token t iff j <= seq_len - T + t; scale 1/sqrt(D). Returns {"out": (R*T, Hq*D),
    "k_cache", "v_cache"} (new caches; the inputs are left alone). ``wide``: the attention
    after the bf16 q and caches in float64, ``out`` before its one rounding.
    """
    page_size, hkv, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if hkv != num_kv_heads or num_q_heads % num_kv_heads:
        raise ValueError("cache heads must equal num_kv_heads, which must divide num_q_heads")
    group = num_q_heads // num_kv_heads
    requests = kv_indptr.numel() - 1
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    rows = qkv.view(requests * tokens, num_kv_heads, group + 2, dim)
    q = rows[:, :, :group].reshape(requests * tokens, num_q_heads, dim).float()
    k, v = rows[:, :, group].float(), rows[:, :, group + 1]
    q = q * _rms_scale(q, eps) * q_norm_weight.float()
    k = k * _rms_scale(k, eps) * k_norm_weight.float()
    acc = _acc(wide)
    out = torch.empty(requests * tokens, num_q_heads, dim, dtype=acc if wide else qkv.dtype)
    for r in range(requests):
        pages = kv_indices[kv_indptr[r] : kv_indptr[r + 1]].to(torch.int64)
        seq_len = (pages.numel() - 1) * page_size + int(last_page_len[r])
        first = seq_len - tokens
        for t in range(tokens):
            row, pos = r * tokens + t, first + t
            k_t = rope(k[row], cos[pos], sin[pos]).to(qkv.dtype)
            page, slot = pages[pos // page_size], pos % page_size
            k_cache[page, slot], v_cache[page, slot] = k_t, v[row]
        keys = k_cache[pages].reshape(-1, hkv, dim)[:seq_len].to(acc)  # (S, Hkv, D)
        values = v_cache[pages].reshape(-1, hkv, dim)[:seq_len].to(acc)
        for t in range(tokens):
            row, pos = r * tokens + t, first + t
            q_t = rope(q[row], cos[pos], sin[pos]).to(qkv.dtype).to(acc)  # (Hq, D)
            kv_head = torch.arange(num_q_heads) // group
            scores = torch.einsum("hd,shd->hs", q_t, keys[:, kv_head]) / math.sqrt(dim)
            scores[:, pos + 1 :] = -math.inf  # causal: key j visible iff j <= pos
            probs = torch.softmax(scores, dim=-1)
            out[row] = _once(torch.einsum("hs,shd->hd", probs, values[:, kv_head]), qkv.dtype,
                             wide)
    return {"out": out.reshape(requests * tokens, num_q_heads * dim), "k_cache": k_cache,
            "v_cache": v_cache}


def attention_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One KV chunk of split-KV attention for one token: q (Hq, D), k and v (S, Hq, D).
    Returns the chunk's normalised output (Hq, D) in float32 and its log-sum-exp (Hq,)."""
    scores = torch.einsum("hd,shd->hs", q.float(), k.float()) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hs,shd->hd", torch.exp(scores - lse[:, None]), v.float())
    return out, lse


def merge_attention(outs: list[torch.Tensor], lses: list[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge chunk results: lse = logsumexp_c(lse_c), out = sum_c exp(lse_c - lse) * out_c."""
    stacked = torch.stack(lses)  # (C, Hq)
    lse = torch.logsumexp(stacked, dim=0)
    weights = torch.exp(stacked - lse)  # (C, Hq)
    out = sum(w[:, None] * o for w, o in zip(weights, outs, strict=True))
    return out, lse


def attention_split_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int
                       ) -> dict[str, torch.Tensor]:
    """Split-KV attention of one token over S keys in chunks of ``chunk``, merged by
    log-sum-exp: {"out": (Hq, D) in q's dtype, "lse": (Hq,) float32}.

    Special values follow softmax's IEEE arithmetic, as torch.softmax does: a NaN score (a NaN
    in q or in a key) makes its head's every output and its lse NaN, in whichever chunk it
    sits; a NaN in v reaches only the output column it is in (its probability times NaN), the
    lse stays finite. A kernel that treats a NaN score as masked is wrong."""
    parts = [attention_partial(q, k[s : s + chunk], v[s : s + chunk])
             for s in range(0, k.shape[0], chunk)]
    out, lse = merge_attention([p[0] for p in parts], [p[1] for p in parts])
    return {"out": out.to(q.dtype), "lse": lse}


def identity(x: torch.Tensor) -> torch.Tensor:
    """A copy: the task that captures an intermediate result of a pipeline."""
    return x.clone()
