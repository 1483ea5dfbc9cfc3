"""Tests for harness.core.spec: case ids, the registry, selectors, implementation resolution,
plans."""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest
import torch

from harness.core.discovery import registry
from harness.core.results import result_key
from harness.core.spec import OpSpec, Registry, SpecError, case_id, glob_match, load_callable


def _identity(x):
    return x


def _inputs(params, rank, world_size):
    return {"x": torch.zeros(params["n"])}


def tiny_spec(name="tiny.copy", family="tiny", distributed=False, world_sizes=None,
              **kwargs) -> OpSpec:
    """A small op for the tests: no suite needed."""
    fields = dict(
        name=name,
        family=family,
        reference=_identity,
        make_inputs=_inputs,
        grid={"smoke": [{"n": 1}, {"n": 2}], "nightly": [{"n": 3}]},
        implementations={"copy": _identity},
        negative_controls={"wrong": lambda x: x + 1},
        distributed=distributed,
        world_sizes=world_sizes,
    )
    fields.update(kwargs)
    return OpSpec(**fields)


@pytest.fixture(scope="module")
def reg() -> Registry:
    return registry(reload=True)


@pytest.fixture(scope="module")
def allreduce(reg):
    return reg.specs["allreduce"]


# ------------------------------------------------------------------------------------ case ids
def test_case_id_design_example():
    params = {"op": "sum", "n": 65536, "dtype": "bf16"}
    assert case_id("allreduce", params) == "allreduce[dtype=bf16,n=65536,op=sum]"


def test_case_id_canonical_values():
    params = {"inplace": True, "causal": False, "shape": (2, 2), "dims": [4, 8, 16],
              "eps": 1e-06, "scale": 0.5, "name": "x"}
    assert case_id("op", params) == (
        "op[causal=false,dims=4x8x16,eps=1e-06,inplace=true,name=x,scale=0.5,shape=2x2]")
    assert case_id("op", {}) == "op[]"


def test_case_id_ignores_insertion_order():
    a = {"dtype": "f32", "n": 7, "op": "max", "inplace": False}
    b = {"inplace": False, "op": "max", "n": 7, "dtype": "f32"}
    assert list(a) != list(b)
    assert case_id("allreduce", a) == case_id("allreduce", b) == (
        "allreduce[dtype=f32,inplace=false,n=7,op=max]")


def test_case_object_id():
    spec = tiny_spec()
    (case, _) = spec.cases("smoke", 1)
    assert case.id == "tiny.copy[n=1]"


# ------------------------------------------------------------------------------------ registry
def test_registry_finds_allreduce_in_collectives(reg, allreduce):
    assert allreduce.family == "collectives"
    assert "collectives" in reg.families
    assert allreduce.distributed


def test_registry_rejects_duplicates_and_unknown_ops():
    r = Registry()
    r.add(tiny_spec())
    with pytest.raises(SpecError):
        r.add(tiny_spec())
    with pytest.raises(SpecError, match="tiny.copy"):
        r.add_implementation("no_such_op", "mine", _identity)
    r.add_implementation("tiny.copy", "mine", _identity)
    assert "mine" in r.specs["tiny.copy"].implementations


def test_select_by_family_op_and_tier(reg):
    assert "allreduce" in [s.name for s in reg.select(["collectives"], "smoke")]
    assert [s.name for s in reg.select(["allreduce"], "smoke")] == ["allreduce"]
    # allreduce has no stress grid: nothing to run there
    assert "allreduce" not in [s.name for s in reg.select([], "stress")]
    assert "allreduce" in [s.name for s in reg.select([], "smoke")]


def test_unknown_selector_lists_families(reg):
    with pytest.raises(SpecError) as info:
        reg.select(["no_such_thing"], "smoke")
    assert "no_such_thing" in str(info.value)
    assert "collectives" in str(info.value)


def test_unknown_tier_raises(reg):
    with pytest.raises(SpecError, match="tier"):
        reg.select([], "weekly")
    with pytest.raises(SpecError):
        reg.plan("weekly", 1)


