"""The expert SwiGLU FFN as a grouped GEMM over the permuted rows (contiguous layout: each
expert's rows padded to the alignment), bf16 or FP8 blockwise (1x128 activations, 128x128
weights, the SwiGLU output requantized per token before the down projection).

The output buffer is poisoned, so padding rows must be written (as zeros). The tolerance is
sized for legitimate arithmetic that differs from the reference's: the ``fused_epilogue``
implementation keeps gate and up in float32 and must pass. FP8 cases are also compared with
the bf16 FFN on the unquantized rows and weights (calc_diff), which bounds the quantization's
own error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Tolerance, Work, cos_diff, poisoned
from reference_kernels import fp8
from reference_kernels import moe as ref

from . import torch_ops
from .common import (
    BF16,
    BF16_FFN_TOLERANCE,
    FAMILY,
    FMT,
    FP8_FFN_TOLERANCE,
    expert_weights,
    hidden,
    layout,
    routing,
)

#: calc_diff of the FP8 FFN against the bf16 FFN on unquantized inputs: four quantized
#: operands (x, w13, the activation, w2) where DeepGEMM's 1e-3 covers two; measured 1.94e-3
UNQUANTIZED_BOUND = 4e-3


def _ffn_case(params: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The permuted bf16 rows, and the FFN's inputs (rows quantized for fp8)."""
    x = hidden("ffn", params, params["tokens"], params["hidden"])
    if params.get("outlier"):
        # one token 256x the others (exact): the activation between the GEMMs must be
        # requantized per token; one scale per expert or tensor zeroes the other tokens
        x[5] *= 256.0
    routemap, probs = routing("ffn", params, params["tokens"])
    tpe, rows = layout(routemap, params)
    permuted = ref.moe_permute(x, None, routemap, probs, params["experts"], tpe,
                               params["align"])[0]
    q, scale = (fp8.quantize(permuted, FMT, "token") if params["precision"] == "fp8"
                else (permuted, None))
    inputs = {"x": q, "x_scale": scale, **expert_weights("ffn", params),
              "tokens_per_expert": tpe, "padding_alignment": params["align"],
              "out": poisoned((rows, params["hidden"]), BF16)}
    return permuted, inputs


def ffn_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return _ffn_case(params)[1]


def ffn_reference(x, x_scale, w13, w13_scale, w2, w2_scale, tokens_per_expert,
                  padding_alignment, out):
    return ref.expert_ffn(x, x_scale, w13, w13_scale, w2, w2_scale, tokens_per_expert,
                          padding_alignment, FMT)


def ffn_expected(params: Mapping[str, Any], rank: int, world_size: int
                 ) -> dict[str, torch.Tensor]:
    permuted, inputs = _ffn_case(params)
    expected = {"out": ffn_reference(**inputs)}
    if params["precision"] == "fp8":
        w = expert_weights("ffn", params, quantized=False)
        expected["out:unquantized"] = ref.expert_ffn(
            permuted, None, w["w13"], None, w["w2"], None, inputs["tokens_per_expert"],
            params["align"])
    return expected


def ffn_tolerance(params: Mapping[str, Any], world_size: int) -> dict[str, Tolerance]:
    if params["precision"] == "bf16":
        return {"out": BF16_FFN_TOLERANCE}
    return {"out": FP8_FFN_TOLERANCE, "out:unquantized": cos_diff(UNQUANTIZED_BOUND)}


def ffn_torch(**kw):
    return torch_ops.expert_ffn(**kw)


def ffn_fused_epilogue(**kw):
    """gate and up stay float32 into the SwiGLU (no bf16 rounding between the GEMM and the
    activation), as an epilogue-fused kernel computes it."""
    return torch_ops.expert_ffn(**kw, fused_epilogue=True)


def ffn_gate_up_swapped(**kw):
    """Bug: silu is applied to the up half and the gate half is the multiplier (a w13
    layout read as [up | gate])."""
    return torch_ops.expert_ffn(**kw, gate_up_swapped=True)


def ffn_padding_unwritten(**kw):
    """Bug: padding rows are skipped, so they keep whatever the buffer held."""
    return torch_ops.expert_ffn(**kw, zero_padding=False)


def _ffn_work(params: Mapping[str, Any], world_size: int) -> Work:
    routed = int((routing("ffn", params, params["tokens"])[0] >= 0).sum())
    h, i = params["hidden"], params["inter"]
    item = 1 if params["precision"] == "fp8" else 2
    return Work(flops=2.0 * routed * h * 3 * i,
                bytes=(params["experts"] * 3 * h * i + routed * h) * item + routed * h * 2,
                flops_dtype=params["precision"])


def _case(tokens, hidden_size, inter, experts, topk, align, precision, **extra) -> dict:
    return {"tokens": tokens, "hidden": hidden_size, "inter": inter, "experts": experts,
            "topk": topk, "align": align, "precision": precision, **extra}


SMOKE = [_case(200, 256, 128, 8, 4, 128, "bf16"), _case(200, 256, 128, 8, 4, 128, "fp8"),
         _case(90, 384, 256, 4, 2, 16, "fp8", outlier=True),
         _case(150, 128, 256, 16, 8, 32, "bf16"),
         # per-group and per-block magnitudes 2**-1..2 (a scale read from the wrong group,
         # block or expert shows), and a decode-sized batch: experts with exactly one token
         _case(6, 256, 256, 16, 2, 16, "fp8", scales="blocky")]
#: DeepSeek-V3's expert shape (hidden 7168, moe_intermediate 2048)
NIGHTLY = [_case(5000, 7168, 2048, e, 8, 128, p) for e in (8, 64) for p in ("bf16", "fp8")] + [
    _case(5000, 7168, 2048, 64, 8, 128, "fp8", outlier=True)]

EXPERT_FFN = OpSpec(
    name="moe.expert_ffn", family=FAMILY, reference=ffn_reference,
    description="SwiGLU experts as a grouped GEMM over the permuted rows (bf16 or FP8 "
                "blockwise); padding rows come out zero.",
    make_inputs=ffn_inputs, expected=ffn_expected, tolerance=ffn_tolerance, work=_ffn_work,
    grid={"smoke": SMOKE, "nightly": NIGHTLY}, out_buffers={"out": "out"},
    implementations={"torch": ffn_torch, "fused_epilogue": ffn_fused_epilogue},
    negative_controls={"gate_up_swapped": ffn_gate_up_swapped,
                       "padding_unwritten": ffn_padding_unwritten},
    deadline_s=900.0,
)

SPECS = [EXPERT_FFN]
