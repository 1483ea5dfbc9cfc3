"""Static checks of the suites' grids: every case is well formed before any rank runs it."""

from __future__ import annotations

import math

import pytest

from harness.core.discovery import builtin_suite
from reference_kernels import dtensor, strided_copy
from suites import dtensor as dtensor_suite
from suites import strided_copy as strided_suite


@pytest.mark.parametrize("tier", ["smoke", "nightly"])
def test_every_dtensor_case_names_one_placement_per_mesh_dim(tier):
    for p in dtensor_suite.REDISTRIBUTE.grid[tier]:
        dims = len(dtensor_suite.mesh_shape(p))
        for side in ("src", "dst"):
            placements = dtensor.parse(p[side])
            assert len(placements) == dims, p
            assert all(q.dim < len(p["shape"]) for q in placements if q.kind in ("S", "SS")), p


@pytest.mark.parametrize("tier", ["smoke", "nightly", "stress"])
def test_every_strided_view_fits_its_storage_and_stress_goes_past_2_31(tier):
    for p in strided_suite.STRIDED_COPY.grid[tier]:
        assert len(p["size"]) == len(p["stride"]) and p["offset"] >= 0, p
        assert strided_copy.source_span(p["size"], p["stride"], p["offset"]) >= 0
    if tier == "stress":
        for p in strided_suite.STRIDED_COPY.grid[tier]:
            big = max([math.prod(p["size"]), p["offset"], *p["stride"]])
            assert big > 2**31, p


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def _special(p) -> bool:
    return p.get("mode") == "special"


def _near_eps(p) -> bool:
    return p.get("rows") == "zero"


#: the edge classes each op's semantics name (docs/concepts.md's op tables): a bug that lives in
#: one shows only where a case holds it, so each is in two smoke cases and in the nightly tier
EDGES = {
    "hopper_tasks.rmsnorm": {"hidden not a power of two": lambda p: not _pow2(p["hidden"]),
                             "an all-zero row": lambda p: p.get("rows") == "zero"},
    "hopper_tasks.rmsnorm_linear": {"K not a power of two": lambda p: not _pow2(p["k"])},
    "hopper_tasks.linear": {"K not a multiple of 128": lambda p: p["k"] % 128},
    "hopper_tasks.linear_with_residual": {"K not a multiple of 128": lambda p: p["k"] % 128},
    "hopper_tasks.embedding": {"edge ids, special values": lambda p: p.get("ids") == "edges"},
    "hopper_tasks.identity": {"special values": lambda p: p.get("values") == "special"},
    "hopper_tasks.argmax": {"ties": lambda p: p.get("values") == "ties",
                            "NaN and infinities": lambda p: p.get("values") == "nan",
                            "a padded last chunk": lambda p: p["vocab"] % p["chunk"]},
    "hopper_tasks.paged_attention": {"a full last page": lambda p: p.get("last") == "edges"},
    "hopper_tasks.attention_split_kv": {"NaN in a key and in a value":
                                        lambda p: p.get("scores") == "nan"},
    "fp8_gemm.blockwise": {"K not a multiple of 128": lambda p: p["k"] % 128},
    "fp8_gemm.quantize": {"NaN and infinities": lambda p: p.get("dist") == "nan",
                          "K not a multiple of 128": lambda p: p["k"] % 128},
    "moe.layer": {"renormalize=false": lambda p: not p["renormalize"]},
    "moe.router": {"ties": lambda p: p.get("values") == "ties",
                   "NaN logits": lambda p: p.get("values") == "nan",
                   "experts not a power of two": lambda p: not _pow2(p["experts"]),
                   "renormalize=false": lambda p: not p["renormalize"]},
    **{op: {"-0.0, subnormals, NaN, infinities": _special,
            "a count a vector width divides": lambda p: p["n"] % 16 == 0,
            "a count no vector width divides": lambda p: p["n"] % 2}
       for op in ("allreduce", "reduce_scatter", "allgather", "broadcast", "all_to_all")},
}


