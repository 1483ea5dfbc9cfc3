"""moe_permute and moe_unpermute with Paddle's semantics.

permute: every output (rows, rowmap, probs, fp8 scales) is data movement, checked bitwise;
the buffers are poisoned first, so a padding row left unwritten fails. unpermute: a float32
sum of at most topk bf16 rows rounded once, so any summation order is within one bf16 ulp of
the reference; the returned probs are exact; and the round trip unpermute(permute(x) * p)
must give x back (max relative error 1e-2 for bf16, 1e-1 for fp8 rows, Paddle's bounds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import OpSpec, Tolerance, Work, allclose, exact, plant_specials, poisoned, ulp
from reference_kernels import fp8
from reference_kernels import moe as ref
from suites._triton import triton_impl

from . import torch_ops
from .common import BF16, FAMILY, FMT, counts_rotated, hidden, layout, routing


def _source(tag: str, params: Mapping[str, Any]):
    """(rows as given to permute (bf16, or fp8 with 1x128 scales), routemap, probs)."""
    x = hidden(tag, params, params["tokens"], params["hidden"])
    if tag == "permute" and params.get("values") == "special":
        plant_specials(x)  # -0.0, subnormals, +-inf, NaN: permute moves bits
    if tag == "unpermute" and params.get("values") == "special":
        # every fifth token's row times 2**17 (exact): sums past float16's 65504, which a
        # float32 accumulator holds and a float16 one does not
        x[::5] *= 2.0**17
    routemap, probs = routing(tag, params, params["tokens"])
    if params["dtype"] == "fp8":
        q, scale = fp8.quantize(x, FMT, "token")
        return q, scale, routemap, probs
    return x, None, routemap, probs


# ---------------------------------------------------------------- permute
def permute_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    x, scale, routemap, probs = _source("permute", params)
    tpe, rows = layout(routemap, params)
    return {"hidden": x, "scale": scale, "routemap": routemap, "probs": probs,
            "num_experts": params["experts"], "tokens_per_expert": tpe,
            "padding_alignment": params["align"],
            "out": poisoned((rows, x.shape[1]), x.dtype),
            "out_rowmap": poisoned((x.shape[0], params["experts"]), torch.int32),
            "out_probs": poisoned(rows, torch.float32),
            "out_scale": None if scale is None else poisoned((rows, scale.shape[1]),
                                                             torch.float32)}


def permute_reference(hidden, scale, routemap, probs, num_experts, tokens_per_expert,
                      padding_alignment, **_buffers):
    return ref.moe_permute(hidden, scale, routemap, probs, num_experts, tokens_per_expert,
                           padding_alignment)


def permute_expected(params: Mapping[str, Any], rank: int, world_size: int
                     ) -> dict[str, torch.Tensor]:
    out, rowmap, probs, scale = permute_reference(**permute_inputs(params, rank, world_size))
    expected = {"out": out, "rowmap": rowmap, "probs": probs}
    return expected if scale is None else {**expected, "scale": scale}


def permute_torch(**kw):
    return torch_ops.permute_into(**kw)


def permute_expert_out_of_order(**kw):
    """Bug: the tokens of one expert land in descending token order (a racy atomic slot
    counter instead of a prefix sum)."""
    return torch_ops.permute_into(**kw, reverse_one_expert=True)


def permute_padding_not_zeroed(**kw):
    """Bug: padding rows (data, probs, scales) keep whatever the buffer held."""
    return torch_ops.permute_into(**kw, zero_padding=False)


def permute_scales_dropped(**kw):
    """Bug: the fp8 scales are never copied (their buffer is only zeroed). bf16 rows have no
    scales, so only the fp8 cases can show it."""
    return torch_ops.permute_into(**kw, copy_scales=False)


def _permute_work(params: Mapping[str, Any], world_size: int) -> Work:
    item = 1 if params["dtype"] == "fp8" else 2
    routemap, _ = routing("permute", params, params["tokens"])
    _, rows = layout(routemap, params)
    routed = int((routemap >= 0).sum())
    return Work(bytes=(routed + rows) * params["hidden"] * item)


def _case(tokens, hidden_size, experts, topk, align, dtype, **extra) -> dict:
    return {"tokens": tokens, "hidden": hidden_size, "experts": experts, "topk": topk,
            "align": align, "dtype": dtype, **extra}


#: Paddle's own test sweep: 5000 and 16384 tokens of 7168, experts 4..64, top-k 4 / 8
NIGHTLY = [_case(s, 7168, e, k, 128, dt) for s in (5000, 16384) for e in (4, 8, 16, 32, 64)
           for k in (4, 8) for dt in ("bf16", "fp8")] + [
    _case(16384, 7168, 64, 8, 128, "bf16", unrouted=True, values="special"),
    _case(5000, 7100, 128, 8, 24, "bf16"),
    # a prefill past 65535 tokens: a grid whose y dimension is the token stops there
    _case(70000, 128, 8, 2, 128, "bf16")]
SMOKE = [_case(300, 256, 8, 4, 128, "bf16"), _case(257, 320, 16, 8, 128, "fp8"),
         _case(100, 128, 4, 4, 16, "bf16"), _case(700, 128, 64, 8, 128, "fp8"),
         # tokens routed to no expert beside idle experts; permute's rows carry special floats
         _case(130, 128, 8, 4, 16, "bf16", unrouted=True, values="special"),
         # experts holding 0, 1, align - 1, align and align + 1 tokens (padded sizes 0, 16,
         # 16, 16, 32), and tokens routed to none
         _case(20, 128, 5, 4, 16, "fp8", counts="0x1x15x16x17"),
         # one token routed to one expert: a single (token, expert) pair in all
         _case(1, 128, 4, 1, 16, "bf16"),
         # more than 1024 tokens: an expert's rows stay in token order across any block of
         # tokens a kernel takes at a time
         _case(1100, 64, 8, 2, 16, "bf16"),
         # rows of 200 bytes (no whole 16-byte units), 128 experts (past a 64-entry table of
         # counters), segments padded to 24 rows (no power of two: a bit mask rounds wrong)
         _case(300, 100, 128, 8, 24, "bf16")]

PERMUTE = OpSpec(
    name="moe.permute", family=FAMILY, reference=permute_reference,
    description="Paddle moe_permute: rows grouped by expert in ascending token order, each "
                "segment padded to the alignment with zero rows; rowmap, probs, fp8 scales.",
    make_inputs=permute_inputs, expected=permute_expected, tolerance=exact(),
    work=_permute_work, grid={"smoke": SMOKE, "nightly": NIGHTLY},
    outputs=("out", "rowmap", "probs", "scale"),
    out_buffers={"out": "out", "rowmap": "out_rowmap", "probs": "out_probs",
                 "scale": "out_scale"},
    implementations={"torch": permute_torch,
                     "triton": triton_impl("moe_permute:permute")},
    negative_controls={"expert_out_of_order": permute_expert_out_of_order,
                       "padding_not_zeroed": permute_padding_not_zeroed,
                       "scales_dropped": permute_scales_dropped,
                       "triton_tail_mask_off_by_one":
                           triton_impl("moe_permute:permute_tail_mask_off_by_one")},
    twin=counts_rotated, deadline_s=600.0,
    any_alignment=True,
)


# ---------------------------------------------------------------- unpermute
def _unpermute_case(params: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The permute source rows (what the round trip must give back) and unpermute's inputs:
    the permuted rows times their probs, rounded to bf16, as Paddle's test makes them."""
    x, _, routemap, probs = _source("unpermute", params)
    tpe, _ = layout(routemap, params)
    rows, rowmap, pprobs, _ = ref.moe_permute(x, None, routemap, probs, params["experts"],
                                              tpe, params["align"])
    weighted = (rows.float() * pprobs[:, None]).to(BF16)
    return x, {"permuted": weighted, "rowmap": rowmap, "routemap": routemap,
               "permuted_probs": pprobs, "num_tokens": params["tokens"],
               "num_experts": params["experts"]}


