"""The files ``harness new-op`` writes: one op in the layout of gpu-mode's reference kernels
(the reference apart from the checker), ready to run, to be edited into the user's op.

The template op is a softmax over the last dimension: small, with a tolerance that matters
and a control (no max subtraction) that a large-logit case exposes. With ``--distributed`` it
is the same softmax over a vocabulary sharded across tensor-parallel ranks (the pattern of
examples/example_ops' tp_argmax): the reference computes the whole result, each rank gets its
shard of the inputs and is expected to return its shard of the result, and the control
forgets to reduce across ranks, so it passes at one rank and fails at four. ``$op`` is the
op's registered name, ``$name`` its module name and ``$package`` the suite package.
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
db = "harness-results/history.db"
world_sizes = [$world_sizes]
'''

# ---------------------------------------------------------------- the distributed op
DIST_REFERENCE = '''\
"""Reference of $op: the readable, trusted definition, on the whole tensor as one
device would see it. Keep it slow and obvious; it runs on the CPU and produces the goldens.

The template is a softmax over a vocabulary sharded across tensor-parallel ranks: rank r of
W holds columns [r * V/W, (r + 1) * V/W) of the logits and returns the same columns of the
softmax of the whole row. Replace it with your op and keep the three parts: the reference
computes the whole result, make_inputs gives each rank its shard of the inputs, expected
cuts out what each rank must return."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.api import case_tensor, shard

OP = "$op"


def make_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's columns of the logits, uniform in [-scale, scale): ``region`` makes exactly
    these columns of the whole tensor, the same values at any number of ranks."""
    cols = shard(params["cols"], rank, world_size)
    x = case_tensor(OP, params, "x", (params["rows"], params["cols"]),
                    low=-params["scale"], high=params["scale"], region=(slice(None), cols))
    return {"x": x}


def whole_inputs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs one device would see: every rank's shard side by side."""
    return make_inputs(params, 0, 1)


