"""FP8 GEMMs: per-tensor scaled, blockwise scaled (1x128 activations by 128x128 weights),
and the grouped GEMMs of an MoE layer (contiguous layout with padding rows, masked layout).

Every output is compared twice: allclose with the dequantized reference (the same arithmetic,
float32) and calc_diff with the product of the unquantized inputs (the quantization's own
error must stay small). The allclose also allows 2**-14 of each element's magnitude
sum_k |a_ik| |b_jk| (``OpSpec.magnitude``): FP8 tensor cores accumulate with fewer bits than
float32, and an element whose products cancel keeps their error, not its own size (on an
H200, torch._scaled_mm was 0.0016 off an element of -0.020 whose products summed to 252 in
magnitude: 6.2e-6 of it). TFLOP/s counts 2*M*N*K."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.api import OpSpec, Work, poisoned
from reference_kernels import fp8 as ref

from .common import OUT_DTYPES, gemm_tolerances, values

FAMILY = "fp8_gemm"


def _quantized_pair(tag: str, params: Mapping[str, Any], m: int, n: int, k: int,
                    a_grouping: str, b_grouping: str, g: int | None = None):
    """bf16 a (M, K) and b (N, K) (or (G, N, K)), and their quantized forms."""
    fmt, ue8m0 = params.get("fmt", "e4m3"), params.get("ue8m0", False)
    a = values(tag, params, "a", (m, k))
    b = values(tag, params, "b", (n, k) if g is None else (g * n, k))
    qa, sa = ref.quantize(a, fmt, a_grouping, ue8m0)
    if g is None:
        qb, sb = ref.quantize(b, fmt, b_grouping, ue8m0)
    else:
        pairs = [ref.quantize(bg, fmt, b_grouping, ue8m0) for bg in b.view(g, n, k)]
        qb, sb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        b = b.view(g, n, k)
    return a, b, qa, sa, qb, sb


def _bf16_acc_matmul(a32: torch.Tensor, b32: torch.Tensor, step: int = 128) -> torch.Tensor:
    """The bug of a kernel whose K loop keeps its accumulator in bf16 (one bf16 add per
    128-wide K block, as a WGMMA pipeline promoting partials would)."""
    acc = torch.zeros(a32.shape[0], b32.shape[0], dtype=torch.bfloat16, device=a32.device)
    for k in range(0, a32.shape[1], step):
        acc = (acc.float() + a32[:, k : k + step] @ b32[:, k : k + step].T).to(torch.bfloat16)
    return acc.float()


# ---------------------------------------------------------------- per-tensor
def _gemm_case(tag: str, params: Mapping[str, Any], a_grouping: str, b_grouping: str
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The unquantized a and b, and the GEMM's inputs (quantized once)."""
    a, b, qa, sa, qb, sb = _quantized_pair(tag, params, params["m"], params["n"], params["k"],
                                           a_grouping, b_grouping)
    return a, b, {"a": qa, "scale_a": sa, "b": qb, "scale_b": sb,
                  "out_dtype": OUT_DTYPES[params["out"]]}


def _gemm_expected(reference, tag: str, params: Mapping[str, Any], a_grouping: str,
                   b_grouping: str) -> dict[str, torch.Tensor]:
    """The reference on the quantized inputs, and the product of the unquantized ones."""
    a, b, inputs = _gemm_case(tag, params, a_grouping, b_grouping)
    return {"out": reference(**inputs), "out:unquantized": a.float() @ b.float().T}


def _lens(out_dtype: torch.dtype, reference, *inputs: Any) -> dict[str, torch.Tensor]:
    """The float64 value of a bf16 output before its rounding, for the precision lens (a
    second bf16 rounding in the epilogue is inside the allclose). Nothing for a float32 output:
    a tensor core's accumulator, about 14 bits between promotions, leaves a quarter of its
    elements fitting in fp16, the lens's sign of a 16-bit path."""
    if out_dtype != torch.bfloat16:
        return {}
    return {"out": reference(*inputs, wide=True)}


def _magnitude(a32: torch.Tensor, b32: torch.Tensor) -> torch.Tensor:
    """sum_k |a_ik| |b_jk| of the dequantized operands (b in nn.Linear layout)."""
    return a32.abs() @ b32.abs().T