def unpermute_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return _unpermute_case(params)[1]


def unpermute_expected(params: Mapping[str, Any], rank: int, world_size: int
                       ) -> dict[str, torch.Tensor]:
    x, inputs = _unpermute_case(params)
    out, probs = ref.moe_unpermute(**inputs)
    # a token routed to no expert comes back as a zero row
    routed = (inputs["routemap"] >= 0).any(dim=1, keepdim=True)
    return {"out": out, "probs": probs, "out:roundtrip": x.float() * routed}


def unpermute_tolerance(params: Mapping[str, Any], world_size: int
                        ) -> dict[str, Tolerance]:
    # SEMANTICS allows 1e-1 for an FP8 round trip, whose rows would carry the quantization's
    # error; here the FP8 cases' rows are the e4m3 codes themselves, exact in bf16, so the
    # round trip holds what a bf16 one does (at most 0.52% off on the smoke cases)
    return {"out": ulp(1), "probs": exact(), "out:roundtrip": allclose(rtol=1e-2, atol=0.0)}


def unpermute_exact(permuted, rowmap, routemap, permuted_probs, num_tokens, num_experts):
    """Each token's rows summed in float64 (exact for bf16 rows), the value before the one
    rounding the semantics allow: the precision lens. A sum rounded toward zero, or twice,
    is within one ulp of the reference but moves a quarter of the elements."""
    acc = torch.zeros(num_tokens, permuted.shape[1], dtype=torch.float64)
    for e in range(num_experts):
        rows = rowmap[:, e].long()
        has = rows >= 0
        acc[has] += permuted[rows[has]].double()
    return {"out": acc}


