"""Reference FP8 quantization and GEMMs (DeepGEMM / TransformerEngine / Paddle semantics).

Formats: e4m3 (float8_e4m3fn, max 448) and e5m2 (max 57344). A group's scale is
amax / fmax with amax clamped to >= 1e-4 (an all-zero group gets a tiny scale, not a division
by zero); the UE8M0 variant rounds the scale up to a power of two. Quantized value =
saturate(x / scale) rounded to nearest even: values beyond the format's max become +-max.
Groupings: per tensor; per token (1 x 128 along K, scales [M, ceil(K/128)]); per block
(128 x 128, scales [ceil(N/128), ceil(K/128)]); a ragged last group is zero padded.
GEMMs dequantize (scales repeated over their blocks), multiply in float32 and cast once.

Non-finite inputs (torch's amax, which propagates NaN, and IEEE division): a group holding a
NaN has amax NaN, so its scale is NaN and every value of the group quantizes to NaN; a group
holding an infinity (and no NaN) has scale +inf, so its finite values quantize to 0 (with
their sign) and its infinities to NaN (inf / inf). A kernel whose max skips NaN (fmaxf,
Triton's max) gives the group a finite scale instead, and fails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
AMAX_FLOOR = 1e-4
BLOCK = 128


def divide(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b correctly rounded on every device. torch on CUDA computes a tensor divided by a
    Python number (or by a CPU scalar) as a * (1 / b), which can be one ulp off
    (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu); a divisor on a's own device is
    divided by."""
    return a / a.new_tensor(b)


def scale_from_amax(amax: torch.Tensor, fmt: str, ue8m0: bool = False) -> torch.Tensor:
    """amax (clamped to >= 1e-4) / fmax in float32, correctly rounded; rounded up to a power
    of two for UE8M0."""
    scale = divide(amax.float().clamp_min(AMAX_FLOOR), FMAX[fmt])
    if ue8m0:
        # the smallest power of two >= scale, exactly: scale = m * 2**e with m in [0.5, 1);
        # (float32 log2 of a value one ulp above a power of two rounds to an integer). A NaN
        # or infinite scale stays as it is (DeepGEMM's 2**ceil(log2 s) keeps it): frexp gives
        # them exponent 0, which would make them 1.0
        mantissa, exponent = torch.frexp(scale)
        pow2 = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).int())
        scale = torch.where(torch.isfinite(scale), pow2, scale)
    return scale


def cast_saturating(x32: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round to the format (nearest even) after clamping to +-fmax."""
    return x32.clamp(-FMAX[fmt], FMAX[fmt]).to(FORMATS[fmt])


def _pad_to(x: torch.Tensor, multiples: Sequence[int]) -> torch.Tensor:
    pads: list[int] = []
    for dim, m in reversed(list(enumerate(multiples))):
        pads += [0, (-x.shape[dim]) % m]
    return torch.nn.functional.pad(x, pads)


def group_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """amax of each (rows x cols) group of a 2-D tensor, zero padded: [ceil(M/rows),
    ceil(K/cols)]."""
    padded = _pad_to(x.float().abs(), (rows, cols))
    m, k = padded.shape
    return padded.view(m // rows, rows, k // cols, cols).amax(dim=(1, 3))


def expand_scales(scales: torch.Tensor, rows: int, cols: int, shape: Sequence[int]
                  ) -> torch.Tensor:
    """Each group's scale repeated over its (rows x cols) block, cropped to ``shape``."""
    full = scales.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)
    return full[: shape[0], : shape[1]]


_GROUPS = {"token": (1, BLOCK), "block": (BLOCK, BLOCK)}


