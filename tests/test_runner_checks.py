"""The runner's checks on one process: output buffers poisoned, inputs moved to shifted memory
with the old buffers poisoned, the last timed repeat re-checked, read-only inputs guarded, and
the peak memory of a call. Each check is shown catching the bug class it exists for."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re

import numpy as np
import pytest
import torch

from harness.core.buffers import poisoned
from harness.core.inputs import generate, reseeded
from harness.core.spec import Case, OpSpec
from harness.core.timing import TimingConfig
from harness.device import memory
from harness.device.runtime import World
from harness.engine import case_setup, checked_calls, runner
from harness.engine.case_setup import SetupCache
from harness.engine.runner import run_case
from harness.engine.verdict import STAGE_PREFIX

TIMING = TimingConfig(warmup=1, min_repeats=3, max_repeats=6, budget_s=0.01)


def _inputs(params, rank, world_size):
    n = params["n"]
    x = generate((n,), torch.float32, seed=7, dist="uniform")
    out = x if params.get("inplace") else poisoned(n, torch.float32)
    return {"x": x, "out": out}


def _reference(x, out):
    return x * 2


def doubled(x, out):
    return torch.mul(x, 2, out=out)


def _spec(**extra) -> OpSpec:
    return OpSpec(name="toy_double", family="toy", reference=_reference, make_inputs=_inputs,
                  grid={"smoke": [{"n": 1031}]}, implementations={"ok": doubled},
                  out_buffers={"out": "out"}, **extra)


def _run(world, fn, params=None, bench=True, **extra):
    case = Case(_spec(**extra), params or {"n": 1031}, 1)
    return run_case(world, case, fn.__name__, fn, bench=bench, timing=TIMING)


def test_a_correct_implementation_passes_every_check(world):
    r = _run(world, doubled)
    assert r.status == "pass", r.reason
    assert r.checks == ["poisoned_outputs", "padded", "shifted_buffers", "process_settings",
                        "after_timing", "same_bits", "timed_contract", "near_values",
                        "reused_buffers", "settled"]
    assert r.timing["n"] >= 3 and r.output_hash



def test_a_write_past_the_output_is_an_error_though_every_element_is_right(world):
    # a store mask one too long: the output holds the right values, and one more
    def one_past(x, out):
        n = out.numel()
        torch.mul(x, 2, out=out)
        torch.empty(0, dtype=out.dtype).set_(out.untyped_storage(), out.storage_offset() + n,
                                             (1,)).fill_(1.0)
        return out

    r = _run(world, one_past)
    assert r.status == "error"
    assert "wrote outside the buffers it was given: 'out' (4 bytes past its end)" in r.reason


def test_a_write_before_the_input_is_caught_on_the_shifted_call(world):
    # a negative index; the first call's buffers start where their storage does, the shifted
    # call's have the shift before them
    def one_before(x, out):
        if x.storage_offset() > 0:
            torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), x.storage_offset() - 1,
                                               (1,)).fill_(1.0)
        return torch.mul(x, 2, out=out)

    r = _run(world, one_before)
    assert r.status == "error"
    assert "wrote outside the buffers it was given: 'x' (4 bytes before its start)" in r.reason

def test_an_unwritten_element_stays_poisoned_and_fails(world):
    def skips_last(x, out):
        torch.mul(x[:-1], 2, out=out[:-1])
        return out

    r = _run(world, skips_last, bench=False)
    assert r.status == "fail" and r.wrong == 1
    assert r.outputs["out"]["metrics"]["n_nan"] == 1
    assert "moved" not in r.reason  # caught by the first call already


def test_a_new_tensor_instead_of_the_buffer_is_a_contract_error(world):
    def allocates(x, out):
        return x * 2

    r = _run(world, allocates, bench=False)
    assert r.status == "error" and "must be written into the buffer passed as 'out'" in r.reason


_REGISTERED: dict = {}


def test_reading_a_stale_registered_buffer_fails_only_after_the_move(world):
    def stale(x, out):
        source = _REGISTERED.setdefault((x.shape, x.dtype), x)
        return torch.mul(source, 2, out=out)

    r = _run(world, stale, bench=True)  # the shifted call on the same values (timed later)
    assert r.status == "fail"
    assert r.reason.startswith("with the inputs moved to fresh shifted memory")
    assert r.wrong == 1031
    _REGISTERED.clear()
    r = _run(world, stale, bench=False)  # untimed, on the twin's values too
    assert r.status == "fail" and r.wrong == 1031
    assert r.reason.startswith("on other input values in fresh shifted memory"), r.reason


def test_an_implementation_that_breaks_after_warm_up_fails_the_check_after_timing(world):
    calls = {"n": 0}

    def autotuned(x, out):
        # a tuner that switches to a faster config without the scalar tail after two calls
        calls["n"] += 1
        if calls["n"] <= 3:  # the first call, the padded one and the shifted check
            return torch.mul(x, 2, out=out)
        body = x.numel() - x.numel() % 4
        torch.mul(x[:body], 2, out=out[:body])
        return out

    r = _run(world, autotuned)
    assert r.status == "fail" and r.timing is not None
    assert r.reason.startswith("after the timed repeats")
    assert "after_timing" in r.checks


@pytest.mark.parametrize("untimed", ["no bench", "token timing"])
def test_a_result_kept_by_shape_fails_on_other_values_where_no_real_timing_follows(world,
                                                                                  untimed):
    """Two calls on the same values pass a result computed once per shape; the second call
    takes the twin case's values where no real timing will (untimed, or one token call)."""
    kept: dict = {}

    def by_shape(x, out):
        if x.shape not in kept:
            kept[x.shape] = x * 2
        return out.copy_(kept[x.shape])

    spec = _spec()
    spec.make_inputs = lambda p, r, w: _inputs(p, r, w) if "twin" not in p else {
        **_inputs(p, r, w), "x": generate((p["n"],), torch.float32, seed=8, dist="uniform")}
    case = Case(spec, {"n": 1031}, 1)
    timing = TimingConfig(minimal=True, warmup=0, min_repeats=1, max_repeats=1, budget_s=0.0)
    r = run_case(world, case, "by_shape", by_shape, bench=untimed == "token timing",
                 timing=timing)
    assert r.status == "fail", r.reason
    assert r.reason.startswith("on other input values in fresh shifted memory, the old "
                               "buffers poisoned (a result kept by shape or by call count?): "
                               "out: 1031/1031 elements outside"), r.reason
    kept.clear()
    right = run_case(world, case, "doubled", doubled, bench=untimed == "token timing",
                     timing=timing)
    assert right.status == "pass" and "other_values" in right.checks, right.reason


def test_a_table_made_from_the_params_differs_in_the_twin_only_where_the_op_says(world):
    """x times a table made from a param (no seed: a RoPE table): a kernel that keeps the
    table by shape passes the call on other values unless the op's ``twin`` changes the
    param; a right one passes either way."""
    def inputs(params, rank, world_size):
        n = params["n"]
        scale = torch.full((n,), float(params.get("base", 2.0)))
        return {**_inputs(params, rank, world_size), "scale": scale}

    kept: dict = {}

    def table_by_shape(x, out, scale):
        kept.setdefault(scale.shape, scale.clone())
        return torch.mul(x, kept[scale.shape], out=out)

    def right(x, out, scale):
        return torch.mul(x, scale, out=out)

    def spec(**extra):
        return OpSpec(name="toy_table", family="toy", reference=lambda x, out, scale: x * scale,
                      make_inputs=inputs, grid={"smoke": [{"n": 1031}]}, implementations={},
                      out_buffers={"out": "out"}, **extra)

    for twin, caught in ((None, False), (lambda p: {**p, "base": 3.0}, True)):
        case = Case(spec(twin=twin), {"n": 1031}, 1)
        kept.clear()
        r = run_case(world, case, "table_by_shape", table_by_shape, bench=False, timing=TIMING)
        assert r.status == ("fail" if caught else "pass"), r.reason
        r = run_case(world, case, "right", right, bench=False, timing=TIMING)
        assert r.status == "pass", r.reason


