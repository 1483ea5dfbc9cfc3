"""The verdict every rank agrees on: each rank's metrics (and its outputs against the golden)
gathered on rank 0, merged and judged there, and the verdict broadcast, so that all ranks
pass or fail a case together; the first check that fails decides, named in the reason."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core import compare
from harness.core.golden import GoldenError, GoldenShelf, GoldenStore, check_output
from harness.core.metrics import Metrics
from harness.core.spec import Case, OpSpec
from harness.device.memory import NOT_MEASURED
from harness.device.runtime import World
from harness.engine.case_setup import EXACT_SUFFIX

#: the words that open a failure found at each stage (one wording per stage, whatever failed)
STAGE_PREFIX = {
    "call": "",
    "shifted": "with the inputs moved to fresh shifted memory and the old buffers poisoned: ",
    "misaligned": ("on inputs off 16-byte alignment (a vectorised kernel's path for "
                   "unaligned inputs?): "),
    "padded": ("on the same values with the read-only inputs as rows of wider buffers, in "
               "fresh shifted memory (a kernel that reads an input as dense rows, ignoring "
               "its strides, or from its storage's start, ignoring its offset?): "),
    "other_values": "on other input values (a result kept by shape or by call count?): ",
    "shifted_other_values": ("on other input values in fresh shifted memory, the old buffers "
                             "poisoned (a result kept by shape or by call count?): "),
    "after_timing": "after the timed repeats (on shifted buffer copies): ",
    "near_values": ("on the timed values with a few elements of each input changed, in buffers "
                    "an earlier call used (a result kept by a sample of the inputs, a "
                    "fingerprint?): "),
    "reused_buffers": ("on new input values written into buffers an earlier call used "
                       "(a result cached by buffer or by call?): "),
    "settled": ("its outputs changed after the call returned (work left running on another "
                "thread or stream, outside the timed interval): "),
}


def agree(world: World, local: Any, judge: Callable[[list[Any]], Any]) -> Any:
    """Every rank's ``local`` judged on rank 0, the verdict broadcast so all ranks agree."""
    gathered = world.comm.gather(local, root=0) if world.size > 1 else [local]
    verdict = judge(gathered) if world.rank == 0 else None
    if world.size > 1:
        verdict = world.comm.bcast(verdict, root=0)
    assert verdict is not None
    return verdict


@dataclass
class RankNotes:
    """What one rank adds to a verdict's exchange besides its error and metrics."""

    #: each replicated output's hash (``OpSpec.replicated``)
    replicas: dict[str, str] = field(default_factory=dict)
    #: the process-wide settings the implementation changed, put back (``process_state``)
    changed: list[str] = field(default_factory=list)
    #: this rank's process changed a setting its threads keep (``process_state.tainted``)
    tainted: bool = False
    #: the calls' peak memory and how it was measured
    peak: int | None = None
    peak_kind: str = NOT_MEASURED
    #: the hash of the first call's outputs ("" if it made none)
    digest: str = ""
    #: which calls on the same inputs gave other bits (``OpSpec.deterministic``), or ""
    repeat: str = ""


@dataclass
class Verdict:
    """What every rank agrees on after the exchange."""

    status: str
    reason: str
    outputs: dict[str, Any]
    wrong: int
    #: the largest peak over the ranks (None: some rank could not measure it)
    peak: int | None = None
    peak_kind: str = NOT_MEASURED
    #: some rank's process is tainted: the job ends after this case
    tainted: bool = False
    #: the ranks' output hashes, in rank order, hashed (a verdict on the numbers only)
    output_hash: str | None = None


