"""The MoE ``torch`` implementations where a GPU would expose them: the router breaks ties as
the op says (lower expert first), and every float row sum gives the same bits in any order of
execution (no atomics), so ``deterministic=True`` holds on CUDA too."""

from __future__ import annotations

import pytest
import torch

from reference_kernels import moe as ref
from suites._moe import torch_ops
from suites._moe.router import ROUTER, router_inputs, router_torch


def test_the_router_breaks_ties_lower_expert_first():
    # experts 1, 3 and 6 tie for the top; 0 and 5 tie for fourth place
    logits = torch.tensor([[2.0, 5.0, 1.0, 5.0, -1.0, 2.0, 5.0, 0.5]])
    probs, routemap = router_torch(logits, 4, False)
    assert routemap.tolist() == [[1, 3, 6, 0]]
    exp_probs, exp_routes = ref.router(logits, 4, False)
    assert torch.equal(routemap, exp_routes) and torch.equal(probs, exp_probs)


def test_the_router_chooses_on_logits_not_on_probabilities_that_rounded_equal():
    # two different logits whose softmax rounds to one float32: the larger logit wins
    big = torch.tensor([[0.0, 1e-9, -10.0, -10.0]])
    p = torch.softmax(big, dim=-1)
    assert p[0, 0] == p[0, 1]  # the premise: the probabilities tie
    _, routemap = router_torch(big, 1, False)
    assert routemap.tolist() == [[1]]


@pytest.mark.parametrize("params", [p for p in ROUTER.grid["nightly"] if p["experts"] == 256
                                    and p["topk"] == 4], ids=str)
def test_the_nightly_router_cases_with_tied_logits_match_the_reference(params):
    inputs = router_inputs(params, 0, 1)
    logits = inputs["logits"]
    top5 = torch.sort(logits, dim=-1, descending=True).values[:, :5]
    assert (top5[:, :-1] == top5[:, 1:]).any(), "the premise: some token ties in its top 5"
    probs, routemap = router_torch(**inputs)
    exp_probs, exp_routes = ref.router(**inputs)
    assert torch.equal(routemap, exp_routes)
    assert torch.equal(probs, exp_probs)


def _sequential_index_add(acc, index, src):
    for i, t in enumerate(index.tolist()):
        acc[t] += src[i]
    return acc


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rows,targets,width", [(1000, 200, 64), (37, 5, 3), (8, 8, 1)])
def test_ordered_index_add_equals_the_cpus_sequential_index_add_bitwise(seed, rows, targets,
                                                                        width):
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, targets, (rows,), generator=g)
    src = torch.randn(rows, width, generator=g) * torch.logspace(-6, 6, width)
    got = torch_ops.ordered_index_add(torch.zeros(targets + 2, width), index, src)
    want = _sequential_index_add(torch.zeros(targets + 2, width), index, src)
    assert torch.equal(got, want)
    assert torch.equal(got, torch.zeros(targets + 2, width).index_add_(0, index, src))


def test_ordered_index_add_of_nothing_leaves_the_accumulator_alone():
    acc = torch.ones(3, 2)
    assert torch.equal(torch_ops.ordered_index_add(acc, torch.zeros(0, dtype=torch.long),
                                                   torch.zeros(0, 2)), torch.ones(3, 2))


def test_no_moe_implementation_uses_an_atomic_float_accumulation():
    # index_add_, scatter_add_ and index_put_(accumulate=True) on float are atomics on CUDA
    import inspect

    from suites._moe import expert_parallel, layer

    for module in (torch_ops, expert_parallel, layer):
        text = inspect.getsource(module)
        for call in (".index_add_(", ".scatter_add_(", "accumulate=True"):
            assert call not in text, f"{module.__name__} calls {call}"