def quantize(x: torch.Tensor, fmt: str = "e4m3", granularity: str = "tensor",
             ue8m0: bool = False, scale: float | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(quantized x, float32 scales). ``granularity``: ``tensor`` (scale shape ()), ``token``
    (1x128 groups along the last dim) or ``block`` (128x128). ``scale`` fixes a per-tensor
    scale (static scaling) instead of deriving it from amax: then values beyond fmax * scale
    saturate."""
    x32 = x.float()
    if granularity == "tensor":
        s = (x32.new_tensor(float(scale)) if scale is not None
             else scale_from_amax(x32.abs().amax(), fmt, ue8m0))
        return cast_saturating(x32 / s, fmt), s
    if scale is not None:
        raise ValueError("a static scale is per tensor")
    rows, cols = _GROUPS[granularity]
    s = scale_from_amax(group_amax(x32, rows, cols), fmt, ue8m0)
    return cast_saturating(x32 / expand_scales(s, rows, cols, x.shape), fmt), s


def dequantize(q: torch.Tensor, scales: torch.Tensor, granularity: str = "tensor", *,
               wide: bool = False) -> torch.Tensor:
    """float32 values of a quantized tensor (``wide``: float64, where every product of an FP8
    value and its float32 scale is exact)."""
    acc = torch.float64 if wide else torch.float32
    if granularity == "tensor":
        return q.to(acc) * scales.to(acc)
    rows, cols = _GROUPS[granularity]
    return q.to(acc) * expand_scales(scales.to(acc), rows, cols, q.shape)


def _once(value: torch.Tensor, out_dtype: torch.dtype, wide: bool) -> torch.Tensor:
    """``value`` rounded once to the output dtype; ``wide``: kept as it is (float64), the
    value before that rounding, for the precision lens."""
    return value if wide else value.to(out_dtype)


def gemm_per_tensor(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor,
                    scale_b: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                    wide: bool = False) -> torch.Tensor:
    """(a * sa) @ (b * sb).T in float32, cast once; b in nn.Linear layout (N, K)."""
    return _once(dequantize(a, scale_a, wide=wide) @ dequantize(b, scale_b, wide=wide).T,
                 out_dtype, wide)


def gemm_blockwise(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor,
                   scale_b: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                   wide: bool = False) -> torch.Tensor:
    """DeepGEMM's 1x128 (activations) by 128x128 (weights) scaled GEMM."""
    return _once(dequantize(a, scale_a, "token", wide=wide)
                 @ dequantize(b, scale_b, "block", wide=wide).T, out_dtype, wide)


def grouped_gemm_contiguous(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor,
                            scale_b: torch.Tensor, group_index: torch.Tensor,
                            out_dtype: torch.dtype = torch.bfloat16, *, wide: bool = False
                            ) -> torch.Tensor:
    """Rows of every expert stacked (each segment padded to the alignment); row i uses expert
    group_index[i]'s weight b[g] (G, N, K); padding rows (group -1) come out 0."""
    a32 = dequantize(a, scale_a, "token", wide=wide)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=a32.dtype)
    for g in range(b.shape[0]):
        rows = group_index == g
        if rows.any():
            out[rows] = a32[rows] @ dequantize(b[g], scale_b[g], "block", wide=wide).T
    return _once(out, out_dtype, wide)


def grouped_gemm_masked(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor,
                        scale_b: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor
                        ) -> torch.Tensor:
    """A (G, max_m, K): for each group only the first masked_m[g] rows are valid and written
    into out (G, max_m, N); rows beyond keep what ``out`` held (a copy is returned)."""
    result = out.clone()
    for g in range(a.shape[0]):
        m = int(masked_m[g])
        if m:
            prod = dequantize(a[g, :m], scale_a[g, :m], "token") @ dequantize(
                b[g], scale_b[g], "block").T
            result[g, :m] = prod.to(out.dtype)
    return result


def transpose_split_quant(x: torch.Tensor, tokens_per_expert: Sequence[int], fmt: str = "e4m3",
                          ue8m0: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Paddle's fused_transpose_split_quant: x (M, K) split by tokens (each a multiple of 128),
    each piece transposed to (K, M_i) and quantized in groups of 128 tokens per column:
    scales (M_i / 128, K)."""
    if sum(tokens_per_expert) != x.shape[0] or any(m % BLOCK for m in tokens_per_expert):
        raise ValueError("tokens_per_expert must be multiples of 128 adding up to M")
    outs, scales = [], []
    for piece in x.split(list(tokens_per_expert)):
        t = piece.float().T.contiguous()                       # (K, M_i)
        amax = t.abs().view(t.shape[0], -1, BLOCK).amax(-1).T if piece.shape[0] else (
            torch.zeros(0, x.shape[1]))                        # (M_i/128, K)
        s = scale_from_amax(amax, fmt, ue8m0)
        expanded = s.T.repeat_interleave(BLOCK, dim=1)         # (K, M_i)
        outs.append(cast_saturating(t / expanded, fmt))
        scales.append(s)
    return outs, scales


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's 1 - 2<x,y> / (|x|^2 + |y|^2) in float64 (0 when both are zero)."""
    x64, y64 = x.double(), y.double()
    denom = (x64 * x64 + y64 * y64).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x64 * y64).sum() / denom)


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
