"""FP8 quantizers that are bitwise on the CPU must stay bitwise compiled on a GPU.

An H200 run found two ways a quantizer checked bitwise on the CPU drifts on CUDA, and these
tests hold each of them on the CPU:
- torch on CUDA divides a tensor by a Python number as a * (1 / b) (one ulp off at times:
  aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu, "compute a * reciprocal(b)"), and its
  log2 may be an ulp high; the torch quantizers and the reference are run here under both
  and must not move a bit;
- compiled Triton divides with ``div.full.f32`` and (before 3.9) negates as ``0 - x``; the
  Triton quantizer's division and sign must therefore not depend on either, and its UE8M0
  scale must be exact where a float32 log2 is not.
"""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reference_kernels import fp8 as ref
from suites._fp8 import quant
from suites._fp8.common import values


class CudaArithmetic(TorchDispatchMode):
    """Two things torch on CUDA may do that the CPU does not: a tensor divided by a Python
    number is multiplied by the reciprocal, taken in the tensor's own precision (opmath:
    float32 for float32); and log2 is one ulp high (within the CUDA Math API's 1 ulp bound for
    log2, so an exact power of two need not give an integer)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.log2.default:
            out = func(*args, **kwargs)
            return torch.nextafter(out, torch.full_like(out, float("inf")))
        if func is torch.ops.aten.div.Tensor and isinstance(args[1], (int, float)) \
                and args[0].is_floating_point() and not kwargs:
            a = args[0]
            one = torch.ones((), dtype=a.dtype)
            inverse = torch.ops.aten.div.Tensor(one, torch.full((), args[1], dtype=a.dtype))
            return torch.ops.aten.mul.Tensor(a, inverse)
        return func(*args, **kwargs)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 4: torch.int32}[t.element_size()])


# the cases that failed on the H200 before the quantizers divided by a tensor
FAILED_ON_CUDA = [
    {"fmt": "e4m3", "granularity": "token", "m": 130, "k": 300, "ue8m0": False,
     "dist": "logmag"},
    {"fmt": "e5m2", "granularity": "block", "m": 130, "k": 300, "ue8m0": False,
     "dist": "logmag"},
    {"fmt": "e4m3", "granularity": "block", "m": 256, "k": 256, "ue8m0": True, "dist": "edge"},
    {"fmt": "e4m3", "granularity": "token", "m": 7, "k": 128, "ue8m0": False,
     "dist": "uniform"},
]


@pytest.mark.parametrize("params", FAILED_ON_CUDA,
                         ids=lambda p: f"{p['fmt']}-{p['granularity']}-{p['dist']}"
                                       f"{'-ue8m0' if p['ue8m0'] else ''}")
def test_quantizers_keep_every_bit_under_cudas_arithmetic(params):
    x = values("quantize", {**params, "static": False}, "x", (params["m"], params["k"]))
    args = (x, params["fmt"], params["granularity"], params["ue8m0"], None)
    for fn in (ref.quantize, quant.quantize_torch):
        q, s = fn(*args)
        with CudaArithmetic():
            q_cuda, s_cuda = fn(*args)
        assert torch.equal(_bits(s_cuda), _bits(s)), f"{fn.__qualname__}: scales moved"
        assert torch.equal(_bits(q_cuda), _bits(q)), f"{fn.__qualname__}: values moved"


def _leaves(out) -> list[torch.Tensor]:
    """Every tensor of a (nested) tuple or list of outputs, as raw bits."""
    if isinstance(out, (list, tuple)):
        return [leaf for part in out for leaf in _leaves(part)]
    return [_bits(out)]


def test_transpose_split_quant_keeps_every_bit_under_cudas_arithmetic():
    x = values("tsq", {"k": 200, "fmt": "e4m3"}, "x", (384, 200))
    for fn in (ref.transpose_split_quant, quant.tsq_torch):
        plain = _leaves(fn(x, [128, 0, 256], "e4m3", False))
        with CudaArithmetic():
            emulated = _leaves(fn(x, [128, 0, 256], "e4m3", False))
        assert all(torch.equal(a, b) for a, b in zip(plain, emulated, strict=True)), \
            fn.__qualname__


def test_the_emulation_moves_a_bit_where_cuda_does():
    """The control: amax / 448 by reciprocal is one ulp off for this amax, as on the H200."""
    amax = torch.tensor([0.9921875], dtype=torch.float32)
    with CudaArithmetic():
        by_reciprocal = amax / 448.0
    assert not torch.equal(_bits(by_reciprocal), _bits(amax / 448.0))
    assert torch.equal(_bits(ref.divide(amax, 448.0)), _bits(amax / 448.0))


# ---------------------------------------------------------------- Triton
def _triton_quantize(x, fmt, ue8m0):
    pytest.importorskip("triton")
    from suites._triton import fp8_quant

    return fp8_quant.quantize_per_token(x, fmt, "token", ue8m0, None)


def _pow2_boundary_rows(fmt: str) -> torch.Tensor:
    """bf16 rows whose amax / fmax lands one float32 ulp or less above a power of two, where a
    float32 log2 rounds to the integer and UE8M0 must still round up."""
    fmax = ref.FMAX[fmt]
    rows = []
    for e in range(-6, 3):
        for ulps in (1, 2, 3):
            amax = torch.tensor(fmax * 2.0 ** e, dtype=torch.float32)
            amax = torch.nextafter(amax.to(torch.bfloat16).float(), torch.tensor(1e9))
            for _ in range(ulps - 1):
                amax = torch.nextafter(amax, torch.tensor(1e9))
            row = torch.linspace(-1, 1, 128) * float(amax)
            row[5] = float(amax)
            rows.append(row)
    return torch.stack(rows).to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_the_triton_quantizer_keeps_signed_zeros_and_exact_power_of_two_scales(fmt, ue8m0):
    x = torch.cat([_pow2_boundary_rows(fmt),
                   values("quantize", {"dist": "logmag", "fmt": fmt}, "x", (16, 128))])
    x[-1, :7] = torch.tensor([-0.0, 0.0, -1e-30, 1e-30, -0.0, -1e-38, 3.0])
    q, s = _triton_quantize(x, fmt, ue8m0)
    eq, es = ref.quantize(x, fmt, "token", ue8m0)
    assert torch.equal(_bits(s), _bits(es)), "scales"
    assert torch.equal(_bits(q), _bits(eq)), "values (signed zeros included)"


def test_the_triton_quantizer_divides_exactly_and_reads_no_log2():
    """Compiled, a float32 ``/`` is div.full.f32 (Triton's FDivOpConversion) and log2/exp2
    are approximations: the quantizer uses tl.math.div_rn and bit arithmetic instead."""
    pytest.importorskip("triton")
    from suites._triton import fp8_quant

    tree = ast.parse(inspect.getsource(fp8_quant))
    kernels = [f for f in tree.body if isinstance(f, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in f.decorator_list)]
    assert {k.name for k in kernels} >= {"_quantize_1x128", "_round_to_fp8"}
    for kernel in kernels:
        for node in ast.walk(kernel):
            assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)), \
                f"{kernel.name}: a float division '{ast.unparse(node)}'; use tl.math.div_rn"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("log2", "exp2", "log", "exp"), \
                    f"{kernel.name}: {ast.unparse(node)} is approximate when compiled"