def unpermute_torch(**kw):
    return torch_ops.unpermute(**kw)


def unpermute_probs_applied_twice(**kw):
    """Bug: unpermute multiplies by the probs again, which the caller already did."""
    return torch_ops.unpermute(**kw, reweight=True)


def unpermute_bf16_accumulation(**kw):
    """Bug: the expert rows are summed in bf16 (Paddle's use_mix_precision=False)."""
    return torch_ops.unpermute(**kw, bf16_accumulation=True)


def unpermute_rounded_toward_zero(**kw):
    """Bug: the float32 sum cast to bf16 by dropping its low 16 bits (toward zero, a cast
    without rounding): within one ulp everywhere, so only the precision lens sees it."""
    return torch_ops.unpermute(**kw, truncated=True)


def _unpermute_work(params: Mapping[str, Any], world_size: int) -> Work:
    routed = int((routing("unpermute", params, params["tokens"])[0] >= 0).sum())
    return Work(bytes=(routed + params["tokens"]) * params["hidden"] * 2)


UNPERMUTE = OpSpec(
    name="moe.unpermute", family=FAMILY, reference=ref.moe_unpermute,
    description="Paddle moe_unpermute: each token's expert rows summed in float32 (no "
                "re-weighting), its slot probs given back; the round trip restores x.",
    make_inputs=unpermute_inputs, expected=unpermute_expected, tolerance=unpermute_tolerance,
    exact=unpermute_exact, work=_unpermute_work, grid={"smoke": SMOKE, "nightly": NIGHTLY},
    outputs=("out", "probs"),
    implementations={"torch": unpermute_torch},
    negative_controls={"probs_applied_twice": unpermute_probs_applied_twice,
                       "bf16_accumulation": unpermute_bf16_accumulation,
                       "rounded_toward_zero": unpermute_rounded_toward_zero},
    twin=counts_rotated, deadline_s=600.0,
    any_alignment=True,
)

SPECS = [PERMUTE, UNPERMUTE]
