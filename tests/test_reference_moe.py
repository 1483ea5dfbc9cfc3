"""Tests for reference_kernels.moe (router, Paddle's moe_permute / moe_unpermute, the expert
SwiGLU FFN and the whole MoE layer).

Every expected value is built independently of the code under test: the router by a
pure-Python per-token sort with key (-logit, expert) and a float64 softmax; the permuted layout
by a loop over tokens (the reference loops over experts) that hands out each expert's next free
row; counts, padded counts and offsets written out literally; the unpermute as a float64 sum;
the expert FFN and the layer as per-row / per-token float64 computations with the rounding
points of the specification. ``reference_kernels.fp8`` is only used to make quantized inputs
(``quantize``) and to read their values back (``dequantize``); it has its own tests.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from reference_kernels import fp8, moe

BF16 = torch.bfloat16
F8 = torch.float8_e4m3fn
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ------------------------------------------------------------------ helpers
def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32
          ) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (an integer view of the same size)."""
    return t.contiguous().view(_INT_VIEW[t.element_size()])


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    assert torch.equal(bits(actual), bits(expected))


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 ulps (representable values between a and b), elementwise."""
    def key(t: torch.Tensor) -> torch.Tensor:
        i = t.to(BF16).view(torch.int16).int()
        return torch.where(i < 0, -(i + 32768), i)   # sign-magnitude -> ordered integers
    return (key(a) - key(b)).abs()


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2<x,y> / (|x|^2 + |y|^2) in float64 (written here, not taken from fp8)."""
    x64, y64 = x.double(), y.double()
    denom = float((x64 * x64 + y64 * y64).sum())
    return 0.0 if denom == 0 else 1 - 2 * float((x64 * y64).sum()) / denom


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / |e| over the nonzero expected values; zeros must be reproduced exactly."""
    a, e = actual.double(), expected.double()
    zero = e == 0
    assert torch.equal(a[zero], e[zero])
    return float(((a - e).abs()[~zero] / e.abs()[~zero]).max())


def to_bf16(t: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 -> float64 (a rounding point)."""
    return t.to(BF16).double()


def silu64(g: torch.Tensor) -> torch.Tensor:
    return g / (1 + torch.exp(-g))


# ------------------------------------------------------------------ independent models
def brute_router(logits: torch.Tensor, topk: int, renormalize: bool
                 ) -> tuple[list[list[float]], list[list[int]]]:
    """Per token: experts sorted by (-logit, expert), float64 softmax probabilities."""
    all_probs, all_routes = [], []
    for row in logits.double().tolist():
        top = max(row)
        ex = [math.exp(v - top) for v in row]
        z = math.fsum(ex)
        order = sorted(range(len(row)), key=lambda e: (-row[e], e))[:topk]
        p = [ex[e] / z for e in order]
        if renormalize:
            t = math.fsum(p)
            p = [v / t for v in p]
        all_probs.append(p)
        all_routes.append(order)
    return all_probs, all_routes


def make_routes(seed: int, tokens: int, experts: int, topk: int, *, hole_rate: float = 0.0,
                unused_experts: tuple[int, ...] = (), empty_tokens: tuple[int, ...] = ()
                ) -> list[list[int]]:
    """A routemap as Python lists: distinct experts per token, -1 holes anywhere."""
    rng = random.Random(seed)
    pool = [e for e in range(experts) if e not in unused_experts]
    routes = []
    for s in range(tokens):
        row = rng.sample(pool, topk)
        row = [-1 if rng.random() < hole_rate else e for e in row]
        if s in empty_tokens:
            row = [-1] * topk
        routes.append(row)
    return routes


def make_probs(seed: int, routes: list[list[int]], junk: float = 0.0) -> torch.Tensor:
    """float32 probs summing to 1 over each token's used slots; ``junk`` in the -1 slots."""
    rng = random.Random(seed)
    rows = []
    for route in routes:
        w = [rng.uniform(0.2, 1.0) if e >= 0 else 0.0 for e in route]
        t = sum(w) or 1.0
        rows.append([v / t if e >= 0 else junk for v, e in zip(w, route, strict=True)])
    return torch.tensor(rows, dtype=torch.float32)


def routemap_tensor(routes: list[list[int]]) -> torch.Tensor:
    return torch.tensor(routes, dtype=torch.int32)


def counts_of(routes: list[list[int]], experts: int) -> list[int]:
    counts = [0] * experts
    for route in routes:
        for e in route:
            if e >= 0:
                counts[e] += 1
    return counts


def offsets_of(counts: list[int], align: int) -> tuple[list[int], int]:
    """(offset of each expert, total rows) with every count rounded up to the alignment."""
    offsets, total = [], 0
    for c in counts:
        offsets.append(total)
        total += math.ceil(c / align) * align
    return offsets, total


