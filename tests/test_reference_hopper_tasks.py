"""Tests for reference_kernels.hopper_tasks (Mirage persistent-kernel task semantics on Hopper).

Every expected value comes from an independent formulation: float64 arithmetic, plain Python
loops, torch.nn.functional (rms_norm, silu, scaled_dot_product_attention), torch.argmax /
torch.logsumexp, or the textbook RoPE formula. Paged decode attention is checked against a dense
contiguous-KV formulation of the same scenario. Nothing is compared with values the function
under test produced itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from reference_kernels import hopper_tasks as ref

BF16 = torch.bfloat16
EPS = 1e-6
#: one bf16 ulp relative to the value (8 significant bits)
BF16_ULP = 2.0**-7


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype: torch.dtype = BF16, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen(seed), dtype=torch.float64) * scale).to(dtype)


def within_bf16_rounding(actual: torch.Tensor, expected64: torch.Tensor, atol: float = 1e-4):
    """actual (bf16) equals the float64 value up to one bf16 rounding (plus a tiny atol for the
    float32 accumulation of values that cancel to near zero)."""
    assert actual.dtype == BF16
    torch.testing.assert_close(actual.double(), expected64.double(), rtol=BF16_ULP, atol=atol)


# ----------------------------------------------------------------------------------- embedding
def test_embedding_rows_and_negative_ids_give_zero_rows():
    weight = randn(10, 8, seed=1)
    ids = torch.tensor([[3], [-1], [0], [9], [-5], [3]], dtype=torch.int64)
    out = ref.embedding(ids, weight)
    assert out.shape == (6, 8) and out.dtype == BF16
    for b, i in enumerate(ids.reshape(-1).tolist()):
        want = [0.0] * 8 if i < 0 else weight[i].double().tolist()
        assert out[b].double().tolist() == want, (b, i)


# ------------------------------------------------------------------------------------- rmsnorm
def _rmsnorm64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def test_rmsnorm_matches_float64_and_functional_rms_norm():
    x = randn(5, 64, seed=2, scale=3.0)
    w = randn(64, seed=3, scale=0.2) + 1
    out = ref.rmsnorm(x, w)
    assert out.shape == x.shape and out.dtype == BF16
    within_bf16_rounding(out, _rmsnorm64(x, w), atol=0)
    functional = F.rms_norm(x.float(), (64,), w.float(), eps=EPS).to(BF16)
    torch.testing.assert_close(out.float(), functional.float(), rtol=BF16_ULP, atol=0)


def test_rmsnorm_eps_is_1e_minus_6():
    # mean(x^2) == c^2 ~ 1e-6 is comparable with eps: y = c / sqrt(c^2 + 1e-6) ~ 1/sqrt(2)
    x = torch.full((2, 16), 1e-3, dtype=BF16)
    c = float(x[0, 0])
    out = ref.rmsnorm(x, torch.ones(16, dtype=BF16))
    want = c / math.sqrt(c * c + 1e-6)
    assert abs(want - 0.7071) < 0.01
    torch.testing.assert_close(out.double(), torch.full((2, 16), want, dtype=torch.float64),
                               rtol=BF16_ULP, atol=0)
    zeros = ref.rmsnorm(torch.zeros(1, 16, dtype=BF16), torch.ones(16, dtype=BF16))
    assert torch.equal(zeros, torch.zeros(1, 16, dtype=BF16))


# ------------------------------------------------------------------------------------- linears
def test_linear_matches_float64_matmul():
    x, w = randn(3, 48, seed=4), randn(24, 48, seed=5, scale=0.2)
    out = ref.linear(x, w)
    assert out.shape == (3, 24) and out.dtype == BF16
    within_bf16_rounding(out, x.double() @ w.double().T)


def test_linear_with_residual_matches_float64_matmul():
    x, w = randn(3, 48, seed=6), randn(24, 48, seed=7, scale=0.2)
    residual = randn(3, 24, seed=8, scale=2.0)
    out = ref.linear_with_residual(x, w, residual)
    assert out.shape == (3, 24) and out.dtype == BF16
    within_bf16_rounding(out, x.double() @ w.double().T + residual.double())


def test_rmsnorm_linear_matches_float64():
    x, w = randn(4, 32, seed=9, scale=2.0), randn(16, 32, seed=10, scale=0.2)
    norm_w = randn(32, seed=11, scale=0.2) + 1
    out = ref.rmsnorm_linear(x, norm_w, w)
    assert out.shape == (4, 16) and out.dtype == BF16
    within_bf16_rounding(out, _rmsnorm64(x, norm_w) @ w.double().T)


def test_silu_mul_linear_with_residual_matches_float64():
    inter, hidden = 16, 24
    x = randn(3, 2 * inter, seed=12, scale=2.0)
    w, residual = randn(hidden, inter, seed=13, scale=0.3), randn(3, hidden, seed=14)
    out = ref.silu_mul_linear_with_residual(x, w, residual)
    assert out.shape == (3, hidden) and out.dtype == BF16
    g, u = x[:, :inter].double(), x[:, inter:].double()
    h = g / (1 + torch.exp(-g)) * u
    within_bf16_rounding(out, h @ w.double().T + residual.double())


# ------------------------------------------------------------------------------------ silu_mul
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_interleave_gate_up_layout(groups):
    inter, hidden = 16, 8
    wg, wu = randn(inter, hidden, seed=15), randn(inter, hidden, seed=16)
    fused = ref.interleave_gate_up(wg, wu, groups)
    assert fused.shape == (2 * inter, hidden)
    rows = inter // groups
    for g in range(groups):
        base = 2 * g * rows
        assert torch.equal(fused[base : base + rows], wg[g * rows : (g + 1) * rows])
        assert torch.equal(fused[base + rows : base + 2 * rows], wu[g * rows : (g + 1) * rows])


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_silu_mul_on_interleaved_weights_equals_separate_gate_and_up(groups):
    batch, inter, hidden = 3, 16, 32
    x = randn(batch, hidden, seed=17)
    wg, wu = randn(inter, hidden, seed=18, scale=0.3), randn(inter, hidden, seed=19, scale=0.3)
    fused = ref.interleave_gate_up(wg, wu, groups)
    # the linear task's output, rounded once to bf16 (float64 accumulation: same per element)
    mixed = (x.double() @ fused.double().T).to(BF16)
    out = ref.silu_mul(mixed, groups)
    assert out.shape == (batch, inter) and out.dtype == BF16
    gate = (x.double() @ wg.double().T).to(BF16)
    up = (x.double() @ wu.double().T).to(BF16)
    want = (F.silu(gate.float()).to(BF16).float() * up.float()).to(BF16)
    assert torch.equal(out, want)
    # and, up to bf16 rounding, silu(x @ Wg.T) * (x @ Wu.T) in float64
    g64, u64 = x.double() @ wg.double().T, x.double() @ wu.double().T
    torch.testing.assert_close(out.double(), g64 / (1 + torch.exp(-g64)) * u64,
                               rtol=3 * BF16_ULP, atol=1e-2)


# -------------------------------------------------------------------------------------- argmax
def _planted_logits(batch: int, vocab: int, where: list[int], seed: int) -> torch.Tensor:
    logits = torch.rand(batch, vocab, generator=gen(seed), dtype=torch.float64) * 2 - 1
    for b, i in enumerate(where):
        logits[b, i] = 5.0
    return logits.to(BF16)


@pytest.mark.parametrize("vocab,chunk", [(37, 8), (40, 8), (100, 16), (9, 64)])
def test_argmax_unique_max_equals_torch_argmax(vocab, chunk):
    spots = sorted({0, chunk - 1, chunk, vocab // 2, vocab - 1} & set(range(vocab)))
    logits = _planted_logits(len(spots), vocab, spots, seed=20 + vocab)
    out = ref.argmax(logits, chunk)
    assert out.shape == (len(spots), 1) and out.dtype == torch.int64
    assert out.reshape(-1).tolist() == spots
    assert torch.equal(out.reshape(-1), torch.argmax(logits.float(), dim=-1))


def test_argmax_partial_per_chunk_values_and_relative_indices():
    vocab, chunk = 37, 8
    logits = _planted_logits(2, vocab, [12, 36], seed=21)
    values, index = ref.argmax_partial(logits, chunk)
    assert values.shape == (2, 5) and index.shape == (2, 5) and index.dtype == torch.int64
    for b in range(2):
        row = logits[b].double().tolist() + [0.0] * (5 * chunk - vocab)
        for c in range(5):
            block = row[c * chunk : (c + 1) * chunk]
            assert float(values[b, c]) == max(block)
            assert int(index[b, c]) == block.index(max(block))


def test_argmax_all_negative_logits_pick_a_padded_zero():
    vocab, chunk = 37, 8  # padded to 40: columns 37..39 are zeros
    logits = -(torch.rand(2, vocab, generator=gen(22), dtype=torch.float64) + 0.5).to(BF16)
    out = ref.argmax(logits, chunk).reshape(-1).tolist()
    assert all(i >= vocab for i in out)
    assert out == [vocab, vocab]  # the first padded column
    # without padding (vocab a multiple of the chunk) it is the plain argmax
    exact = logits[:, :32]
    assert torch.equal(ref.argmax(exact, chunk).reshape(-1), torch.argmax(exact.float(), -1))
    # a real 0 before the padding wins the tie with the padded zeros (first index)
    logits[:, 5] = 0
    assert ref.argmax(logits, chunk).reshape(-1).tolist() == [5, 5]


def test_argmax_ties_give_the_first_index():
    vocab, chunk = 37, 8
    logits = _planted_logits(3, vocab, [3, 10, 30], seed=23)
    logits[0, [20, 30]] = 5.0  # ties across chunks, first one in chunk 0
    logits[1, 12] = 5.0  # ties inside chunk 1 (10 and 12)
    logits[2, [31, 36]] = 5.0  # ties inside the last chunk and across
    assert ref.argmax(logits, chunk).reshape(-1).tolist() == [3, 10, 30]


# ---------------------------------------------------------------------------------------- rope
def _textbook_tables(max_pos: int, dim: int, base: float = 10000.0):
    cos = torch.empty(max_pos, dim, dtype=torch.float64)
    sin = torch.empty(max_pos, dim, dtype=torch.float64)
    for p in range(max_pos):
        for i in range(dim // 2):
            angle = p * base ** (-2 * i / dim)
            cos[p, i] = cos[p, i + dim // 2] = math.cos(angle)
            sin[p, i] = sin[p, i + dim // 2] = math.sin(angle)
    return cos.float(), sin.float()


def _rope_inline(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def test_rope_tables_match_textbook_formula():
    cos, sin = ref.rope_tables(64, 16)
    want_cos, want_sin = _textbook_tables(64, 16)
    assert cos.shape == sin.shape == (64, 16) and cos.dtype == sin.dtype == torch.float32
    torch.testing.assert_close(cos, want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, want_sin, rtol=0, atol=1e-6)
    cos5, _ = ref.rope_tables(8, 16, base=500.0)
    torch.testing.assert_close(cos5, _textbook_tables(8, 16, base=500.0)[0], rtol=0, atol=1e-6)


def test_rotate_half_explicit():
    x = torch.arange(1.0, 9.0)
    assert ref.rotate_half(x).tolist() == [-5.0, -6.0, -7.0, -8.0, 1.0, 2.0, 3.0, 4.0]


def test_rope_rotates_each_pair_preserving_norm_and_relative_position():
    dim, half = 16, 8
    cos, sin = ref.rope_tables(40, dim)
    x = randn(40, dim, seed=24, dtype=torch.float32)
    y = ref.rope(x, cos, sin)
    torch.testing.assert_close(y[:, :half] ** 2 + y[:, half:] ** 2,
                               x[:, :half] ** 2 + x[:, half:] ** 2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[0], x[0])  # position 0 is the identity
    torch.testing.assert_close(y, _rope_inline(x, cos, sin))
    # <rope(q, p), rope(k, s)> depends only on p - s
    q, k = randn(dim, seed=25, dtype=torch.float64), randn(dim, seed=26, dtype=torch.float64)
    c64, s64 = (t.double() for t in _textbook_tables(40, dim))
    dots = [float(ref.rope(q, c64[p + 3], s64[p + 3]) @ ref.rope(k, c64[p], s64[p]))
            for p in (0, 7, 30)]
    assert dots == pytest.approx([dots[0]] * 3, rel=1e-6, abs=1e-6)


# ------------------------------------------------------------------------ paged decode attention
PAGE = 4
DIM = 16
#: (pages, last_page_len) per request: last_page_len == PAGE, == 1, a single page, and more
REQUESTS = [(3, PAGE), (2, 1), (1, 3), (4, 2)]
MAX_PAGES = 14


def _make_scenario(hq: int, hkv: int, tokens: int, seed: int) -> dict:
    g = gen(seed)
    group = hq // hkv
    perm = torch.randperm(MAX_PAGES, generator=g)
    indptr, indices, last, start = [0], [], [], 0
    for pages, last_len in REQUESTS:
        indices += perm[start : start + pages].tolist()
        start += pages
        indptr.append(len(indices))
        last.append(last_len)
    assert indices != sorted(indices)
    seq_lens = [(p - 1) * PAGE + n for p, n in REQUESTS]
    # garbage everywhere: unowned pages, free slots, and the slots the new tokens will take
    k_cache = (torch.randn(MAX_PAGES, PAGE, hkv, DIM, generator=g) * 3).to(BF16)
    v_cache = (torch.randn(MAX_PAGES, PAGE, hkv, DIM, generator=g) * 3).to(BF16)
    past_k, past_v = [], []  # dense (S - T, Hkv, D): k as the cache holds it (normed + roped)
    for r, s in enumerate(seq_lens):
        pk = torch.randn(s - tokens, hkv, DIM, generator=g).to(BF16)
        pv = torch.randn(s - tokens, hkv, DIM, generator=g).to(BF16)
        pages = indices[indptr[r] : indptr[r + 1]]
        for j in range(s - tokens):
            k_cache[pages[j // PAGE], j % PAGE] = pk[j]
            v_cache[pages[j // PAGE], j % PAGE] = pv[j]
        past_k.append(pk)
        past_v.append(pv)
    n = len(REQUESTS) * tokens
    q = torch.randn(n, hq, DIM, generator=g).to(BF16)
    k = torch.randn(n, hkv, DIM, generator=g).to(BF16)
    v = torch.randn(n, hkv, DIM, generator=g).to(BF16)
    # the fused qkv row: per KV group h, [G q heads | k_h | v_h]
    parts = []
    for h in range(hkv):
        parts += [q[:, h * group : (h + 1) * group].reshape(n, -1), k[:, h], v[:, h]]
    qkv = torch.cat(parts, dim=1)
    assert qkv.shape == (n, hkv * (group + 2) * DIM)
    cos, sin = _textbook_tables(max(seq_lens) + 2, DIM)
    return {
        "hq": hq, "hkv": hkv, "tokens": tokens, "seq_lens": seq_lens,
        "indptr": indptr, "indices": indices, "last": last,
        "k_cache": k_cache, "v_cache": v_cache, "past_k": past_k, "past_v": past_v,
        "q": q, "k": k, "v": v, "qkv": qkv,
        "q_norm": (torch.rand(DIM, generator=g) * 0.5 + 0.75).to(BF16),
        "k_norm": (torch.rand(DIM, generator=g) * 0.5 + 0.75).to(BF16),
        "cos": cos, "sin": sin,
    }


def _run_paged(sc: dict, **override) -> dict:
    sc = {**sc, **override}
    return ref.paged_attention_decode(
        sc["qkv"], sc["k_cache"], sc["v_cache"],
        torch.tensor(sc["indptr"], dtype=torch.int32),
        torch.tensor(sc["indices"], dtype=torch.int32),
        torch.tensor(sc["last"], dtype=torch.int32),
        sc["q_norm"], sc["k_norm"], sc["cos"], sc["sin"], sc["hq"], sc["hkv"], sc["tokens"])


def _dense(sc: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Contiguous-KV decode attention with F.rms_norm, inline RoPE and SDPA: the output
    (R*T, Hq*D) in float32 and, per request, the new keys (T, Hkv, D) as bf16."""
    hq, hkv, tokens = sc["hq"], sc["hkv"], sc["tokens"]
    outs, new_keys = [], []
    for r, s in enumerate(sc["seq_lens"]):
        rows = slice(r * tokens, (r + 1) * tokens)
        pos = torch.arange(s - tokens, s)
        cos, sin = sc["cos"][pos][:, None], sc["sin"][pos][:, None]  # (T, 1, D)
        q = F.rms_norm(sc["q"][rows].float(), (DIM,), sc["q_norm"].float(), eps=EPS)
        k = F.rms_norm(sc["k"][rows].float(), (DIM,), sc["k_norm"].float(), eps=EPS)
        q, k = _rope_inline(q, cos, sin), _rope_inline(k, cos, sin).to(BF16)
        new_keys.append(k)
        keys = torch.cat([sc["past_k"][r], k]).float()  # (S, Hkv, D)
        values = torch.cat([sc["past_v"][r], sc["v"][rows]]).float()
        keys = keys.permute(1, 0, 2).repeat_interleave(hq // hkv, dim=0)  # (Hq, S, D)
        values = values.permute(1, 0, 2).repeat_interleave(hq // hkv, dim=0)
        mask = torch.arange(s)[None, :] <= pos[:, None]  # (T, S)
        o = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys[None], values[None],
                                           attn_mask=mask)  # (1, Hq, T, D)
        outs.append(o[0].permute(1, 0, 2).reshape(tokens, hq * DIM))
    return torch.cat(outs), new_keys


HEADS = pytest.mark.parametrize("hq,hkv", [(4, 2), (2, 2)], ids=["gqa", "mha"])
TOKENS = pytest.mark.parametrize("tokens", [1, 3])


@HEADS
@TOKENS
def test_paged_decode_matches_dense_sdpa(hq, hkv, tokens):
    sc = _make_scenario(hq, hkv, tokens, seed=100 + 10 * hq + tokens)
    k_before, v_before = sc["k_cache"].clone(), sc["v_cache"].clone()
    res = _run_paged(sc)
    assert res["out"].shape == (len(REQUESTS) * tokens, hq * DIM) and res["out"].dtype == BF16
    want, _ = _dense(sc)
    torch.testing.assert_close(res["out"].float(), want.to(BF16).float(), rtol=1e-2, atol=1e-2)
    # the inputs are left alone
    assert torch.equal(sc["k_cache"], k_before) and torch.equal(sc["v_cache"], v_before)


@HEADS
@TOKENS
def test_paged_decode_writes_normed_roped_k_and_raw_v_to_its_slots_only(hq, hkv, tokens):
    sc = _make_scenario(hq, hkv, tokens, seed=200 + 10 * hq + tokens)
    res = _run_paged(sc)
    _, new_keys = _dense(sc)
    want_k, want_v = sc["k_cache"].clone(), sc["v_cache"].clone()
    written = torch.zeros(MAX_PAGES, PAGE, dtype=torch.bool)
    for r, s in enumerate(sc["seq_lens"]):
        pages = sc["indices"][sc["indptr"][r] : sc["indptr"][r + 1]]
        for t in range(tokens):
            p = s - tokens + t
            page, slot = pages[p // PAGE], p % PAGE
            want_k[page, slot] = new_keys[r][t]
            want_v[page, slot] = sc["v"][r * tokens + t]
            written[page, slot] = True
    assert torch.equal(res["v_cache"], want_v)
    # everything not written (unowned pages, past tokens, free slots) is bit-for-bit the same
    assert torch.equal(res["k_cache"][~written], sc["k_cache"][~written])
    # the new k: normed then roped, rounded once to bf16 (allow a 1-ulp rounding difference)
    torch.testing.assert_close(res["k_cache"][written].float(), want_k[written].float(),
                               rtol=BF16_ULP, atol=1e-3)


@HEADS
def test_paged_decode_masked_keys_do_not_matter_visible_ones_do(hq, hkv):
    tokens = 3
    sc = _make_scenario(hq, hkv, tokens, seed=300 + hq)
    base = _run_paged(sc)["out"]
    r = 0  # seq_len 12, new tokens at positions 9, 10, 11
    rows = [r * tokens + t for t in range(tokens)]
    group = hq // hkv
    # scramble k and v of the last new token (position 11): invisible to tokens 0 and 1
    qkv = sc["qkv"].clone()
    for h in range(hkv):
        lo = (h * (group + 2) + group) * DIM
        qkv[rows[2], lo : lo + 2 * DIM] = torch.randn(2 * DIM, generator=gen(7)).to(BF16) * 4
    out = _run_paged(sc, qkv=qkv)["out"]
    assert torch.equal(out[rows[:2]], base[rows[:2]])
    assert not torch.equal(out[rows[2]], base[rows[2]])
    others = [i for i in range(base.shape[0]) if i not in rows]
    assert torch.equal(out[others], base[others])
    # scramble the free slots past seq_len of request 3 (seq_len 14 in 4 pages of 4)
    r3_last = sc["indices"][sc["indptr"][4] - 1]
    k_cache, v_cache = sc["k_cache"].clone(), sc["v_cache"].clone()
    k_cache[r3_last, 2:] = 40.0
    v_cache[r3_last, 2:] = -40.0
    assert torch.equal(_run_paged(sc, k_cache=k_cache, v_cache=v_cache)["out"], base)
    # scramble a visible past key of request 0 (position 1): all of its tokens change
    k_cache = sc["k_cache"].clone()
    k_cache[sc["indices"][0], 1] = torch.randn(hkv, DIM, generator=gen(8)).to(BF16) * 4
    out = _run_paged(sc, k_cache=k_cache)["out"]
    for row in rows:
        assert not torch.equal(out[row], base[row])
    assert torch.equal(out[others], base[others])


def test_paged_decode_rejects_inconsistent_heads():
    sc = _make_scenario(4, 2, 1, seed=400)
    with pytest.raises(ValueError):
        _run_paged(sc, hkv=1)
    with pytest.raises(ValueError):
        _run_paged(sc, hq=3)


# ------------------------------------------------------------------------- split-KV attention
def _dense_attention64(q, k, v):
    scores = torch.einsum("hd,shd->hs", q.double(), k.double()) / math.sqrt(q.shape[-1])
    out = torch.einsum("hs,shd->hd", torch.softmax(scores, -1), v.double())
    return out, torch.logsumexp(scores, -1)


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 16])
def test_split_kv_merge_equals_dense_attention(chunk):
    seq, heads = 10, 3
    q = randn(heads, DIM, seed=30, dtype=torch.float32)
    k = randn(seq, heads, DIM, seed=31, dtype=torch.float32, scale=2.0)
    v = randn(seq, heads, DIM, seed=32, dtype=torch.float32)
    res = ref.attention_split_kv(q, k, v, chunk)
    want_out, want_lse = _dense_attention64(q, k, v)
    assert res["out"].shape == (heads, DIM) and res["out"].dtype == torch.float32
    assert res["lse"].shape == (heads,)
    torch.testing.assert_close(res["out"].double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res["lse"].double(), want_lse, rtol=1e-5, atol=1e-5)
    sdpa = F.scaled_dot_product_attention(q[:, None], k.permute(1, 0, 2), v.permute(1, 0, 2))
    torch.testing.assert_close(res["out"], sdpa[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [3, 16])
def test_split_kv_bf16_output(chunk):
    seq, heads = 10, 2
    q, k = randn(heads, DIM, seed=33), randn(seq, heads, DIM, seed=34)
    v = randn(seq, heads, DIM, seed=35)
    res = ref.attention_split_kv(q, k, v, chunk)
    assert res["out"].dtype == BF16
    want_out, want_lse = _dense_attention64(q, k, v)
    torch.testing.assert_close(res["out"].double(), want_out, rtol=BF16_ULP, atol=1e-3)
    torch.testing.assert_close(res["lse"].double(), want_lse, rtol=1e-5, atol=1e-5)


def test_attention_partial_and_merge_of_uneven_parts():
    heads = 2
    q = randn(heads, DIM, seed=36, dtype=torch.float32)
    k = randn(9, heads, DIM, seed=37, dtype=torch.float32, scale=2.0)
    v = randn(9, heads, DIM, seed=38, dtype=torch.float32)
    cuts = [(0, 2), (2, 7), (7, 9)]
    parts = []
    for a, b in cuts:
        out, lse = ref.attention_partial(q, k[a:b], v[a:b])
        want_out, want_lse = _dense_attention64(q, k[a:b], v[a:b])
        torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
        parts.append((out, lse))
    out, lse = ref.merge_attention([p[0] for p in parts], [p[1] for p in parts])
    want_out, want_lse = _dense_attention64(q, k, v)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ identity
def test_identity_is_an_equal_copy():
    x = randn(3, 5, seed=39)
    y = ref.identity(x)
    assert torch.equal(x, y) and y.dtype == x.dtype
    y[0, 0] = 123.0
    assert float(x[0, 0]) != 123.0


def test_the_smoke_ties_case_exposes_each_tie_and_padding_bug_in_its_own_row():
    from suites._hopper.readout import argmax_inputs

    params = {"b": 6, "vocab": 200, "chunk": 64, "values": "ties"}
    inputs = argmax_inputs(params, 0, 1)
    logits, chunk = inputs["logits"], inputs["chunk"]
    # worked out from the rows' construction: 21 and 129 tie; 70 and 96; all negative (the
    # first padded column, 200); 0.0 at 67 ties the padding; one 4.0 in each of the chunks
    # 0, 1, 2 (0, 71, 142); -0.0 at 32 ties the padded +0.0
    right = [21, 70, 200, 67, 0, 32]
    assert ref.argmax(logits, chunk).reshape(-1).tolist() == right
    padded = torch.cat([logits.float(), torch.zeros(6, 56)], dim=1)
    last_on_ties = [255 - int(padded[r].flip(0).argmax()) for r in range(6)]
    ignores_padding = [int(logits[r].float().argmax()) for r in range(6)]
    # -0.0 below +0.0: order by the sign-aware integer image of the float's bits
    bits = padded.view(torch.int32)
    ordered = torch.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)
    signed_zero_below = [int(ordered[r].argmax()) for r in range(6)]
    wrong_rows = {name: [r for r in range(6) if got[r] != right[r]] for name, got in (
        ("last_on_ties", last_on_ties), ("ignores_padding", ignores_padding),
        ("signed_zero_below", signed_zero_below))}
    assert wrong_rows == {"last_on_ties": [0, 1, 2, 3, 4, 5], "ignores_padding": [2],
                          "signed_zero_below": [5]}


def test_argmax_takes_the_first_nan_as_the_largest_value():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[4.0, 0.0, 1.0, nan, 2.0],     # NaN beats a larger number
                           [inf, nan, 0.0, nan, 1.0],     # the first NaN, after +inf
                           [-inf, -inf, -inf, -inf, -inf]])  # the padded 0 at index 5
    assert ref.argmax(logits, chunk=2).reshape(-1).tolist() == [3, 1, 5]