#: edges found by wrong kernels that passed every smoke case (tests/test_wrong_kernels.py):
#: in one smoke case each (the smoke tier's time budget) and in the nightly tier
EDGES_ONCE = {
    "hopper_tasks.silu_mul": {"gates below -11": lambda p: p.get("values") == "wide",
                              "chunks of no whole vector":
                              lambda p: (p["inter"] // p["groups"]) % 8},
    "hopper_tasks.argmax": {"an all -inf row, no padding":
                            lambda p: p.get("values") == "neginf",
                            "maxima a float16 load ties": lambda p: p.get("values") == "range",
                            "all below a padded zero": lambda p: p.get("values") == "negative"},
    "hopper_tasks.paged_attention": {"scores past exp's range":
                                     lambda p: p.get("scores") == "wide",
                                     "pages of no power of two":
                                     lambda p: not _pow2(p["page_size"]),
                                     "a zero and a near-eps token": _near_eps},
    "hopper_tasks.rmsnorm_linear": {"a zero and a near-eps row": _near_eps},
    "hopper_tasks.linear": {"activations past float16's range, one row":
                            lambda p: p.get("values") == "wide" and p["b"] == 1},
    "hopper_tasks.embedding": {"one valid id": lambda p: p["b"] == 1 and p.get("ids") == "valid",
                               "rows of no whole vector": lambda p: p["hidden"] % 8},
    "hopper_tasks.attention_split_kv": {"a chunk of very negative scores, whole chunks":
                                        lambda p: p.get("scores") == "wide"
                                        and p["seq"] % p["chunk"] == 0,
                                        "the first chunk very negative":
                                        lambda p: p.get("scores") == "low_first"},
    "fp8_gemm.quantize": {"UE8M0 of a NaN group": lambda p: p.get("dist") == "nan"
                          and p["ue8m0"] and p["granularity"] == "token",
                          "amax below the floor; the max in the last row tile":
                          lambda p: p.get("dist") == "edge" and p["granularity"] == "tensor",
                          "a static scale other than 1": lambda p: p.get("static") not in
                          (None, True),
                          "a static scale no 16-bit float holds, UE8M0 on":
                          lambda p: p.get("static") == 0.3 and p["ue8m0"],
                          "NaN per tensor": lambda p: p.get("dist") == "nan"
                          and p["granularity"] == "tensor"},
    "fp8_gemm.grouped_contiguous": {"segments aligned to less than 64 rows":
                                    lambda p: p["align"] < 64},
    "fp8_gemm.per_tensor": {"outputs past 65504": lambda p: p.get("dist") == "wide"},
    "moe.router": {"logits past exp's range": lambda p: p.get("values") == "shifted",
                   "logits spread past exp's range": lambda p: p.get("values") == "spread",
                   "fewer finite logits than k": lambda p: p.get("values") == "masked",
                   "a tile of experts far below": lambda p: p.get("values") == "low_tile"},
    "moe.permute": {"alignment no power of two": lambda p: not _pow2(p["align"]),
                    "rows of no whole 16 bytes": lambda p: p["hidden"] * 2 % 16},
    "fp8_gemm.transpose_split_quant": {"K of no whole vector, NaN groups":
                                       lambda p: p["k"] % 8 and p["dist"] == "nan"},
    "moe.unpermute": {"sums past 65504": lambda p: p.get("values") == "special"},
    "moe.expert_ffn": {"an outlier token": lambda p: bool(p.get("outlier"))},
    "moe.layer": {"routing past any capacity": lambda p: bool(p.get("skew")),
                  "top-1, not renormalised": lambda p: p["topk"] == 1 and not p["renormalize"],
                  "FP8 pairs of even weight": lambda p: p.get("route") == "even"
                  and p["precision"] == "fp8"},
    "strided_copy": {view: (lambda v: lambda p: p["view"] == v)(view)
                     for view in ("transpose_slice", "rows16", "unit_dim", "empty_inner",
                                  "contiguous_offset", "overlap", "aligned_pitch_tail")},
    "allreduce": {"min and max specials": lambda p: _special(p) and p["op"] in ("min", "max"),
                  "f16 random": lambda p: p["dtype"] == "f16" and p["mode"] == "random"},
    "reduce_scatter": {"max specials": lambda p: _special(p) and p["op"] == "max",
                       "f16 random": lambda p: p["dtype"] == "f16" and p["mode"] == "random"},
}


@pytest.mark.parametrize("op,edges,least", [(op, EDGES[op], 2) for op in sorted(EDGES)]
                         + [(op, EDGES_ONCE[op], 1) for op in sorted(EDGES_ONCE)],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_every_named_edge_is_in_the_smoke_and_the_nightly_tier(op, edges, least):
    spec = {s.name: s for s in builtin_suite().specs}[op]
    for edge, holds in edges.items():
        smoke = [p for p in spec.grid["smoke"] if holds(p)]
        nightly = [p for p in spec.grid["nightly"] if holds(p)]
        assert len(smoke) >= least, f"{op}: {edge} is in {len(smoke)} smoke case(s)"
        assert nightly, f"{op}: {edge} is in no nightly case"


def test_every_smoke_cases_twin_takes_other_values():
    """The twin (the case's other values, every seed reseeded) is what a result kept by shape
    or by call count is checked on: a twin whose inputs were the case's own made that check
    see nothing (allreduce's, broadcast's, DTensor's and strided_copy's seeds ignore the twin
    parameter). Only a case with no random value at all may keep its values."""
    import torch

    from harness.core.spec import Case
    from harness.engine.case_setup import CaseSetup

    def bits(t):
        t = t.detach().contiguous().reshape(-1)
        return t if t.dtype == torch.bool else t.view(torch.uint8)

    def differs(a, b):
        return any(isinstance(v, torch.Tensor) and v.numel()
                   and (v.shape != b[k].shape or not torch.equal(bits(v), bits(b[k])))
                   for k, v in a.items())

    same = []
    for spec in builtin_suite().specs:
        for ws in (1, 4):
            for case in spec.cases("smoke", ws):
                if not any(differs(*(s.inputs(torch.device("cpu")) for s in (setup, setup.twin())))
                           for setup in (CaseSetup(Case(spec, case.params, ws), r)
                                         for r in range(ws))):
                    same.append(case.id)
    assert same == ["hopper_tasks.argmax[b=2,chunk=16,values=neginf,vocab=64]"]