def expected_permute(hidden: torch.Tensor, scale: torch.Tensor | None,
                     routes: list[list[int]], probs: torch.Tensor, experts: int, align: int):
    """The permuted layout built token by token: token s takes the next free row of each of its
    experts, so every expert's rows come out in ascending token order."""
    tokens, width = hidden.shape
    offsets, total = offsets_of(counts_of(routes, experts), align)
    rows = torch.zeros(total, width, dtype=hidden.dtype)
    pprobs = torch.zeros(total, dtype=torch.float32)
    pscale = None if scale is None else torch.zeros(total, scale.shape[1], dtype=scale.dtype)
    rowmap = [[-1] * experts for _ in range(tokens)]
    nxt = list(offsets)
    for s in range(tokens):
        for j, e in enumerate(routes[s]):
            if e < 0:
                continue
            r = nxt[e]
            nxt[e] += 1
            rows[r] = hidden[s]
            pprobs[r] = probs[s, j]
            if pscale is not None:
                pscale[r] = scale[s]
            rowmap[s][e] = r
    return rows, torch.tensor(rowmap, dtype=torch.int32), pprobs, pscale


def ffn_row64(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, rounding: bool = True
              ) -> torch.Tensor:
    """SwiGLU of one row in float64; with ``rounding`` the bf16 rounding points of the spec
    (gu and h rounded to bf16, the output left unrounded)."""
    inter = w13.shape[0] // 2
    gu = w13.double() @ x.double()
    if rounding:
        gu = to_bf16(gu)
    h = silu64(gu[:inter]) * gu[inter:]
    if rounding:
        h = to_bf16(h)
    return w2.double() @ h


# ------------------------------------------------------------------ router
ROUTER_CASES = [  # (seed, tokens, experts, topk)
    (0, 9, 8, 2), (1, 5, 6, 1), (2, 7, 5, 5), (3, 12, 16, 4), (4, 3, 3, 3),
]


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("seed,tokens,experts,topk", ROUTER_CASES)
def test_router_matches_brute_force(seed, tokens, experts, topk, dtype, renormalize):
    logits = randn(tokens, experts, seed=seed, scale=2.0, dtype=dtype)
    probs, routemap = moe.router(logits, topk, renormalize)
    exp_probs, exp_routes = brute_router(logits, topk, renormalize)
    assert routemap.dtype == torch.int32 and probs.dtype == torch.float32
    assert routemap.shape == probs.shape == (tokens, topk)
    assert routemap.tolist() == exp_routes
    torch.testing.assert_close(probs, torch.tensor(exp_probs, dtype=torch.float32),
                               rtol=2e-6, atol=1e-7)
    assert (probs[:, :-1] >= probs[:, 1:]).all()
    if renormalize:
        torch.testing.assert_close(probs.double().sum(1), torch.ones(tokens, dtype=torch.float64),
                                   rtol=0, atol=1e-6)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("seed", [5, 6])
def test_router_many_ties(seed, renormalize):
    """Small-integer logits: ties everywhere; lower expert index first."""
    logits = torch.randint(-2, 3, (16, 7), generator=gen(seed)).to(BF16)
    probs, routemap = moe.router(logits, 4, renormalize)
    exp_probs, exp_routes = brute_router(logits, 4, renormalize)
    assert routemap.tolist() == exp_routes
    torch.testing.assert_close(probs, torch.tensor(exp_probs, dtype=torch.float32),
                               rtol=2e-6, atol=1e-7)


def test_router_exact_ties_literal():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0],
                           [-3.0, 0.0, -3.0, 0.0, 4.0]])
    _, routemap = moe.router(logits, 4)
    assert routemap.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3], [4, 1, 3, 0]]
    probs, routemap = moe.router(logits, 2, renormalize=True)
    assert routemap.tolist() == [[1, 2], [0, 1], [4, 1]]
    # equal logits give equal probabilities, renormalised: exactly one half each
    assert probs[0].tolist() == [0.5, 0.5] and probs[1].tolist() == [0.5, 0.5]
    probs, _ = moe.router(logits[1:2], 5)
    torch.testing.assert_close(probs, torch.full((1, 5), 0.2), rtol=1e-6, atol=0)


def test_router_signed_zero_is_a_tie():
    """+0.0 and -0.0 are the same logit: the lower expert index goes first."""
    logits = torch.tensor([[-0.0, 0.0, -0.0, 0.0, -1.0], [0.0, -0.0, 0.0, -0.0, -1.0]])
    _, routemap = moe.router(logits, 4)
    assert routemap.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]