def per_tensor_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return _gemm_case("gemm_pt", params, "tensor", "tensor")[2]


def per_tensor_expected(params: Mapping[str, Any], rank: int, world_size: int
                        ) -> dict[str, torch.Tensor]:
    return _gemm_expected(ref.gemm_per_tensor, "gemm_pt", params, "tensor", "tensor")


def per_tensor_magnitude(a, scale_a, b, scale_b, out_dtype) -> dict[str, torch.Tensor]:
    return {"out": _magnitude(ref.dequantize(a, scale_a), ref.dequantize(b, scale_b))}


def per_tensor_torch(a, scale_a, b, scale_b, out_dtype):
    """Dequantize, then one float32 matmul."""
    return ((a.float() * scale_a) @ (b.float() * scale_b).T).to(out_dtype)


def per_tensor_scaled_mm(a, scale_a, b, scale_b, out_dtype):
    """torch._scaled_mm, the vendor path (b passed column-major)."""
    return torch._scaled_mm(a, b.t(), scale_a=scale_a.float().to(a.device),
                            scale_b=scale_b.float().to(a.device), out_dtype=out_dtype)


def scaled_mm_cuda_limits(n: int, k: int, fmt: str, capability: tuple[int, int]) -> str | None:
    """Why torch._scaled_mm refuses a GEMM on a CUDA device of ``capability``, or None.

    Its CUDA checks (torch's ScaledBlas.cpp, _scaled_mm_out_cuda; repeated for non-CPU devices
    in torch/_meta_registrations.py): the trailing dim of mat1 (K) and both dims of mat2 (K, N)
    divisible by 16, not both operands e5m2, and compute capability 8.9 or 9.0+. Its CPU
    kernel checks none of these."""
    why = [f"{name}={v} is not a multiple of 16" for name, v in (("K", k), ("N", n)) if v % 16]
    if fmt == "e5m2":
        why.append("it does not multiply two e5m2 matrices")
    if capability < (8, 9):
        why.append(f"it needs compute capability 8.9 or newer (this GPU: "
                   f"{capability[0]}.{capability[1]})")
    return f"torch._scaled_mm on CUDA: {'; '.join(why)}" if why else None


def _scaled_mm_skip(params: Mapping[str, Any], world_size: int, device: Any) -> str | None:
    if torch.device(device).type != "cuda":
        return None
    return scaled_mm_cuda_limits(params["n"], params["k"], params.get("fmt", "e4m3"),
                                 torch.cuda.get_device_capability(device))


per_tensor_scaled_mm.skip_reason = _scaled_mm_skip  # type: ignore[attr-defined]


def per_tensor_bf16_accumulation(a, scale_a, b, scale_b, out_dtype):
    """Bug: partial products over K are accumulated in bf16."""
    return (_bf16_acc_matmul(a.float() * scale_a, b.float() * scale_b)).to(out_dtype)


def _mnk(m, n, k, **extra) -> dict:
    return {"m": m, "n": n, "k": k, **extra}


NIGHTLY_MNK = [(4096, 7168, 2048), (4096, 2112, 7168), (128, 7168, 16384), (64, 4096, 7168)]

def per_tensor_epilogue_through_fp16(a, scale_a, b, scale_b, out_dtype):
    """Bug: a bf16 output staged through float16 (the epilogue's 16-bit type, then a cast):
    two roundings, and outputs past 65504 are inf."""
    acc = (a.float() * scale_a) @ (b.float() * scale_b).T
    if out_dtype == torch.bfloat16:
        return acc.to(torch.float16).to(out_dtype)
    return acc.to(out_dtype)