def gather_verdict(world: World, case: Case, local_error: str,
                   stages: dict[str, dict[str, Any]], notes: RankNotes | None = None
                   ) -> Verdict:
    """Every rank's error and metrics judged as one, in one exchange with each rank's
    ``notes``: a case that passes fails where a rank holds other bits of a replicated output
    than rank 0, or where an implementation changed a process-wide setting on some rank."""
    def judge(gathered: list[tuple[str, dict[str, Any], RankNotes]]) -> Verdict:
        status, reason, outputs, wrong = _judge([(e, s) for e, s, _ in gathered], case)
        every = [n for _, _, n in gathered]
        differ = _judge_replicas([n.replicas for n in every], case) if status == "pass" else ""
        if differ:
            status, reason = "fail", differ
        repeat = _said_by_rank([[n.repeat] if n.repeat else [] for n in every])
        if status == "pass" and repeat:
            status, reason = "fail", (f"not deterministic: {repeat} (the op's results are "
                                      "the same bits on the same inputs, and its history "
                                      "flags changed bits: a sum in whatever order atomics "
                                      "land, within tolerance each time, still fails here)")
        tainted = any(n.tainted for n in every)
        leaked = _said_by_rank([n.changed for n in every])
        if leaked:
            why = (f"it changed process-wide settings that the reference and every "
                   f"later case would run under ({leaked}); restored")
            if tainted:
                why += (", but threads started meanwhile keep their own copy: the job ended "
                        "after this case and its remaining cases ran in a new one")
            status, reason = ("fail", why) if status == "pass" else (status, f"{reason}; {why}")
        peaks = [n.peak for n in every]
        peak = None if any(p is None for p in peaks) else max(peaks)  # type: ignore[type-var]
        digest = (hashlib.sha256("".join(n.digest for n in every).encode()).hexdigest()
                  if status in ("pass", "fail") and every[0].digest else None)
        return Verdict(status, reason, outputs, wrong, peak,
                       every[0].peak_kind if peak is not None else NOT_MEASURED, tainted,
                       digest)

    return agree(world, (local_error, stages, notes or RankNotes()), judge)


def _said_by_rank(changes: list[list[str]]) -> str:
    """The ranks' changes in one line, ranks with the same ones together ("" if none)."""
    by_change: dict[str, list[int]] = {}
    for rank, theirs in enumerate(changes):
        if theirs:
            by_change.setdefault("; ".join(theirs), []).append(rank)
    return "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: "
                     f"{change}" for change, ranks in by_change.items())


def _judge_replicas(per_rank: list[dict[str, str]], case: Case) -> str:
    """Why a replicated output differs between ranks ("" if it does not)."""
    for name in case.spec.replicated:
        differ = [r for r, h in enumerate(per_rank) if h.get(name) != per_rank[0].get(name)]
        if differ:
            ranks = ", ".join(map(str, differ))
            return (f"{name}: rank{'s' if len(differ) > 1 else ''} {ranks} of "
                    f"{len(per_rank)} hold other bits than rank 0 (each within tolerance, "
                    f"maybe): every rank must receive the same result")
    return ""


def golden_check(store: GoldenStore | GoldenShelf, case: Case,
                 outputs: Mapping[str, torch.Tensor], tols: Mapping[str, compare.Tolerance],
                 rank: int, magnitudes: Mapping[str, torch.Tensor] | None = None
                 ) -> dict[str, Any]:
    """This rank's outputs against the stored golden: {"file", "outputs"}, {"error"} or
    {"absent"} when the case has no golden."""
    try:
        if isinstance(store, GoldenShelf):
            store = store.for_op(case.spec.name)
        if store.entry(case.id, case.world_size) is None:
            lost = store.lost_entry(case.id, case.world_size)
            return {"error": lost} if lost else {"absent": True}
        path, stored = store.load(case.id, case.world_size, rank)
    except GoldenError as exc:
        return {"error": str(exc)}
    tols = {k: t for k, t in tols.items() if not k.endswith(EXACT_SUFFIX)}  # not stored
    if set(stored) != set(tols):
        return {"error": f"golden {path} holds outputs {sorted(stored)} but the op produces "
                         f"{sorted(tols)}: regenerate it with `harness golden generate --accept`"}
    report = {}
    for name, value in stored.items():
        actual = outputs.get(name.split(":")[0])
        if not isinstance(actual, torch.Tensor):
            return {"error": f"output {name!r} is missing, but golden {path} has it"}
        report[name] = check_output(actual, value, tols[name], rank,
                                    (magnitudes or {}).get(name)).to_dict()
    return {"file": str(path), "outputs": report}


