"""When DTensor cases are skips instead of runs, each with the reason an H200 run gave.

- CUDA tensors over gloo (ranks sharing a GPU): every rank crashed in the functional
  all-gather; nccl (one GPU per rank) and the CPU run.
- A _StridedShard whose split factor is no product of mesh sizes, on torch before 2.12:
  torch 2.11 raised for all six smoke cases at one rank; torch 2.12+ takes them
  (pytorch/pytorch#178735), as the CPU runs of this suite show every night.
"""

from __future__ import annotations

import torch

from suites.dtensor import REDISTRIBUTE, dtensor_refusal, strided_shard_refusal


def test_strided_shards_are_refused_only_where_torch_2_11_refused_them():
    at_one_rank = [c.params for c in REDISTRIBUTE.cases("smoke", 1)]
    strided = [p for p in at_one_rank if "SS" in p["src"]]
    assert len(strided) == 3  # x2 implementations: the six errors of the H200 run
    for p in strided:
        why = strided_shard_refusal(p, "2.11.0+cu130")
        assert why and "pytorch/pytorch#178735" in why
        assert strided_shard_refusal(p, "2.12.0") is None
    # no other case, and no strided shard whose factor is a product of mesh sizes
    everything = [c.params for w in (1, 2, 4, 8) for c in REDISTRIBUTE.cases("smoke", w)]
    refused = [p for p in everything if strided_shard_refusal(p, "2.11.0")]
    assert all("SS" in p["src"] + p["dst"] for p in refused)
    assert not strided_shard_refusal({"mesh": "2x2", "src": "SS0sf2,S0", "dst": "R,R"},
                                     "2.11.0")


def test_this_torch_runs_every_case_on_the_cpu():
    for w in (1, 4, 8):
        for case in REDISTRIBUTE.cases("smoke", w):
            assert dtensor_refusal(case.params, w, torch.device("cpu"), backend="gloo") is None
