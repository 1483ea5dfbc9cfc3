"""Single-device Hopper tasks: embedding, rmsnorm, the linear family, silu_mul, argmax and
identity. ``torch`` implementations run on the harness's device in bf16 with torch's own ops
(a different code path from the float32 reference); negative controls reproduce real bug
classes of hand-written task kernels."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness.api import OpSpec, Work, exact, generate, hash32, plant_specials, seed_from
from reference_kernels import hopper_tasks as ref
from suites._triton import triton_impl

from .common import (
    GEMM_TOLERANCE,
    linear_bf16_accumulation,
    near_eps_rows,
    norm_weight,
    tensor,
    weight,
)

FAMILY = "hopper_tasks"
HIDDENS = (4096, 5120, 7168)
BATCHES = (1, 4, 16)


def _gemm_work(b: int, n: int, k: int, extra_bytes: int = 0) -> Work:
    return Work(flops=2.0 * b * n * k, bytes=2.0 * (b * k + n * k + b * n) + extra_bytes,
                flops_dtype="bf16")


# ---------------------------------------------------------------- embedding
def embedding_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    b, vocab = params["b"], params["vocab"]
    ids = generate((b, 1), torch.int64, seed=seed_from("embedding", b, vocab), dist="int",
                   low=0, high=vocab - 1)
    if params.get("ids") != "valid":  # valid: every id in the table (a batch of one too)
        ids[::3] = -1  # padding slots: a zero row
    if params.get("ids") == "edges":
        # the first and last rows of the table, beside padding: a gather off by one reads
        # past the table or a neighbour; an id 0 taken for padding gives a zero row
        # (-2: every negative id is padding, not -1 alone)
        edges = [0, vocab - 1, -1, 1, vocab - 2, -2, 0, vocab - 1, vocab // 2]
        ids = torch.tensor(edges[:b], dtype=torch.int64).reshape(b, 1)
    w = tensor("embedding", params, "w", (vocab, params["hidden"]))
    if params.get("values") == "special":
        plant_specials(w)  # -0.0, subnormals, +-inf, NaN: a gather moves bits, not values
    return {"ids": ids, "weight": w}


def embedding_torch(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    valid = (ids.reshape(-1) >= 0).unsqueeze(1)
    rows = F.embedding(ids.reshape(-1).clamp_min(0), weight)
    return torch.where(valid, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def embedding_zero_id_as_padding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: id 0 is taken for padding (``ids > 0``, as with padding_idx=0), a zero row."""
    valid = (ids.reshape(-1) > 0).unsqueeze(1)
    rows = F.embedding(ids.reshape(-1).clamp_min(0), weight)
    return torch.where(valid, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def embedding_negative_wraps(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: a negative id indexes from the end (Python-style), reading the last row."""
    return weight[ids.reshape(-1)]


EMBEDDING = OpSpec(
    name="hopper_tasks.embedding", family=FAMILY, reference=ref.embedding,
    description="Row gather; a negative id gives a zero row.",
    make_inputs=embedding_inputs, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * 2 * p["b"] * p["hidden"] + 8 * p["b"]),
    grid={"smoke": [{"b": 7, "vocab": 1000, "hidden": 256}, {"b": 1, "vocab": 17, "hidden": 64},
                    {"b": 9, "vocab": 17, "hidden": 64, "ids": "edges", "values": "special"},
                    {"b": 9, "vocab": 33, "hidden": 96, "ids": "edges", "values": "special"},
                    {"b": 1, "vocab": 1000, "hidden": 128, "ids": "valid"}],
          "nightly": [{"b": b, "vocab": 152064, "hidden": h} for b in BATCHES for h in HIDDENS]
          + [{"b": 9, "vocab": 152064, "hidden": 5120, "ids": "edges", "values": "special"},
             {"b": 1, "vocab": 152064, "hidden": 7168, "ids": "valid"}]},
    implementations={"torch": embedding_torch, "triton": triton_impl("hopper:embedding")},
    negative_controls={"negative_wraps": embedding_negative_wraps,
                       "zero_id_as_padding": embedding_zero_id_as_padding,
                       "triton_zero_id_as_padding":
                           triton_impl("hopper:embedding_zero_id_as_padding")},
)


# ---------------------------------------------------------------- rmsnorm
def rmsnorm_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    b, h = params["b"], params["hidden"]
    x = tensor("rmsnorm", params, "x", (b, h), -2.0, 2.0)
    if params.get("rows") == "zero":
        near_eps_rows(x, 1, 2)
    if params.get("values") == "wide":
        # rows of magnitude 1, 300 and 30000, ...: squares past float16's 65504 (from 256 up),
        # which a mean square taken in float16 turns to inf and the row to zeros
        x.mul_(torch.logspace(0, 4.5, b).to(x.dtype)[:, None])
    return {"x": x, "weight": norm_weight("rmsnorm", params, "w", h)}


def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps=ref.EPS)


def rmsnorm_rms_of_weighted(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the fused kernel takes the mean square of x * w instead of x."""
    y = x.float() * weight.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + ref.EPS)).to(x.dtype)


