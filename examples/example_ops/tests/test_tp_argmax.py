"""example.tp_argmax at world size 1 in this process; its multi-rank bug (a missing shard
offset) shows only under `harness run example.tp_argmax --world-sizes 4 --impl
no_shard_offset`, which fails every case there."""

import torch

from example_ops.tp_argmax.reference import full_logits, greedy_token, make_inputs
from example_ops.tp_argmax.spec import SPECS
from harness.api import run_cases

SPEC = SPECS[0]


def _statuses(impl):
    return {r.case_id: r.status for r in run_cases(SPEC, impl)}


def test_torch_passes_every_case():
    assert set(_statuses("torch").values()) == {"pass"}


def test_last_on_ties_fails_the_ties_case_only():
    got = _statuses("last_on_ties")
    assert got == {c: "fail" if "values=ties" in c else "pass" for c in got}


def test_no_shard_offset_is_invisible_at_one_rank():
    assert set(_statuses("no_shard_offset").values()) == {"pass"}


def test_the_shards_of_four_ranks_make_the_full_logits():
    params = SPEC.grid["smoke"][1]
    shards = [make_inputs(params, rank, 4)["logits"] for rank in range(4)]
    assert torch.equal(torch.cat(shards, dim=-1), full_logits(params))


def test_the_reference_takes_the_first_of_equal_maxima():
    logits = torch.tensor([[0.0, 4.0, 1.0, 4.0], [4.0, 4.0, 4.0, 4.0]], dtype=torch.bfloat16)
    assert greedy_token(logits).tolist() == [1, 0]
