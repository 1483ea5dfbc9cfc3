"""FP8 quantization (per tensor, per token 1x128, per block 128x128; UE8M0 scales; static
scales that saturate) and Paddle's fused transpose-split-quant. Scales are checked bitwise
against the reference quantizer, quantized values bitwise against the float64 quotient
rounded once (``rounded_near``: a float32 quotient in another order may land a boundary's
other side)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from harness.api import OpSpec, Work, exact, from_source, rounded_near, ulp
from reference_kernels import fp8 as ref
from suites._cuda import source
from suites._cuda.fp8_quant import launch_quantize_per_token
from suites._triton import triton_impl

from .common import values

FAMILY = "fp8_gemm"


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= s, exactly: s = m * 2**e with m in [0.5, 1) (a log2, in
    float32 or through a device's math library, need not land on the integer). The reference
    spells the same out in ``scale_from_amax``; this implementation keeps its own, so that a
    bug in one is not in both (tests/test_edge_cases.py swaps this one for a wrong one)."""
    mantissa, exponent = torch.frexp(s)
    up = torch.ldexp(torch.ones_like(s), exponent - (mantissa == 0.5).int())
    return torch.where(s.isnan() | s.isinf(), s, up)  # frexp(NaN or inf) has exponent 0


def quantize_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return {"x": values("quantize", params, "x", (params["m"], params["k"])),
            "fmt": params["fmt"], "granularity": params["granularity"],
            "ue8m0": params["ue8m0"],
            # static=True: a scale of 1.0; a number: that scale (divides, never multiplies)
            "scale": float(params["static"]) if params.get("static") else None}