@pytest.mark.parametrize("topk", [0, -1, 6, 100])
def test_router_topk_out_of_range(topk):
    with pytest.raises(ValueError):
        moe.router(torch.zeros(3, 5), topk)


# ------------------------------------------------------------------ counts and offsets
ROUTES_305 = [[0, 2], [2, -1], [0, 2], [2, 0], [-1, 2]]   # expert 0: 3, 1: 0, 2: 5 tokens


def test_tokens_per_expert_literal():
    assert moe.tokens_per_expert(routemap_tensor(ROUTES_305), 3) == [3, 0, 5]
    assert moe.tokens_per_expert(routemap_tensor(ROUTES_305), 5) == [3, 0, 5, 0, 0]
    assert moe.tokens_per_expert(routemap_tensor([[-1, -1], [-1, -1]]), 3) == [0, 0, 0]
    assert moe.tokens_per_expert(routemap_tensor([[-1, 1, 3], [3, -1, 0]]), 4) == [1, 1, 0, 2]


@pytest.mark.parametrize("align,padded,offsets", [
    (1, [3, 0, 5], [0, 3, 3]),
    (4, [4, 0, 8], [0, 4, 4]),
    (5, [5, 0, 5], [0, 5, 5]),
    (8, [8, 0, 8], [0, 8, 8]),
    (128, [128, 0, 128], [0, 128, 128]),
])
def test_padded_counts_and_offsets_literal(align, padded, offsets):
    assert moe.padded_counts([3, 0, 5], align) == padded
    assert moe.expert_offsets([3, 0, 5], align) == offsets


def test_offsets_more_literal():
    assert moe.padded_counts([0, 0, 1, 16, 17], 16) == [0, 0, 16, 16, 32]
    assert moe.expert_offsets([0, 0, 1, 16, 17], 16) == [0, 0, 0, 16, 32]
    assert moe.expert_offsets([7, 2, 9, 4], 3) == [0, 9, 12, 21]
    assert moe.expert_offsets([], 4) == []


@pytest.mark.parametrize("align", [0, -1, -128])
def test_alignment_below_one_raises(align):
    with pytest.raises(ValueError):
        moe.padded_counts([3, 0, 5], align)
    with pytest.raises(ValueError):
        moe.expert_offsets([3, 0, 5], align)


def test_tokens_per_expert_expert_out_of_range():
    with pytest.raises(ValueError):
        moe.tokens_per_expert(routemap_tensor([[0, 3], [1, 2]]), 3)
    with pytest.raises(ValueError):
        moe.tokens_per_expert(routemap_tensor(ROUTES_305), 2)


def test_a_routemap_slot_below_minus_one_is_rejected():
    with pytest.raises(ValueError, match="unused slots are -1"):
        moe.tokens_per_expert(routemap_tensor([[0, -2], [1, 2]]), 3)


# ------------------------------------------------------------------ moe_permute
PERMUTE_CASES = [  # (seed, tokens, experts, topk, hole_rate, unused experts, empty tokens, align)
    (10, 13, 6, 2, 0.0, (), (), 1),
    (11, 13, 6, 2, 0.3, (1, 5), (4,), 4),
    (12, 20, 8, 3, 0.4, (0, 3), (0, 19), 16),
    (13, 9, 4, 4, 0.0, (), (), 8),
    (14, 7, 5, 2, 0.5, (2,), (3,), 128),
]


def permute_inputs(case, fmt):
    seed, tokens, experts, topk, hole_rate, unused, empty, align = case
    routes = make_routes(seed, tokens, experts, topk, hole_rate=hole_rate,
                         unused_experts=unused, empty_tokens=empty)
    probs = make_probs(seed + 100, routes, junk=0.375)
    x = randn(tokens, 200, seed=seed, scale=3.0)
    if fmt == "bf16":
        hidden, scale = x.to(BF16), None
    else:
        hidden, scale = fp8.quantize(x, "e4m3", "token")
        assert hidden.dtype == F8 and scale.shape == (tokens, 2)
    return routes, probs, hidden, scale, experts, align


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("case", PERMUTE_CASES)
def test_permute_matches_token_loop(case, fmt):
    routes, probs, hidden, scale, experts, align = permute_inputs(case, fmt)
    tpe = counts_of(routes, experts)
    rows, rowmap, pprobs, pscale = moe.moe_permute(
        hidden, scale, routemap_tensor(routes), probs, experts, tpe, align)
    e_rows, e_rowmap, e_pprobs, e_pscale = expected_permute(
        hidden, scale, routes, probs, experts, align)
    assert_bitwise(rows, e_rows)
    assert_bitwise(rowmap, e_rowmap)
    assert_bitwise(pprobs, e_pprobs)
    if scale is None:
        assert pscale is None
    else:
        assert_bitwise(pscale, e_pscale)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("case", PERMUTE_CASES)
