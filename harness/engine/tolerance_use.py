"""How much of each tolerance an implementation uses, and how far out each control lands.

For every case of an op (world size 1, in this process) and every output, each part of the
output's tolerance gets a *use*: the measured metric as a share of what the part allows, so
1 is the edge, below passes and above fails. allclose: the worst element's |a-e| / (atol +
rtol*|e|); ulp: the largest ulp distance / n; cos_diff and rel_l2: the metric / its bound;
exact: 0 when bitwise equal, else infinite. A tolerance is well sized when the correct
implementations stay well below 1 and every control lands well above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.spec import OpSpec
from harness.engine.local import run_cases


@dataclass
class Use:
    """One tolerance part on one output of one case, for one implementation."""

    case_id: str
    impl: str
    control: bool
    output: str
    part: str  # the part's text: "allclose(rtol=0.016, atol=1e-05)", "cos_diff<=1e-05"
    use: float  # 1 is the edge
    status: str  # the case's verdict as a run gives it


def part_uses(tolerance: Mapping[str, Any], metrics: Mapping[str, Any]
              ) -> list[tuple[str, float]]:
    """(part text, use) for each part of a stored tolerance (``Tolerance.to_dict``) given the
    output's metrics (``Metrics.to_dict``)."""
    kind = tolerance["kind"]
    if kind == "all_of":
        return [u for part in tolerance["parts"] for u in part_uses(part, metrics)]
    if metrics.get("shape_error"):
        return [(tolerance["text"], math.inf)]
    if kind in ("exact", "rounded_near"):
        return [(tolerance["text"] if kind == "rounded_near" else "exact",
                 0.0 if metrics["n_mismatch"] == 0 else math.inf)]
    if kind == "allclose":
        special = metrics.get("n_bad_special", 0)
        return [(tolerance["text"], math.inf if special else float(metrics["max_tol_ratio"]))]
    if kind == "ulp":
        return [(tolerance["text"], float(metrics["max_ulp"]) / max(tolerance["ulps"], 1))]
    if kind == "rounding":  # the share of elements not rounded once, of the share allowed
        off = metrics["n_mismatch"] / max(metrics["numel"], 1)
        allowed = float(tolerance["max_mismatch_frac"])
        return [(tolerance["text"], off / allowed if allowed else (0.0 if off == 0 else math.inf))]
    bound = float(tolerance["bound"])
    value = float(metrics[kind])
    return [(tolerance["text"], value / bound if bound else (0.0 if value == 0 else math.inf))]


def measure(spec: OpSpec, impls: Sequence[str | Callable[..., Any]], tier: str = "smoke",
            keep: Callable[[Any], bool] = lambda case: True) -> list[Use]:
    """The use of every tolerance part, for every implementation on every case at world size
    1, in this process."""
    return uses(spec, [r for impl in impls for r in run_cases(spec, impl, tier, keep)])


def uses(spec: OpSpec, results: Sequence[Any]) -> list[Use]:
    """The use of every tolerance part in run results (``CaseResult``: this process's, or a
    launched run's at several ranks, where each output's metrics are merged over ranks)."""
    rows: list[Use] = []
    for r in results:
        control = r.impl in spec.negative_controls
        label = r.case_id if getattr(r, "world_size", 1) == 1 else f"w{r.world_size}:{r.case_id}"
        if not r.outputs:  # raised, or broke a contract: no metrics, it did not pass
            rows.append(Use(label, r.impl, control, "-", r.reason.split("\n")[0][:80],
                            math.inf, r.status))
            continue
        for name, out in r.outputs.items():
            for part, use in part_uses(out["tolerance"], out["metrics"]):
                rows.append(Use(label, r.impl, control, name, part, use, r.status))
    return rows


@dataclass
class Worst:
    """The furthest one implementation went on one tolerance part, over every case."""

    impl: str
    control: bool
    output: str
    part: str
    use: float
    case_id: str


def worst_uses(rows: Sequence[Use]) -> list[Worst]:
    """Per correct implementation and (output, part): the most it used. Per control: the
    furthest it reached on any output and part (a control need fail one output of one case;
    each control catches its own bug, so its reach on other outputs says nothing)."""
    out: dict[tuple[str, str, str], Worst] = {}
    for r in rows:
        if r.output == "-" and not r.control:
            continue
        key = (r.impl, "", "") if r.control else (r.impl, r.output, r.part)
        best = out.get(key)
        if best is None or r.use > best.use:
            out[key] = Worst(r.impl, r.control, r.output, r.part, r.use, r.case_id)
    return list(out.values())


def controls_caught(rows: Sequence[Use]) -> dict[str, bool]:
    """Whether each control failed at least one case (by the run's own verdict; a case not
    run catches nothing)."""
    caught: dict[str, bool] = {}
    for r in rows:
        if r.control:
            caught[r.impl] = caught.get(r.impl, False) or r.status not in ("pass", "skip")
    return caught