def _grouped(x32: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(padded view as [M/rows, rows, K/cols, cols], amax per group)."""
    m, k = x32.shape
    padded = F.pad(x32, (0, (-k) % cols, 0, (-m) % rows))
    blocks = padded.unflatten(0, (-1, rows)).unflatten(2, (-1, cols))
    return blocks, blocks.abs().amax(dim=(1, 3))


def _quantize(x, fmt, granularity, ue8m0, scale, *, group: int = 128, saturate: bool = True):
    fmax = ref.FMAX[fmt]

    def cast(v: torch.Tensor) -> torch.Tensor:
        if saturate:
            return v.clamp(-fmax, fmax).to(ref.FORMATS[fmt])
        # a cvt without .satfinite: e4m3 has no infinity, so out-of-range becomes NaN
        v = torch.where(v.abs() > fmax, torch.full_like(v, float("nan")), v) \
            if fmt == "e4m3" else v
        return v.to(ref.FORMATS[fmt])

    x32 = x.float()
    if granularity == "tensor":
        if scale is not None:
            s = torch.tensor(float(scale), device=x.device)
        else:
            s = ref.divide(x32.abs().max().clamp_min(ref.AMAX_FLOOR), fmax)
            s = _pow2_ceil(s) if ue8m0 else s
        return cast(x32 / s), s
    rows = 1 if granularity == "token" else group
    blocks, amax = _grouped(x32, rows, group)
    s = ref.divide(amax.clamp_min(ref.AMAX_FLOOR), fmax)
    if ue8m0:
        s = _pow2_ceil(s)
    q = cast(blocks / s[:, None, :, None]).flatten(2, 3).flatten(0, 1)
    return q[: x.shape[0], : x.shape[1]].contiguous(), s


def quantize_torch(x, fmt, granularity, ue8m0, scale):
    return _quantize(x, fmt, granularity, ue8m0, scale)


def quantize_block_off_by_one(x, fmt, granularity, ue8m0, scale):
    """Bug: groups of 127 instead of 128."""
    return _quantize(x, fmt, granularity, ue8m0, scale, group=127)


def quantize_saturation_ignored(x, fmt, granularity, ue8m0, scale):
    """Bug: values beyond the format's max are cast without clamping (NaN in e4m3, inf in
    e5m2) instead of saturating."""
    return _quantize(x, fmt, granularity, ue8m0, scale, saturate=False)


def per_token_only(params: Mapping[str, Any]) -> str | None:
    """The cases the Triton quantizer takes (suites/_triton/fp8_quant.py)."""
    if params.get("granularity") != "token" or params.get("static"):
        return "the Triton quantizer is per token (1x128 groups, scales from amax) only"
    return None


#: a quantizer's float32 quotient may be x / s or x * (fmax / amax) (DeepGEMM's
#: per_token_cast_to_fp8): each within two float32 roundings (2**-23) of the float64 one;
#: where that crosses a rounding boundary the codes differ by one, elsewhere never
QUOTIENT_REL = 2.0**-22
#: q within one code of the reference (checked to the bit against its float64 value, below),
#: the scales to the bit; a NaN group's values and scale are computed NaNs
QUANT_TOLERANCE = {"q": ulp(1), "q:exact": rounded_near(QUOTIENT_REL),
                   "scales": exact(any_nan=True)}


def quantize_exact(x, fmt, granularity, ue8m0, scale) -> dict[str, torch.Tensor]:
    """q before its one rounding: x / s in float64 (s the reference's float32 scales),
    clamped to the format's range."""
    _, s = ref.quantize(x, fmt, granularity, ue8m0, scale)
    if granularity != "tensor":
        rows = 1 if granularity == "token" else 128
        s = ref.expand_scales(s, rows, 128, x.shape)
    fmax = ref.FMAX[fmt]
    return {"q": (x.double() / s.double()).clamp(-fmax, fmax)}


def _qcase(fmt, granularity, m, k, ue8m0=False, dist="logmag", static=False) -> dict:
    case = {"fmt": fmt, "granularity": granularity, "m": m, "k": k, "ue8m0": ue8m0,
            "dist": dist}
    if static:
        case["static"] = static
    return case


QUANTIZE = OpSpec(
    name="fp8_gemm.quantize", family=FAMILY, reference=ref.quantize,
    description="FP8 quantization per tensor, per token (1x128) or per block (128x128).",
    make_inputs=quantize_inputs, outputs=("q", "scales"),
    tolerance=QUANT_TOLERANCE, exact=quantize_exact,
    work=lambda p, w: Work(bytes=3.0 * p["m"] * p["k"]),
    grid={
        "smoke": [
            *[_qcase(f, g, 130, 300) for f in ("e4m3", "e5m2") for g in ("tensor", "token",
                                                                         "block")],
            _qcase("e4m3", "token", 130, 300, ue8m0=True),
            _qcase("e4m3", "block", 256, 256, ue8m0=True, dist="edge"),
            _qcase("e4m3", "token", 129, 384, dist="edge"),
            _qcase("e5m2", "token", 255, 256, ue8m0=True, dist="edge"),
            _qcase("e4m3", "tensor", 64, 100, dist="wide", static=True),
            _qcase("e5m2", "tensor", 64, 100, dist="wide", static=True),
            _qcase("e4m3", "tensor", 64, 100, dist="wide", static=0.375),
            # 0.3 is no bf16 or fp16 value, and UE8M0 rounds derived scales, not a given one
            _qcase("e4m3", "tensor", 64, 100, ue8m0=True, dist="wide", static=0.3),
            # a NaN under a static scale: a clamp by fminf/fmaxf makes it -fmax
            _qcase("e4m3", "tensor", 64, 100, dist="nan", static=True),
            _qcase("e4m3", "token", 7, 128, dist="uniform"),
            # NaN and infinities: their groups' scales and values (reference_kernels.fp8);
            # a UE8M0 scale keeps them too
            _qcase("e4m3", "token", 5, 300, dist="nan"),
            _qcase("e5m2", "token", 3, 260, ue8m0=True, dist="nan"),
            _qcase("e5m2", "block", 130, 200, ue8m0=True, dist="nan"),
            _qcase("e4m3", "tensor", 5, 300, dist="nan"),  # one NaN: every value and the scale
            # the tensor's largest value in its last, partial 128-row tile
            _qcase("e4m3", "tensor", 130, 300, dist="edge"),
            _qcase("e4m3", "tensor", 130, 300, ue8m0=True, dist="edge"),
        ],
        "nightly": [_qcase(f, g, m, k, ue8m0=u) for f in ("e4m3", "e5m2")
                    for g in ("token", "block") for m, k in ((4096, 7168), (16384, 2048))
                    for u in (False, True)]
        + [_qcase("e4m3", "token", 4096, 7168, dist="nan"),
           _qcase("e5m2", "token", 4096, 7168, ue8m0=True, dist="nan"),
           _qcase("e4m3", "token", 4096, 7168, dist="edge"),
           _qcase("e4m3", "tensor", 4100, 7168, dist="edge"),
           _qcase("e4m3", "tensor", 4096, 7168, dist="nan"),
           _qcase("e4m3", "tensor", 4096, 7168, dist="wide", static=0.375),
           _qcase("e4m3", "tensor", 4096, 7168, ue8m0=True, dist="wide", static=0.3),
           _qcase("e5m2", "tensor", 4096, 7168, dist="nan", static=True),
           _qcase("e4m3", "block", 4096, 7000)],  # a partial last group
    },
    implementations={"torch": quantize_torch,
                     "cuda": from_source(source("fp8_quant.cu"), launch_quantize_per_token),
                     "triton": triton_impl("fp8_quant:quantize_per_token",
                                           unsupported=per_token_only)},
    negative_controls={"block_off_by_one": quantize_block_off_by_one,
                       "saturation_ignored": quantize_saturation_ignored,
                       "triton_tail_mask_off_by_one":
                           triton_impl("fp8_quant:quantize_tail_mask_off_by_one",
                                       unsupported=per_token_only)},
    any_alignment=True,
)


# ---------------------------------------------------------------- transpose-split-quant
def tsq_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    tokens = tuple(params["tokens"])
    return {"x": values("tsq", params, "x", (sum(tokens), params["k"])),
            "tokens_per_expert": tokens, "fmt": params["fmt"], "ue8m0": params["ue8m0"]}


def tsq_expected(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    outs, scales = ref.transpose_split_quant(**tsq_inputs(params, rank, world_size))
    return {"q": torch.cat(outs, dim=1), "scales": torch.cat(scales, dim=0)}


def _tsq(x, tokens_per_expert: Sequence[int], fmt, ue8m0, *, per_row_scale: bool = False):
    """Every piece at once: groups of 128 tokens never straddle two experts."""
    fmax = ref.FMAX[fmt]
    blocks = x.float().unflatten(0, (-1, 128))               # (M/128, 128, K)
    amax = blocks.abs().amax(dim=1)                           # (M/128, K)
    if per_row_scale:  # bug: one scale per 128-token block, over every column
        amax = amax.amax(dim=1, keepdim=True).expand_as(amax)
    s = ref.divide(amax.clamp_min(ref.AMAX_FLOOR), fmax)
    if ue8m0:
        s = _pow2_ceil(s)
    q = (blocks / s[:, None, :]).clamp(-fmax, fmax).to(ref.FORMATS[fmt])
    return q.flatten(0, 1).T.contiguous(), s


def tsq_exact(x, tokens_per_expert, fmt, ue8m0) -> dict[str, torch.Tensor]:
    """q before its one rounding: each 128-token group's x / s in float64, transposed."""
    s = tsq_expected_scales(x, tokens_per_expert, fmt, ue8m0)
    fmax = ref.FMAX[fmt]
    q = (x.double().unflatten(0, (-1, 128)) / s.double()[:, None, :]).clamp(-fmax, fmax)
    return {"q": q.flatten(0, 1).T.contiguous()}


def tsq_expected_scales(x, tokens_per_expert, fmt, ue8m0) -> torch.Tensor:
    _, scales = ref.transpose_split_quant(x, tokens_per_expert, fmt, ue8m0)
    return torch.cat(scales, dim=0)


def tsq_torch(x, tokens_per_expert, fmt, ue8m0):
    return _tsq(x, tokens_per_expert, fmt, ue8m0)


def tsq_scale_per_block_row(x, tokens_per_expert, fmt, ue8m0):
    """Bug: one scale per 128-token block for all K columns instead of one per column."""
    return _tsq(x, tokens_per_expert, fmt, ue8m0, per_row_scale=True)


TRANSPOSE_SPLIT_QUANT = OpSpec(
    name="fp8_gemm.transpose_split_quant", family=FAMILY, reference=ref.transpose_split_quant,
    description="Paddle's fused transpose-split-quant: pieces by expert, each (K, M_i), "
                "128-token groups per column (pieces concatenated along M).",
    make_inputs=tsq_inputs, expected=tsq_expected, outputs=("q", "scales"),
    tolerance=QUANT_TOLERANCE, exact=tsq_exact,
    work=lambda p, w: Work(bytes=3.0 * sum(p["tokens"]) * p["k"]),
    grid={"smoke": [{"tokens": (128, 0, 256), "k": 200, "fmt": "e4m3", "ue8m0": False,
                     "dist": "logmag"},
                    {"tokens": (384,), "k": 64, "fmt": "e4m3", "ue8m0": True,
                     "dist": "uniform"},
                    # e5m2; a zero group, groups under the amax floor and a scale that is a
                    # power of two already (UE8M0 keeps it)
                    {"tokens": (256, 128), "k": 256, "fmt": "e5m2", "ue8m0": True,
                     "dist": "edge"},
                    # 100 columns (no whole 8-column vectors) and NaN/inf groups
                    {"tokens": (256, 128), "k": 100, "fmt": "e4m3", "ue8m0": False,
                     "dist": "nan"}],
          "nightly": [{"tokens": tuple(128 * ((7 * e) % 11) for e in range(n)), "k": 7168,
                       "fmt": "e4m3", "ue8m0": u, "dist": "uniform"}
                      for n in (8, 64) for u in (False, True)]
          + [{"tokens": (2048, 1024), "k": 7100, "fmt": "e4m3", "ue8m0": False,
              "dist": "nan"}]},
    implementations={"torch": tsq_torch},
    negative_controls={"scale_per_block_row": tsq_scale_per_block_row},
    any_alignment=True,
)

SPECS = [QUANTIZE, TRANSPOSE_SPLIT_QUANT]