GEMM_PER_TENSOR = OpSpec(
    name="fp8_gemm.per_tensor", family=FAMILY, reference=ref.gemm_per_tensor,
    description="(a8 * sa) @ (b8 * sb).T, float32 accumulation.",
    make_inputs=per_tensor_inputs, expected=per_tensor_expected,
    magnitude=per_tensor_magnitude, tolerance=lambda p, w: gemm_tolerances(p["fmt"], p["out"]),
    exact=lambda a, scale_a, b, scale_b, out_dtype: _lens(
        out_dtype, ref.gemm_per_tensor, a, scale_a, b, scale_b),
    work=lambda p, w: Work(flops=2.0 * p["m"] * p["n"] * p["k"],
                           bytes=p["m"] * p["k"] + p["n"] * p["k"] + 2 * p["m"] * p["n"],
                           flops_dtype="fp8"),
    grid={"smoke": [_mnk(130, 200, 300, fmt="e4m3", out="bf16"),
                    _mnk(64, 96, 1024, fmt="e4m3", out="f32"),
                    _mnk(33, 64, 512, fmt="e5m2", out="bf16"),
                    # outputs past float16's 65504 (an epilogue through float16 overflows),
                    # in either output type
                    _mnk(32, 64, 256, fmt="e4m3", out="f32", dist="wide"),
                    _mnk(32, 64, 256, fmt="e4m3", out="bf16", dist="wide")],
          "nightly": [_mnk(m, n, k, fmt="e4m3", out="bf16") for m, n, k in NIGHTLY_MNK]
          + [_mnk(4096, 2112, 7168, fmt="e4m3", out="f32", dist="wide")]},
    implementations={"torch": per_tensor_torch, "scaled_mm": per_tensor_scaled_mm},
    negative_controls={"bf16_accumulation": per_tensor_bf16_accumulation,
                       "epilogue_through_fp16": per_tensor_epilogue_through_fp16},
)


# ---------------------------------------------------------------- blockwise
def blockwise_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return _gemm_case("gemm_bw", params, "token", "block")[2]


def blockwise_expected(params: Mapping[str, Any], rank: int, world_size: int
                       ) -> dict[str, torch.Tensor]:
    return _gemm_expected(ref.gemm_blockwise, "gemm_bw", params, "token", "block")


def blockwise_magnitude(a, scale_a, b, scale_b, out_dtype) -> dict[str, torch.Tensor]:
    return {"out": _magnitude(ref.dequantize(a, scale_a, "token"),
                              ref.dequantize(b, scale_b, "block"))}


