"""The checks around the timed calls (harness/engine/timed_checks.py): every timed repeat
against the checked call's bits, its outputs poisoned behind torch's version counter after,
and the call after the repeats checked for its contract as the first call is. Each test is a
bug class that passed every check while only the last repeat's values were looked at."""

from __future__ import annotations

import pytest
import torch

from harness.core.buffers import poison_behind, poisoned
from harness.core.inputs import generate
from harness.core.spec import Case, OpSpec
from harness.core.timing import TimingConfig
from harness.engine.runner import run_case

TIMING = TimingConfig(warmup=1, min_repeats=6, max_repeats=6, budget_s=0.01)


def _inputs(params, rank, world_size):
    n = params["n"]
    return {"x": generate((n,), torch.float32, seed=7, dist="uniform"),
            "idx": torch.arange(n, dtype=torch.int64) % 5 - 1,
            "out": poisoned(n, torch.float32)}


def _reference(x, idx, out):
    return x * 2


def doubled(x, idx, out):
    return torch.mul(x, 2, out=out)


def _run(world, fn, bench=True, make_inputs=_inputs, **extra):
    spec = OpSpec(name="toy_double", family="toy", reference=_reference, make_inputs=make_inputs,
                  grid={"smoke": [{"n": 1031}]}, implementations={"ok": doubled},
                  out_buffers={"out": "out"}, **extra)
    return run_case(world, Case(spec, {"n": 1031}, 1), fn.__name__, fn, bench=bench,
                    timing=TIMING)


def _from_call(first: int, last: int, wrong, right=doubled):
    """``wrong`` on calls ``first``..``last`` (the checked calls are the first two), ``right``
    on the others."""
    count = {"n": 0}

    def impl(x, idx, out):
        count["n"] += 1
        return (wrong if first <= count["n"] <= last else right)(x, idx, out)
    impl.__name__ = wrong.__name__
    return impl


def zeroes_the_tail(x, idx, out):
    doubled(x, idx, out)
    out[-64:] = 0
    return out


def own_tensor(x, idx, out):
    return x * 2


def returns_input(x, idx, out):
    return x


def rewrites_indices(x, idx, out):
    idx.clamp_(min=0)  # "normalises" its caller's indices in place
    return doubled(x, idx, out)


def test_a_window_of_wrong_timed_calls_fails_as_autotuning_candidates_would(world):
    """Calls 5 to 8 wrong (an autotuner's candidates tried on the real calls), the checked
    calls (the first, the padded and the shifted) and the last repeat right: only a check of
    every repeat sees it."""
    r = _run(world, _from_call(5, 8, zeroes_the_tail))
    assert r.status == "fail", r.reason
    assert "not deterministic" in r.reason and "repeat 2 of 7" in r.reason, r.reason


@pytest.mark.parametrize("wrong,words", [
    (own_tensor, "output 'out' must be written into the buffer passed as 'out'"),
    (returns_input, "output 'out' shares memory with input 'x'"),
    (rewrites_indices, "input 'idx' was modified"),
], ids=["own_tensor", "returns_input", "rewrites_indices"])
@pytest.mark.parametrize("bench", [True, False], ids=["timed", "untimed"])
def test_the_call_after_the_repeats_keeps_the_first_calls_contract(world, wrong, words, bench):
    """Right on the checked calls, from the fourth call on a breach of the call contract: it
    is an error on the last call after the checked ones, timed or untimed."""
    r = _run(world, _from_call(4, 10**9, wrong), bench=bench)
    assert r.status == "error", r.reason
    assert "on the last call on the checked call's inputs" in r.reason and words in r.reason, \
        r.reason
    assert "timed_contract" in r.checks


def test_a_call_that_skips_its_work_while_its_output_looks_unchanged_fails(world):
    """A copy kernel's "out already holds it": skip while torch's version counters of x and
    out have not moved since its own last write. Every repeat returns what the harness wrote
    behind the counter (poison), not the answer."""
    last: dict = {}

    def skips(x, idx, out):
        key = (x.data_ptr(), out.data_ptr())
        if last.get(key) == (x._version, out._version):
            return out
        doubled(x, idx, out)
        last[key] = (x._version, out._version)
        return out

    r = _run(world, skips)
    assert r.status == "fail", r.reason


def test_poison_behind_writes_the_memory_but_not_the_version_counter():
    t = torch.zeros(8)[2:6]
    version = t._version
    poison_behind(t)
    assert t.isnan().all() and t._version == version
    assert torch.equal(t._base[:2], torch.zeros(2)) and torch.equal(t._base[6:], torch.zeros(2))


def test_honest_calls_with_a_workspace_and_a_first_call_compile_pass(world):
    cache: dict = {}

    def honest(x, idx, out):
        ws = cache.setdefault(x.shape, torch.empty_like(x))  # reused across calls
        torch.mul(x, 2, out=ws)
        return out.copy_(ws)

    for fn in (doubled, honest):
        r = _run(world, fn)
        assert r.status == "pass", r.reason
        assert {"same_bits", "timed_contract"} <= set(r.checks)


def test_an_op_whose_inputs_refuse_the_near_values_still_passes_a_correct_kernel(world):
    """The near twin is the harness's perturbation: where the op's own make_inputs refuses
    it (unique keys, a sorted table), the call on it is left out, not the implementation's
    error."""
    from harness.core import inputs

    def refusing(params, rank, world_size):
        if inputs._NUDGE_SALT.get():
            raise ValueError("duplicate keys")
        return _inputs(params, rank, world_size)

    r = _run(world, doubled, make_inputs=refusing)
    assert r.status == "pass", r.reason
    assert "near_values" not in r.checks and "reused_buffers" in r.checks


def test_the_near_values_call_is_left_out_where_its_reference_is_the_cases(world):
    """A nudge the output never reads (the op ignores x past its first element) can show
    nothing; the precision lens's float64 values do not count as a difference."""
    def first(params, rank, world_size):
        return {**_inputs(params, rank, world_size), "n": params["n"]}

    spec_kw = dict(exact=lambda x, idx, out, n: {"out": x[:1].double().expand(n) * 2})

    def reference(x, idx, out, n):
        return (x[:1] * 2).expand(n).clone()

    def impl(x, idx, out, n):
        return out.copy_((x[:1] * 2).expand(n))

    spec = OpSpec(name="toy_first", family="toy", reference=reference, make_inputs=first,
                  grid={"smoke": [{"n": 1031}]}, implementations={"ok": impl},
                  out_buffers={"out": "out"}, **spec_kw)
    r = run_case(world, Case(spec, {"n": 1031}, 1), "ok", impl, bench=True, timing=TIMING)
    assert r.status == "pass", r.reason
    assert "near_values" not in r.checks and "reused_buffers" in r.checks
