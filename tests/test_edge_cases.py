"""Each edge-case smoke case exposes the bug it was added for: a plausible wrong kernel fails
that case through the real runner (every check, in process at world size 1) and passes the
op's first plain smoke case, so it is the edge case, not any case, that catches it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from quantizers import with_pow2_ceil
from smoke_cases import smoke_case, status

import suites._fp8.quant as quant
from harness.core.discovery import registry
from harness.core.inputs import plant_specials, special_values
from harness.core.spec import Case
from harness.engine.runner import run_case
from reference_kernels import hopper_tasks as hopper_ref
from suites._moe import torch_ops


def _edge_and_plain(op: str, **match) -> tuple[dict, dict]:
    """The smoke case whose params include ``match``, and the op's first smoke case."""
    return smoke_case(op, **match), registry().specs[op].grid["smoke"][0]


# ------------------------------------------------------------------ wrong kernels

def copy_through_arithmetic(x: torch.Tensor) -> torch.Tensor:
    """A copy that adds 0: -0.0 becomes +0.0 (every other value, NaN included, survives)."""
    return x + 0.0


def copy_through_float32(x: torch.Tensor) -> torch.Tensor:
    """A copy that loads into float32 and stores back: every value survives but a NaN's sign
    and payload (torch's float32 to bf16 returns one NaN for all)."""
    return x.float().to(x.dtype)


def copy_flushing_subnormals(x: torch.Tensor) -> torch.Tensor:
    """A copy that flushes subnormals to a zero of their sign, as a load with FTZ does (-0.0
    stays -0.0: only the subnormals can show it)."""
    tiny = torch.finfo(x.dtype).tiny
    return torch.where(x.abs() < tiny, torch.zeros_like(x).copysign(x), x)


def rmsnorm_eps_outside_sqrt(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """rsqrt(mean) + eps: equal to within rounding on every row but an all-zero one (NaN)."""
    x32 = x.float()
    r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True)) + hopper_ref.EPS
    return (x32 * r * weight.float()).to(x.dtype)


#: UE8M0 as 2**(floor(log2 s) + 1): right except where s is a power of two already
quantize_ue8m0_bumped = with_pow2_ceil(lambda s: torch.exp2(torch.floor(torch.log2(s)) + 1))


def unpermute_per_token_loop(permuted, rowmap, routemap, permuted_probs, num_tokens,
                             num_experts):
    """A loop over tokens that stacks each token's rows: a token routed to no expert has none
    to stack, and torch.stack raises."""
    out = torch.empty(num_tokens, permuted.shape[1], dtype=permuted.dtype)
    for t in range(num_tokens):
        rows = rowmap[t][rowmap[t] >= 0].long()
        out[t] = torch.stack([permuted[r].float() for r in rows]).sum(0).to(permuted.dtype)
    return out, torch_ops.unpermute(permuted, rowmap, routemap, permuted_probs, num_tokens,
                                    num_experts)[1]


# ------------------------------------------------------------------ the tests

@pytest.mark.parametrize("wrong", [copy_through_arithmetic, copy_flushing_subnormals,
                                   copy_through_float32])
def test_identity_special_values_catch_a_copy_that_computes(world, wrong):
    edge, plain = _edge_and_plain("hopper_tasks.identity", values="special")
    assert status(world, "hopper_tasks.identity", edge, wrong) == "fail"
    assert status(world, "hopper_tasks.identity", plain, wrong) == "pass"


def test_embedding_special_values_catch_a_gather_that_computes(world):
    def gather_plus_zero(ids, weight):
        rows = F.embedding(ids.reshape(-1).clamp_min(0), weight) + 0.0
        valid = (ids.reshape(-1) >= 0).unsqueeze(1)
        return torch.where(valid, rows, torch.zeros((), dtype=rows.dtype))

    edge, plain = _edge_and_plain("hopper_tasks.embedding", values="special")
    assert status(world, "hopper_tasks.embedding", edge, gather_plus_zero) == "fail"
    assert status(world, "hopper_tasks.embedding", plain, gather_plus_zero) == "pass"


