"""example.qk_norm_rope: the implementation passes every smoke case and each control fails
every one, through every check a `harness run` makes (in this process, at world size 1)."""

import pytest
import torch

from example_ops.qk_norm_rope.reference import make_inputs, qk_norm_rope
from example_ops.qk_norm_rope.spec import SPECS
from harness.api import run_cases

SPEC = SPECS[0]


def test_torch_passes_every_case():
    results = run_cases(SPEC, "torch")
    assert [r.status for r in results] == ["pass"] * len(SPEC.grid["smoke"]), \
        [r.reason for r in results]


@pytest.mark.parametrize("control", ["rope_before_norm", "k_normed_with_q_weight"])
def test_each_control_fails_every_case(control):
    results = run_cases(SPEC, control)
    assert {r.status for r in results} == {"fail"}, [r.reason for r in results]


def test_an_all_zero_head_stays_zero():
    params = next(p for p in SPEC.grid["smoke"] if p.get("rows") == "zero")
    out = qk_norm_rope(**make_inputs(params, 0, 1))
    assert torch.equal(out["q"][0], torch.zeros_like(out["q"][0]))
    assert torch.equal(out["k"][0], torch.zeros_like(out["k"][0]))
