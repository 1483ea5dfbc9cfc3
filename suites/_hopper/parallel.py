"""Tensor parallelism across ranks, built from the tasks: a column-parallel then
row-parallel MLP, and a whole decoder layer whose check captures every stage.

Each rank holds its shard of the weights (made alone, from the global tensor's generator);
the residual is added on rank 0 only, so it counts once after the sum allreduce. The expected
result is the single-device layer on the full weights, sliced to the rank's shard where a
stage's output is sharded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness.api import OpSpec, Work, default_for
from reference_kernels import hopper_tasks as ref

from .attention import paged_layout, torch_paged_attention
from .common import (
    ATTENTION_TOLERANCE,
    BF16,
    GEMM_TOLERANCE,
    linear_bf16_accumulation,
    norm_weight,
    tensor,
    weight,
)
from .tasks import silu_mul_torch

FAMILY = "hopper_tasks"


def _shard(total: int, rank: int, world_size: int, what: str) -> slice:
    if total % world_size:
        raise ValueError(f"{what}={total} does not split over {world_size} ranks")
    size = total // world_size
    return slice(rank * size, (rank + 1) * size)


def _unsplit(*names: str) -> Any:
    """A ``requires`` for a tensor-parallel op: the first of the params ``names`` that the
    world size does not divide makes the case a skip that says so (at 3 ranks, a collective
    runs; a split of 8 heads cannot)."""
    def requires(params: Mapping[str, Any], world_size: int, device: Any) -> str | None:
        for name in names:
            if params[name] % world_size:
                return (f"{name}={params[name]} does not split over {world_size} ranks "
                        "(tensor parallel: a multiple of the world size)")
        return None
    return requires


def _allreduce_sum(world: Any, t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if world.size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=world.group)
    return t


# ---------------------------------------------------------------- tensor-parallel MLP
def tp_mlp_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    b, h, i = params["b"], params["hidden"], params["inter"]
    cols = _shard(i, rank, world_size, "inter")
    return {"x": tensor("tp_mlp", params, "x", (b, h)),
            "residual": tensor("tp_mlp", params, "r", (b, h)),
            "w1": weight("tp_mlp", params, "w1", i, h, region=(cols,)),
            "w2": weight("tp_mlp", params, "w2", h, i, region=(slice(None), cols))}


def tp_mlp_expected(params: Mapping[str, Any], rank: int, world_size: int
                    ) -> dict[str, torch.Tensor]:
    """The single-device layer: linear, then linear_with_residual, on the full weights; and
    for the precision lens the second's float64 value before its one rounding (the partial
    sums travel as float32: rounding them to bf16 first is a second rounding)."""
    full = tp_mlp_inputs(params, 0, 1)
    h = ref.linear(full["x"], full["w1"])
    return {"out": ref.linear_with_residual(h, full["w2"], full["residual"]),
            "out:exact": ref.linear_with_residual(h, full["w2"], full["residual"], wide=True)}


def tp_mlp_torch(world: Any, x: torch.Tensor, residual: torch.Tensor, w1: torch.Tensor,
                 w2: torch.Tensor) -> torch.Tensor:
    h = F.linear(x, w1)                                   # column-parallel: this rank's slice
    partial = h.float() @ w2.float().T                    # row-parallel: a partial sum
    if world.rank == 0:
        partial += residual.float()
    return _allreduce_sum(world, partial).to(x.dtype)


def tp_mlp_residual_every_rank(world: Any, x: torch.Tensor, residual: torch.Tensor,
                               w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Bug: every rank adds the residual, so it counts W times. Invisible at one rank."""
    partial = F.linear(x, w1).float() @ w2.float().T + residual.float()
    return _allreduce_sum(world, partial).to(x.dtype)


