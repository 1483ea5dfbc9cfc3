"""The files ``harness new-op`` writes: one op in the layout of gpu-mode's reference kernels
(the reference apart from the checker), ready to run, to be edited into the user's op.

The template op is a softmax over the last dimension: small, with a tolerance that matters
and a control (no max subtraction) that a large-logit case exposes. ``$op`` is the op's
registered name, ``$name`` its module name and ``$package`` the suite package.
"""

from __future__ import annotations

from string import Template

SUITE_INIT = '''\
"""Op suite: kernel-harness finds every SPECS in this package (one subpackage per op)."""
'''

OP_INIT = '''\
"""$op: replace this line with what the op computes and where it comes from."""
'''

REFERENCE = '''\
"""Reference of $op: the readable, trusted definition. Keep it slow and obvious;
it runs on the CPU and produces the goldens.

Replace the softmax below with your op; keep make_inputs deterministic (case_tensor makes the
same values for the same params on every machine and rank)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import case_tensor

OP = "$op"


def make_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The keyword arguments of one call: logits uniform in [-scale, scale)."""
    x = case_tensor(OP, params, "x", (params["rows"], params["cols"]),
                    low=-params["scale"], high=params["scale"])
    return {"x": x}


def $name(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, in float64, rounded once to the input's dtype."""
    return torch.softmax(x.double(), dim=-1).to(x.dtype)
'''

TORCH_IMPL = '''\
"""The implementation under test (replace with a call into your kernel)."""

from __future__ import annotations

import torch


def ${name}_torch(x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    e = torch.exp(x32 - x32.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
'''

CONTROLS = '''\
"""Negative controls: plausible wrong kernels that the checks must fail. Each is a bug
someone could write; the case that exposes it belongs in the grid."""

from __future__ import annotations

import torch


def no_max_shift(x: torch.Tensor) -> torch.Tensor:
    """exp without subtracting the row maximum: right for small logits, inf/inf = NaN once
    a logit passes ~88 (the scale=100 case)."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
'''

SPEC = '''\
"""$op as kernel-harness sees it: grids, tolerance, work, implementations, controls."""

from __future__ import annotations

import torch

from harness.api import OpSpec, Work, default_for

from . import controls
from .reference import OP, $name, make_inputs
from .torch_impl import ${name}_torch

SPECS = [OpSpec(
    name=OP, family="$package", reference=$name,
    description="Softmax over the last dimension (replace with your op).",
    make_inputs=make_inputs,
    # size it from numbers: `harness tolerance $op` shows how much of it each
    # implementation uses and how far out each control lands
    tolerance=default_for(torch.bfloat16),
    work=lambda p, w: Work(bytes=4.0 * p["rows"] * p["cols"]),
    grid={"smoke": [{"rows": 4, "cols": 1000, "scale": 1.0},
                    {"rows": 3, "cols": 257, "scale": 100.0}],
          "nightly": [{"rows": r, "cols": c, "scale": 8.0}
                      for r in (1, 64) for c in (4096, 151936)]},
    implementations={"torch": ${name}_torch},
    negative_controls={"no_max_shift": controls.no_max_shift},
)]
'''

TEST = '''\
"""$op: the implementation passes every smoke case, the control fails one (each run in
this process at world size 1, through every check a `harness run` makes)."""

from harness.api import run_cases
from $package.$name.spec import SPECS

SPEC = SPECS[0]


def test_torch_passes_every_case():
    results = run_cases(SPEC, "torch")
    assert [r.status for r in results] == ["pass"] * len(SPEC.grid["smoke"]), \\
        [r.reason for r in results]


def test_no_max_shift_is_caught():
    assert "fail" in {r.status for r in run_cases(SPEC, "no_max_shift")}
'''

CONFTEST = '''\
# Puts this directory on sys.path (pytest's rootdir conftest), so that the tests import
# the suite without installing it.
'''

PROJECT = '''\
# kernel-harness settings for this repository: `harness run` here needs no flags.
suites = ["$package/"]
golden_dir = "golden"
world_sizes = [1]
'''


def render(text: str, **values: str) -> str:
    """A template with its ``$`` placeholders filled."""
    return Template(text).substitute(values)


def op_files(package: str, name: str, op: str) -> dict[str, str]:
    """{path relative to the suite package's parent: text} of one new op."""
    values = {"package": package, "name": name, "op": op}
    return {f"{package}/{name}/{file}": render(text, **values) for file, text in (
        ("__init__.py", OP_INIT), ("reference.py", REFERENCE), ("torch_impl.py", TORCH_IMPL),
        ("controls.py", CONTROLS), ("spec.py", SPEC))}


def test_file(package: str, name: str, op: str) -> str:
    return render(TEST, package=package, name=name, op=op)