def $name(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of the whole logits, in float64, rounded once to the
    input's dtype."""
    return torch.softmax(x.double(), dim=-1).to(x.dtype)


def expected(params: Mapping[str, Any], rank: int, world_size: int) -> torch.Tensor:
    """What rank ``rank`` must return: its columns of the whole result."""
    whole = $name(**whole_inputs(params))
    return whole[:, shard(params["cols"], rank, world_size)].contiguous()
'''

DIST_TORCH_IMPL = '''\
"""The implementation under test (replace with a call into your kernel). It takes the World
first (world.rank, world.size, world.group: the run's torch.distributed process group) and
this rank's inputs; the row maximum and the row sum are all-reduced over the ranks, so each
rank returns its columns of the softmax of the whole row."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce(world, t: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
    """``t`` reduced over every rank, in place. One rank has nothing to reduce (and a suite's
    own tests, at world size 1 in their process, then need no process group)."""
    if world.size > 1:
        dist.all_reduce(t, op=op, group=world.group)
    return t


def ${name}_torch(world, x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    row_max = all_reduce(world, x32.amax(dim=-1, keepdim=True), dist.ReduceOp.MAX)
    e = torch.exp(x32 - row_max)
    row_sum = all_reduce(world, e.sum(dim=-1, keepdim=True), dist.ReduceOp.SUM)
    return (e / row_sum).to(x.dtype)
'''

DIST_CONTROLS = '''\
"""Negative controls: plausible wrong kernels that the checks must fail. Each is a bug
someone could write; the case (or the world size) that exposes it belongs in the spec."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .torch_impl import all_reduce


def no_sum_reduce(world, x: torch.Tensor) -> torch.Tensor:
    """Divides by this rank's part of the row sum (its all-reduce forgotten): right at one
    rank, where the shard is the whole row; at four ranks each shard sums to 1 on its own."""
    x32 = x.float()
    row_max = all_reduce(world, x32.amax(dim=-1, keepdim=True), dist.ReduceOp.MAX)
    e = torch.exp(x32 - row_max)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
'''

DIST_SPEC = '''\
"""$op as kernel-harness sees it: grids, tolerance, work, world sizes, implementations,
controls."""

from __future__ import annotations

import torch

from harness.api import OpSpec, Work, default_for

from . import controls
from .reference import OP, $name, expected, make_inputs
from .torch_impl import ${name}_torch

SPECS = [OpSpec(
    name=OP, family="$package", reference=$name,
    description="Softmax over a vocabulary sharded across tensor-parallel ranks (replace "
                "with your op).",
    # make_inputs gives each rank its shard; expected, each rank's part of the whole result
    make_inputs=make_inputs, expected=expected,
    # size it from numbers: `harness tolerance $op --world-sizes 1,4`
    tolerance=default_for(torch.bfloat16),
    work=lambda p, w: Work(bytes=4.0 * p["rows"] * p["cols"] / w),  # one rank's share
    # implementations take the World first; the cases run at world sizes 1 and 4 (those of
    # them that `harness run --world-sizes`, or the project file's world_sizes, asks for)
    distributed=True, world_sizes=(1, 4),
    # every cols splits evenly over 1 and 4 ranks (shard refuses an uneven split)
    grid={"smoke": [{"rows": 4, "cols": 1024, "scale": 1.0},
                    {"rows": 3, "cols": 260, "scale": 100.0}],
          "nightly": [{"rows": r, "cols": c, "scale": 8.0}
                      for r in (1, 64) for c in (4096, 151936)]},
    implementations={"torch": ${name}_torch},
    negative_controls={"no_sum_reduce": controls.no_sum_reduce},
)]
'''

DIST_TEST = '''\
"""$op: the implementation passes every smoke case at world sizes 1 and 4; the
control, whose bug needs several ranks, passes at 1 and fails at 4. World size 1 runs in
this process (run_cases, through every check a `harness run` makes); 4 ranks are launched
as `harness run` launches them (mpiexec)."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from harness.api import run_cases

import $package
from $package.$name.reference import make_inputs, whole_inputs
from $package.$name.spec import SPECS

SPEC = SPECS[0]
SMOKE = len(SPEC.grid["smoke"])


def test_torch_passes_every_case():
    results = run_cases(SPEC, "torch")
    assert [r.status for r in results] == ["pass"] * SMOKE, [r.reason for r in results]


def test_no_sum_reduce_is_invisible_at_one_rank():
    assert {r.status for r in run_cases(SPEC, "no_sum_reduce")} == {"pass"}


def test_the_shards_of_four_ranks_make_the_whole_inputs():
    for params in SPEC.grid["smoke"]:
        shards = [make_inputs(params, rank, 4)["x"] for rank in range(4)]
        assert torch.equal(torch.cat(shards, dim=-1), whole_inputs(params)["x"])


def test_at_four_ranks_torch_passes_and_no_sum_reduce_fails(tmp_path):
    suite = Path($package.__file__).parent
    run = subprocess.run(
        [sys.executable, "-m", "harness", "run", SPEC.name, "--suite", str(suite),
         "--world-sizes", "4", "--impl", "torch", "--impl", "no_sum_reduce", "--no-bench",
         "--no-golden", "--db", str(tmp_path / "history.db"), "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]  # the control fails
    # the run's folder: results.jsonl holds one line per case and implementation
    results = next(tmp_path.glob("*/results.jsonl")).read_text().splitlines()
    statuses = {"torch": [], "no_sum_reduce": []}
    for result in map(json.loads, results):
        statuses[result["impl"]].append(result["status"])
    assert statuses == {"torch": ["pass"] * SMOKE, "no_sum_reduce": ["fail"] * SMOKE}, \\
        run.stdout[-3000:]
'''

#: what a run writes into the repository it runs in, by default: run folders, the history
#: DB and the dashboard under harness-results/ (store.DEFAULT_DB, reports' DEFAULT_SITE);
#: pytest-benchmark's .benchmarks/ where `harness export --format pytest-benchmark` files
#: are compared
GITIGNORE = ("harness-results/", ".benchmarks/")


def render(text: str, **values: str) -> str:
    """A template with its ``$`` placeholders filled."""
    return Template(text).substitute(values)


def op_files(package: str, name: str, op: str, distributed: bool = False) -> dict[str, str]:
    """{path relative to the suite package's parent: text} of one new op."""
    values = {"package": package, "name": name, "op": op}
    templates = ((REFERENCE, TORCH_IMPL, CONTROLS, SPEC) if not distributed else
                 (DIST_REFERENCE, DIST_TORCH_IMPL, DIST_CONTROLS, DIST_SPEC))
    return {f"{package}/{name}/{file}": render(text, **values) for file, text in zip(
        ("__init__.py", "reference.py", "torch_impl.py", "controls.py", "spec.py"),
        (OP_INIT, *templates), strict=True)}


def test_file(package: str, name: str, op: str, distributed: bool = False) -> str:
    return render(DIST_TEST if distributed else TEST, package=package, name=name, op=op)


def project_file(package: str, distributed: bool = False) -> str:
    """The harness.toml of a repository that had none: its world sizes are those the new op
    runs at."""
    return render(PROJECT, package=package, world_sizes="1, 4" if distributed else "1")


def _pattern(line: str) -> str:
    """A .gitignore line reduced to the path it names (``/harness-results/``,
    ``harness-results/**`` and ``!harness-results/`` all name harness-results): a path the
    file already has a rule for, either way, is the user's choice and left alone."""
    line = line.strip().lstrip("!").removeprefix("**/").lstrip("/")
    return line.removesuffix("/**").removesuffix("/*").rstrip("/")


def gitignore(existing: str | None) -> tuple[str, list[str]]:
    """(the .gitignore's new text, the lines added): ``existing`` (None: no file) with the
    GITIGNORE lines it lacks appended; nothing added where it has them all."""
    have = {_pattern(line) for line in (existing or "").splitlines()
            if line.strip() and not line.lstrip().startswith("#")}
    missing = [line for line in GITIGNORE if _pattern(line) not in have]
    if existing is None:
        return "# written by runs: kernel-harness's results, pytest-benchmark's files\n" + \
            "".join(f"{line}\n" for line in missing), missing
    if not missing:
        return existing, []
    sep = "" if not existing or existing.endswith("\n") else "\n"
    return existing + sep + "".join(f"{line}\n" for line in missing), missing