def tp_mlp_partials_in_bf16(world: Any, x: torch.Tensor, residual: torch.Tensor,
                            w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Bug: each rank's partial sum is rounded to bf16 before the allreduce (an allreduce in
    the activation dtype): a second rounding, within the GEMM tolerance, caught by the
    precision lens wherever there are two ranks or more."""
    partial = (F.linear(x, w1).float() @ w2.float().T).to(x.dtype).float()
    if world.rank == 0:
        partial += residual.float()
    return _allreduce_sum(world, partial).to(x.dtype)


TP_MLP = OpSpec(
    name="hopper_tasks.tp_mlp", family=FAMILY, reference=ref.linear_with_residual,
    description="Column-parallel then row-parallel linear, sum allreduce, residual on rank 0.",
    make_inputs=tp_mlp_inputs, expected=tp_mlp_expected, tolerance=GEMM_TOLERANCE,
    work=lambda p, w: Work(flops=4.0 * p["b"] * p["hidden"] * p["inter"] / w,
                           flops_dtype="bf16"),
    grid={"smoke": [{"b": 4, "hidden": 256, "inter": 1024},
                    {"b": 1, "hidden": 256, "inter": 512}],  # a decode step's own path
          "nightly": [{"b": b, "hidden": h, "inter": i} for b in (1, 4, 16)
                      for h, i in ((4096, 12288), (5120, 14336), (7168, 18432))]},
    implementations={"torch": tp_mlp_torch},
    negative_controls={"residual_every_rank": tp_mlp_residual_every_rank,
                       "partials_in_bf16": tp_mlp_partials_in_bf16},
    distributed=True, replicated=("out",), requires=_unsplit("inter"),
)


# ---------------------------------------------------------------- decoder layer
STAGES = ("norm1", "qkv", "attn", "k_cache", "v_cache", "attn_out", "norm2", "gate_up", "act",
          "out")


def _layer_weights(params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The layer's full weights and state (single device)."""
    p = params
    h, hq, hkv, d, i = p["hidden"], p["hq"], p["hkv"], p["d"], p["inter"]
    _, _, _, pool = paged_layout(p)
    tag = "decoder_layer"
    return {
        "x": tensor(tag, p, "x", (p["requests"] * p["tokens"], h)),
        "w_in": norm_weight(tag, p, "w_in", h),
        "wqkv": weight(tag, p, "wqkv", hkv * (hq // hkv + 2) * d, h),
        "q_norm_weight": norm_weight(tag, p, "qn", d),
        "k_norm_weight": norm_weight(tag, p, "kn", d),
        "wo": weight(tag, p, "wo", h, hq * d),
        "w_post": norm_weight(tag, p, "w_post", h),
        "wgu": ref.interleave_gate_up(weight(tag, p, "wg", i, h), weight(tag, p, "wu", i, h),
                                      p["groups"]),
        "wdown": weight(tag, p, "wdown", h, i),
        "k_cache": tensor(tag, p, "k_cache", (pool, p["page_size"], hkv, d)),
        "v_cache": tensor(tag, p, "v_cache", (pool, p["page_size"], hkv, d)),
    }


def _rank_slices(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, slice]:
    p = params
    group = p["hq"] // p["hkv"]
    kv = _shard(p["hkv"], rank, world_size, "hkv")
    groups = _shard(p["groups"], rank, world_size, "groups")
    gu_rows, i_per = 2 * p["inter"] // p["groups"], p["inter"] // p["groups"]
    qkv_rows = (group + 2) * p["d"]
    return {
        "kv_heads": kv,
        "qkv": slice(kv.start * qkv_rows, kv.stop * qkv_rows),
        "attn": slice(kv.start * group * p["d"], kv.stop * group * p["d"]),
        "gate_up": slice(groups.start * gu_rows, groups.stop * gu_rows),
        "act": slice(groups.start * i_per, groups.stop * i_per),
    }


def decoder_layer_inputs(params: Mapping[str, Any], rank: int, world_size: int
                         ) -> dict[str, Any]:
    full = _layer_weights(params)
    s = _rank_slices(params, rank, world_size)
    indptr, indices, last, pool = paged_layout(params)
    cos, sin = ref.rope_tables(pool * params["page_size"], params["d"])
    return {
        "x": full["x"], "w_in": full["w_in"], "wqkv": full["wqkv"][s["qkv"]].clone(),
        "q_norm_weight": full["q_norm_weight"], "k_norm_weight": full["k_norm_weight"],
        "wo": full["wo"][:, s["attn"]].clone(), "w_post": full["w_post"],
        "wgu": full["wgu"][s["gate_up"]].clone(), "wdown": full["wdown"][:, s["act"]].clone(),
        "k_cache": full["k_cache"][:, :, s["kv_heads"]].clone(),
        "v_cache": full["v_cache"][:, :, s["kv_heads"]].clone(),
        "kv_indptr": indptr, "kv_indices": indices, "last_page_len": last, "cos": cos, "sin": sin,
        "num_q_heads": params["hq"] // world_size, "num_kv_heads": params["hkv"] // world_size,
        "tokens": params["tokens"], "groups": params["groups"] // world_size,
    }


def decoder_layer_reference(params: Mapping[str, Any],
                            w: Mapping[str, torch.Tensor] | None = None
                            ) -> dict[str, torch.Tensor]:
    """Every stage of the single-device layer, each from the previous reference stage (``w``:
    the layer's weights, if the caller made them already)."""
    w = _layer_weights(params) if w is None else w
    indptr, indices, last, pool = paged_layout(params)
    cos, sin = ref.rope_tables(pool * params["page_size"], params["d"])
    stages: dict[str, torch.Tensor] = {"norm1": ref.rmsnorm(w["x"], w["w_in"])}
    stages["qkv"] = ref.linear(stages["norm1"], w["wqkv"])
    attn = ref.paged_attention_decode(
        stages["qkv"], w["k_cache"], w["v_cache"], indptr, indices, last, w["q_norm_weight"],
        w["k_norm_weight"], cos, sin, params["hq"], params["hkv"], params["tokens"])
    stages.update(attn=attn["out"], k_cache=attn["k_cache"], v_cache=attn["v_cache"])
    stages["attn_out"] = ref.linear_with_residual(stages["attn"], w["wo"], w["x"])
    stages["norm2"] = ref.rmsnorm(stages["attn_out"], w["w_post"])
    stages["gate_up"] = ref.linear(stages["norm2"], w["wgu"])
    stages["act"] = ref.silu_mul(stages["gate_up"], params["groups"])
    stages["out"] = ref.linear_with_residual(stages["act"], w["wdown"], stages["attn_out"])
    return stages


def decoder_layer_expected(params: Mapping[str, Any], rank: int, world_size: int
                           ) -> dict[str, torch.Tensor]:
    w = _layer_weights(params)
    full = decoder_layer_reference(params, w)
    s = _rank_slices(params, rank, world_size)
    out = dict(full)
    for name in ("qkv", "attn", "gate_up", "act"):
        out[name] = full[name][:, s[name]]
    for name in ("k_cache", "v_cache"):
        out[name] = full[name][:, :, s["kv_heads"]]
    # the precision lens on the two row-parallel sums, whose partials travel as float32
    out["attn_out:exact"] = ref.linear_with_residual(full["attn"], w["wo"], w["x"], wide=True)
    out["out:exact"] = ref.linear_with_residual(full["act"], w["wdown"], full["attn_out"],
                                                wide=True)
    return out


def _decoder_layer(world: Any, x, w_in, wqkv, q_norm_weight, k_norm_weight, wo, w_post, wgu,
                   wdown, k_cache, v_cache, kv_indptr, kv_indices, last_page_len, cos, sin,
                   num_q_heads, num_kv_heads, tokens, groups, *, bug: str = ""):
    """The tensor-parallel layer in torch; ``bug`` plants a negative control in one stage."""
    out: dict[str, torch.Tensor] = {"norm1": F.rms_norm(x, (x.shape[-1],), w_in, eps=ref.EPS)}
    out["qkv"] = F.linear(out["norm1"], wqkv)
    attn = torch_paged_attention(out["qkv"], k_cache, v_cache, kv_indptr, kv_indices, last_page_len,
                            q_norm_weight, k_norm_weight, cos, sin, num_q_heads, num_kv_heads,
                            tokens, rope_first=bug == "rope_before_norm")
    out.update(attn=attn["out"], k_cache=attn["k_cache"], v_cache=attn["v_cache"])
    partial = out["attn"].float() @ wo.float().T
    if world.rank == 0 or bug == "residual_every_rank":
        partial += x.float()
    out["attn_out"] = _allreduce_sum(world, partial).to(x.dtype)
    out["norm2"] = F.rms_norm(out["attn_out"], (x.shape[-1],), w_post, eps=ref.EPS)
    out["gate_up"] = F.linear(out["norm2"], wgu)
    out["act"] = silu_mul_torch(out["gate_up"], groups)
    if bug == "down_bf16_accumulation":
        partial = linear_bf16_accumulation(out["act"], wdown).float()
    else:
        partial = out["act"].float() @ wdown.float().T
    if world.rank == 0:
        partial += out["attn_out"].float()
    out["out"] = _allreduce_sum(world, partial).to(x.dtype)
    return out


def decoder_layer_torch(world: Any, **inputs: Any) -> dict[str, torch.Tensor]:
    return _decoder_layer(world, **inputs)


def decoder_layer_rope_before_norm(world: Any, **inputs: Any) -> dict[str, torch.Tensor]:
    """Bug planted in the attention stage: RoPE before the per-head norm."""
    return _decoder_layer(world, **inputs, bug="rope_before_norm")


def decoder_layer_residual_every_rank(world: Any, **inputs: Any) -> dict[str, torch.Tensor]:
    """Bug planted in the o-proj stage: every rank adds the residual (invisible at 1 rank)."""
    return _decoder_layer(world, **inputs, bug="residual_every_rank")


def decoder_layer_down_bf16_accumulation(world: Any, **inputs: Any) -> dict[str, torch.Tensor]:
    """Bug planted in the down projection: its K loop accumulates in bf16."""
    return _decoder_layer(world, **inputs, bug="down_bf16_accumulation")


def _layer_case(requests, tokens, hidden, hq, hkv, d, inter, groups, page_size, max_pages):
    return {"requests": requests, "tokens": tokens, "hidden": hidden, "hq": hq, "hkv": hkv,
            "d": d, "inter": inter, "groups": groups, "page_size": page_size,
            "max_pages": max_pages}


DECODER_LAYER = OpSpec(
    name="hopper_tasks.decoder_layer", family=FAMILY, reference=decoder_layer_reference,
    description="rmsnorm -> qkv -> paged attention -> o-proj + residual -> rmsnorm -> gate/up "
                "-> silu_mul -> down + residual, tensor parallel; names the first stage that "
                "diverges.",
    make_inputs=decoder_layer_inputs, expected=decoder_layer_expected,
    outputs=STAGES, pipeline=True,
    tolerance={"norm1": default_for(BF16), "qkv": GEMM_TOLERANCE,
               "attn": ATTENTION_TOLERANCE, "k_cache": default_for(BF16),
               "v_cache": GEMM_TOLERANCE, "attn_out": GEMM_TOLERANCE,
               "norm2": default_for(BF16), "gate_up": GEMM_TOLERANCE,
               "act": ATTENTION_TOLERANCE, "out": GEMM_TOLERANCE},
    out_buffers={"k_cache": "k_cache", "v_cache": "v_cache"},
    readwrite_inputs=("k_cache", "v_cache"),
    work=lambda p, w: Work(flops=2.0 * p["requests"] * p["tokens"] * p["hidden"] * (
        (p["hkv"] * (p["hq"] // p["hkv"] + 2) + p["hq"]) * p["d"] + 3 * p["inter"]) / w,
        flops_dtype="bf16"),
    # a hidden size that is no power of two (as 7168 and 2880 are): a norm over a padded
    # power-of-two block divides by the wrong width only there
    grid={"smoke": [_layer_case(2, 2, 384, 16, 8, 32, 4096, 8, 16, 3)],
          "nightly": [_layer_case(b, 1, 4096, 32, 8, 128, 12288, 8, 64, 64) for b in (1, 8)]},
    implementations={"torch": decoder_layer_torch},
    negative_controls={"rope_before_norm": decoder_layer_rope_before_norm,
                       "residual_every_rank": decoder_layer_residual_every_rank,
                       "down_bf16_accumulation": decoder_layer_down_bf16_accumulation},
    # the stages after an allreduce, and the norms of replicated rows: every rank holds them
    # bit for bit the same (a rank that normalises its own order of the sum diverges there)
    distributed=True, replicated=("norm1", "attn_out", "norm2", "out"),
    requires=_unsplit("hkv", "groups"), deadline_s=300.0,
)

SPECS = [TP_MLP, DECODER_LAYER]