def test_writing_a_read_only_input_is_an_error_and_nan_inputs_are_not_mistaken_for_it(world):
    def clobbers(x, out):
        torch.mul(x, 2, out=out)
        x.zero_()
        return out

    r = _run(world, clobbers, bench=False)
    assert r.status == "error" and "input 'x' was modified" in r.reason

    def nan_inputs(params, rank, world_size):
        inputs = _inputs(params, rank, world_size)
        inputs["x"][3] = float("nan")
        return inputs

    spec = _spec()
    spec.make_inputs = nan_inputs
    r = run_case(world, Case(spec, {"n": 1031}, 1), "ok", doubled, bench=False)
    assert r.status == "pass", r.reason


def _splits_spec() -> OpSpec:
    """x doubled, with a list, a dict and a tuple of lists beside it that it only reads."""
    def inputs(params, rank, world_size):
        return {**_inputs(params, rank, world_size), "sizes": [3, 0, 5, float("nan")],
                "meta": {"align": 16, "groups": [1, 2]}, "pair": ([1], [2])}

    return OpSpec(name="toy_splits", family="toy",
                  reference=lambda x, out, sizes, meta, pair: x * 2, make_inputs=inputs,
                  grid={"smoke": [{"n": 1031}]}, implementations={}, out_buffers={"out": "out"})