def rmsnorm_rounded_twice(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the normalised value is stored as bf16 before the weight multiplies it (two
    roundings; within the tolerance, caught by the precision lens)."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + ref.EPS)).to(x.dtype)
    return (normed.float() * weight.float()).to(x.dtype)


def rmsnorm_squares_in_fp16(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the squares formed in float16 (a 16-bit FMA path), summed in float32: inf for
    |x| >= 256, and the row comes out zeros."""
    x16 = x.to(torch.float16)
    ms = (x16 * x16).float().mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(ms + ref.EPS) * weight.float()).to(x.dtype)


def rmsnorm_padded_block_mean(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the mean square divides by the kernel's power-of-two block (1024 for a row of
    768), not the row length: exact where the row is a power of two."""
    x32 = x.float()
    block = 1 << (x.shape[-1] - 1).bit_length()
    ms = x32.pow(2).sum(-1, keepdim=True) / block
    return (x32 * torch.rsqrt(ms + ref.EPS) * weight.float()).to(x.dtype)


RMSNORM = OpSpec(
    name="hopper_tasks.rmsnorm", family=FAMILY, reference=ref.rmsnorm,
    description="RMSNorm over the hidden dim, eps 1e-6, one rounding (H % 256 == 0 on Hopper).",
    make_inputs=rmsnorm_inputs, exact=lambda x, weight: {"out": ref.rmsnorm(x, weight, wide=True)},
    work=lambda p, w: Work(bytes=2.0 * (2 * p["b"] * p["hidden"] + p["hidden"])),
    # hidden 768 and 1280: multiples of 256 that are not powers of two, where a kernel that
    # divides by its padded block (1024, 2048) instead of the row length is wrong
    grid={"smoke": [{"b": 4, "hidden": 256}, {"b": 1, "hidden": 512},
                    {"b": 3, "hidden": 256, "rows": "zero"}, {"b": 2, "hidden": 768},
                    {"b": 3, "hidden": 1280, "rows": "zero"},
                    {"b": 3, "hidden": 512, "values": "wide"}],
          "nightly": [{"b": b, "hidden": h} for b in BATCHES for h in HIDDENS]
          + [{"b": 16, "hidden": 5120, "rows": "zero"}]},
    implementations={"torch": rmsnorm_torch, "triton": triton_impl("hopper:rmsnorm")},
    negative_controls={"rms_of_weighted": rmsnorm_rms_of_weighted,
                       "squares_in_fp16": rmsnorm_squares_in_fp16,
                       "rounded_twice": rmsnorm_rounded_twice,
                       "padded_block_mean": rmsnorm_padded_block_mean,
                       "triton_eps_outside_rsqrt":
                           triton_impl("hopper:rmsnorm_eps_outside_rsqrt")},
)


# ---------------------------------------------------------------- the linear family
def linear_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    b, n, k = params["b"], params["n"], params["k"]
    inputs = {"x": tensor("linear", params, "x", (b, k)), "weight": weight("linear", params, "w",
                                                                          n, k)}
    if params.get("residual"):
        inputs["residual"] = tensor("linear", params, "r", (b, n))
    return inputs


def linear_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def linear_with_residual_torch(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor
                               ) -> torch.Tensor:
    return torch.addmm(residual.float(), x.float(), weight.float().T).to(x.dtype)


def linear_bf16_acc(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the K loop accumulates in bf16."""
    return linear_bf16_accumulation(x, weight)


def linear_with_residual_bf16_acc(x: torch.Tensor, weight: torch.Tensor,
                                  residual: torch.Tensor) -> torch.Tensor:
    """Bug: the K loop accumulates in bf16, then adds the residual."""
    return (linear_bf16_accumulation(x, weight).float() + residual.float()).to(x.dtype)


def linear_with_residual_rounded_twice(x: torch.Tensor, weight: torch.Tensor,
                                       residual: torch.Tensor) -> torch.Tensor:
    """Bug: the bf16 GEMM's result is rounded before the residual add (two roundings; within
    the tolerance, caught by the precision lens)."""
    return (F.linear(x, weight).float() + residual.float()).to(x.dtype)


def linear_k_tail_dropped(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Bug: the K loop runs over whole 64-wide tiles only (K // 64 of them): the tail of a K
    that is not a multiple of 64 is never added."""
    k = x.shape[1] // 64 * 64
    return (x[:, :k].float() @ weight[:, :k].float().T).to(x.dtype)


def _linear_grid(residual: bool) -> dict[str, list[dict]]:
    # K of 1024 and more: the bf16-accumulation control's error grows with K, and below that
    # it hides under the GEMM tolerance
    # and K = 1096, 1544: 8 past a multiple of 16, 32 and 64, so a K loop over tiles of any
    # of those sizes has a tail to mask (or drops it)
    # (the one-row case, a decode step, with a K tail too: a GEMV path of its own)
    smoke = [{"b": 4, "n": 384, "k": 1024}, {"b": 1, "n": 100, "k": 1096},
             {"b": 3, "n": 96, "k": 1096}, {"b": 2, "n": 130, "k": 1544}]
    nightly = [{"b": b, "n": n, "k": h} for b in BATCHES for h in HIDDENS
               for n in (6144, h)]
    nightly += [{"b": 16, "n": 6144, "k": 4104}, {"b": 1, "n": 4100, "k": 7000}]
    if residual:
        for case in smoke + nightly:
            case["residual"] = True
    return {"smoke": smoke, "nightly": nightly}


LINEAR = OpSpec(
    name="hopper_tasks.linear", family=FAMILY, reference=ref.linear,
    description="x @ W.T, float32 accumulation.",
    make_inputs=linear_inputs, tolerance=GEMM_TOLERANCE,
    exact=lambda x, weight: {"out": ref.linear(x, weight, wide=True)},
    work=lambda p, w: _gemm_work(p["b"], p["n"], p["k"]), grid=_linear_grid(False),
    implementations={"torch": linear_torch},
    negative_controls={"bf16_accumulation": linear_bf16_acc,
                       "k_tail_dropped": linear_k_tail_dropped},
)

LINEAR_WITH_RESIDUAL = OpSpec(
    name="hopper_tasks.linear_with_residual", family=FAMILY, reference=ref.linear_with_residual,
    description="x @ W.T + residual, float32 accumulation.",
    make_inputs=linear_inputs, tolerance=GEMM_TOLERANCE,
    exact=lambda x, weight, residual: {
        "out": ref.linear_with_residual(x, weight, residual, wide=True)},
    work=lambda p, w: _gemm_work(p["b"], p["n"], p["k"], 2 * p["b"] * p["n"]),
    grid=_linear_grid(True),
    implementations={"torch": linear_with_residual_torch},
    negative_controls={"bf16_accumulation": linear_with_residual_bf16_acc,
                       "rounded_twice": linear_with_residual_rounded_twice},
)


def rmsnorm_linear_inputs(params: Mapping[str, Any], rank: int, world_size: int
                          ) -> dict[str, Any]:
    b, n, k = params["b"], params["n"], params["k"]
    x = tensor("rmsnorm_linear", params, "x", (b, k), -2.0, 2.0)
    if params.get("rows") == "zero":
        near_eps_rows(x, 0, b - 1)
    return {"x": x,
            "norm_weight": norm_weight("rmsnorm_linear", params, "nw", k),
            "weight": weight("rmsnorm_linear", params, "w", n, k)}


def rmsnorm_linear_torch(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor
                         ) -> torch.Tensor:
    normed = F.rms_norm(x.float(), (x.shape[-1],), norm_weight.float(), eps=ref.EPS)
    return F.linear(normed, weight.float()).to(x.dtype)


def rmsnorm_linear_unweighted(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor
                              ) -> torch.Tensor:
    """Bug: the fused task forgets the norm's weight."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps=ref.EPS)
    return F.linear(normed, weight.float()).to(x.dtype)


RMSNORM_LINEAR = OpSpec(
    name="hopper_tasks.rmsnorm_linear", family=FAMILY, reference=ref.rmsnorm_linear,
    description="RMSNorm fused into the following linear.",
    make_inputs=rmsnorm_linear_inputs, tolerance=GEMM_TOLERANCE,
    exact=lambda x, norm_weight, weight: {
        "out": ref.rmsnorm_linear(x, norm_weight, weight, wide=True)},
    work=lambda p, w: _gemm_work(p["b"], p["n"], p["k"]),
    grid={"smoke": [{"b": 4, "n": 384, "k": 256}, {"b": 3, "n": 200, "k": 768},
                    {"b": 2, "n": 64, "k": 1280}, {"b": 3, "n": 64, "k": 768, "rows": "zero"},
                    {"b": 1, "n": 96, "k": 768}],  # a decode step: a one-row path
          "nightly": [{"b": b, "n": 6144, "k": h} for b in BATCHES for h in HIDDENS]
          + [{"b": 16, "n": 6144, "k": 5120, "rows": "zero"}]},
    implementations={"torch": rmsnorm_linear_torch},
    negative_controls={"unweighted": rmsnorm_linear_unweighted},
)


# ---------------------------------------------------------------- silu_mul
def silu_mul_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    b, inter = params["b"], params["inter"]
    # gates to -24 (values=wide): silu(g) = g * sigmoid(g) is ~1e-9 there, which an exp or a
    # division in float16 flushes to zero or overflows; and every seventh gate from 60 to
    # 2000, where exp(g) overflows float32 (past 88.7: a sigmoid taken as e / (1 + e) is
    # inf / inf, NaN) and float16 (past 11)
    wide = params.get("values") == "wide"
    x = tensor("silu_mul", params, "x", (b, 2 * inter), -24.0 if wide else -4.0, 4.0)
    if wide:
        gates = x.unflatten(1, (params["groups"], 2, -1))[:, :, 0]
        far = gates[..., ::7]
        far.copy_(torch.logspace(math.log10(60), math.log10(2000), far.numel())
                  .reshape(far.shape).to(far.dtype))
    return {"x": x, "groups": params["groups"]}


def silu_mul_torch(x: torch.Tensor, groups: int) -> torch.Tensor:
    m = x.unflatten(1, (groups, 2, -1))
    return (F.silu(m[:, :, 0]) * m[:, :, 1]).flatten(1)


def silu_mul_not_interleaved(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Bug: the input is read as one [gate | up] pair, ignoring the grouped interleaving."""
    gate, up = x.chunk(2, dim=1)
    return F.silu(gate) * up


def silu_mul_sigmoid_as_exp_ratio(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Bug: sigmoid(g) taken as e / (1 + e), e = exp(g) in float32: inf / inf, NaN, for gates
    past 88.7 (right for every gate below)."""
    m = x.unflatten(1, (groups, 2, -1))
    g = m[:, :, 0].float()
    e = torch.exp(g)
    return ((g * (e / (1 + e))).to(x.dtype) * m[:, :, 1]).flatten(1)


SILU_MUL = OpSpec(
    name="hopper_tasks.silu_mul", family=FAMILY, reference=ref.silu_mul,
    description="silu(gate) * up over G interleaved [gate | up] chunks.",
    make_inputs=silu_mul_inputs,
    work=lambda p, w: Work(bytes=2.0 * 3 * p["b"] * p["inter"]),
    grid={"smoke": [{"b": 4, "inter": 256, "groups": 4},
                    {"b": 3, "inter": 96, "groups": 2, "values": "wide"}],
          "nightly": [{"b": b, "inter": i, "groups": 8} for b in BATCHES
                      for i in (12288, 14336, 18432)]
          + [{"b": 16, "inter": 14336, "groups": 8, "values": "wide"}]},
    implementations={"torch": silu_mul_torch, "triton": triton_impl("hopper:silu_mul")},
    negative_controls={"not_interleaved": silu_mul_not_interleaved,
                       "sigmoid_as_exp_ratio": silu_mul_sigmoid_as_exp_ratio,
                       "triton_tail_mask_off_by_one":
                           triton_impl("hopper:silu_mul_tail_mask_off_by_one")},
)


def silu_mul_linear_inputs(params: Mapping[str, Any], rank: int, world_size: int
                           ) -> dict[str, Any]:
    b, inter, n = params["b"], params["inter"], params["n"]
    return {"x": tensor("silu_mul_linear", params, "x", (b, 2 * inter), -2.0, 2.0),
            "weight": weight("silu_mul_linear", params, "w", n, inter),
            "residual": tensor("silu_mul_linear", params, "r", (b, n))}


def silu_mul_linear_torch(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor
                          ) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=1)
    return torch.addmm(residual.float(), F.silu(gate) * up, weight.float().T).to(x.dtype)


def silu_mul_linear_bf16_acc(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor
                             ) -> torch.Tensor:
    """Bug: the K loop of the down projection accumulates in bf16."""
    gate, up = x.float().chunk(2, dim=1)
    h = (F.silu(gate) * up).to(x.dtype)
    return (linear_bf16_accumulation(h, weight).float() + residual.float()).to(x.dtype)


SILU_MUL_LINEAR = OpSpec(
    name="hopper_tasks.silu_mul_linear_with_residual", family=FAMILY,
    reference=ref.silu_mul_linear_with_residual,
    description="(silu(gate) * up) @ W.T + residual, fused.",
    make_inputs=silu_mul_linear_inputs, tolerance=GEMM_TOLERANCE,
    exact=lambda x, weight, residual: {
        "out": ref.silu_mul_linear_with_residual(x, weight, residual, wide=True)},
    work=lambda p, w: _gemm_work(p["b"], p["n"], p["inter"], 2 * p["b"] * p["inter"]),
    grid={"smoke": [{"b": 4, "inter": 1024, "n": 128}, {"b": 2, "inter": 1096, "n": 96}],
          "nightly": [{"b": b, "inter": i, "n": h} for b in BATCHES
                      for i, h in ((12288, 4096), (14336, 5120), (18432, 7168))]},
    implementations={"torch": silu_mul_linear_torch},
    negative_controls={"bf16_accumulation": silu_mul_linear_bf16_acc},
)


# ---------------------------------------------------------------- argmax
def argmax_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Logits in [-1, 1) with one planted maximum per row (so the answer is unique), placed
    by a hash so that most rows have it past the first chunk; or, with ``values=ties``, the
    rows of ``argmax_ties`` (``nan``: of ``argmax_nan``). ``values=neginf``, for a vocab of whole
    chunks: row 0 all -inf (answer 0: a scan that starts at index -1 or at a finite floor and
    takes a logit only when it is larger keeps -1) and every other row -inf but its last
    logit."""
    b, vocab, chunk = params["b"], params["vocab"], params["chunk"]
    logits = tensor("argmax", params, "logits", (b, vocab))
    if params.get("values") == "ties":
        return {"logits": argmax_ties(logits, chunk), "chunk": chunk}
    if params.get("values") == "nan":
        return {"logits": argmax_nan(logits, chunk), "chunk": chunk}
    if params.get("values") == "neginf":
        logits[:] = float("-inf")
        logits[1:, -1] = -3.0
        return {"logits": logits, "chunk": chunk}
    if params.get("values") == "range":
        return {"logits": argmax_range(logits, chunk), "chunk": chunk}
    where = hash32(torch.arange(b), seed_from("argmax.max", b, vocab)) % vocab
    logits[torch.arange(b), where] = 4.0
    return {"logits": logits, "chunk": chunk}


def argmax_range(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose maximum a comparison in a narrower type loses: row 0 holds 66048 in its
    first chunk and the maximum 70144 in its last (both +inf in float16), row 1 negative
    logits and two positive ones below float16's normal range, the larger last (2**-24 and
    its next bf16 value, one float16 subnormal), so a float16 load ties them and keeps the
    first."""
    b, vocab = logits.shape
    if b < 2 or vocab <= chunk:
        raise ValueError(f"the range rows need b >= 2 and more than one chunk: b={b}, "
                         f"vocab={vocab}, chunk={chunk}")
    x = logits.clone()
    x[0, 1], x[0, vocab - 2] = 66048.0, 70144.0
    x[1] = -x[1].abs() - 2.0**-8
    x[1, 2], x[1, vocab - 1] = 2.0**-24, 2.0**-24 * (1 + 2.0**-7)
    return x


def argmax_ties(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose answer rests on argmax's defined edges (first index on ties; the vocab padded
    with zero columns up to a multiple of the chunk, so a padded 0 beats negative logits):

    0. the maximum twice, in the first and the third chunk: the first chunk's wins;
    1. the maximum twice inside one chunk: the first of the two;
    2. every logit negative: the first padded column (index ``vocab``) wins with its 0;
    3. the maximum is 0.0, at a real column, tying the padded zeros: the real column wins;
    4. the maximum once in every chunk: the first chunk's;
    5. every logit negative but one -0.0, which ties the padded +0.0 and comes first.

    A tie broken towards the later index fails every row (the padded zeros of rows 2, 3 and 5
    tie each other too); a reduce that ignores the padding fails row 2; one that orders -0.0
    below +0.0 (comparing bits) fails row 5."""
    b, vocab = logits.shape
    if b < 6 or vocab % chunk == 0 or vocab < 3 * chunk:
        raise ValueError(f"the ties rows need b >= 6 and a padded vocab of 3+ chunks: "
                         f"b={b}, vocab={vocab}, chunk={chunk}")
    x = logits.clone()
    x[0, [chunk // 3, 2 * chunk + 1]] = 4.0
    x[1, [chunk + 6, chunk + chunk // 2]] = 4.0
    x[2] = -x[2].abs() - 1.0
    x[3] = -x[3].abs() - 1.0
    x[3, chunk + 3] = 0.0
    x[4, [c * chunk + (7 * c) % chunk for c in range(-(-vocab // chunk)) if c * chunk < vocab
          and c * chunk + (7 * c) % chunk < vocab]] = 4.0
    x[5] = -x[5].abs() - 1.0
    x[5, chunk // 2] = -0.0
    return x


def argmax_nan(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose answer rests on argmax's NaN and infinity semantics (NaN counts as the
    largest value, as torch.argmax and numpy.argmax have it; the first NaN wins):

    0. a NaN in the last chunk and a finite maximum in the first: the NaN wins;
    1. NaN twice, in the second and the third chunk: the second chunk's;
    2. +inf in the first chunk and a NaN after it: the NaN;
    3. +inf twice: the first;
    4. every logit -inf: the first padded column (index ``vocab``) wins with its 0;
    5. NaN twice inside the first chunk: the first of the two.

    A kernel that compares with ``>`` alone never takes a NaN (rows 0, 1, 2, 5); one that
    takes the last NaN fails rows 1 and 5; one that pads with -inf fails row 4."""
    b, vocab = logits.shape
    if b < 6 or vocab % chunk == 0 or vocab < 3 * chunk:
        raise ValueError(f"the NaN rows need b >= 6 and a padded vocab of 3+ chunks: "
                         f"b={b}, vocab={vocab}, chunk={chunk}")
    nan, inf = float("nan"), float("inf")
    x = logits.clone()
    x[0, 1], x[0, vocab - 2] = 4.0, nan
    x[1, [chunk + 5, 2 * chunk + 1]] = nan
    x[2, chunk // 2], x[2, 2 * chunk] = inf, nan
    x[3, [chunk + 1, 2 * chunk + 3]] = inf
    x[4] = -inf
    x[5, [chunk // 4, chunk // 2]] = nan
    return x


def argmax_torch(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    b, v = logits.shape
    padded = F.pad(logits, (0, (-v) % chunk))
    values, index = padded.view(b, -1, chunk).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return best * chunk + index.gather(1, best)


def argmax_last_on_ties(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: ties go to the later index, in the chunk and across chunks (a partial kernel that
    keeps a candidate on ``>=`` instead of ``>``, a greedy decode that then diverges)."""
    b, v = logits.shape
    padded = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk)
    index = chunk - 1 - padded.flip(-1).float().argmax(dim=-1)
    values = padded.amax(dim=-1).float()
    best = values.shape[1] - 1 - values.flip(-1).argmax(dim=-1, keepdim=True)
    return best * chunk + index.gather(1, best)


def argmax_no_chunk_offset(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: the reduce step returns the chunk-relative index without chunk * CHUNK."""
    b, v = logits.shape
    values, index = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk).max(dim=-1)
    return index.gather(1, values.argmax(dim=-1, keepdim=True))


def argmax_nan_skipped(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: NaN never wins (a kernel that keeps a candidate on ``x > best`` alone, which is
    false for NaN): the largest number is returned instead."""
    return argmax_torch(logits.nan_to_num(nan=float("-inf"), posinf=float("inf")), chunk)


def argmax_index_in_8_bits(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: the partial step keeps the index within its chunk in 8 bits (a uint8 workspace):
    right for chunks up to 256, wrapped past them."""
    b, v = logits.shape
    values, index = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return best * chunk + index.to(torch.uint8).long().gather(1, best)


ARGMAX = OpSpec(
    name="hopper_tasks.argmax", family=FAMILY, reference=ref.argmax,
    description="Greedy sampling: per-chunk partial max, then the reduce over chunks.",
    make_inputs=argmax_inputs, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * p["b"] * p["vocab"]),
    grid={"smoke": [{"b": 5, "vocab": 1000, "chunk": 96}, {"b": 3, "vocab": 64, "chunk": 16},
                    {"b": 6, "vocab": 200, "chunk": 64, "values": "ties"},
                    {"b": 6, "vocab": 1000, "chunk": 96, "values": "ties"},
                    {"b": 6, "vocab": 200, "chunk": 64, "values": "nan"},
                    {"b": 6, "vocab": 1000, "chunk": 96, "values": "nan"},
                    {"b": 2, "vocab": 64, "chunk": 16, "values": "neginf"},
                    {"b": 2, "vocab": 200, "chunk": 64, "values": "range"},
                    # a chunk past 256: an index within it kept in 8 bits wraps
                    {"b": 4, "vocab": 1500, "chunk": 512}],
          "nightly": [{"b": b, "vocab": v, "chunk": 4096} for b in BATCHES
                      for v in (128256, 151936, 152064)]
          + [{"b": 6, "vocab": 151936, "chunk": 4096, "values": v} for v in ("ties", "nan")]
          + [{"b": 2, "vocab": 131072, "chunk": 4096, "values": "neginf"},
             {"b": 2, "vocab": 151936, "chunk": 4096, "values": "range"}]},
    implementations={"torch": argmax_torch, "triton": triton_impl("hopper:argmax")},
    negative_controls={"no_chunk_offset": argmax_no_chunk_offset,
                       "index_in_8_bits": argmax_index_in_8_bits,
                       "last_on_ties": argmax_last_on_ties,
                       "nan_skipped": argmax_nan_skipped,
                       "triton_no_chunk_offset": triton_impl("hopper:argmax_no_chunk_offset")},
)


# ---------------------------------------------------------------- identity
def identity_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    x = tensor("identity", params, "x", (params["b"], params["hidden"]))
    if params.get("values") == "special":
        plant_specials(x)  # -0.0, subnormals, +-inf, NaN: a copy through arithmetic loses them
    return {"x": x}


def identity_torch(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def identity_last_tile_dropped(x: torch.Tensor) -> torch.Tensor:
    """Bug: the tile loop stops one 64-column tile early (range(0, H - 64, 64))."""
    out = torch.zeros_like(x)
    for start in range(0, x.shape[1] - 64, 64):
        out[:, start : start + 64] = x[:, start : start + 64]
    return out


IDENTITY = OpSpec(
    name="hopper_tasks.identity", family=FAMILY, reference=ref.identity,
    description="A copy: captures an intermediate of a pipeline.",
    make_inputs=identity_inputs, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * 2 * p["b"] * p["hidden"]),
    grid={"smoke": [{"b": 4, "hidden": 256}, {"b": 3, "hidden": 193, "values": "special"},
                    {"b": 2, "hidden": 1000, "values": "special"}],
          "nightly": [{"b": b, "hidden": h} for b in BATCHES for h in HIDDENS]
          + [{"b": 16, "hidden": 5000, "values": "special"}]},
    implementations={"torch": identity_torch},
    negative_controls={"last_tile_dropped": identity_last_tile_dropped},
)

SPECS = [EMBEDDING, RMSNORM, LINEAR, LINEAR_WITH_RESIDUAL, RMSNORM_LINEAR, SILU_MUL,
         SILU_MUL_LINEAR, ARGMAX, IDENTITY]
