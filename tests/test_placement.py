"""Where ranks run and which backend they use, driven through the situations a site can be in
(placement.place is a function of plain facts: no GPU is needed to decide for one)."""

from __future__ import annotations

import os

import pytest

from harness.device.placement import (
    GpuFacts,
    PlacementError,
    RankFacts,
    contention,
    place,
    ranges,
    usable_cpus,
)

CUDA_TORCH = {"torch_version": "2.13.0+cu130", "torch_cuda": "13.0"}
H100 = "NVIDIA H100 80GB HBM3"


def gpus(n: int, node: str = "a", mode: str = "default") -> tuple[GpuFacts, ...]:
    return tuple(GpuFacts(f"GPU-{node}{i:02d}-0000-0000-0000", H100, mode) for i in range(n))


def node(name: str, ranks: int, seen: list[tuple[GpuFacts, ...]], **extra) -> list[RankFacts]:
    """The facts of ``ranks`` ranks on one node; rank i sees ``seen[i % len(seen)]``."""
    return [RankFacts(name, i, seen[i % len(seen)], **{**CUDA_TORCH, **extra})
            for i in range(ranks)]


def placements(requested: str, facts: list[RankFacts]):
    out = [place(requested, facts, r) for r in range(len(facts))]
    assert len({p.backend for p in out}) == 1, "every rank must choose the same backend"
    assert len({p.warning for p in out}) == 1
    return out


def test_a_machine_without_gpus_runs_on_the_cpu_with_gloo():
    facts = [RankFacts("a", i, (), "2.13.0+cpu", None) for i in range(8)]
    assert {(p.device, p.backend) for p in placements("auto", facts)} == {("cpu", "gloo")}
    with pytest.raises(PlacementError, match="--device cuda but no CUDA device"):
        place("cuda", facts, 0)


def test_one_gpu_per_rank_by_enumeration_takes_local_rank_and_nccl():
    all8 = gpus(8)
    out = placements("auto", node("a", 8, [all8]))
    assert [p.device for p in out] == [f"cuda:{i}" for i in range(8)]
    assert {p.backend for p in out} == {"nccl"} and not out[0].warning
    assert len({p.gpu_uuid for p in out}) == 8


@pytest.mark.parametrize("ranks", [4, 8])
def test_one_gpu_per_rank_by_binding_is_nccl_on_device_0(ranks):
    # srun --gpus-per-task=1, --gpu-bind, a per-rank CUDA_VISIBLE_DEVICES: each rank sees one
    # GPU (renumbered 0, or a global index the process still calls 0); the old rule compared
    # the node's rank count with the devices one rank sees and chose gloo
    own = [(g,) for g in gpus(ranks)]
    out = placements("cuda", node("a", ranks, own))
    assert {p.device for p in out} == {"cuda:0"}
    assert {p.backend for p in out} == {"nccl"}
    assert len({p.gpu_uuid for p in out}) == ranks


@pytest.mark.parametrize("ranks", [4, 8])
def test_several_ranks_on_one_gpu_use_gloo_and_say_so(ranks):
    out = placements("auto", node("a", ranks, [gpus(1)]))
    assert {p.device for p in out} == {"cuda:0"}
    assert {p.backend for p in out} == {"gloo"}
    assert f"ranks 0-{ranks - 1} on GPU" in out[0].warning and "gloo" in out[0].warning


def test_every_rank_binding_to_the_same_gpu_is_sharing_too():
    # a site that sets CUDA_VISIBLE_DEVICES=0 for every task
    one = gpus(1)
    out = placements("auto", node("a", 4, [one, one]))
    assert {p.backend for p in out} == {"gloo"}


def test_eight_ranks_on_two_gpus_name_the_groups():
    out = placements("auto", node("a", 8, [gpus(2)]))
    assert [p.device for p in out] == ["cuda:0", "cuda:1"] * 4
    assert out[0].backend == "gloo"
    assert "ranks 0, 2, 4, 6 on GPU" in out[0].warning
    assert "ranks 1, 3, 5, 7 on GPU" in out[0].warning


def test_two_nodes_decide_one_backend_together():
    both = node("a", 4, [gpus(4, "a")]) + node("b", 4, [gpus(4, "b")])
    assert {p.backend for p in placements("auto", both)} == {"nccl"}
    # node b has 2 GPUs for its 4 ranks: nccl is impossible there, so gloo everywhere
    short = node("a", 4, [gpus(4, "a")]) + node("b", 4, [gpus(2, "b")])
    out = placements("auto", short)
    assert {p.backend for p in out} == {"gloo"}
    assert out[0].device == "cuda:0" and out[7].device == "cuda:1"