@pytest.mark.parametrize("how, shown", [
    ("offsets", "[3, 0, 5, nan] -> [0, 3, 3, nan]"),  # sizes rewritten as offsets, in place
    ("padded", "[3, 0, 5, nan] -> [16, 0, 16, nan]"),
    ("dict", "'align': 16"),
    ("nested", "([1], [2]) -> ([1], [2, 2])"),
    ("control", None),  # read, copied, written to a copy: nothing changed
])
def test_a_list_or_dict_the_case_may_not_write_is_checked_as_a_tensor_is(world, how, shown):
    def impl(x, out, sizes, meta, pair):
        if how == "offsets":
            total = 0
            for i, n in enumerate(sizes[:3]):
                sizes[i], total = total, total + n
        elif how == "padded":
            sizes[:3] = [-(-n // 16) * 16 for n in sizes[:3]]
        elif how == "dict":
            meta["align"] = 32
        elif how == "nested":
            pair[1].append(2)
        else:
            local = list(sizes)
            local[0] = 99
        return torch.mul(x, 2, out=out)

    def control(x, out, sizes, meta, pair):
        seen.append((list(sizes), dict(meta), pair))
        return torch.mul(x, 2, out=out)

    key = {"offsets": "sizes", "padded": "sizes", "dict": "meta", "nested": "pair"}.get(how)
    case, setups, seen = Case(_splits_spec(), {"n": 1031}, 1), SetupCache(), []
    r = run_case(world, case, "impl", impl, bench=False, timing=TIMING, setups=setups)
    if shown is None:
        assert r.status == "pass", r.reason
    else:
        assert r.status == "error" and f"input {key!r} was modified" in r.reason, r.reason
        assert shown in r.reason, r.reason
    # the next implementation of the case, on the same set-up, gets them as they were made
    r = run_case(world, case, "control", control, bench=False, timing=TIMING, setups=setups)
    assert r.status == "pass" and seen and all(
        sizes[:3] == [3, 0, 5] and meta == {"align": 16, "groups": [1, 2]} and pair == ([1], [2])
        for sizes, meta, pair in seen), seen


def _copy_spec(**extra) -> OpSpec:
    return OpSpec(name="toy_copy", family="toy", reference=lambda x: (x.clone(), x[:4] * 1),
                  make_inputs=lambda p, r, w: {"x": generate((8, 5), torch.float32, seed=3)},
                  outputs=("out", "head"), grid={"smoke": [{}]}, implementations={}, **extra)


@pytest.mark.parametrize("fn", [
    lambda x: (x, x[:4].clone()),                      # the input itself
    lambda x: (x.view(8, 5), x[:4].clone()),           # a view of all of it
    lambda x: (x.clone(), x[:4]),                      # a copy, but the second a slice
    lambda x: (x.clone(), x.view(-1)[:20].view(4, 5)),  # a view of part of it
], ids=["itself", "view", "slice", "part"])
def test_an_output_that_shares_memory_with_a_read_only_input_is_an_error(world, fn):
    r = run_case(world, Case(_copy_spec(), {}, 1), "aliased", fn, bench=False)
    assert r.status == "error", r.reason
    assert "shares memory with input 'x'" in r.reason and "return a copy" in r.reason
    copies = run_case(world, Case(_copy_spec(), {}, 1), "copies",
                      lambda x: (x.clone(), x[:4].clone()), bench=False)
    assert copies.status == "pass", copies.reason
    allowed = run_case(world, Case(_copy_spec(outputs_may_alias=True), {}, 1), "aliased", fn,
                       bench=False)
    assert allowed.status == "pass", allowed.reason


@pytest.mark.parametrize("fn", [
    lambda x: (x.t().contiguous().t(), x[:4].clone()),            # column-major
    lambda x: (torch.nn.functional.pad(x, (0, 3))[:, :5], x[:4].clone()),  # rows padded to 8
    lambda x: (x.clone(), x.repeat(1, 2)[:4, :5]),                # the second output padded
], ids=["column_major", "padded_rows", "second_output"])
def test_an_output_neither_dense_nor_laid_out_as_its_reference_is_an_error(world, fn):
    """The right values in a transposed or padded view: a kernel reading the output's pointer
    as dense rows finds others there."""
    r = run_case(world, Case(_copy_spec(), {}, 1), "strided", fn, bench=False)
    assert r.status == "error", r.reason
    assert "neither contiguous nor the reference's" in r.reason, r.reason
    assert run_case(world, Case(_copy_spec(any_output_layout=True), {}, 1), "strided", fn,
                    bench=False).status == "pass"


def test_an_output_laid_out_as_its_reference_or_contiguous_passes(world):
    spec = _copy_spec()
    spec.reference = lambda x: (x.t().contiguous().t(), x[:4] * 1)   # column-major
    for fn in (lambda x: (x.t().contiguous().t(), x[:4].clone()),      # as the reference
               lambda x: (x.clone(), x[:4].clone())):                  # contiguous
        r = run_case(world, Case(spec, {}, 1), "laid_out", fn, bench=False)
        assert r.status == "pass", r.reason


def _wobbly(first: int):
    """Doubles, one float32 ulp off from call ``first`` on: within tolerance each time, as
    a reduction in whatever order atomics land is, but not the same bits for the same
    inputs."""
    count = {"n": 0}

    def wobbly(x, out):
        count["n"] += 1
        torch.mul(x, 2, out=out)
        if count["n"] >= first:
            out.copy_(torch.nextafter(out, torch.full_like(out, float("inf"))))
        return out
    return wobbly


@pytest.mark.parametrize("first,bench,where", [
    (2, True, "the second call, on the same inputs in shifted"),  # the padded call is no
    # bitwise judge of the first: a kernel may take another path for strided rows
    # the warm-up (the checked calls were three), of however many repeats the budget took
    (4, True, r"repeat 1 of \d+ on the checked call's inputs \(warm-up included\)"),
    (4, False, "repeat 1 of 2 on the checked call's inputs"),  # the fourth call
], ids=["second_call", "timed", "untimed"])
def test_other_bits_for_the_same_inputs_fail_a_deterministic_op(world, first, bench, where):
    r = _run(world, _wobbly(first), bench=bench)
    assert r.status == "fail", r.reason
    assert "not deterministic" in r.reason and re.search(where, r.reason), r.reason
    loose = _run(world, _wobbly(first), bench=bench, deterministic=False)
    assert loose.status == "pass", loose.reason
    assert "same_bits" not in loose.checks


def _alternating(phase: int):
    """Doubles; from the third call on, every other call (odd or even, by ``phase``) one
    float32 ulp off: a scheduler that alternates two accurate configurations call by call.
    The checked calls are right, and so is every second later one."""
    count = {"n": 0}

    def alternating(x, out):
        count["n"] += 1
        torch.mul(x, 2, out=out)
        if count["n"] >= 3 and count["n"] % 2 == phase:
            out.copy_(torch.nextafter(out, torch.full_like(out, float("inf"))))
        return out
    return alternating


@pytest.mark.parametrize("bench", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("phase", [0, 1], ids=["even", "odd"])
def test_calls_that_alternate_fail_a_deterministic_op_whatever_the_call_count(world, bench,
                                                                                phase):
    r = _run(world, _alternating(phase), bench=bench)
    assert r.status == "fail", r.reason
    assert "not deterministic" in r.reason, r.reason


@pytest.mark.parametrize("bench", [False, True], ids=["untimed", "timed"])
def test_an_output_in_a_workspace_reused_across_calls_is_an_error(world, bench):
    """Each call right when it returns, but the next call on other values overwrites what the
    last one returned: caught after the second call untimed, after the check on other values
    that ends a real timing (the calls between had the same values)."""
    workspace: dict = {}

    def reuses(x):
        out = workspace.setdefault("out", torch.empty_like(x)).copy_(x)
        return out, workspace.setdefault("head", torch.empty_like(x[:4])).copy_(x[:4])

    r = run_case(world, Case(_copy_spec(), {}, 1), "reuses", reuses, bench=bench,
                 timing=TIMING)
    assert r.status == "error", r.reason
    assert ("output 'out' of an earlier call changed after it was returned, by the later "
            "calls on other values") in r.reason, r.reason
    fresh = run_case(world, Case(_copy_spec(), {}, 1), "copies",
                     lambda x: (x.clone(), x[:4].clone()), bench=bench, timing=TIMING)
    assert fresh.status == "pass", fresh.reason


@pytest.mark.parametrize("bench", [True, False], ids=["timed", "untimed"])
def test_outputs_from_a_ring_longer_than_the_calls_of_a_case_are_an_error(world, bench):
    """Each output a view of one of 64 buffers taken in turn: no call of a case overwrites
    what an earlier one returned, but the 65th does. Memory still held after the case (its
    storage alive) gets more calls on other values, which show the overwrite; memory held
    but never written again (an arena that only moves on, a list of outputs) passes."""
    ring = [torch.empty(16, 5) for _ in range(64)]
    turn = {"n": 0}

    def from_ring(x):
        turn["n"] += 1
        buf = ring[turn["n"] % 64]
        out, head = buf[:8].copy_(x), buf[8:12].copy_(x[:4])
        return out, head

    r = run_case(world, Case(_copy_spec(), {}, 1), "ring", from_ring, bench=bench,
                 timing=TIMING)
    assert r.status == "error", r.reason
    # the case's last call's outputs are held too (after a real timing, the twin call's): half
    # the calls for each
    assert r.reason.endswith("output 'out' of the first call was overwritten by one of 128 "
                             "later calls on other values: the implementation keeps memory "
                             "it returned and reuses it (a ring of output buffers) under its "
                             "caller's feet; return memory of its own per call"), r.reason
    # a ring that starts after the first call, as a pool set up after a warm-up: timed, half
    # way through the 12 calls the case makes before the ring calls; untimed, at the second
    late = {"n": 0}

    def from_ring_after_warm_up(x):
        late["n"] += 1
        if late["n"] <= (6 if bench else 1):
            return x.clone(), x[:4].clone()
        buf = ring[late["n"] % 64]
        return buf[:8].copy_(x), buf[8:12].copy_(x[:4])

    r = run_case(world, Case(_copy_spec(), {}, 1), "ring", from_ring_after_warm_up,
                 bench=bench, timing=TIMING)
    which = "the call after the timing" if bench else "the last call of the case"
    assert r.status == "error" and f"output 'out' of {which} was overwritten by one of 256 " \
        in r.reason, r.reason
    # the same ring in memory torch did not allocate, wrapped anew per call: each output's
    # storage dies with it, the memory lives on
    np_ring = [np.empty((16, 5), dtype=np.float32) for _ in range(64)]

    def from_a_numpy_ring(x):
        turn["n"] += 1
        buf = torch.from_numpy(np_ring[turn["n"] % 64])
        return buf[:8].copy_(x), buf[8:12].copy_(x[:4])

    r = run_case(world, Case(_copy_spec(), {}, 1), "ring", from_a_numpy_ring, bench=bench,
                 timing=TIMING)
    assert r.status == "error" and "a ring of output buffers" in r.reason, r.reason
    kept: list = []
    arena = {"buf": torch.empty(1 << 16), "at": 0}

    def keeps_every_output(x):
        kept.append(x.clone())
        return kept[-1], x[:4].clone()

    def from_an_arena(x):  # a bump allocator: every output a slice never handed out again
        at = arena["at"]
        arena["at"] += 60
        piece = arena["buf"][at:at + 60]
        return piece[:40].view(8, 5).copy_(x), piece[40:].view(4, 5).copy_(x[:4])

    def fresh_numpy(x):  # memory torch did not allocate, new per call
        return torch.from_numpy(x.numpy().copy()), torch.from_numpy(x[:4].numpy().copy())

    for fn in (keeps_every_output, from_an_arena, fresh_numpy,
               lambda x: (torch.cat([x, x])[:8], x[:4].clone())):  # fresh views
        r = run_case(world, Case(_copy_spec(), {}, 1), "legit", fn, bench=bench, timing=TIMING)
        assert r.status == "pass", (fn, r.reason)
    assert _run(world, doubled, bench=bench).status == "pass"
    # outputs of their own memory per call: the harness's own references let go of, none is
    # taken for the implementation's, and the case makes no ring calls
    made = {"n": 0}

    def fresh(x):
        made["n"] += 1
        return x.clone(), x[:4].clone()

    r = run_case(world, Case(_copy_spec(), {}, 1), "fresh", fresh, bench=bench, timing=TIMING)
    assert r.status == "pass" and made["n"] < 64, (made, r.reason)


def test_in_place_cases_skip_the_check_after_timing_and_must_alias(world):
    """The timed repeats rewrite an in-place case's input: its last output is not checked,
    but the calls on the near twin's and the twin's values written into its buffers are."""
    r = _run(world, doubled, params={"n": 1031, "inplace": True}, inplace_inputs=("x",))
    assert r.status == "pass", r.reason
    assert r.checks == ["poisoned_outputs", "shifted_buffers", "process_settings",
                        "near_values", "reused_buffers", "settled"]
    cache: dict = {}

    def by_fingerprint(x, out):
        # in place: the values differ after each repeat, but the near call's are the case's
        # but a few elements, whose fingerprint the checked calls filled
        key = tuple(x[::129].tolist())
        if key not in cache:
            cache[key] = x * 2
        return out.copy_(cache[key])

    r = _run(world, by_fingerprint, params={"n": 1031, "inplace": True}, inplace_inputs=("x",))
    assert r.status == "fail" and r.reason.startswith(STAGE_PREFIX["near_values"]), r.reason


def test_peak_memory_counts_the_temporaries_of_the_call(world):
    def with_temporary(x, out):
        scratch = torch.ones(8 << 20)  # 32 MiB, touched
        torch.mul(x, scratch[: x.numel()] * 2, out=out)
        return out

    lean = _run(world, doubled, bench=False)
    heavy = _run(world, with_temporary, bench=False)
    assert heavy.status == lean.status == "pass"
    if heavy.peak_memory_kind == memory.NOT_MEASURED:
        pytest.skip("this system has no per-call peak memory (no /proc/self/clear_refs)")
    assert heavy.peak_memory_kind == memory.CPU_KIND
    assert heavy.peak_memory_bytes >= 30 << 20
    assert lean.peak_memory_bytes < 4 << 20


def test_without_the_proc_files_peak_memory_is_labelled_not_measured(tmp_path):
    with memory.PeakMemory(torch.device("cpu"), proc=tmp_path / "missing") as mem:
        torch.ones(1 << 20)
    assert mem.bytes is None and mem.kind == memory.NOT_MEASURED


def test_shift_buffers_off_skips_the_move_but_not_the_call_on_other_values(world):
    r = _run(world, doubled, bench=False, shift_buffers=False)
    assert r.status == "pass"
    assert r.checks == ["poisoned_outputs", "padded", "other_values", "process_settings",
                        "reused_buffers", "same_bits", "timed_contract"]


def test_an_out_buffer_passed_as_none_is_an_output_the_case_lacks(world):
    # fp8 rows have scales and bf16 rows do not: one spec, the scale buffer None for bf16
    def inputs(params, rank, world_size):
        x = generate((8,), torch.float32, seed=3)
        scale = poisoned(8, torch.float32) if params["scaled"] else None
        return {"x": x, "out": poisoned(8, torch.float32), "out_scale": scale}

    def reference(x, out, out_scale):
        return x * 2, (None if out_scale is None else torch.ones(8))

    def impl(x, out, out_scale):
        if out_scale is not None:
            out_scale.fill_(1)
        return torch.mul(x, 2, out=out), out_scale

    def expected(params, rank, world_size):
        out, scale = reference(**inputs(params, rank, world_size))
        return {"out": out} if scale is None else {"out": out, "scale": scale}

    spec = OpSpec(name="toy_scaled", family="toy", reference=reference, make_inputs=inputs,
                  expected=expected, grid={}, implementations={"ok": impl},
                  outputs=("out", "scale"), out_buffers={"out": "out", "scale": "out_scale"})
    for scaled in (False, True):
        r = run_case(world, Case(spec, {"scaled": scaled}, 1), "ok", impl, timing=TIMING)
        assert r.status == "pass", r.reason
        assert set(r.outputs) == ({"out", "scale"} if scaled else {"out"})


def test_a_skip_question_that_raises_is_an_error_result_not_an_escaped_exception(world):
    # after a sticky CUDA error or an OOM, `requires` (mem_get_info) raises: the case must
    # still record a result, or at several ranks the next gathers would pair across cases
    def requires(params, world_size, device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    r = _run(world, doubled, requires=requires)
    assert r.status == "error"
    assert "illegal memory access" in r.reason and r.reason.startswith("rank 0:")


def test_an_implementation_skip_reason_that_raises_is_an_error_too(world):
    def flaky(x, out):
        return doubled(x, out)

    def skip_reason(params, world_size, device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    flaky.skip_reason = skip_reason
    r = _run(world, flaky)
    assert r.status == "error" and "OutOfMemoryError" in r.reason


# ----------------------------------------------------------------- a case's set-up, shared
def _counting_spec(calls: dict, **extra) -> OpSpec:
    def make(params, rank, world_size):
        calls["inputs"] = calls.get("inputs", 0) + 1
        return dict(_inputs(params, rank, world_size), sizes=[1, 2, 3])

    def reference(x, out, sizes):
        calls["reference"] = calls.get("reference", 0) + 1
        x.add_(1)  # a reference that writes its inputs must not reach the implementations
        return (x - 1) * 2

    return OpSpec(name="toy_double", family="toy", reference=reference, make_inputs=make,
                  grid={"smoke": [{"n": 1031}]}, implementations={"ok": doubled},
                  out_buffers={"out": "out"}, **extra)


def test_the_implementations_of_a_case_share_one_set_up_but_never_its_tensors(world):
    calls: dict = {}
    spec = _counting_spec(calls)
    case = Case(spec, {"n": 1031}, 1)
    setups = SetupCache()
    seen = []

    def ok(x, out, sizes):
        seen.append((x.data_ptr(), x.clone(), list(sizes)))
        return torch.mul(x, 2, out=out)

    for _ in range(3):  # three implementations, five calls each, untimed: the second on
        # the case's values in padded rows, the third on the twin case's values (made once
        # too), the fourth and fifth (the lone timed call and its pair) on the case's again
        r = run_case(world, case, "ok", ok, bench=False, setups=setups)
        assert r.status == "pass", r.reason
    assert len(seen) == 15 and calls == {"inputs": 2, "reference": 2}
    fresh = _inputs({"n": 1031}, 0, 1)["x"]
    with reseeded(setups.get(case, 0).twin().salt):  # other values from the same generator
        twin = _inputs({"n": 1031}, 0, 1)["x"]
    assert not torch.equal(fresh, twin)
    assert all(torch.equal(x, twin if i % 5 == 2 else fresh) and sizes == [1, 2, 3]
               for i, (_, x, sizes) in enumerate(seen))
    pristine = setups.get(case, 0).pristine
    assert pristine is not None  # never handed out: every call got a copy
    assert pristine["x"].data_ptr() not in {ptr for ptr, _, _ in seen}
    r = run_case(world, case, "ok", ok, bench=True, timing=TIMING, setups=setups)
    # a timed run checks the twin case after timing instead: the same twin; and the near
    # twin, made once too
    assert r.status == "pass" and calls == {"inputs": 3, "reference": 3}
    r = run_case(world, case, "ok", ok, bench=True, timing=TIMING, setups=setups)
    assert r.status == "pass" and calls == {"inputs": 3, "reference": 3}
    # a new case makes its own, and its twin
    run_case(world, Case(spec, {"n": 517}, 1), "ok", ok, bench=False, setups=setups)
    assert calls == {"inputs": 5, "reference": 5}


def test_a_shared_set_up_still_catches_a_clobbered_input_in_every_implementation(world):
    calls: dict = {}
    case = Case(_counting_spec(calls), {"n": 1031}, 1)
    setups = SetupCache()

    def clobbers(x, out, sizes):
        torch.mul(x, 2, out=out)
        x.zero_()
        return out

    for _ in range(2):
        r = run_case(world, case, "clobbers", clobbers, bench=False, setups=setups)
        assert r.status == "error" and "input 'x' was modified" in r.reason
    r = run_case(world, case, "ok", lambda x, out, sizes: torch.mul(x, 2, out=out),
                 bench=False, setups=setups)
    assert r.status == "pass", r.reason


def test_inputs_over_the_cap_are_generated_for_every_call(world, monkeypatch):
    monkeypatch.setattr(case_setup, "SETUP_CACHE_CAP_BYTES", 1024)
    calls: dict = {}
    case = Case(_counting_spec(calls), {"n": 1031}, 1)
    setups = SetupCache()
    for _ in range(2):
        r = run_case(world, case, "ok", lambda x, out, sizes: torch.mul(x, 2, out=out),
                     bench=False, setups=setups)
        assert r.status == "pass", r.reason
    # the first implementation: the setup's (its first call's) and the reference's own, one
    # for the padded call, the same two for the twin case (the third call's values,
    # untimed), one for each of its last two calls (the case's values again); the second
    # implementation: one for each of its five calls. Each reference is made once for both
    # (a stress case's 2**31-element reference took most of its time per impl)
    assert calls == {"inputs": 10, "reference": 2}


def test_a_token_timing_still_checks_its_call(world):
    calls = {"n": 0}

    def breaks_on_third_call(x, out):
        calls["n"] += 1
        if calls["n"] <= 3:  # the first call, the padded one and the shifted check
            return torch.mul(x, 2, out=out)
        torch.mul(x[:-1], 2, out=out[:-1])
        return out

    case = Case(_spec(), {"n": 1031}, 1)
    token = TIMING.for_placement("8 ranks on 2 CPU(s) of vm")
    r = run_case(world, case, "b", breaks_on_third_call, bench=True, timing=token)
    assert calls["n"] == 5 and r.status == "fail"  # the token call and one right after it
    assert r.reason.startswith("on new input values written into buffers an earlier call used")
    assert r.timing["minimal"] and r.timing["n"] == 1


@pytest.mark.parametrize("bench", [True, False], ids=["token", "untimed"])
def test_a_result_kept_by_buffer_address_fails_a_token_timing_and_untimed(world, bench):
    """Ranks that contend for CPUs (or a GPU) get one token call, no real timing; --no-bench
    none: that call, or a third one, takes the case's values in the buffers the second call
    (on the twin's values) used, so a result cached by address returns the twin's."""
    cache: dict = {}
    calls = {"n": 0}

    def by_address(x, out):
        # kept from the third call on (the twin's), so that where the allocator hands the
        # twin call the first call's freed buffer the verdict is still this check's
        calls["n"] += 1
        if calls["n"] < 3:
            return doubled(x, out)
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = x * 2
        return out.copy_(cache[x.data_ptr()])

    token = TIMING.for_placement("8 ranks on 2 CPU(s) of vm")
    r = run_case(world, Case(_spec(), {"n": 1031}, 1), "cached", by_address, bench=bench,
                 timing=token)
    assert r.status == "fail", r.reason
    assert r.reason.startswith("on new input values written into buffers an earlier"), r.reason
    assert "reused_buffers" in r.checks and "same_bits" in r.checks
    r = run_case(world, Case(_spec(), {"n": 1031}, 1), "ok", doubled, bench=bench,
                 timing=token)
    assert r.status == "pass", r.reason


def test_a_set_up_is_never_shared_between_two_specs_of_one_name(world):
    calls: dict = {}
    setups = SetupCache()
    first, second = _counting_spec(calls), _counting_spec(calls)  # both named toy_double
    for spec in (first, second):
        r = run_case(world, Case(spec, {"n": 1031}, 1), "ok",
                     lambda x, out, sizes: torch.mul(x, 2, out=out), bench=False, setups=setups)
        assert r.status == "pass", r.reason
    assert calls == {"inputs": 4, "reference": 4}  # each case and its twin


def test_a_skip_question_that_takes_backend_is_told_the_jobs():
    """DTensor refuses CUDA tensors over gloo (ranks sharing a GPU) and runs over nccl: the
    runner hands the World's backend to a question that asks for it, and not to one that
    does not."""
    from suites.dtensor import REDISTRIBUTE

    case = Case(REDISTRIBUTE, REDISTRIBUTE.cases("smoke", 4)[0].params, 4)
    impl = REDISTRIBUTE.implementations["torch"]

    def on(device: str, backend: str) -> World:
        return World(comm=None, rank=0, size=1, local_rank=0, local_size=1,
                     device=torch.device(device), backend=backend)

    status, why = runner._skip_or_error(on("cuda", "gloo"), case, impl)
    assert status == "skip" and "needs nccl" in why
    assert runner._skip_or_error(on("cuda", "nccl"), case, impl) == ("", "")
    assert runner._skip_or_error(on("cpu", "gloo"), case, impl) == ("", "")
    # a question without the keyword is asked as before
    plain = Case(_spec(requires=lambda p, w, d: f"on {d}"), {"n": 1031}, 1)
    assert runner._skip_or_error(on("cuda", "gloo"), plain, doubled) == ("skip", "on cuda")


def test_the_phases_a_timeout_names_are_the_ones_the_case_is_in(world):
    """What the phase callback says (a timeout's reason names the last one) against where
    the work happens: the reference and the inputs under "setup", the implementation under
    "call", its timed repeats under "timing"."""
    phases: list[str] = []
    seen: dict[str, list[str]] = {"inputs": [], "reference": [], "impl": []}

    def inputs(params, rank, world_size):
        seen["inputs"].append(phases[-1])
        return _inputs(params, rank, world_size)

    def reference(x, out):
        seen["reference"].append(phases[-1])
        return x * 2

    def impl(x, out):
        seen["impl"].append(phases[-1])
        return torch.mul(x, 2, out=out)

    spec = OpSpec(name="toy_phases", family="toy", reference=reference, make_inputs=inputs,
                  grid={"smoke": [{"n": 1031}]}, implementations={"ok": impl},
                  out_buffers={"out": "out"})
    r = run_case(world, Case(spec, {"n": 1031}, 1), "ok", impl, timing=TIMING,
                 phase=phases.append)
    assert r.status == "pass", r.reason
    assert phases == ["setup", "call", "check", "call", "check", "call", "check", "timing"]
    # the case's own inputs and reference in its setup; after timing, the twin case's
    assert seen["inputs"][0] == seen["reference"][0] == "setup"
    assert set(seen["inputs"]) | set(seen["reference"]) == {"setup", "timing"}
    assert seen["impl"][:3] == ["call"] * 3 and set(seen["impl"][3:]) == {"timing"}
    assert set(phases) <= set(runner.PHASES)


def _leaves(change):
    """An implementation that computes right and leaves a process-wide setting changed."""

    def impl(x, out):
        change()
        return torch.mul(x, 2, out=out)

    return impl


# flush-to-zero is left to tests/test_cli_integration.py, in ranks of their own: threads this
# process started meanwhile would keep it for the tests after this one
_LEAKS = {
    "default dtype": lambda: torch.set_default_dtype(torch.float64),
    "intra-op threads": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
    "autocast on cpu": lambda: torch.set_autocast_enabled("cpu", True),
    "torch.backends.mkldnn.matmul.fp32_precision":
        lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
    "grad mode": lambda: torch.set_grad_enabled(False),
    "transformer fast path": lambda: torch.backends.mha.set_fastpath_enabled(False),
    "anomaly detection": lambda: torch.set_anomaly_enabled(True),
    # a kernel library's fused silu patched in: every later reference would call it
    "torch functions": lambda: setattr(torch.nn.functional, "silu",
                                       lambda x, inplace=False: x * torch.sigmoid(x)),
    # the rank's output to the launch log: a kernel's printf, the watchdog's stacks
    "standard output and error": lambda: os.dup2(os.open(os.devnull, os.O_WRONLY), 2),
}


@pytest.mark.parametrize("setting", list(_LEAKS))
def test_a_process_wide_setting_left_changed_fails_the_case_and_is_put_back(world, setting):
    """Every later case, the reference included, would run under it: a float64 default
    changes the inputs make_inputs builds, reduced-precision float32 matmuls the CPU
    reference's numbers, fewer threads the next implementation's time."""
    from harness.device import process_state

    before = process_state.snapshot()
    try:
        r = _run(world, _leaves(_LEAKS[setting]), bench=False)
        assert r.status == "fail" and setting in r.reason and "restored" in r.reason, r.reason
        assert process_state.snapshot() == before
        assert _run(world, doubled, bench=False).status == "pass"  # the next case runs clean
    finally:
        process_state.changed(before)


def _c_getenv(name: bytes) -> bytes | None:
    """What NCCL's getenv sees (os.getenv reads Python's copy)."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    return getenv(name)


@pytest.mark.parametrize("how", ["os.environ", "setenv in C"])
def test_an_nccl_variable_left_set_fails_the_case_and_is_unset(world, how):
    """NCCL reads NCCL_ALGO when a later case makes a communicator: the next group's
    reduction order would change. A C library's own setenv, which Python's os.environ never
    sees, is caught too."""
    from harness.device import process_state

    def leave():
        if how == "os.environ":
            os.environ["NCCL_ALGO"] = "Tree"
        else:
            ctypes.CDLL(None).setenv(b"NCCL_ALGO", b"Tree", 1)

    before = process_state.snapshot()
    try:
        r = _run(world, _leaves(leave), bench=False)
        assert r.status == "fail" and "environment: NCCL_ALGO: (unset) -> Tree" in r.reason, \
            r.reason
        assert process_state.snapshot() == before
        assert _c_getenv(b"NCCL_ALGO") is None and "NCCL_ALGO" not in os.environ
    finally:
        process_state.changed(before)


def test_what_nccl_sets_from_its_configuration_file_is_nccls_doing(world, monkeypatch,
                                                                     tmp_path):
    """The first case to make a NCCL communicator has NCCL set the file's variables where
    unset (setenv without overwrite): not the implementation's change, and not undone."""
    from harness.device import process_state

    conf = tmp_path / "nccl.conf"
    conf.write_text("# site settings\nNCCL_ALGO=Ring\nNCCL_IB_HCA=mlx5_0\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_1")  # set already: NCCL leaves it
    for key in ("NCCL_ALGO", "NCCL_PROTO"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(process_state, "nccl_conf", functools.cache(
        process_state.nccl_conf.__wrapped__))
    setenv = ctypes.CDLL(None).setenv

    def as_nccl(x, out):
        for key, value in ((b"NCCL_ALGO", b"Ring"), (b"NCCL_IB_HCA", b"mlx5_0")):
            setenv(key, value, 0)
        return torch.mul(x, 2, out=out)

    def sets_its_own(x, out):
        setenv(b"NCCL_PROTO", b"LL", 1)
        return as_nccl(x, out)

    try:
        assert _run(world, as_nccl, bench=False).status == "pass"
        assert _c_getenv(b"NCCL_ALGO") == b"Ring"  # as NCCL left it
        r = _run(world, sets_its_own, bench=False)
        assert r.status == "fail" and "(rank 0: environment: NCCL_PROTO: (unset) -> LL)" \
            in r.reason, r.reason
    finally:
        os.unsetenv("NCCL_ALGO")
        os.unsetenv("NCCL_PROTO")


def test_what_torch_sets_for_a_nccl_group_under_deterministic_algorithms_is_torchs(
        world, monkeypatch):
    """torch's ProcessGroupNCCL sets NCCL_ALGO=^NVLS where unset when deterministic
    algorithms are on (the first case to make a NCCL group does it): not the
    implementation's change. Any other value still is."""
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    setenv = ctypes.CDLL(None).setenv
    before_mode = (torch.are_deterministic_algorithms_enabled(),
                   torch.is_deterministic_algorithms_warn_only_enabled())

    def as_torch(x, out):
        setenv(b"NCCL_ALGO", b"^NVLS", 0)
        return torch.mul(x, 2, out=out)

    def own(x, out):
        setenv(b"NCCL_ALGO", b"Tree", 1)
        return torch.mul(x, 2, out=out)

    torch.use_deterministic_algorithms(True)
    try:
        assert _run(world, as_torch, bench=False).status == "pass"
        os.unsetenv("NCCL_ALGO")
        r = _run(world, own, bench=False)
        assert r.status == "fail" and "NCCL_ALGO: ^NVLS -> Tree" in r.reason, r.reason
    finally:
        torch.use_deterministic_algorithms(before_mode[0], warn_only=before_mode[1])
        os.unsetenv("NCCL_ALGO")
    torch.use_deterministic_algorithms(False)
    try:  # without deterministic algorithms torch sets nothing: it is the implementation
        r = _run(world, as_torch, bench=False)
        assert r.status == "fail" and "NCCL_ALGO: (unset) -> ^NVLS" in r.reason, r.reason
    finally:
        torch.use_deterministic_algorithms(before_mode[0], warn_only=before_mode[1])
        os.unsetenv("NCCL_ALGO")


@pytest.mark.parametrize("name", ["TORCHINDUCTOR_CACHE_DIR", "NVSHMEM_DISABLE_P2P",
                                  "CUBLAS_WORKSPACE_CONFIG"])
def test_variables_no_later_case_reads_are_left_alone(world, monkeypatch, name):
    """torch.compile sets its cache directories for itself; an NVSHMEM library sets its
    variables just before its one nvshmem_init, which no later case repeats."""
    monkeypatch.delenv(name, raising=False)  # put back after the test

    def sets(x, out):
        os.environ[name] = "1"
        return torch.mul(x, 2, out=out)

    assert _run(world, sets, bench=False).status == "pass"


def test_inference_mode_left_on_fails_the_case_and_ends_the_job(world, monkeypatch):
    """Only the InferenceMode guard the implementation holds can end it: the case fails
    naming it, and the process is tainted, so its job ends after the case."""
    from torch.autograd import grad_mode

    from harness.device import process_state

    monkeypatch.setattr(process_state, "_TAINTED", False)  # put back after the test
    guards = []
    try:
        r = _run(world, _leaves(lambda: guards.append(grad_mode._enter_inference_mode(True))),
                 bench=False)
        assert r.status == "fail" and "inference mode: False -> True (not restored" in r.reason
        assert process_state.tainted()
    finally:
        for guard in reversed(guards):  # RAII guards: last in, first out
            grad_mode._exit_inference_mode(guard)
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs to pin a process to one")
def test_a_process_pinned_to_fewer_cpus_fails_the_case_and_is_put_back(world, monkeypatch):
    """The reference and every later case would run on one CPU: slower times, not the
    implementation's."""
    from harness.device import process_state

    monkeypatch.setattr(process_state, "_TAINTED", False)  # put back after the test
    cpus = os.sched_getaffinity(0)
    try:
        r = _run(world, _leaves(lambda: os.sched_setaffinity(0, {min(cpus)})), bench=False)
        assert r.status == "fail" and "CPU affinity" in r.reason, r.reason
        assert os.sched_getaffinity(0) == cpus and process_state.tainted()
    finally:
        os.sched_setaffinity(0, cpus)


@pytest.mark.parametrize("name, change", [
    ("torch's global RNG", lambda: torch.manual_seed(0)),
    ("torch's global RNG", lambda: torch.rand(1)),
    # back to its seeded start: as found only in a process that never drew from it
    ("torch's global RNG", lambda: torch.manual_seed(torch.initial_seed())),
    ("NumPy's global RNG", lambda: __import__("numpy").random.seed(0)),
    ("NumPy's global RNG", lambda: __import__("numpy").random.rand()),
    ("Python's random module", lambda: __import__("random").seed(0)),
    ("Python's random module", lambda: __import__("random").random()),
])
def test_a_global_rng_reseeded_or_drawn_from_fails_the_case_and_is_put_back(world, name,
                                                                            change):
    """The calling program's random stream (its dropout, its sampling) would move with
    every call of the kernel; the generators' states are put back."""
    import random

    import numpy

    states = (torch.get_rng_state(), numpy.random.get_state()[1].copy(), random.getstate())
    r = _run(world, _leaves(change), bench=False)
    assert r.status == "fail" and f"{name}: reseeded or drawn from" in r.reason, r.reason
    assert torch.equal(torch.get_rng_state(), states[0])
    assert (numpy.random.get_state()[1] == states[1]).all() and random.getstate() == states[2]


def test_a_generator_of_the_implementations_own_passes(world):
    own = torch.Generator().manual_seed(0)
    assert _run(world, _leaves(lambda: torch.rand(4, generator=own)), bench=False).status \
        == "pass"


def test_a_working_directory_left_changed_fails_the_case_and_is_put_back(world, tmp_path):
    """The next implementation's relative paths (a compiler's output, a log) would land
    wherever this one went."""
    here = os.getcwd()
    try:
        r = _run(world, _leaves(lambda: os.chdir(tmp_path)), bench=False)
        assert r.status == "fail" and "working directory" in r.reason, r.reason
        assert str(tmp_path) in r.reason and os.getcwd() == here
    finally:
        os.chdir(here)


def test_a_setting_changed_and_put_back_inside_the_call_passes(world):
    def tidy(x, out):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return torch.mul(x, 2, out=out)
        finally:
            torch.set_num_threads(threads)

    assert _run(world, tidy).status == "pass"


def test_a_setting_changed_only_while_timed_fails_too(world):
    from harness.device import process_state

    before, threads, calls = process_state.snapshot(), torch.get_num_threads(), []

    def late(x, out):
        calls.append(1)
        if len(calls) > 2:  # after the first and the shifted call: in the timed repeats
            torch.set_num_threads(threads + 1)
        return torch.mul(x, 2, out=out)

    try:
        r = _run(world, late)
        assert r.status == "fail" and "intra-op threads" in r.reason, r.reason
        assert torch.get_num_threads() == threads
    finally:
        process_state.changed(before)


def test_sys_exit_in_an_implementation_is_an_error_not_the_end_of_the_rank(world):
    def exits(x, out):
        raise SystemExit(3)

    r = _run(world, exits)
    assert r.status == "error" and "implementation raised SystemExit: 3" in r.reason, r.reason


def test_in_process_cases_after_one_that_tainted_the_process_are_not_run(monkeypatch):
    """``run_cases`` (a suite's own tests, ``harness tolerance``) cannot end its process as a
    job does after a flush-to-zero its threads keep: the cases after it are skips that say
    why, not results computed under it."""
    from harness.device import process_state
    from harness.engine.local import TAINTED, run_cases

    monkeypatch.setattr(process_state, "_TAINTED", False)  # put back after the test
    spec = OpSpec(name="toy_double", family="toy", reference=_reference, make_inputs=_inputs,
                  grid={"smoke": [{"n": 1031}, {"n": 7}, {"n": 64}]},
                  implementations={"ok": doubled}, out_buffers={"out": "out"},
                  negative_controls={"tripled": lambda x, out: torch.mul(x, 3, out=out)})
    calls = []

    def taints_on_second(x, out):
        calls.append(1)
        if x.numel() == 7:
            process_state.taint()  # as a leaked flush-to-zero found by the check does
        return torch.mul(x, 2, out=out)

    results = run_cases(spec, taints_on_second)
    assert [r.status for r in results] == ["pass", "pass", "skip"]
    assert results[2].reason == TAINTED and results[2].case_id.endswith("n=64]")
    assert len(calls) == 2 * 5  # each run case's five calls (untimed); none for the skip
    assert {r.status for r in run_cases(spec, "ok")} == {"skip"}  # nor in a later call
    # and a control's skipped cases are no catch (harness tolerance)
    from harness.engine.tolerance_use import controls_caught, uses

    assert controls_caught(uses(spec, run_cases(spec, "tripled"))) == {"tripled": False}


def test_a_function_wrapped_in_place_is_not_a_replacement(world):
    """Importing torch._dynamo wraps torch.manual_seed (functools.wraps): the first DTensor
    case would otherwise fail for torch's own import. A replacement that does not wrap the
    function it replaces fails (``_LEAKS``)."""
    import functools

    from harness.device import process_state

    original = torch.nn.functional.gelu
    before = process_state.snapshot()
    try:
        torch.nn.functional.gelu = functools.wraps(original)(lambda *a, **k: original(*a, **k))
        assert process_state.changed(before) == []
    finally:
        torch.nn.functional.gelu = original


class _Liar(torch.Tensor):
    """A subclass that overrides what compares it: every element equal, nothing unequal."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose):
            return True
        if func in (torch.Tensor.ne, torch.Tensor.__ne__, torch.ne):
            return torch.zeros(args[0].shape, dtype=torch.bool)
        if func is torch.Tensor.as_subclass:
            return args[0]
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_is_judged_by_the_values_it_holds(world):
    """An output that lies in its comparisons (it holds zeros) fails as zeros do; one that
    holds the right values passes."""
    lying = _run(world, lambda x, out: out.zero_().as_subclass(_Liar), bench=False)
    assert lying.status == "fail", lying.reason
    honest = _run(world, lambda x, out: doubled(x, out).as_subclass(_Liar), bench=False)
    assert honest.status == "pass", honest.reason


@pytest.mark.parametrize("fn,why", [
    (lambda x: (x.to_sparse(), x[:4].clone()), "is a sparse_coo tensor: return a dense one"),
    (lambda x: (torch.empty_like(x, device="meta"), x[:4].clone()), "on the meta device"),
    (lambda x: {"out": x.clone(), "debug": x.sum()}, "missing outputs ['head']"),
], ids=["sparse", "meta", "extra_key_and_one_missing"])
def test_outputs_without_dense_values_or_the_ops_names_are_errors_saying_so(world, fn, why):
    r = run_case(world, Case(_copy_spec(), {}, 1), "odd", fn, bench=False)
    assert r.status == "error" and why in r.reason, r.reason
    assert "harness error" not in r.reason


def test_a_dict_with_more_than_the_ops_outputs_is_read_for_the_ops_outputs_alone(world):
    """A kernel's extra results (a router's logits, an attention's LSE) are not the op's:
    not checked, not even for sharing memory with an input (the last one is the input)."""
    r = run_case(world, Case(_copy_spec(), {}, 1), "extra",
                 lambda x: {"out": x.clone(), "head": x[:4].clone(), "lse": x}, bench=False)
    assert r.status == "pass", r.reason


class _Custom(BaseException):
    pass


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


@pytest.mark.parametrize("exc,words", [
    (_Custom("a library's own"), "implementation raised _Custom: a library's own"),
    (GeneratorExit("gone"), "implementation raised GeneratorExit: gone"),
    (_Unprintable(), "implementation raised _Unprintable: <its message could not be read"),
    (ValueError("x" * 100_000), "(98000 more characters)"),
], ids=["base_exception", "generator_exit", "unprintable", "huge"])
def test_whatever_an_implementation_raises_is_its_case_error_in_a_bounded_line(world, exc,
                                                                               words):
    def raises(x, out):
        raise exc

    r = _run(world, raises, bench=False)
    assert r.status == "error" and words in r.reason, r.reason[:300]
    assert len(r.reason) < 3000 and "harness error" not in r.reason


def _unaligned_fallback_drops_last(x, out):
    # a vector path for 16-byte aligned inputs, and a scalar fallback one element short
    torch.mul(x, 2, out=out)
    if x.data_ptr() % 16 or out.data_ptr() % 16:
        out[-1] = 0.0
    return out


@pytest.mark.parametrize("bench", [True, False])
def test_an_unaligned_fallback_is_called_and_judged_where_the_op_takes_any_address(world,
                                                                                   bench):
    addresses = []

    def recorded(x, out):
        addresses.append((x.data_ptr() % 16, out.data_ptr() % 16))
        return doubled(x, out)

    r = _run(world, recorded, bench=bench, any_alignment=True)
    assert r.status == "pass", r.reason
    assert "misaligned" in r.checks
    # the first call's inputs are aligned, the second's one, two or four float32s past it
    # (by the case: 4, 8 or 4 bytes, as 16 is aligned), the rest aligned again (the timing
    # measures the kernel's usual path)
    off = {1: 4, 2: 8, 4: 4}[checked_calls.misaligned_by(Case(_spec(), {"n": 1031}, 1))]
    assert addresses[0] == (0, 0) and addresses[1] == (off, off), addresses
    assert all(a == (0, 0) for a in addresses[2:]), addresses
    r = _run(world, _unaligned_fallback_drops_last, bench=bench, any_alignment=True)
    assert r.status == "fail"
    assert r.reason.startswith("on inputs off 16-byte alignment"), r.reason
    # an op whose contract guarantees aligned inputs never reaches the fallback
    assert _run(world, _unaligned_fallback_drops_last, bench=bench).status == "pass"


def test_an_implementation_may_refuse_unaligned_inputs_but_not_misuse_them(world):
    def refuses(x, out):
        if x.data_ptr() % 16:
            raise ValueError("x must be 16-byte aligned")
        return doubled(x, out)

    r = _run(world, refuses, any_alignment=True)
    assert r.status == "pass" and "misaligned_refused" in r.checks, r.reason

    def returns_a_word(x, out):  # returning something that is no output is no refusal
        return "done" if x.data_ptr() % 16 else doubled(x, out)

    r = _run(world, returns_a_word, any_alignment=True)
    assert r.status == "error" and "off 16-byte alignment" in r.reason, r.reason

    def writes_before(x, out):
        # an aligned-down vector store: the 4 bytes before an unaligned output are written
        doubled(x, out)
        if out.data_ptr() % 16:
            torch.empty(0, dtype=out.dtype).set_(out.untyped_storage(),
                                                 out.storage_offset() - 1, (1,)).fill_(0.0)
        return out

    r = _run(world, writes_before, any_alignment=True)
    assert r.status == "error"
    assert r.reason.startswith("rank 0: on inputs off 16-byte alignment (a vectorised "
                               "kernel's path for unaligned inputs?): wrote outside the "
                               "buffers it was given: 'out' (4 bytes before its start)"), r.reason


def test_an_input_read_as_dense_whatever_its_strides_fails_the_padded_call(world):
    """Each read-only input is passed once as a strided view of the same values: a kernel
    handed a pointer and a shape reads the wrong memory there; one that needs contiguous
    inputs may refuse them by raising; an op whose input's layout is its meaning opts out."""
    def stride_blind(x, out):
        dense = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), x.storage_offset(),
                                                   x.shape)
        return doubled(dense, out)

    r = _run(world, stride_blind, bench=False)
    assert r.status == "fail" and r.reason.startswith(
        "on the same values with the read-only inputs as rows of wider buffers"), r.reason
    assert _run(world, stride_blind, bench=False, fixed_layout_inputs=("x",)).status == "pass"
    assert _run(world, stride_blind, bench=False, fixed_layout_inputs=("*",)).status == "pass"

    def refuses(x, out):
        if not x.is_contiguous():
            raise ValueError("x must be contiguous")
        return doubled(x, out)

    r = _run(world, refuses)
    assert r.status == "pass" and "padded_refused" in r.checks and "padded" not in r.checks


def test_the_padded_call_lays_out_only_read_only_inputs_alone_in_their_storage():
    spec = _spec()
    case = Case(spec, {"n": 8}, 1)
    buf = torch.zeros(16)
    inputs = {"x": torch.ones(4, 3), "out": torch.empty(4, 3), "one": torch.ones(1),
              "a": buf[:8], "b": buf[8:], "ids": torch.arange(6), "n": 6}
    assert checked_calls.paddable(case, inputs, {"out"}) == ["x", "ids"]
    fixed = Case(_spec(fixed_layout_inputs=("ids",)), {"n": 8}, 1)
    assert checked_calls.paddable(fixed, inputs, {"out"}) == ["x"]


def test_a_refusal_that_left_the_device_faulted_is_no_refusal(world, monkeypatch):
    def faults(x, out):
        if x.data_ptr() % 16:
            raise RuntimeError("CUDA error: misaligned address")
        return doubled(x, out)

    monkeypatch.setattr(checked_calls, "broken_context",
                        lambda device: "CUDA error: misaligned address")
    r = _run(world, faults, any_alignment=True)
    assert r.status == "error" and "misaligned address" in r.reason, r.reason


def _piece_inputs(params, rank, world_size):
    # in place, as a reduce_scatter's: out is x's second quarter
    x = generate((64,), torch.float32, seed=3, dist="uniform")
    return {"x": x, "out": x[16:32]}


def test_an_in_place_call_may_write_its_output_piece_of_an_input_and_nothing_else(world):
    spec = OpSpec(name="toy_piece", family="toy", reference=lambda x, out: x[16:32] * 2,
                  make_inputs=_piece_inputs, grid={"smoke": [{"inplace": True}]},
                  implementations={}, out_buffers={"out": "out"})
    case = Case(spec, {"inplace": True}, 1)

    def piece_only(x, out):
        return out.mul_(2)

    def scratch_in_x(x, out):  # the rest of x used as scratch, then the result copied in
        x[:16].copy_(x[16:32] * 2)
        return out.copy_(x[:16])

    assert run_case(world, case, "ok", piece_only, bench=False).status == "pass"
    r = run_case(world, case, "scratch", scratch_in_x, bench=False)
    assert r.status == "error" and "input 'x' was modified outside the output buffer" \
        in r.reason, r.reason


def test_the_misaligned_call_runs_on_every_case_up_to_4_ranks_and_a_quarter_past():
    from harness.core.discovery import registry

    spec = registry().specs["reduce_scatter"]
    cases = [Case(spec, p, 8) for p in spec.grid["smoke"]]
    assert all(checked_calls.misaligned_here(c, w) for c in cases for w in (1, 2, 3, 4))
    chosen = [c for c in cases if checked_calls.misaligned_here(c, 8)]
    assert 0 < len(chosen) < len(cases)
    assert chosen == [c for c in cases if checked_calls.misaligned_here(c, 16)]  # the same
    assert not checked_calls.misaligned_here(Case(_spec(), {"n": 7}, 1), 1)  # not opted in


def test_hashing_outputs_leaves_their_storage_as_it_was(monkeypatch):
    """The output hash reads copies: numpy's view of the tensor itself would mark its
    storage not resizable for good, and a later resize_ of the caller's tensor would fail.
    Chunked or not, it is the hash of all the bytes at once."""
    from harness.engine import checked_calls

    out = torch.arange(1000, dtype=torch.float32)
    whole = hashlib.sha256()
    for part in (b"out", str(out.dtype).encode(), str(tuple(out.shape)).encode(),
                 out.clone().numpy().tobytes()):
        whole.update(part)
    monkeypatch.setattr(checked_calls, "HASH_CHUNK_BYTES", 999)  # past one chunk, unaligned
    assert checked_calls.output_hashes({"out": out})[0] == whole.hexdigest()
    assert out.untyped_storage().resizable()
    out.resize_(2000)  # what a caller may do with its tensor
