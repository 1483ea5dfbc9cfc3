"""A spec's own mistakes are one line naming the op and the field (harness.core.spec_checks,
harness.engine.case_setup): a grid that is not {tier: [params]}, a parameter that cannot name
a case, a tolerance that is not one (or names no output), a reference or make_inputs that
returns the wrong thing, said as the spec's, never as the implementation's."""

from __future__ import annotations

import pytest
import torch

from harness.api import OpSpec, allclose, case_tensor, cos_diff, exact
from harness.core import compare
from harness.core.spec import SpecError
from harness.engine.local import run_cases


def _inputs(params, rank, world_size):
    return {"x": case_tensor("t.op", params, "x", (params["n"],), torch.float32)}


def _spec(**changes) -> OpSpec:
    fields = dict(name="t.op", family="t", reference=lambda x: x * 2, make_inputs=_inputs,
                  grid={"smoke": [{"n": 4}]}, implementations={"torch": lambda x: x + x})
    return OpSpec(**{**fields, **changes})


@pytest.mark.parametrize("grid, says", [
    ([{"n": 4}], "grid must be a dict of tiers"),
    ({"smoke": {"n": 4}}, "grid['smoke'] must be a list of parameter dicts"),
    ({"smoke": "n=4"}, "grid['smoke'] must be a list of parameter dicts"),
    ({"smoke": [4]}, "grid['smoke'][0] must be a dict of parameters, not a int"),
    ({"smoke": [{1: 4}]}, "has a parameter named 1: names are strings"),
    ({"smoke": [{"n": 4}, {"n": torch.tensor(3.0)}]}, "grid['smoke'][1]['n'] is a Tensor"),
    ({"smoke": [{"n": 4, "tags": {"a", "b"}}]}, "a set has no order"),
    ({"smoke": [{"n": 4, "dims": (2, [3, {"k": 1}])}]}, "grid['smoke'][0]['dims'][1][1] is a"),
])
def test_a_grid_that_cannot_name_its_cases_is_refused(grid, says):
    with pytest.raises(SpecError, match="t.op: ") as info:
        _spec(grid=grid)
    assert says in str(info.value)


def test_plain_parameters_and_their_lists_are_taken():
    spec = _spec(grid={"smoke": [{"n": 4, "f": 0.5, "s": "a", "b": True, "z": None,
                                  "dims": (2, [3, 4])}]})
    assert spec.cases("smoke", 1)[0].id == "t.op[b=true,dims=2x3x4,f=0.5,n=4,s=a,z=None]"


@pytest.mark.parametrize("tolerance, says", [
    (1e-3, "got a float (0.001)"),
    ((2**-7, 1e-5), "got a tuple"),
    ("allclose", "got a str ('allclose')"),
    (allclose, "tolerance=allclose is the constructor"),
    (exact, "tolerance=exact is the constructor"),
    ({"outt": allclose(1e-3, 1e-5)}, "names 'outt', which is not an output ('out',)"),
    ({"out": 1e-3}, "the tolerance of 'out': a tolerance is"),
])
def test_a_tolerance_that_is_none_is_refused_not_replaced_by_the_default(tolerance, says):
    with pytest.raises(SpecError) as info:
        _spec(tolerance=tolerance)
    assert says in str(info.value)


def test_tolerances_per_output_and_second_references_are_taken():
    spec = _spec(tolerance={"out": allclose(1e-3, 1e-5), "out:exact": None,
                            "out:unquantized": cos_diff(1e-3)})
    assert spec.tolerance["out"].rtol == 1e-3


@pytest.mark.parametrize("make", [
    lambda: compare.allclose(rtol=-2**-7, atol=1e-5),
    lambda: compare.allclose(rtol=1e-3, atol=-1e-5),
    lambda: compare.allclose(1e-3, float("nan")),
    lambda: compare.cos_diff(-1e-3),
    lambda: compare.ulp(-1),
    lambda: compare.allclose(1e-3, 1e-5, max_mismatch_frac=2.0),
])
def test_a_negative_bound_is_refused(make):
    """rtol=-1/128 passes exact values only: a spec that meant 1/128 would never find out."""
    with pytest.raises(ValueError, match="bound|share"):
        make()


def test_a_tolerance_functions_answer_is_checked_where_a_case_asks_it():
    spec = _spec(tolerance=lambda params, world_size: 1e-3)
    (result,) = run_cases(spec, "torch")
    assert result.status == "error"
    assert "the op's spec: t.op: a tolerance is" in result.reason and "returned a float" in \
        result.reason


@pytest.mark.parametrize("changes, says", [
    ({"reference": lambda x: (x * 2, x)}, "its reference returned 2 outputs, expected 1"),
    ({"reference": lambda x: None}, "its reference returned a NoneType"),
    ({"make_inputs": lambda p, r, w: (torch.zeros(4),)}, "make_inputs returned a tuple"),
    ({"reference": lambda x: x.view(3, -1)}, "making the case's inputs and reference outputs "
                                             "raised RuntimeError: shape '[3, -1]'"),
])
def test_the_reference_and_make_inputs_answer_for_their_own_mistakes(changes, says):
    (result,) = run_cases(_spec(**changes), "torch")
    assert result.status == "error" and "the op's spec: t.op: " in result.reason
    assert says in result.reason


def test_a_suite_that_raises_at_import_names_the_line_and_debug_shows_the_traceback(tmp_path):
    import subprocess
    import sys

    suite = tmp_path / "broken.py"
    suite.write_text("import math\n\nSCALE = math.sqrt(-1.0)\n")
    args = [sys.executable, "-m", "harness", "list", "--suite", str(suite)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"ValueError: math domain error (at {suite}, line 3)" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run(args[:3] + ["--debug"] + args[3:], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" in out.stderr and "math.sqrt(-1.0)" in out.stderr
