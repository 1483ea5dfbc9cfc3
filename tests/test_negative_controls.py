"""Every negative control of every built-in family, run once for the module at 1 and 4 ranks
(with the Triton implementations, interpreted): each fails where its planted bug shows and
passes where it cannot."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
from test_cli_integration import harness, rows

pytestmark = pytest.mark.mpi


def _registry_controls(family: str) -> set[tuple[str, str]]:
    """(op without its family prefix, control) of every negative control of a family. The
    tables below refine where some of them must fail; a control with no entry must fail at
    least one case, so a new op or control needs no edit here. Triton controls only where
    triton is installed (elsewhere they skip, saying how to install it)."""
    from harness.core.discovery import registry

    has_triton = importlib.util.find_spec("triton") is not None
    return {(spec.name.removeprefix(f"{family}."), control)
            for spec in registry().select([family], "smoke")
            for control, fn in spec.negative_controls.items()
            if has_triton or not getattr(fn, "triton", False)}


#: the families whose negative controls share one run (strided_copy runs at world size 1 only)
CONTROLLED = ("collectives", "hopper_tasks", "fp8_gemm", "moe", "dtensor", "strided_copy")


@pytest.fixture(scope="module")
def controls_run(tmp_path_factory):
    """Every negative control of every family in one run at 1 and 4 ranks: one launch per
    world size, whose tests only read the results (each its own family's; the
    implementations' results come from the smoke run, at 1, 4 and 8). Not at 8: every bug
    planted in a control shows at 4 ranks as it does at 8 (these tables once had an 8 column,
    always equal to the 4 one), and 8 ranks on 2 cores cost this launch half of its 100 s."""
    tmp_path = tmp_path_factory.mktemp("controls")
    controls = sorted({c for f in CONTROLLED for _, c in _registry_controls(f)})
    # and the Triton implementations, which a CPU run plans only when asked for (interpreted)
    args = [a for c in [*controls, "triton", "tile_triton"] for a in ("--impl", c)]
    out = harness(tmp_path, "run", *CONTROLLED, "--world-sizes", "1,4", "--no-bench", *args)
    return tmp_path, out


def _triton_passes(results: list[dict], ops: set[str]) -> None:
    """The Triton implementation passed (or skipped a case outside its kernels, saying why)
    on every case of each of ``ops``, interpreted; skipped everywhere without triton."""
    got = [r for r in results if r["impl"] == "triton"]
    assert {r["op"] for r in got} == ops, got
    if importlib.util.find_spec("triton") is None:
        assert all(r["status"] == "skip" and "pip install" in r["reason"] for r in got), got
        return
    assert {r["status"] for r in got} <= {"pass", "skip"}, [r for r in got
                                                           if r["status"] != "pass"]
    for op in ops:
        assert any(r["status"] == "pass" for r in got if r["op"] == op), op


def _family_rows(db: Path, family: str, columns: str, impls: tuple[str, ...] | None = None):
    """The results of one family in the shared controls run, of ``impls`` only if given."""
    got = rows(db, f"SELECT {columns} FROM results WHERE family = ?", family)
    return [r for r in got if impls is None or r["impl"] in impls]


# every negative control of the collectives, with where it must fail: "all" cases, the cases
# a predicate picks, or "some" case; a bug invisible at one rank must pass there
_COLLECTIVE_CONTROLS = {
    ("allreduce", "drop_rank"): {1: "none", 4: "all"},
    ("allreduce", "low_precision"): {1: "some", 4: "some"},
    # no power of two in these runs: at 3 ranks (test_a_world_size_no_power_of_two_...)
    ("allreduce", "doubling_pow2_only"): {1: "none", 4: "none"},
    ("allgather", "rank_order"): {1: "none", 4: "all"},
    ("allgather", "no_tail"): {1: "some", 4: "unaligned"},
    ("allgather", "stale_buffer"): {1: "all", 4: "all"},
    ("reduce_scatter", "wrong_piece"): {1: "none", 4: "all"},
    ("reduce_scatter", "low_precision"): {1: "all", 4: "all"},
    ("reduce_scatter", "no_tail"): {1: "some", 4: "unaligned"},
    ("all_to_all", "rank_order"): {1: "none", 4: "all"},
    ("all_to_all", "no_tail"): {1: "unaligned", 4: "unaligned"},
    ("all_to_all", "splits_transposed"): {1: "none", 4: "splits=uneven|splits=idle"},
    ("broadcast", "root_zero"): {1: "none", 4: "root!=0"},
    ("broadcast", "no_tail"): {1: "some", 4: "unaligned"},
    ("broadcast", "root_out_unwritten"): {1: "inplace=false", 4: "inplace=false"},
}


def _must_fail(rule: str, case_id: str) -> bool | None:
    if rule in ("all", "none"):
        return rule == "all"
    if rule == "some":
        return None
    if rule == "root!=0":
        return "root=0" not in case_id
    if rule == "unaligned":  # a count 4 divides has no tail (its pieces may, or not)
        return True if int(re.search(r"\bn=(\d+)", case_id).group(1)) % 4 else None
    return any(part in case_id for part in rule.split("|"))  # "a|b": either marker


def test_collective_controls_fail_where_their_bug_shows_with_exit_1(controls_run):
    every = _registry_controls("collectives")
    tmp_path, out = controls_run
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "FAIL w4 allreduce[" in out.stdout and "not bitwise equal" in out.stdout
    results = rows(tmp_path / "h.db", "SELECT world_size, op, case_id, impl, status, wrong, "
                                      "reason FROM results WHERE family = 'collectives' "
                                      "ORDER BY started_at")
    by = {}
    for r in results:
        by.setdefault((r["op"], r["impl"], r["world_size"]), []).append(r)
    for (op, impl), rules in _COLLECTIVE_CONTROLS.items():
        for w, rule in rules.items():
            got = by[(op, impl, w)]
            assert got, (op, impl, w)
            for r in got:
                must = _must_fail(rule, r["case_id"])
                if must is not None:
                    assert (r["status"] == "fail") == must, (impl, w, r)
                if r["status"] == "fail":
                    assert r["wrong"] > 0, r
            if rule == "some":
                assert any(r["status"] == "fail" for r in got), (op, impl, w)
    for op, impl in every - set(_COLLECTIVE_CONTROLS):  # caught somewhere, at least
        assert any(r["status"] == "fail" for w in (1, 4) for r in by.get((op, impl, w), ())
                   ), (op, impl)
    # the stale buffer is caught by the call on moved memory (untimed: on other values too),
    # and says so (a later case of the same shape already reads the first case's poisoned
    # buffer on its first call)
    for w in (1, 4):
        stale = by[("allgather", "stale_buffer", w)]
        assert stale[0]["reason"].startswith(
            "on other input values in fresh shifted memory, the old buffers poisoned"), stale[0]
    # the Triton tile reduction, interpreted in every rank, at both world sizes
    tile = [r for w in (1, 4) for r in by[("allreduce", "tile_triton", w)]]
    statuses = {r["status"] for r in tile}
    assert statuses == ({"skip"} if importlib.util.find_spec("triton") is None else {"pass"}), [
        r for r in tile if r["status"] != "pass"]

# every negative control of the Hopper tasks: (op, control) -> where it must fail, and for
# the decoder layer the stage its report must name as the first divergence
_HOPPER_CONTROLS = {
    ("embedding", "negative_wraps"): {1: "some"},  # not where every id is valid
    ("embedding", "zero_id_as_padding"): {1: "some"},
    ("rmsnorm", "rms_of_weighted"): {1: "all"},
    # only on inputs off 16-byte alignment (the misaligned call)
    ("rmsnorm", "unpeeled_head"): {1: "all"},
    ("linear", "bf16_accumulation"): {1: "all"},
    ("linear_with_residual", "bf16_accumulation"): {1: "all"},
    ("silu_mul_linear_with_residual", "bf16_accumulation"): {1: "all"},
    ("rmsnorm_linear", "unweighted"): {1: "all"},
    ("silu_mul", "not_interleaved"): {1: "all"},
    ("argmax", "no_chunk_offset"): {1: "some"},
    ("argmax", "last_on_ties"): {1: "some"},
    ("identity", "last_tile_dropped"): {1: "all"},
    ("paged_attention", "rope_before_norm"): {1: "all"},
    ("paged_attention", "visibility_off_by_one"): {1: "all"},
    # not the one-chunk case (seq=20): one chunk has nothing to merge
    ("attention_split_kv", "merge_without_rescale"): {1: "some"},
    ("attention_split_kv", "min_shift"): {1: "some"},
    ("tp_mlp", "residual_every_rank"): {1: "none", 4: "all"},
    ("decoder_layer", "rope_before_norm"): {1: "attn", 4: "attn"},
    ("decoder_layer", "residual_every_rank"): {1: "none", 4: "attn_out"},
    ("decoder_layer", "down_bf16_accumulation"): {1: "out", 4: "out"},
}


def test_hopper_task_controls_fail_and_the_pipeline_names_the_planted_stage(controls_run):
    tmp_path, out = controls_run
    every = _registry_controls("hopper_tasks")
    controls = tuple(sorted({impl for _, impl in every}))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    _triton_passes(_family_rows(tmp_path / "h.db", "hopper_tasks", "op, impl, status, reason"),
                   {f"hopper_tasks.{op}" for op in ("rmsnorm", "silu_mul", "embedding",
                                                    "argmax")})
    results = _family_rows(tmp_path / "h.db", "hopper_tasks",
                           "world_size, op, impl, status, reason", controls)
    by = {}
    for r in results:
        by.setdefault((r["op"].removeprefix("hopper_tasks."), r["impl"], r["world_size"]),
                      []).append(r)
    assert {k[:2] for k in by} == every
    for (op, impl), rules in _HOPPER_CONTROLS.items():
        for w, rule in rules.items():
            got = by[(op, impl, w)]
            statuses = [r["status"] for r in got]
            if rule == "none":
                assert set(statuses) == {"pass"}, (op, impl, w, got)
            elif rule == "some":
                assert "fail" in statuses, (op, impl, w, got)
            else:
                assert set(statuses) == {"fail"}, (op, impl, w, got)
            if op == "decoder_layer" and rule != "none":
                assert all(r["reason"].startswith(f"first divergence at stage {rule!r}")
                           for r in got), got
    for op, impl in every - set(_HOPPER_CONTROLS):  # caught somewhere, at least
        assert any(r["status"] == "fail" for k, got in by.items() if k[:2] == (op, impl)
                   for r in got), (op, impl)
    assert all(r["reason"].startswith("on inputs off 16-byte alignment")
               for r in by[("rmsnorm", "unpeeled_head", 1)])
    # controls that only the case built for their bug catches: ties decide only the argmax
    # case of ties (the others plant a unique maximum); only the embedding case of edge ids
    # holds an id 0; only the split-KV cases of wide scores (one chunk very negative)
    # overflow a min-shifted softmax (the NaN rows hold two NaNs a row, whose order ties
    # decide too, and an all -inf row ties every logit)
    # and the controls of the cases made for the red team's bugs: gates past exp's float32
    # range, squares past float16's, an index within a chunk past 8 bits
    for control, marker in (("last_on_ties",
                             "values=ties|values=nan|values=neginf|values=negative"),
                            ("zero_id_as_padding", "ids=edges"),
                            ("min_shift", "scores=wide|scores=low_first"),
                            ("sigmoid_as_exp_ratio", "values=wide"),
                            ("squares_in_fp16", "values=wide"),
                            ("index_in_8_bits", "chunk=512"),
                            ("one_chunk_lse_max", "seq=20")):
        got = {r["case_id"]: r["status"] for r in _family_rows(
            tmp_path / "h.db", "hopper_tasks", "case_id, impl, status", (control,))}
        assert {c for c, s in got.items() if s == "fail"} == {
            c for c in got if _must_fail(marker, c)}, got


# every negative control of the FP8 suite and the cases it must fail: all of them, or some
# (a bug that only shows on some inputs: a group size off by one is invisible per tensor)
_FP8_CONTROLS = {
    ("quantize", "block_off_by_one"): "some",
    ("quantize", "saturation_ignored"): "some",
    ("transpose_split_quant", "scale_per_block_row"): "some",
    ("per_tensor", "bf16_accumulation"): "all",
    ("per_tensor", "epilogue_through_fp16"): "some",  # the wide bf16 case, and bf16 roundings
    ("blockwise", "scales_transposed"): "all",
    ("blockwise", "block_off_by_one"): "all",
    ("blockwise", "bf16_accumulation"): "all",
    ("grouped_contiguous", "padding_unwritten"): "all",
    ("grouped_masked", "writes_past_mask"): "all",
}


def _controls_by_op(controls_run, family: str, triton_op: str) -> dict:
    """The rows of ``family``'s controls by (op without its prefix, control), every control
    there; the family's Triton implementation passed ``triton_op``'s cases (_triton_passes)."""
    tmp_path, out = controls_run
    every = _registry_controls(family)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    columns = "world_size, op, case_id, impl, status, reason"
    _triton_passes(_family_rows(tmp_path / "h.db", family, columns), {triton_op})
    by: dict = {}
    for r in _family_rows(tmp_path / "h.db", family, columns, tuple(c for _, c in every)):
        by.setdefault((r["op"].removeprefix(f"{family}."), r["impl"]), []).append(r)
    assert set(by) == every
    return by


def test_fp8_controls_fail_where_their_bug_shows(controls_run):
    by = _controls_by_op(controls_run, "fp8_gemm", "fp8_gemm.quantize")
    for (op, impl), got in by.items():
        rule = _FP8_CONTROLS.get((op, impl), "some")
        statuses = [r["status"] for r in got]
        # a Triton kernel skips the cases outside what it does (per tensor, per block)
        ran = {"pass", "fail", "skip"} if impl.startswith("triton") else {"pass", "fail"}
        assert "fail" in statuses and set(statuses) <= ran, (op, impl, got)
        if rule == "all":
            assert set(statuses) == {"fail"}, (op, impl, got)
    # static scaling saturates: the unclamped cast must fail exactly there, in both formats
    static = [r for r in by[("quantize", "saturation_ignored")]
              if "static=true" in r["case_id"] and "dist=wide" in r["case_id"]]
    assert len(static) == 2 and all(r["status"] == "fail" for r in static)


# every negative control of the MoE suite and the cases it must fail: "all", "some", the
# exact ones named by a parameter (a bug in fp8 scales cannot show on bf16 rows), or all but
# those ("!tokens=1,": one token routed to one expert has no order to get wrong and a prob of
# 1, which applied twice changes nothing)
_MOE_CONTROLS = {
    ("router", "softmax_after_topk"): "renormalize=false",
    # two NaNs in a row tie; masked experts tie at -inf; bf16 logits tie often
    ("router", "ties_higher_first"): "values=ties|values=nan|values=masked|logits=bf16",
    ("router", "unstable_sort"): "values=ties|values=nan|values=masked|logits=bf16",
    ("permute", "expert_out_of_order"): "!tokens=1,",
    ("permute", "padding_not_zeroed"): "all",
    ("permute", "scales_dropped"): "dtype=fp8",
    ("unpermute", "probs_applied_twice"): "!tokens=1,",
    ("unpermute", "bf16_accumulation"): "some",
    ("unpermute", "rounded_toward_zero"): "some",  # the precision lens: within one ulp
    ("expert_ffn", "gate_up_swapped"): "all",
    ("expert_ffn", "padding_unwritten"): "all",
    ("layer", "probs_applied_twice"): "all",
    # renormalised cases but the skewed one ("skew=true" sorts between the two keys), where
    # experts 0 and 1 hold nearly all the probability and renormalising changes nothing
    ("layer", "not_renormalized"): "renormalize=true,tokens",
    ("layer_ep", "dropped_token"): "all",
    # where each pair carries about half its token; elsewhere the lost pair may carry 0.1%
    # of it, inside FP8's noise, and the bf16 cases take another path
    ("layer", "fp8_last_pair_lost"): "route=even",
}


def test_moe_controls_fail_where_their_bug_shows(controls_run):
    by = _controls_by_op(controls_run, "moe", "moe.permute")
    for (op, impl), got in by.items():
        rule = _MOE_CONTROLS.get((op, impl), "some")
        statuses = [r["status"] for r in got]
        if rule == "all":
            assert set(statuses) == {"fail"}, (op, impl, got)
        elif rule == "some":
            assert "fail" in statuses and set(statuses) <= {"pass", "fail"}, (op, impl, got)
        else:
            marker, negated = rule.removeprefix("!"), rule.startswith("!")
            assert {r["case_id"]: r["status"] for r in got} == {
                r["case_id"]: "fail" if _must_fail(marker, r["case_id"]) != negated else "pass"
                for r in got}, got
    # the dropped token fails at 4 ranks (the layer's implementations ran at 4 and 8 in
    # test_smoke_tier.py)
    assert {r["world_size"] for r in by[("layer_ep", "dropped_token")]} == {1, 4}
    # a padding row left unwritten shows as the poison the buffer was filled with
    assert all("nan vs 0.0" in r["reason"] for r in by[("permute", "padding_not_zeroed")])


def _params(case_id: str) -> dict[str, str]:
    """A case id's params as text (values may hold commas: ``src=S0,R``)."""
    inner = case_id[case_id.index("[") + 1 : -1]
    return dict(kv.split("=", 1) for kv in re.split(r",(?=[a-z_]+=)", inner))


def test_strided_copy_controls_fail_where_their_bug_shows(controls_run):
    tmp_path, out = controls_run
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    # the CPU's: the CUDA C++ controls skip here, saying so (tests/test_cuda_host_paths.py)
    mine = {"stride_ignored", "int32_index", "triton", "triton_int32_index",
            "triton_store_one_past"}
    results = [r for r in rows(tmp_path / "h.db", "SELECT op, case_id, impl, status, reason "
                                                  "FROM results WHERE family = 'strided_copy'")
               if r["impl"] in mine]
    assert {r["impl"] for r in results} >= {"stride_ignored", "int32_index", "triton"}
    _triton_passes(results, {"strided_copy"})
    if importlib.util.find_spec("triton") is None:
        results = [r for r in results if not r["impl"].startswith("triton")]
    assert len({r["case_id"] for r in results}) >= 60
    for r in results:
        p = _params(r["case_id"])
        size = [int(v) for v in p["size"].split("x") if v]
        stride = [int(v) for v in p["stride"].split("x") if v]
        if r["impl"] == "stride_ignored":
            # the innermost stride matters when it is not 1 and the dim has 2+ elements
            shows = bool(size) and size[-1] > 1 and stride[-1] != 1 and 0 not in size
            assert r["status"] == ("fail" if shows else "pass"), r
        elif r["impl"] == "triton_store_one_past":
            # every element right; the last program's mask reaches one past the output,
            # unless the output ends where a program does (suites/_triton/strided_copy.py)
            numel = math.prod(size)
            past = numel % 4096 != 0
            assert r["status"] == ("error" if past else "pass"), r
            if past:
                assert "wrote outside the buffers it was given: 'out' (" in r["reason"], r
                assert "past its end" in r["reason"], r
        else:
            # indices below 2**31 never wrap: only the stress tier exposes the int32 controls
            assert r["status"] == "pass", r
    dtypes = {_params(r["case_id"])["dtype"] for r in results}
    assert len(dtypes) == 12  # every dtype the harness knows


def _dtensor_uneven_1d_shard(case_id: str) -> bool:
    p = _params(case_id)
    mesh, dst = p["mesh"], p["dst"]
    if "x" in mesh or not dst.startswith("S") or dst.startswith("SS"):
        return False
    return int(p["shape"].split("x")[int(dst[1:])]) % int(mesh) != 0


def test_dtensor_controls_fail_where_their_bug_shows(controls_run):
    # the planners passed on every mesh in test_smoke_tier.py
    tmp_path, out = controls_run
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    query = ("SELECT world_size, case_id, impl, status, reason FROM results "
             "WHERE family = 'dtensor'")
    results = rows(tmp_path / "h.db", query)
    assert {r["world_size"] for r in results} == {1, 4}
    assert {r["impl"] for r in results} == {"floor_chunks", "strided_as_plain",
                                            "partial_in_bf16", "gather_as_sum",
                                            "to_partial_divided"}
    by = {}
    for r in results:
        by.setdefault(r["impl"], []).append(r)

    def check(impl: str, own, shows) -> None:
        """Outside ``own`` (its move handed to torch's planner) the control skips, saying
        so; on its own cases it fails exactly where ``shows``, on some, and passes on some."""
        seen = set()
        for r in by[impl]:
            p = _params(r["case_id"])
            want = "skip" if not own(p) else "fail" if shows(p, r["world_size"]) else "pass"
            assert r["status"] == want, r
            assert want != "skip" or r["reason"].startswith("torch's planner moves"), r
            seen.add(want)
        assert seen == {"skip", "fail", "pass"}, (impl, seen)

    one_d = lambda p: "x" not in p["mesh"]  # noqa: E731
    check("strided_as_plain", lambda p: "SS" in p["src"],
          lambda p, world: world > 1)  # on one rank a strided shard is plain
    # a sum moves every value but -0.0 (1-D Shard -> R)
    check("gather_as_sum", lambda p: one_d(p) and re.fullmatch(r"S\d", p["src"])
          and p["dst"] == "R", lambda p, world: p.get("values") == "special")
    # x / n is right for sum alone
    check("to_partial_divided", lambda p: one_d(p) and p["src"] == "R"
          and p["dst"].startswith("P"),
          lambda p, world: p["dst"] in ("Pavg", "Pmin", "Pmax") and world > 1)
    # a bf16 reduction is exact on the integer values
    check("partial_in_bf16", lambda p: p["dtype"] == "f32" and "P" in p["src"],
          lambda p, world: p.get("values") == "random")
    floor = by["floor_chunks"]
    for r in floor:
        dst = _params(r["case_id"])["dst"]
        if "S" not in dst:  # nothing is chunked on the way to a replica or a partial
            assert r["status"] == "pass", r
        if r["world_size"] > 1 and _dtensor_uneven_1d_shard(r["case_id"]):
            assert r["status"] == "fail", r
    assert sum(r["status"] == "fail" for r in floor) >= 20
