"""The op as kernel-harness sees it: grids, tolerance, work, implementations, controls."""

from __future__ import annotations

from harness.api import OpSpec, Work, exact

from . import controls
from .reference import OP, expected, greedy_token, make_inputs
from .torch_impl import tp_argmax_torch

SPECS = [OpSpec(
    name=OP, family="sampling", reference=greedy_token,
    description="Greedy token over a vocabulary sharded across tensor-parallel ranks.",
    make_inputs=make_inputs, expected=expected, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * p["b"] * p["vocab"] / w),
    distributed=True, world_sizes=(1, 4),
    grid={"smoke": [{"b": 4, "vocab": 1024}, {"b": 6, "vocab": 1000, "values": "ties"}],
          "nightly": [{"b": b, "vocab": 151936} for b in (1, 16, 64)]},
    implementations={"torch": tp_argmax_torch},
    negative_controls={"no_shard_offset": controls.no_shard_offset,
                       "last_on_ties": controls.last_on_ties},
)]