def test_glob_treats_brackets_literally():
    assert glob_match("a[bc]", "a[bc]")
    assert not glob_match("a[bc]", "ab")
    assert glob_match("allreduce[*]", "allreduce[n=1]")
    assert not glob_match("allreduce[*]", "allreduce")
    assert glob_match("all?educe", "allreduce")
    assert not glob_match("allreduce", "allreduce[n=1]")


def test_glob_over_case_ids_selects_only_matching_cases(reg, allreduce):
    items = reg.plan("smoke", 4, ["allreduce[*dtype=bf16*]"])
    bf16_cases = [p for p in allreduce.grid["smoke"] if p["dtype"] == "bf16"]
    assert bf16_cases, "the smoke grid should have bf16 cases"
    assert items
    assert all(it.case.params["dtype"] == "bf16" for it in items)
    assert len({it.case.id for it in items}) == len(bf16_cases)
    # a glob that only fits case ids of another dtype selects none of these
    f32 = reg.plan("smoke", 4, ["allreduce[*dtype=f32*]"])
    assert f32 and all(it.case.params["dtype"] == "f32" for it in f32)


def test_exact_case_id_selects_that_case(reg, allreduce):
    params = allreduce.grid["smoke"][0]
    cid = case_id("allreduce", params)
    items = reg.plan("smoke", 4, [cid])
    assert {it.case.id for it in items} == {cid}
    assert sorted(it.impl for it in items) == sorted(allreduce.implementations)


# ------------------------------------------------------------------------------- implementations
def test_check_impls(reg):
    specs = reg.select(["allreduce"], "smoke")
    reg.check_impls(specs, ["torch", "drop_rank", "low_precision"])  # controls are accepted
    reg.check_impls(specs, ["math:sqrt"])
    with pytest.raises(SpecError) as info:
        reg.check_impls(specs, ["no_such_impl"])
    assert "no_such_impl" in str(info.value) and "torch" in str(info.value)
    with pytest.raises(SpecError):
        reg.check_impls(specs, ["math:no_such_function"])


def test_load_callable_resolves_dotted_attributes():
    assert load_callable("math:sqrt") is math.sqrt
    assert load_callable("os:path.join") is os.path.join


@pytest.mark.parametrize("ref", [
    "math.sqrt",  # no colon
    ":sqrt",
    "math:",
    "no_such_module_for_harness_tests:f",  # missing module
    "math:no_such_attr",  # missing attribute
    "os:path.no_such_attr",
    "math:pi",  # not callable
])
def test_load_callable_errors_are_spec_errors(ref):
    with pytest.raises(SpecError):
        load_callable(ref)


def test_resolve_impls_of_plan(reg, allreduce):
    items = reg.plan("smoke", 4, ["allreduce"], impls=["torch", "drop_rank", "torch",
                                                        "math:sqrt"])
    per_case: dict[str, list[str]] = {}
    for it in items:
        per_case.setdefault(it.case.id, []).append(it.impl)
    assert len(per_case) == len(allreduce.grid["smoke"])
    for impls in per_case.values():
        assert impls == ["torch", "drop_rank", "math:sqrt"]
    fns = {it.impl: it.fn for it in items}
    assert fns["drop_rank"] is allreduce.negative_controls["drop_rank"]
    assert fns["math:sqrt"] is math.sqrt


# ------------------------------------------------------------------------------------ plans
@pytest.mark.parametrize("world_size", [1, 4, 8])
def test_plan_is_stable_and_complete(reg, allreduce, world_size):
    first = [it.key for it in reg.plan("smoke", world_size)]
    again = [it.key for it in reg.plan("smoke", world_size)]
    fresh = [it.key for it in registry(reload=True).plan("smoke", world_size)]
    assert first == again == fresh
    assert len(set(first)) == len(first)
    items = [it for it in reg.plan("smoke", world_size) if it.case.spec.name == "allreduce"]
    per_case = Counter(it.case.id for it in items)
    assert len(per_case) == len(allreduce.grid["smoke"])
    assert set(per_case.values()) == {len(allreduce.implementations)}
    by_case: dict[str, set[str]] = {}
    for it in items:
        by_case.setdefault(it.case.id, set()).add(it.impl)
        assert it.case.world_size == world_size
    assert all(v == set(allreduce.implementations) for v in by_case.values())
    # negative controls run only when asked for
    assert not {it.impl for it in items} & set(allreduce.negative_controls)