def test_a_cpu_only_torch_on_a_gpu_host_is_one_line_naming_the_build():
    facts = [RankFacts("a", i, gpus(8), "2.13.0+cpu", None) for i in range(4)]
    with pytest.raises(PlacementError) as err:
        place("auto", facts, 0)
    msg = str(err.value)
    assert "torch 2.13.0+cpu is a CPU-only build" in msg and "--device cpu" in msg
    assert "\n" not in msg
    assert place("cpu", facts, 0).device == "cpu"


def test_ranks_that_see_no_gpu_beside_ranks_that_do_are_refused():
    facts = node("a", 4, [gpus(4, "a")]) + [RankFacts("b", i, (), **CUDA_TORCH)
                                          for i in range(4)]
    with pytest.raises(PlacementError, match=r"ranks 4-7 \(on b\) see no GPU while ranks 0-3"):
        place("auto", facts, 0)


def test_exclusive_process_gpus_refuse_sharing_unless_mps_serves_them():
    shared = node("a", 4, [gpus(1, mode="exclusive_process")])
    with pytest.raises(PlacementError, match="exclusive-process compute mode"):
        place("auto", shared, 0)
    with_mps = node("a", 4, [gpus(1, mode="exclusive_process")], mps=True)
    assert place("auto", with_mps, 0).backend == "gloo"
    # one rank per exclusive GPU is what that mode is for
    assert place("auto", node("a", 4, [gpus(4, mode="exclusive_process")]), 0).backend == "nccl"


def test_a_prohibited_gpu_is_refused():
    with pytest.raises(PlacementError, match="prohibited compute mode"):
        place("auto", node("a", 1, [gpus(1, mode="prohibited")]), 0)


def test_an_unknown_device_is_refused():
    with pytest.raises(PlacementError, match="unknown device 'tpu'"):
        place("tpu", [RankFacts()], 0)


def test_a_single_rank_with_a_gpu_is_nccl():
    p = place("auto", node("a", 1, [gpus(2)]), 0)
    assert (p.device, p.backend, p.device_type, p.device_index) == ("cuda:0", "nccl", "cuda", 0)


def test_ranges_reads_like_a_person_would_write_it():
    assert ranges([0, 1, 2, 3, 6]) == "0-3, 6"
    assert ranges([5]) == "5" and ranges([]) == ""
    assert ranges([7, 1, 0]) == "0-1, 7"


# --------------------------------------------------------------------- contention (timing)
def _cpu_ranks(n: int, cpus: tuple[int, ...] | list[tuple[int, ...]], node: str = "n0"
               ) -> list[RankFacts]:
    each = cpus if isinstance(cpus, list) else [cpus] * n
    return [RankFacts(node, r, cpus=each[r]) for r in range(n)]


def _judge(ranks: list[RankFacts], requested: str = "auto") -> str:
    return contention(ranks, [place(requested, ranks, r) for r in range(len(ranks))])


def test_one_rank_on_two_cpus_does_not_contend():
    assert _judge(_cpu_ranks(1, (0, 1))) == ""


@pytest.mark.parametrize("n", [4, 8])
def test_more_ranks_than_cpus_on_a_node_contend_and_say_how_many(n):
    assert _judge(_cpu_ranks(n, (0, 1))) == f"{n} ranks on 2 CPU(s) of n0"


def test_as_many_ranks_as_cpus_do_not_contend():
    assert _judge(_cpu_ranks(2, (0, 1))) == ""


def test_ranks_bound_one_per_core_count_the_union_of_their_cores():
    # mpiexec -bind-to core: each rank sees one CPU, all different
    assert _judge(_cpu_ranks(8, [(c,) for c in range(8)])) == ""
    # every rank bound to the same core: 8 ranks take turns on it
    assert _judge(_cpu_ranks(8, [(3,)] * 8)) == "8 ranks on 1 CPU(s) of n0"


def test_only_the_oversubscribed_node_is_named():
    ranks = _cpu_ranks(4, tuple(range(16)), "a") + _cpu_ranks(4, (0, 1), "b")
    assert _judge(ranks) == "4 ranks on 2 CPU(s) of b"


def test_unknown_cpus_are_not_judged():
    assert _judge(_cpu_ranks(8, ())) == ""


def test_ranks_sharing_a_gpu_contend_even_with_cpus_to_spare():
    gpu = GpuFacts("GPU-0000aaaa")
    ranks = [RankFacts("n0", r, (gpu,), "2.13", "12.9", cpus=tuple(range(16)))
             for r in range(4)]
    assert _judge(ranks) == "ranks 0-3 share GPU GPU-0000aaaa"


def test_one_gpu_per_rank_and_enough_cpus_do_not_contend():
    gpus = tuple(GpuFacts(f"GPU-{i}") for i in range(8))
    ranks = [RankFacts("n0", r, gpus, "2.13", "12.9", cpus=tuple(range(16))) for r in range(8)]
    assert _judge(ranks) == ""


def test_usable_cpus_is_this_process_affinity():
    assert set(usable_cpus()) == set(os.sched_getaffinity(0))