def test_permute_layout_properties(case, fmt):
    routes, probs, hidden, scale, experts, align = permute_inputs(case, fmt)
    tpe = counts_of(routes, experts)
    rows, rowmap, pprobs, pscale = moe.moe_permute(
        hidden, scale, routemap_tensor(routes), probs, experts, tpe, align)
    offsets, total = offsets_of(tpe, align)
    assert rows.shape == (total, hidden.shape[1]) and pprobs.shape == (total,)
    assert rowmap.shape == (len(routes), experts) and rowmap.dtype == torch.int32
    real = torch.zeros(total, dtype=torch.bool)
    for e in range(experts):
        mine = [s for s, route in enumerate(routes) if e in route]   # ascending tokens
        assert len(mine) == tpe[e]
        seg = slice(offsets[e], offsets[e] + len(mine))
        real[seg] = True
        if mine:
            assert torch.equal(bits(rows[seg]), bits(hidden[mine]))
            if scale is not None:
                assert torch.equal(pscale[seg], scale[mine])
        for s in range(len(routes)):
            want = offsets[e] + mine.index(s) if s in mine else -1
            assert int(rowmap[s, e]) == want
    # padding rows (and nothing else) are exactly zero in data, probs and scales
    pad = ~real
    assert (bits(rows[pad]) == 0).all() and (bits(pprobs[pad]) == 0).all()
    if pscale is not None:
        assert (bits(pscale[pad]) == 0).all()
    # every expert with zero tokens owns no rows: the next expert starts at the same offset
    for e in range(experts - 1):
        if tpe[e] == 0:
            assert offsets[e + 1] == offsets[e]


def test_permute_literal_small():
    """Three tokens, three experts, align 2, a -1 hole in the first slot."""
    hidden = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=BF16)
    routemap = routemap_tensor([[-1, 2], [2, 0], [0, -1]])
    probs = torch.tensor([[0.9, 1.0], [0.25, 0.75], [1.0, 0.5]])
    rows, rowmap, pprobs, pscale = moe.moe_permute(hidden, None, routemap, probs, 3, [2, 0, 2], 2)
    assert pscale is None
    assert rows.float().tolist() == [[3, 4], [5, 6], [1, 2], [3, 4]]
    assert rowmap.tolist() == [[-1, -1, 2], [0, -1, 3], [1, -1, -1]]
    assert pprobs.tolist() == [0.75, 1.0, 1.0, 0.25]
    rows, rowmap, pprobs, _ = moe.moe_permute(hidden, None, routemap, probs, 3, [2, 0, 2], 4)
    assert rows.float().tolist() == [[3, 4], [5, 6], [0, 0], [0, 0],
                                     [1, 2], [3, 4], [0, 0], [0, 0]]
    assert rowmap.tolist() == [[-1, -1, 4], [0, -1, 5], [1, -1, -1]]
    assert pprobs.tolist() == [0.75, 1.0, 0, 0, 1.0, 0.25, 0, 0]


def test_permute_unpermute_no_routed_tokens():
    """A routemap of -1 only: no rows at all, rowmap all -1, zero output and zero probs."""
    hidden = randn(3, 4, seed=60, dtype=BF16)
    routemap = torch.full((3, 2), -1, dtype=torch.int32)
    rows, rowmap, pprobs, _ = moe.moe_permute(hidden, None, routemap, torch.ones(3, 2), 3,
                                              [0, 0, 0], 4)
    assert rows.shape == (0, 4) and pprobs.shape == (0,)
    assert rowmap.tolist() == [[-1, -1, -1]] * 3
    out, back = moe.moe_unpermute(rows, rowmap, routemap, pprobs, 3, 3)
    assert_bitwise(out, torch.zeros(3, 4, dtype=BF16))
    assert_bitwise(back, torch.zeros(3, 2))


def test_permute_wrong_tokens_per_expert():
    routes = [[0, 2], [2, -1], [0, 2]]
    hidden, probs = torch.zeros(3, 4, dtype=BF16), make_probs(0, routes)
    for tpe in ([2, 0, 2], [2, 1, 3], [2, 0], [2, 0, 3, 0]):
        with pytest.raises(ValueError):
            moe.moe_permute(hidden, None, routemap_tensor(routes), probs, 3, tpe, 1)


def test_permute_duplicate_expert_in_token():
    routes = [[1, 1], [0, -1], [1, 0]]
    hidden, probs = torch.zeros(3, 4, dtype=BF16), torch.full((3, 2), 0.5)
    for tpe in ([2, 3], [2, 2]):   # counted with and without the duplicate
        with pytest.raises(ValueError):
            moe.moe_permute(hidden, None, routemap_tensor(routes), probs, 2, tpe, 1)