def test_planned_item_key_is_result_key(reg):
    items = reg.plan("smoke", 8, ["allreduce"])
    assert items
    for it in items:
        assert it.key == result_key(it.case.id, it.impl, 8)
        assert it.key == f"w8:{it.case.id}@{it.impl}"


def test_non_distributed_spec_plans_only_at_world_size_one():
    r = Registry()
    r.add(tiny_spec())
    items = r.plan("smoke", 1)
    assert [it.key for it in items] == ["w1:tiny.copy[n=1]@copy", "w1:tiny.copy[n=2]@copy"]
    assert r.plan("smoke", 4) == []
    assert r.plan("smoke", 8) == []
    assert [it.key for it in r.plan("nightly", 1)] == ["w1:tiny.copy[n=3]@copy"]


def test_world_sizes_restrict_distributed_specs():
    r = Registry()
    r.add(tiny_spec(distributed=True, world_sizes=(1, 4)))
    assert len(r.plan("smoke", 1)) == 2
    assert len(r.plan("smoke", 4)) == 2
    assert r.plan("smoke", 8) == []


def test_plan_orders_by_family_then_name():
    r = Registry()
    r.add(tiny_spec(name="zeta.op", family="zeta"))
    r.add(tiny_spec(name="alpha.b", family="alpha"))
    r.add(tiny_spec(name="alpha.a", family="alpha"))
    names = [it.case.spec.name for it in r.plan("smoke", 1)]
    assert names == ["alpha.a", "alpha.a", "alpha.b", "alpha.b", "zeta.op", "zeta.op"]


# ------------------------------------------------------------------------------------ OpSpec
def test_opspec_rejects_unknown_tier():
    with pytest.raises(SpecError, match="weekly"):
        tiny_spec(grid={"smoke": [{"n": 1}], "weekly": [{"n": 2}]})


def test_opspec_rejects_impl_named_like_a_control():
    with pytest.raises(SpecError, match="same"):
        tiny_spec(implementations={"same": _identity}, negative_controls={"same": _identity})


def test_an_op_says_where_its_cases_run(reg):
    assert reg.specs["hopper_tasks.rmsnorm"].world_sizes_of("smoke") == \
        "world size 1 only (a single-device op)"
    assert reg.specs["allreduce"].world_sizes_of("smoke") == "any world size"
    assert reg.specs["dtensor.redistribute"].world_sizes_of("smoke") == "world sizes 1, 4, 8"
    assert reg.specs["hopper_tasks.rmsnorm"].world_sizes_of("stress") == "no case in this tier"


def test_a_name_several_selected_ops_share_is_reported_with_the_ops(reg):
    specs = reg.select(["hopper_tasks"], "smoke")
    shared = reg.shared_impl_names(specs, ["rope_before_norm", "unweighted", "torch",
                                           "tests.helpers:x"])
    assert shared == {"rope_before_norm": ["hopper_tasks.paged_attention",
                                           "hopper_tasks.decoder_layer"],
                      "torch": [s.name for s in specs]}
    assert reg.shared_impl_names(reg.select(["hopper_tasks.paged_attention"], "smoke"),
                                 ["rope_before_norm"]) == {}


def test_run_of_a_single_device_op_at_4_ranks_says_it_runs_at_1_only(tmp_path, capfd):
    from harness.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "hopper_tasks.rmsnorm", "--world-sizes", "4", "--db",
              str(tmp_path / "h.db")])
    assert exit_info.value.code == 2
    assert "hopper_tasks.rmsnorm runs at world size 1 only" in capfd.readouterr().err


def test_shard_splits_evenly_or_by_torch_chunk_rule_on_request():
    from harness.api import shard

    assert [shard(8, r, 4) for r in range(4)] == [slice(0, 2), slice(2, 4), slice(4, 6),
                                                   slice(6, 8)]
    with pytest.raises(ValueError, match="uneven=True"):
        shard(5, 0, 4)
    got = [shard(5, r, 4, uneven=True) for r in range(4)]
    assert [s.stop - s.start for s in got] == [2, 2, 1, 0]  # torch.chunk(arange(5), 4)
    assert got == [slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 5)]