def dequant(q: torch.Tensor, scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float32 values of q, each (rows x cols) group times its scale."""
    full = scales.float().repeat_interleave(rows, 0).repeat_interleave(cols, 1)
    return q.float() * full[: q.shape[0], : q.shape[1]]


def blockwise_torch(a, scale_a, b, scale_b, out_dtype):
    return (dequant(a, scale_a, 1, 128) @ dequant(b, scale_b, 128, 128).T).to(out_dtype)


def blockwise_scales_transposed(a, scale_a, b, scale_b, out_dtype):
    """Bug: the weight scales are read as if stored K-block-major ([K/128, N/128])."""
    wrong = scale_b.T.contiguous().view(scale_b.shape)
    return (dequant(a, scale_a, 1, 128) @ dequant(b, wrong, 128, 128).T).to(out_dtype)


def blockwise_partial_group_scale(a, scale_a, b, scale_b, out_dtype):
    """Bug: the activation's last, partial K group (K not a multiple of 128) takes the scale of
    the group before it: the scales are indexed by K // 128 groups, rounding down."""
    full = max(a.shape[1] // 128, 1)
    groups = (torch.arange(a.shape[1]) // 128).clamp_max(full - 1)
    sa = scale_a.float()[:, groups]
    return ((a.float() * sa) @ dequant(b, scale_b, 128, 128).T).to(out_dtype)


def blockwise_block_off_by_one(a, scale_a, b, scale_b, out_dtype):
    """Bug: the activation scale of column k is taken from group k // 127."""
    groups = torch.arange(a.shape[1]) // 127
    sa = scale_a.float()[:, groups.clamp_max(scale_a.shape[1] - 1)]
    return ((a.float() * sa) @ dequant(b, scale_b, 128, 128).T).to(out_dtype)


def blockwise_bf16_accumulation(a, scale_a, b, scale_b, out_dtype):
    """Bug: the 128-wide K blocks are accumulated in bf16."""
    return _bf16_acc_matmul(dequant(a, scale_a, 1, 128),
                            dequant(b, scale_b, 128, 128)).to(out_dtype)


GEMM_BLOCKWISE = OpSpec(
    name="fp8_gemm.blockwise", family=FAMILY, reference=ref.gemm_blockwise,
    description="DeepGEMM's 1x128 by 128x128 block-scaled GEMM.",
    make_inputs=blockwise_inputs, expected=blockwise_expected,
    magnitude=blockwise_magnitude, tolerance=lambda p, w: gemm_tolerances(p["fmt"], p["out"]),
    exact=lambda a, scale_a, b, scale_b, out_dtype: _lens(
        out_dtype, ref.gemm_blockwise, a, scale_a, b, scale_b),
    work=lambda p, w: Work(flops=2.0 * p["m"] * p["n"] * p["k"],
                           bytes=p["m"] * p["k"] + p["n"] * p["k"] + 2 * p["m"] * p["n"],
                           flops_dtype="fp8"),
    grid={"smoke": [_mnk(130, 200, 300, fmt="e4m3", ue8m0=False, out="bf16", dist="blocky"),
                    _mnk(64, 384, 1024, fmt="e4m3", ue8m0=True, out="bf16", dist="blocky"),
                    _mnk(17, 256, 640, fmt="e4m3", ue8m0=False, out="f32", dist="logmag"),
                    # 8 rows, a decode step (a swap-AB path for small M); an all-zero
                    # 128-wide K group (a zero partial sum, scaled)
                    _mnk(8, 256, 640, fmt="e4m3", ue8m0=False, out="bf16", dist="edge"),
                    # K not a multiple of 128: the last scale group is partial
                    _mnk(40, 260, 1000, fmt="e4m3", ue8m0=True, out="f32", dist="blocky")],
          "nightly": [_mnk(m, n, k, fmt="e4m3", ue8m0=u, out="bf16") for m, n, k in NIGHTLY_MNK
                      for u in (False, True)]
          + [_mnk(m, n, k, fmt="e4m3", ue8m0=False, out="bf16") for m, n, k in
             ((4096, 7168, 2000), (64, 4100, 7000))]
          + [_mnk(8, 4096, 7168, fmt="e4m3", ue8m0=True, out="bf16", dist="edge")]},
    implementations={"torch": blockwise_torch},
    negative_controls={"scales_transposed": blockwise_scales_transposed,
                       "block_off_by_one": blockwise_block_off_by_one,
                       "partial_group_scale": blockwise_partial_group_scale,
                       "bf16_accumulation": blockwise_bf16_accumulation},
)


# ---------------------------------------------------------------- grouped, contiguous layout
def contiguous_layout(tokens: Sequence[int], align: int) -> torch.Tensor:
    """Per-row expert index of the stacked, aligned segments; -1 on padding rows."""
    index = []
    for g, m in enumerate(tokens):
        padded = -(-m // align) * align
        index += [g] * m + [-1] * (padded - m)
    return torch.tensor(index, dtype=torch.int64)


def _contiguous_case(params: Mapping[str, Any]
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The unquantized a and b, and the grouped GEMM's inputs (quantized once)."""
    tokens, n, k = params["tokens"], params["n"], params["k"]
    index = contiguous_layout(tokens, params["align"])
    # padding rows of a hold values, not zeros: their output must be 0 whatever a holds
    # there (a kernel that multiplies them too passes on zeros)
    a, b, qa, sa, qb, sb = _quantized_pair("grouped_c", params, index.numel(), n, k, "token",
                                           "block", g=len(tokens))
    return a, b, {"a": qa, "scale_a": sa, "b": qb, "scale_b": sb, "group_index": index,
                  "out": poisoned((index.numel(), n), torch.bfloat16)}


def contiguous_inputs(params: Mapping[str, Any], rank: int, world_size: int
                      ) -> dict[str, Any]:
    return _contiguous_case(params)[2]


def contiguous_reference(a, scale_a, b, scale_b, group_index, out):
    return ref.grouped_gemm_contiguous(a, scale_a, b, scale_b, group_index, out.dtype)


def contiguous_expected(params: Mapping[str, Any], rank: int, world_size: int
                        ) -> dict[str, torch.Tensor]:
    a, b, inputs = _contiguous_case(params)
    index = inputs["group_index"]
    unquantized = torch.zeros(index.numel(), params["n"])
    for g in range(b.shape[0]):
        rows = index == g
        unquantized[rows] = a[rows].float() @ b[g].float().T
    return {"out": contiguous_reference(**inputs), "out:unquantized": unquantized}


def contiguous_magnitude(a, scale_a, b, scale_b, group_index, out
                         ) -> dict[str, torch.Tensor]:
    a32 = ref.dequantize(a, scale_a, "token")
    magnitude = torch.zeros(out.shape)  # padding rows: exactly 0
    for g in range(b.shape[0]):
        rows = group_index == g
        magnitude[rows] = _magnitude(a32[rows], ref.dequantize(b[g], scale_b[g], "block"))
    return {"out": magnitude}


def contiguous_torch(a, scale_a, b, scale_b, group_index, out, *, skip_padding=False):
    a32 = dequant(a, scale_a, 1, 128)
    if not skip_padding:
        out[group_index < 0] = 0
    for g in range(b.shape[0]):
        rows = (group_index == g).nonzero().squeeze(1)
        if rows.numel():
            out[rows] = (a32[rows] @ dequant(b[g], scale_b[g], 128, 128).T).to(out.dtype)
    return out


def contiguous_padding_unwritten(a, scale_a, b, scale_b, group_index, out):
    """Bug: rows whose group index is -1 are skipped, so they keep whatever was there."""
    return contiguous_torch(a, scale_a, b, scale_b, group_index, out, skip_padding=True)


def _grouped_work(p: Mapping[str, Any]) -> Work:
    m = sum(p["tokens"]) if "tokens" in p else sum(p["masked"])
    g = len(p.get("tokens", p.get("masked", ())))
    return Work(flops=2.0 * m * p["n"] * p["k"], bytes=m * p["k"] + g * p["n"] * p["k"],
                flops_dtype="fp8")


def _moe_tokens(experts: int, mean: int) -> tuple[int, ...]:
    """Uneven tokens per expert (some experts get none), like a router's output."""
    return tuple((mean * ((5 * e) % 7)) // 3 for e in range(experts))


GROUPED_CONTIGUOUS = OpSpec(
    name="fp8_gemm.grouped_contiguous", family=FAMILY, reference=contiguous_reference,
    description="Grouped GEMM, contiguous layout: expert segments padded to the alignment; "
                "padding rows must come out 0.",
    make_inputs=contiguous_inputs, expected=contiguous_expected,
    magnitude=contiguous_magnitude,
    tolerance=lambda p, w: gemm_tolerances("e4m3"), out_buffers={"out": "out"},
    exact=lambda a, scale_a, b, scale_b, group_index, out: _lens(
        out.dtype, ref.grouped_gemm_contiguous, a, scale_a, b, scale_b, group_index),
    work=lambda p, w: _grouped_work(p),
    grid={"smoke": [{"tokens": (5, 0, 130, 17), "n": 192, "k": 256, "align": 128,
                     "dist": "blocky"},
                    {"tokens": (128, 1), "n": 64, "k": 384, "align": 128, "dist": "logmag"},
                    # segments aligned to 32 (a permute's padding_alignment): a kernel that
                    # takes one group per 64- or 128-row tile from its first row mixes experts
                    {"tokens": (40, 0, 7, 33), "n": 64, "k": 256, "align": 32, "dist": "logmag"}],
          "nightly": [{"tokens": _moe_tokens(e, 4096 * 8 // e), "n": n, "k": k, "align": 128}
                      for e in (8, 32, 256) for n, k in ((4096, 7168), (7168, 2048))]
          + [{"tokens": _moe_tokens(32, 1024), "n": 4096, "k": 7168, "align": 32}]},
    implementations={"torch": contiguous_torch},
    negative_controls={"padding_unwritten": contiguous_padding_unwritten},
    # the call on other values routes the groups' tokens in another order: the same rows
    # in all (a rotation), another group_index
    twin=lambda p: {**p, "tokens": (*p["tokens"][1:], p["tokens"][0])},
)


# ---------------------------------------------------------------- grouped, masked layout
def _masked_case(params: Mapping[str, Any]
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The unquantized a (G, max_m, K) and b, and the masked GEMM's inputs."""
    masked, max_m, n, k = params["masked"], params["max_m"], params["n"], params["k"]
    g = len(masked)
    a = values("grouped_m", params, "a", (g * max_m, k)).view(g, max_m, k)
    qa, sa = zip(*[ref.quantize(ag, "e4m3", "token") for ag in a], strict=True)
    _, b, _, _, qb, sb = _quantized_pair("grouped_m", params, 1, n, k, "token", "block", g=g)
    return a, b, {"a": torch.stack(qa), "scale_a": torch.stack(sa), "b": qb, "scale_b": sb,
                  "masked_m": torch.tensor(masked, dtype=torch.int32),
                  "out": poisoned((g, max_m, n), torch.bfloat16)}


def masked_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    return _masked_case(params)[2]


def masked_expected(params: Mapping[str, Any], rank: int, world_size: int
                    ) -> dict[str, torch.Tensor]:
    a, b, inputs = _masked_case(params)
    g, max_m = len(params["masked"]), params["max_m"]
    unquantized = torch.full((g, max_m, params["n"]), float("nan"))
    for i, m in enumerate(params["masked"]):
        unquantized[i, :m] = a[i, :m].float() @ b[i].float().T
    return {"out": ref.grouped_gemm_masked(**inputs), "out:unquantized": unquantized}


def masked_magnitude(a, scale_a, b, scale_b, masked_m, out) -> dict[str, torch.Tensor]:
    magnitude = torch.zeros(out.shape)  # rows past the mask: untouched, exactly
    for g, m in enumerate(masked_m.tolist()):
        if m:
            magnitude[g, :m] = _magnitude(ref.dequantize(a[g, :m], scale_a[g, :m], "token"),
                                          ref.dequantize(b[g], scale_b[g], "block"))
    return {"out": magnitude}


def masked_torch(a, scale_a, b, scale_b, masked_m, out, *, all_rows=False):
    for g in range(a.shape[0]):
        m = a.shape[1] if all_rows else int(masked_m[g])
        if m:
            prod = dequant(a[g, :m], scale_a[g, :m], 1, 128) @ dequant(
                b[g], scale_b[g], 128, 128).T
            out[g, :m] = prod.to(out.dtype)
    return out


def masked_writes_past_mask(a, scale_a, b, scale_b, masked_m, out):
    """Bug: every one of the max_m rows is computed and written, past masked_m."""
    return masked_torch(a, scale_a, b, scale_b, masked_m, out, all_rows=True)


GROUPED_MASKED = OpSpec(
    name="fp8_gemm.grouped_masked", family=FAMILY, reference=ref.grouped_gemm_masked,
    description="Grouped GEMM, masked layout: only the first masked_m[g] rows of each group "
                "are valid; rows beyond must not be written.",
    make_inputs=masked_inputs, expected=masked_expected, magnitude=masked_magnitude,
    tolerance=lambda p, w: gemm_tolerances("e4m3"), out_buffers={"out": "out"},
    work=lambda p, w: _grouped_work(p),
    grid={"smoke": [{"masked": (3, 0, 64, 17), "max_m": 64, "n": 192, "k": 256},
                    # block magnitudes 2**-8..2**8: a scale of the wrong group or block shows
                    {"masked": (5, 64, 1, 0), "max_m": 64, "n": 256, "k": 384,
                     "dist": "blocky"},
                    # groups past 64 rows: a scale row read tile-relative (row % 64) shows
                    {"masked": (100, 0, 128, 65), "max_m": 128, "n": 128, "k": 256}],
          "nightly": [{"masked": _moe_tokens(e, 128), "max_m": 256, "n": n, "k": k}
                      for e in (8, 32) for n, k in ((4096, 7168), (7168, 2048))]},
    implementations={"torch": masked_torch},
    negative_controls={"writes_past_mask": masked_writes_past_mask},
    # the call on other values masks the groups in another order (masked_m is made from the
    # params, and a schedule kept by shape would pass on reseeded values)
    twin=lambda p: {**p, "masked": (*p["masked"][1:], p["masked"][0])},
)

SPECS = [GEMM_PER_TENSOR, GEMM_BLOCKWISE, GROUPED_CONTIGUOUS, GROUPED_MASKED]
