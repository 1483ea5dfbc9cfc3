"""The mutation benchmark's mutator (benchmarks/mutants.py): the families it generates, what it
leaves alone, and a mutant that replaces its function only while it runs."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import mutants  # noqa: E402

from suites._moe import torch_ops  # noqa: E402


def toy(x: torch.Tensor, n: int, *, planted_bug: bool = False) -> torch.Tensor:
    """A docstring that is not mutated."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if planted_bug:
        x = x * 3
    y = x[1:n].float() + torch.where(x[:n - 1] > 0, x[:n - 1], -x[:n - 1])
    return torch.sort(y, stable=True).values.to(torch.float64).argmax()


def test_every_family_is_generated_and_each_mutant_compiles_once():
    found = mutants.mutants_of(toy)
    families = {m.family for m in found}
    assert families >= {"operator", "compare", "drop_term", "off_by_one", "swap_args", "dtype",
                        "ties"}
    assert len({m.key for m in found}) == len(found)
    original = mutants.unparsed_original(__name__, "toy")
    for m in found:
        assert m.source != original
        compile(m.source, "<test>", "exec")
    described = {m.description for m in found}
    assert {"+->-", ">->>=", "slice lower+1", "True->False", "argmax->argmin",
            "torch.float64->torch.float32", ".float()->.bfloat16()",
            "swap args 1,2"} <= described


def test_validation_docstrings_and_planted_bug_switches_are_not_mutated():
    for m in mutants.mutants_of(toy):
        assert "n must be >= 0" in m.source and "A docstring" in m.source
        assert "raise ValueError" in m.source
        assert "x = x * 3" in m.source  # the bug switch's body is left alone
        assert "if planted_bug:" in m.source


def test_project_functions_follow_calls_into_project_modules_only():
    names = [f.__qualname__ for f in mutants.project_functions(torch_ops.route)]
    assert names == ["route"]  # torch.sort / softmax are not project code
    from suites._moe.permute import permute_torch

    reached = {f.__qualname__ for f in mutants.project_functions(permute_torch)}
    assert {"permute_torch", "permute_into", "sort_by_expert"} <= reached


def test_a_mutant_replaces_its_function_only_while_it_runs():
    from suites._moe.router import router_torch

    swapped = next(m for m in mutants.mutants_of(torch_ops.route)
                   if m.description == "True->False" and "descending=False" in m.source)
    fn = mutants.mutant_callable(router_torch, swapped.module, swapped.function, swapped.source)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    _, experts = fn(logits=logits, topk=2, renormalize=False)
    assert experts.tolist() == [[0, 2]]  # ascending: the two smallest
    assert torch_ops.route(logits, 2, False)[1].tolist() == [[1, 3]]  # restored


def kernel_toy(x: torch.Tensor, n: int) -> torch.Tensor:
    parts = [x[i : i + 1] for i in range(n)]
    y = torch.cat(parts).float()
    z = (y @ y.float().T).sum(-1) + y.mean(-1)
    keep = torch.arange(y.shape[0]) < n
    return torch.where(keep, torch.softmax(z, dim=0), 0.0)


def test_the_kernel_families_are_generated_and_their_helpers_do_the_kernel_bugs():
    found = {m.description: m for m in mutants.mutants_of(kernel_toy)}
    families = {m.family for m in found.values()}
    assert {"padded_block", "extra_rounding", "narrow_output", "tail_mask", "drop_last"} <= families
    assert {"mean over a power-of-two block", "softmax over a power-of-two block",
            "@ rounded to bf16", "sum rounded to bf16", "output through a narrower type",
            "< bound - 1", "range(..., n - 1)", "cat without its last piece"} <= set(found)
    x = torch.tensor([[1.0, 2.0, 3.0]])
    assert mutants.k_mean_padded(x, -1).item() == 1.5  # 6 / 4, not 6 / 3
    p = mutants.k_softmax_padded(torch.zeros(3), 0)
    assert torch.allclose(p, torch.full((3,), 0.25))  # a zero pad took a quarter
    assert mutants.k_round_bf16(torch.tensor([1 + 2**-10])).item() == 1.0
    f16 = torch.tensor([70000.0]).bfloat16()
    assert mutants.k_narrow((f16,))[0].float().isinf().all()  # bf16 through fp16 overflows
    # each mutant runs, and differs from the original on this input
    xs = torch.arange(12.0).reshape(4, 3) / 10
    want = kernel_toy(xs, 3)
    for desc in ("mean over a power-of-two block", "@ rounded to bf16",
                 "range(..., n - 1)", "< bound - 1"):
        m = found[desc]
        got = mutants.mutant_callable(kernel_toy, __name__, "kernel_toy", m.source)(xs, 3)
        assert got.shape != want.shape or not torch.equal(got, want), desc