def test_permute_shape_mismatch():
    routes = [[0, 1], [1, -1], [0, 1]]
    hidden = torch.zeros(3, 4, dtype=BF16)
    rm = routemap_tensor(routes)
    with pytest.raises(ValueError):      # probs [S, topk + 1]
        moe.moe_permute(hidden, None, rm, torch.zeros(3, 3), 2, [2, 3], 1)
    with pytest.raises(ValueError):      # probs [S - 1, topk]
        moe.moe_permute(hidden, None, rm, torch.zeros(2, 2), 2, [2, 3], 1)
    with pytest.raises(ValueError):      # routemap for S + 1 tokens
        rm4 = routemap_tensor(routes + [[0, -1]])
        moe.moe_permute(hidden, None, rm4, torch.zeros(4, 2), 2, [3, 3], 1)
    with pytest.raises(ValueError):      # expert id >= E
        moe.moe_permute(hidden, None, routemap_tensor([[0, 2], [1, -1], [0, 1]]),
                        torch.zeros(3, 2), 2, [2, 2], 1)


# ------------------------------------------------------------------ moe_unpermute
UNPERMUTE_CASES = [  # (seed, tokens, experts, topk, hole_rate, unused, empty tokens, align)
    (20, 11, 5, 2, 0.0, (), (), 1),
    (21, 17, 8, 4, 0.3, (2,), (5, 16), 8),
    (22, 9, 3, 3, 0.4, (), (0,), 4),
]


def unpermute_inputs(case, values):
    seed, tokens, experts, topk, hole_rate, unused, empty, align = case
    routes = make_routes(seed, tokens, experts, topk, hole_rate=hole_rate,
                         unused_experts=unused, empty_tokens=empty)
    probs = make_probs(seed + 1, routes, junk=0.625)
    _, rowmap, pprobs, _ = expected_permute(torch.zeros(tokens, 1), None, routes, probs,
                                            experts, align)
    rows = pprobs.shape[0]
    if values == "ints":
        permuted = torch.randint(-8, 9, (rows, 40), generator=gen(seed)).float()
    else:
        permuted = randn(rows, 40, seed=seed, scale=4.0)
    return routes, probs, rowmap, pprobs, permuted, tokens, experts


def sum64(permuted: torch.Tensor, routes, rowmap) -> torch.Tensor:
    out = torch.zeros(len(routes), permuted.shape[1], dtype=torch.float64)
    for s, route in enumerate(routes):
        for e in route:
            if e >= 0:
                out[s] += permuted[int(rowmap[s, e])].double()
    return out


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("case", UNPERMUTE_CASES)
def test_unpermute_small_integers_exact(case, dtype):
    routes, probs, rowmap, pprobs, permuted, tokens, experts = unpermute_inputs(case, "ints")
    permuted = permuted.to(dtype)
    out, _ = moe.moe_unpermute(permuted, rowmap, routemap_tensor(routes), pprobs, tokens,
                               experts)
    assert out.dtype == dtype and out.shape == (tokens, permuted.shape[1])
    assert torch.equal(out.double(), sum64(permuted, routes, rowmap))   # not weighted by probs


@pytest.mark.parametrize("case", UNPERMUTE_CASES)
def test_unpermute_random_within_one_ulp(case):
    routes, probs, rowmap, pprobs, permuted, tokens, experts = unpermute_inputs(case, "rand")
    permuted = permuted.to(BF16)
    out, _ = moe.moe_unpermute(permuted, rowmap, routemap_tensor(routes), pprobs, tokens,
                               experts)
    expected = sum64(permuted, routes, rowmap).to(BF16)
    assert int(bf16_ulps(out, expected).max()) <= 1
    for s, route in enumerate(routes):                 # tokens with no expert: zero rows
        if all(e < 0 for e in route):
            assert (bits(out[s]) == 0).all()


@pytest.mark.parametrize("case", UNPERMUTE_CASES)
def test_unpermute_does_not_weight_by_probs(case):
    routes, _, rowmap, pprobs, permuted, tokens, experts = unpermute_inputs(case, "ints")
    permuted = permuted.to(BF16)
    rm = routemap_tensor(routes)
    a, _ = moe.moe_unpermute(permuted, rowmap, rm, pprobs, tokens, experts)
    other = pprobs * 3 + 1
    b, pb = moe.moe_unpermute(permuted, rowmap, rm, other, tokens, experts)
    assert_bitwise(a, b)
    assert_bitwise(a, sum64(permuted, routes, rowmap).to(BF16))
    # the probs handed in come back per slot (0 for -1 slots) but never touch the rows
    assert pb.tolist() == [[float(other[int(rowmap[s, e])]) if e >= 0 else 0.0 for e in route]
                           for s, route in enumerate(routes)]