def test_strided_copy_storages_carry_special_values(world):
    def copy_plus_zero(storage, size, stride, offset, out):
        src = storage.as_strided(size, stride, offset + storage.storage_offset())
        return out.copy_(src + 0 if src.is_floating_point() else src)

    spec = registry().specs["strided_copy"]
    f32 = next(p for p in spec.grid["smoke"] if p["dtype"] == "f32")
    i32 = next(p for p in spec.grid["smoke"] if p["dtype"] == "i32")
    assert status(world, "strided_copy", f32, copy_plus_zero) == "fail"
    assert status(world, "strided_copy", i32, copy_plus_zero) == "pass"


def test_rmsnorm_zero_row_catches_the_eps_outside_the_square_root(world):
    edge, plain = _edge_and_plain("hopper_tasks.rmsnorm", rows="zero")
    assert status(world, "hopper_tasks.rmsnorm", edge, rmsnorm_eps_outside_sqrt) == "fail"
    assert status(world, "hopper_tasks.rmsnorm", plain, rmsnorm_eps_outside_sqrt) == "pass"


def test_quantize_power_of_two_groups_catch_ue8m0_rounded_up_past_exact(world):
    op = "fp8_gemm.quantize"
    edge, _ = _edge_and_plain(op, dist="edge", fmt="e5m2", ue8m0=True)
    assert status(world, op, edge, quantize_ue8m0_bumped) == "fail"


def test_unrouted_tokens_catch_an_unpermute_that_assumes_every_token_is_routed(world):
    edge, plain = _edge_and_plain("moe.unpermute", unrouted=True)
    assert status(world, "moe.unpermute", edge, unpermute_per_token_loop) == "error"
    assert status(world, "moe.unpermute", plain, unpermute_per_token_loop) == "pass"


def test_special_values_hold_each_class_once_per_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                  torch.float8_e5m2, torch.float64):
        v = special_values(dtype).double()
        assert bool(torch.isnan(v).any())
        assert bool(((v == 0) & torch.signbit(v)).any())  # -0.0
        sub = v[(v != 0) & (v.abs() < torch.finfo(dtype).tiny)]
        assert sub.numel() == 4 and bool((sub > 0).any()) and bool((sub < 0).any())
        assert bool(torch.isinf(v).any()) == (dtype != torch.float8_e4m3fn)
        # NaNs of every sign, and one that is not the canonical NaN a conversion makes
        nans = special_values(dtype)[torch.isnan(v)]
        bits = {bytes(n.view(torch.uint8).tolist()) for n in nans.reshape(-1, 1)}
        assert len(bits) == nans.numel() == (2 if dtype == torch.float8_e4m3fn else 3)
        assert bool(torch.signbit(nans.double()).any())
        if dtype not in (torch.float32, torch.float64, torch.float8_e4m3fn):
            through = nans.float().to(dtype)  # float32 and back: one NaN (e4m3fn has one)
            assert not torch.equal(through.view(torch.uint8), nans.view(torch.uint8))
    x = plant_specials(torch.ones(100, dtype=torch.bfloat16))  # 15 slots for 13 specials
    special = special_values(torch.bfloat16)
    assert torch.equal(x[0:91:7].view(torch.int16), special.view(torch.int16))
    assert float(x[1]) == 1.0 and float(x[7]) == torch.finfo(torch.bfloat16).max


def test_an_output_in_the_wrong_dtype_fails_even_when_every_value_survives_the_cast(world):
    def bf16_scales(x, fmt, granularity, ue8m0, scale):
        q, s = quant.quantize_torch(x, fmt, granularity, ue8m0, scale)
        return q, s.bfloat16()  # UE8M0 scales are powers of two: exact in bf16

    op = "fp8_gemm.quantize"
    edge, _ = _edge_and_plain(op, dist="edge", fmt="e5m2", ue8m0=True)
    r = run_case(world, Case(registry().specs[op], edge, 1), "candidate", bf16_scales,
                 bench=False)
    assert r.status == "fail"
    assert "dtype bfloat16 != expected float32" in r.reason

