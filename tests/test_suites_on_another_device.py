"""The built-in implementations and controls off the CPU, without a GPU: torch's ``meta`` device
stands in for a second device. A tensor made on the CPU inside an implementation meets the
meta inputs and raises a device mismatch, as it would beside CUDA inputs; an output left on the
CPU shows too. (Ops whose work depends on data, nonzero and .item(), cannot run on meta; they
are listed as such, not counted as passing.)"""

from __future__ import annotations

import re

import pytest
import torch

from harness.core.discovery import registry
from harness.engine.case_setup import normalize_outputs
from suites._fp8.gemm import GEMM_PER_TENSOR, per_tensor_scaled_mm, scaled_mm_cuda_limits

#: what meta tensors cannot do (data-dependent shapes or values): not a device bug
DATA_DEPENDENT = re.compile(r"nonzero|\.item\(\) cannot be called on meta|Cannot copy out of "
                            r"meta|no fake impl or Meta kernel|data-dependent")
MISMATCH = re.compile(r"device|cpu", re.IGNORECASE)


def _meta(value):
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def _single_device_runs():
    for spec in sorted(registry().specs.values(), key=lambda s: s.name):
        if spec.distributed:
            continue
        for params in spec.grid["smoke"]:
            for name, fn in spec.all_impls().items():
                if getattr(fn, "runs_on", None) is not None and not fn.runs_on("cpu"):
                    continue  # CUDA C++: compiled and checked in test_cuda_source.py
                yield spec, params, name, fn


def test_no_implementation_or_control_leaves_the_inputs_device():
    ran, data_dependent, problems = 0, set(), []
    for spec, params, name, fn in _single_device_runs():
        inputs = spec.make_inputs(params, 0, 1)
        try:
            outputs = normalize_outputs(fn(**{k: _meta(v) for k, v in inputs.items()}),
                                        spec.outputs)
        except Exception as exc:  # noqa: BLE001 - each kind is judged below
            text = str(exc).splitlines()[0]
            if fn is per_tensor_scaled_mm and "divisible by 16" in text:
                continue  # torch's non-CPU shape checks: the skip below covers them
            if DATA_DEPENDENT.search(text):
                data_dependent.add(f"{spec.name}@{name}")
                continue
            if MISMATCH.search(text):
                problems.append(f"{spec.name}@{name} {params}: {type(exc).__name__}: {text}")
                continue
            raise
        ran += 1
        stray = {k: str(t.device) for k, t in outputs.items()
                 if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        if stray:
            problems.append(f"{spec.name}@{name} {params}: outputs on {stray}")
    assert not problems, "\n".join(problems)
    assert ran > 250, ran  # most of the single-device implementations ran
    assert "fp8_gemm.per_tensor@bf16_accumulation" not in data_dependent


@pytest.mark.parametrize("tier", ["smoke", "nightly"])
def test_the_scaled_mm_skip_agrees_with_torchs_own_checks_off_the_cpu(tier):
    # torch/_meta_registrations.py repeats _scaled_mm's CUDA shape checks for every non-CPU
    # device: the meta device says which shapes CUDA refuses (e5m2 x e5m2 it does not check)
    for p in GEMM_PER_TENSOR.grid[tier]:
        fp8 = torch.float8_e4m3fn
        a = torch.empty(p["m"], p["k"], dtype=fp8, device="meta")
        b = torch.empty(p["n"], p["k"], dtype=fp8, device="meta")
        one = torch.ones((), device="meta")
        try:
            per_tensor_scaled_mm(a, one, b, one, torch.bfloat16)
            refused = False
        except RuntimeError as exc:
            assert "divisible by 16" in str(exc)
            refused = True
        why = scaled_mm_cuda_limits(p["n"], p["k"], "e4m3", (9, 0))
        assert (why is not None) == refused, (p, why)


def test_scaled_mm_skips_what_cuda_refuses_and_runs_the_rest():
    skip = per_tensor_scaled_mm.skip_reason  # type: ignore[attr-defined]
    smoke = GEMM_PER_TENSOR.grid["smoke"]
    hopper = [scaled_mm_cuda_limits(p["n"], p["k"], p["fmt"], (9, 0)) for p in smoke]
    assert "K=300 is not a multiple of 16" in hopper[0] and "N=200" in hopper[0]
    assert hopper[1] is None
    assert "two e5m2 matrices" in hopper[2]
    assert all(scaled_mm_cuda_limits(p["n"], p["k"], p["fmt"], (9, 0)) is None
               for p in GEMM_PER_TENSOR.grid["nightly"])
    assert "8.9 or newer" in scaled_mm_cuda_limits(96, 1024, "e4m3", (8, 0))
    assert scaled_mm_cuda_limits(96, 1024, "e4m3", (8, 9)) is None
    # the CPU kernel has none of these limits
    assert all(skip(p, 1, torch.device("cpu")) is None for p in smoke)