@pytest.mark.parametrize("case", UNPERMUTE_CASES + [(23, 10, 6, 3, 0.0, (), (), 2)])
def test_unpermute_gives_back_probs(case):
    """Probs permuted by moe_permute come back bitwise; -1 slots give 0 (even with junk)."""
    seed, tokens, experts, topk, hole_rate, unused, empty, align = case
    routes = make_routes(seed, tokens, experts, topk, hole_rate=hole_rate,
                         unused_experts=unused, empty_tokens=empty)
    probs = make_probs(seed + 1, routes, junk=0.625)
    rm = routemap_tensor(routes)
    hidden = randn(tokens, 8, seed=seed, dtype=BF16)
    rows, rowmap, pprobs, _ = moe.moe_permute(hidden, None, rm, probs, experts,
                                              counts_of(routes, experts), align)
    _, back = moe.moe_unpermute(rows, rowmap, rm, pprobs, tokens, experts)
    expected = torch.tensor([[float(probs[s, j]) if e >= 0 else 0.0
                              for j, e in enumerate(route)] for s, route in enumerate(routes)],
                            dtype=torch.float32)
    assert_bitwise(back, expected)
    if hole_rate == 0 and not empty:
        assert_bitwise(back, probs)


ROUNDTRIP_CASES = [  # every token keeps at least one expert
    (30, 16, 6, 2, 0.0, (), 1),
    (31, 24, 8, 4, 0.3, (1, 6), 16),
    (32, 12, 4, 3, 0.5, (), 128),
]


def roundtrip_routes(case):
    seed, tokens, experts, topk, hole_rate, unused, align = case
    routes = make_routes(seed, tokens, experts, topk, hole_rate=hole_rate,
                         unused_experts=unused)
    for route in routes:
        if all(e < 0 for e in route):
            route[0] = next(e for e in range(experts) if e not in unused)
    return routes, make_probs(seed + 7, routes, junk=0.5), experts, align


@pytest.mark.parametrize("case", ROUNDTRIP_CASES)
def test_roundtrip_bf16(case):
    routes, probs, experts, align = roundtrip_routes(case)
    rm = routemap_tensor(routes)
    x = randn(len(routes), 160, seed=case[0], dtype=BF16)
    rows, rowmap, pprobs, _ = moe.moe_permute(x, None, rm, probs, experts,
                                              counts_of(routes, experts), align)
    weighted = (rows.float() * pprobs[:, None]).to(BF16)
    out, _ = moe.moe_unpermute(weighted, rowmap, rm, pprobs, len(routes), experts)
    assert out.dtype == BF16
    assert max_rel_err(out, x) < 1e-2


@pytest.mark.parametrize("case", ROUNDTRIP_CASES)
def test_roundtrip_fp8(case):
    routes, probs, experts, align = roundtrip_routes(case)
    rm = routemap_tensor(routes)
    x8, xs = fp8.quantize(randn(len(routes), 300, seed=case[0], scale=5.0), "e4m3", "token")
    rows, rowmap, pprobs, pscale = moe.moe_permute(x8, xs, rm, probs, experts,
                                                   counts_of(routes, experts), align)
    assert rows.dtype == F8 and pscale.shape == (rows.shape[0], 3)
    weighted = (rows.float() * pprobs[:, None]).to(BF16)
    out, _ = moe.moe_unpermute(weighted, rowmap, rm, pprobs, len(routes), experts)
    assert max_rel_err(out, x8.float()) < 1e-1


def test_unpermute_rowmap_wrong_shape():
    permuted = torch.zeros(4, 3, dtype=BF16)
    rm = routemap_tensor([[0, 1], [1, -1]])
    pp = torch.zeros(4)
    good = torch.tensor([[0, 2], [-1, 3]], dtype=torch.int32)
    moe.moe_unpermute(permuted, good, rm, pp, 2, 2)       # the right shape is accepted
    for bad in (torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3, 2, dtype=torch.int32),
                torch.zeros(4, dtype=torch.int32), good.T.contiguous()[:1]):
        with pytest.raises(ValueError):
            moe.moe_unpermute(permuted, bad, rm, pp, 2, 2)