def judge_golden(gathered: list[dict[str, Any] | None]
                 ) -> tuple[dict[str, Any] | None, str, str]:
    """Every rank's golden report merged into (summary, status, reason)."""
    if all(g is None for g in gathered):  # the case broke before its outputs existed
        return None, "pass", ""
    for rank, g in enumerate(gathered):
        if g is not None and "error" in g:
            return {"status": "error", "reason": g["error"]}, "error", f"rank {rank}: {g['error']}"
    if any(g is not None and g.get("absent") for g in gathered):
        return {"status": "absent"}, "pass", ""
    reports = [g for g in gathered if g is not None]
    outputs: dict[str, Any] = {}
    failed: list[str] = []
    for name in reports[0]["outputs"]:
        parts = [r["outputs"][name] for r in reports]
        tol_dict = parts[0]["tolerance"]
        merged = Metrics.merge([Metrics.from_dict(p["metrics"]) for p in parts])
        ok, why = compare.verdict(merged, compare.Tolerance.from_dict(tol_dict))
        sums = next((f"rank {r}: {p['sums_error']}" for r, p in enumerate(parts)
                     if p["sums_error"]), "")
        if ok and sums:
            ok, why = False, sums
        outputs[name] = {"kind": parts[0]["kind"], "metrics": merged.to_dict(),
                         "tolerance": tol_dict, "passed": ok}
        if not ok:
            failed.append(f"{name}: {why}")
    status = "fail" if failed else "pass"
    summary = {"status": status, "file": reports[0]["file"], "outputs": outputs}
    reason = f"against the golden {reports[0]['file']}: " + "; ".join(failed) if failed else ""
    return summary, status, reason


def _judge(gathered: list[tuple[str, dict[str, Any]]], case: Case
           ) -> tuple[str, str, dict[str, Any], int]:
    """Merge every rank's metrics into (status, reason, outputs, #wrong): the first stage that
    fails decides, else the last stage's metrics are reported."""
    errors = [(r, e) for r, (e, _) in enumerate(gathered) if e]
    if errors:
        rank, msg = errors[0]
        more = f" (and {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
        return "error", f"rank {rank}: {msg}{more}", {}, 0
    verdict: tuple[str, str, dict[str, Any], int] = ("pass", "", {}, 0)
    for stage in gathered[0][1]:
        verdict = _judge_stage([stages[stage] for _, stages in gathered], stage, case.spec)
        if verdict[0] != "pass":
            break
    return verdict


def fails_here(stages: dict[str, dict[str, Any]], spec: OpSpec) -> bool:
    """Whether a stage measured on this rank fails on its own: the case's verdict is found,
    and a further check would only change its words."""
    return any(_judge_stage([m], stage, spec)[0] != "pass" for stage, m in stages.items())


def _judge_stage(per_rank: list[dict[str, Any]], stage: str, spec: OpSpec
                 ) -> tuple[str, str, dict[str, Any], int]:
    outputs: dict[str, Any] = {}
    failed: list[tuple[str, str]] = []  # (output, why), in pipeline order
    wrong = 0
    order = {name: i for i, name in enumerate(spec.outputs)}
    for name in sorted(per_rank[0], key=lambda n: order.get(n.split(":")[0], len(order))):
        tol_dict = per_rank[0][name]["tolerance"]
        tol = compare.Tolerance.from_dict(tol_dict)
        merged = Metrics.merge(
            [Metrics.from_dict(m[name]["metrics"]) for m in per_rank])
        ok, why = compare.verdict(merged, tol)
        wrong += merged.n_mismatch
        outputs[name] = {"metrics": merged.to_dict(), "tolerance": tol_dict, "passed": ok}
        if not ok:
            failed.append((name, why))
    if not failed:
        return "pass", "", outputs, wrong
    text = "; ".join(f"{name}: {why}" for name, why in failed)
    if spec.pipeline:
        (first, why), later = failed[0], [name for name, _ in failed[1:]]
        text = f"first divergence at stage {first!r}: {why}"
        if later:
            text += f"; later stages diverging too: {', '.join(later)}"
    return "fail", STAGE_PREFIX.get(stage, "") + text, outputs, wrong