def test_unpermute_rejects_a_routemap_the_rowmap_disagrees_with():
    permuted = torch.zeros(4, 3, dtype=BF16)
    rowmap = torch.tensor([[0, 2], [-1, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match="rowmap entry is -1"):  # token 1 never went to 0
        moe.moe_unpermute(permuted, rowmap, routemap_tensor([[0, 1], [0, 1]]), torch.zeros(4),
                          2, 2)


def test_expert_ffn_rejects_rows_that_do_not_match_the_padded_layout():
    w13, w2 = torch.zeros(2, 4, 8, dtype=BF16), torch.zeros(2, 8, 2, dtype=BF16)
    x = torch.zeros(5, 8, dtype=BF16)  # tokens [3, 1] at alignment 4 make 8 rows
    with pytest.raises(ValueError, match="padded layout"):
        moe.expert_ffn(x, None, w13, None, w2, None, [3, 1], 4)


# ------------------------------------------------------------------ expert FFN
FFN_CASES = [  # (seed, tokens per expert, align, hidden, inter)
    (40, [5, 0, 3, 7], 8, 256, 64),
    (41, [1, 4, 0, 0, 2], 1, 128, 96),
    (42, [3, 6], 128, 200, 72),
]


def ffn_inputs(case, garbage_padding=False):
    seed, tpe, align, hidden, inter = case
    experts = len(tpe)
    offsets, total = offsets_of(tpe, align)
    x = randn(total, hidden, seed=seed)
    real = torch.zeros(total, dtype=torch.bool)
    for o, t in zip(offsets, tpe, strict=True):
        real[o:o + t] = True
    if not garbage_padding:
        x[~real] = 0
    w13 = randn(experts, 2 * inter, hidden, seed=seed + 1, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, inter, seed=seed + 2, scale=inter ** -0.5)
    return tpe, align, offsets, real, x, w13, w2


def expert_of_rows(tpe, offsets):
    for e, (o, t) in enumerate(zip(offsets, tpe, strict=True)):
        for r in range(o, o + t):
            yield e, r


@pytest.mark.parametrize("garbage_padding", [False, True])
@pytest.mark.parametrize("case", FFN_CASES)
def test_expert_ffn_bf16_rows(case, garbage_padding):
    tpe, align, offsets, real, x, w13, w2 = ffn_inputs(case, garbage_padding)
    x, w13, w2 = x.to(BF16), w13.to(BF16), w2.to(BF16)
    out = moe.expert_ffn(x, None, w13, None, w2, None, tpe, align)
    assert out.dtype == BF16 and out.shape == (x.shape[0], w2.shape[1])
    assert (bits(out[~real]) == 0).all()
    exp32 = torch.zeros(out.shape, dtype=BF16)     # same rounding points, float32, per row
    exp64 = torch.zeros(out.shape, dtype=torch.float64)
    inter = w13.shape[1] // 2
    for e, r in expert_of_rows(tpe, offsets):
        gu = (w13[e].float() @ x[r].float()).to(BF16).float()
        g, u = gu[:inter], gu[inter:]
        h = (g / (1 + torch.exp(-g)) * u).to(BF16).float()
        exp32[r] = (w2[e].float() @ h).to(BF16)
        exp64[r] = ffn_row64(x[r], w13[e], w2[e])
    assert int(bf16_ulps(out[real], exp32[real]).max()) <= 1
    assert int(bf16_ulps(out[real], exp64[real].to(BF16)).max()) <= 1
    assert calc_diff(out[real], exp64[real]) < 1e-5
    torch.testing.assert_close(out[real].double(), exp64[real], rtol=2e-2, atol=2e-2)


def quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pieces = [fp8.quantize(w[e], "e4m3", "block") for e in range(w.shape[0])]
    return torch.stack([q for q, _ in pieces]), torch.stack([s for _, s in pieces])


def dequantize_experts(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.stack([fp8.dequantize(q[e], s[e], "block") for e in range(q.shape[0])])


@pytest.mark.parametrize("case", FFN_CASES)
def test_expert_ffn_fp8(case):
    tpe, align, offsets, real, x, w13, w2 = ffn_inputs(case)
    x, w13, w2 = x.to(BF16), w13.to(BF16), w2.to(BF16)
    x8, xs = fp8.quantize(x, "e4m3", "token")
    xs[~real] = 0                                   # as moe_permute leaves padding scales
    w13q, w13s = quantize_experts(w13)
    w2q, w2s = quantize_experts(w2)
    hidden, inter = x.shape[1], w13.shape[1] // 2
    assert w13s.shape == (len(tpe), math.ceil(2 * inter / 128), math.ceil(hidden / 128))
    out = moe.expert_ffn(x8, xs, w13q, w13s, w2q, w2s, tpe, align, "e4m3")
    assert out.dtype == BF16 and (bits(out[~real]) == 0).all()
    xd = fp8.dequantize(x8, xs, "token")
    w13d, w2d = dequantize_experts(w13q, w13s), dequantize_experts(w2q, w2s)
    exp_q = torch.zeros(out.shape, dtype=torch.float64)    # from the dequantized values
    exp_b = torch.zeros(out.shape, dtype=torch.float64)    # the unquantized bf16 values
    exp_h = torch.zeros(out.shape, dtype=torch.float64)    # gu to bf16, h quantized 1x128
    for e, r in expert_of_rows(tpe, offsets):
        exp_q[r] = ffn_row64(xd[r], w13d[e], w2d[e], rounding=False)
        exp_b[r] = ffn_row64(x[r], w13[e], w2[e])
        gu = to_bf16(w13d[e].double() @ xd[r].double())
        h = silu64(gu[:inter]) * gu[inter:]
        hq = fp8.dequantize(*fp8.quantize(h[None], "e4m3", "token"), "token")[0]
        exp_h[r] = w2d[e].double() @ hq.double()
    assert calc_diff(out[real], exp_q[real]) < 1e-3
    assert calc_diff(out[real], exp_h[real]) < 1e-5      # the documented rounding points
    assert calc_diff(out[real], exp_b[real]) < 4e-3
    bf16_path = moe.expert_ffn(x, None, w13, None, w2, None, tpe, align)
    assert calc_diff(out[real], bf16_path[real]) < 4e-3


# ------------------------------------------------------------------ the layer
LAYER_CASES = [  # (seed, tokens, experts, topk, hidden, inter, renormalize, align)
    (50, 24, 4, 2, 256, 64, True, 16),
    (51, 17, 6, 3, 128, 96, False, 1),
    (52, 10, 5, 1, 200, 64, False, 128),
]


def layer_inputs(case):
    seed, tokens, experts, topk, hidden, inter, renormalize, align = case
    x = randn(tokens, hidden, seed=seed, dtype=BF16)
    logits = randn(tokens, experts, seed=seed + 1, scale=1.5)
    w13 = randn(experts, 2 * inter, hidden, seed=seed + 2, scale=hidden ** -0.5, dtype=BF16)
    w2 = randn(experts, hidden, inter, seed=seed + 3, scale=inter ** -0.5, dtype=BF16)
    return x, logits, w13, w2, topk, renormalize, align


def dense_layer(x, logits, w13, w2, topk, renormalize, rounding=True) -> torch.Tensor:
    """Per token: sum over its k experts of p_k * FFN_e(x), in float64 (bf16 rounding points of
    the spec where ``rounding``: gu, h, the expert output and the weighted output)."""
    probs, routes = brute_router(logits, topk, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for s in range(x.shape[0]):
        for e, p in zip(routes[s], probs[s], strict=True):
            y = ffn_row64(x[s], w13[e], w2[e], rounding)
            out[s] += to_bf16(to_bf16(y) * p) if rounding else y * p
    return out


@pytest.mark.parametrize("case", LAYER_CASES)
def test_moe_layer_bf16_dense(case):
    x, logits, w13, w2, topk, renormalize, align = layer_inputs(case)
    out = moe.moe_layer(x, logits, w13, None, w2, None, topk, renormalize, align)
    assert out.dtype == BF16 and out.shape == x.shape
    expected = dense_layer(x, logits, w13, w2, topk, renormalize)
    assert calc_diff(out, expected) < 1e-4
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)
    unrounded = dense_layer(x, logits, w13, w2, topk, renormalize, rounding=False)
    assert calc_diff(out, unrounded) < 1e-4


@pytest.mark.parametrize("case", LAYER_CASES)
def test_moe_layer_fp8_dense(case):
    x, logits, w13, w2, topk, renormalize, align = layer_inputs(case)
    w13q, w13s = quantize_experts(w13)
    w2q, w2s = quantize_experts(w2)
    out = moe.moe_layer(x, logits, w13q, w13s, w2q, w2s, topk, renormalize, align, "e4m3")
    assert out.dtype == BF16 and out.shape == x.shape
    assert calc_diff(out, dense_layer(x, logits, w13, w2, topk, renormalize)) < 4e-3
    # against the dequantized inputs (tokens 1x128, weights 128x128): closer still
    xd = fp8.dequantize(*fp8.quantize(x, "e4m3", "token"), "token")
    near = dense_layer(xd, logits, dequantize_experts(w13q, w13s),
                       dequantize_experts(w2q, w2s), topk, renormalize, rounding=False)
    assert calc_diff(out, near) < 1e-3


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_moe_layer_independent_of_alignment(case, fmt):
    x, logits, w13, w2, topk, renormalize, _ = layer_inputs(case)
    w13s = w2s = None
    if fmt == "fp8":
        (w13, w13s), (w2, w2s) = quantize_experts(w13), quantize_experts(w2)
    outs = [moe.moe_layer(x, logits, w13, w13s, w2, w2s, topk, renormalize, align)
            for align in (1, 16, 128)]
    assert_bitwise(outs[1], outs[0])
    assert_bitwise(outs[2], outs[0])
