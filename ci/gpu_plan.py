"""The order and time budgets of ci/gpu-validation.sh's steps (stdlib only: it runs before the
harness is known to work on a host).

    python3 ci/gpu_plan.py quick|full            # "STEP BUDGET_S" per line, in order
    python3 ci/gpu_plan.py quick|full --table    # the plan as the dry run prints it

A GPU host is rare and its time short, so a plan spends it on what is unproven first: steps
that rerun a fix no GPU has run yet (``rerun``), then steps no GPU run has finished
(``unfinished``), then the rest (``proven``). The quick plan takes them in that order while
their budgets fit ``QUICK_TOTAL_S``; ``summary`` always closes it. Each budget comes from the
recorded GPU timings (``measured``, docs/gpu-validation.md): a step that finished gets about
twice its time, one that was stopped what the plan can spare. Update ``state`` and
``measured`` after every GPU run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

#: the quick plan's wall-time ceiling, summary included (one 8-minute GPU call)
QUICK_TOTAL_S = 480
#: what `summary` gets at the end of any plan (ingest and print; it never needs a GPU)
SUMMARY_S = 15
STATES = ("rerun", "unfinished", "proven")


@dataclass(frozen=True)
class Step:
    name: str
    state: str
    budget_s: int
    measured: str  # what the last GPU run took, as recorded
    proves: str
    part_of: str = ""  # a narrower run of that step, for the quick plan alone


STEPS = [
    Step("check", "proven", 20, "5 s (H100)", "the host can run the harness at all; a "
         "blocker stops the plan"),
    # calibrate, smoke1 and controls1: rerun since the harness moved into layer subpackages
    # (the device layer split, the ranks reading their options from run.json), which no GPU
    # has run; smoke1 and rerun4 also hold every implementation to the process-settings
    # check on CUDA (the current device and stream among them: no built-in may change one),
    # to outputs of their own memory, dense or laid out as the reference's, to the same bits
    # for the same inputs (cuBLAS, NCCL and the kernels in shifted memory), and, where
    # timing is a token, to a second checked call on other values and a token call on the
    # case's values in the buffers the call before used.
    # The peaks smoke1's impossible-time check divides by, so they run before it
    Step("calibrate", "rerun", 15, "5-8 s (H200)", "copy and matmul peaks for % of peak"),
    # strided_copy.cu rewritten since (torch's elementwise scheme, 16-byte units, 32-bit
    # magic division, no stack frame): its GB/s against torch's is issue 44's open goal
    Step("speed", "rerun", 30, "6 s (H100, the previous kernel)", "strided_copy.cu bitwise "
         "against torch's copy on the nightly views, and its GB/s as a ratio to torch's "
         "(benchmarks/results/strided_copy_speed.json)"),
    Step("smoke1", "rerun", 90, "45-48 s (H100, every verdict check and the free-memory "
         "poison)", "every op on one GPU, with every verdict check"),
    Step("controls1", "rerun", 90, "59.5 s (H100)", "every negative control and the Triton "
         "kernels at 1 rank: none passing every case but those needing more ranks"),
    Step("stress", "unfinished", 150, "the three int8 cases, then stopped at 150 s before the "
         "2**31-element f32 case (H100)", "the int32 control failing, not erroring, "
         "past 2**31 elements"),
    Step("kernels", "unfinished", 110, "551 cases in 110 s, stopped (H100)",
         "the CUDA C++ kernels beside torch's at nightly sizes, 1 and 4 ranks"),
    Step("nightly1", "unfinished", 180, "936 of 3372 cases in 80 s, stopped (H100)",
         "real shapes at 1 rank"),
    Step("rerun1", "proven", 45, "22 s (H100)", "the FP8 quantizers bitwise, the _scaled_mm "
         "tolerance, the _StridedShard refusal on torch < 2.12 (1 rank)", "smoke1"),
    # collectives added since: every rank's replicated output compared bit for bit, min/max
    # specials and outputs that win the reduction, NaNs with payloads through gloo on CUDA
    Step("rerun4", "rerun", 45, "12 s for dtensor alone (H100)", "the collectives' "
         "replicated-output check, min/max specials and NaN payloads through gloo on CUDA; "
         "DTensor a skip, not a crash (4 ranks sharing the GPU)", "smoke48"),
    Step("tests-cuda", "proven", 70, "23 s (H100)", "inputs bit-identical on CPU and CUDA, "
         "CUDA event and graph timing tests", "tests"),
    Step("faults", "proven", 60, "32 s (H100)", "a faulting kernel costs its own case; "
         "--sanitize names it", "tests"),
    Step("smoke48", "proven", 100, "53 s (H100)", "every op at 4 and 8 ranks on one GPU "
         "(gloo, token timing)"),
    Step("env", "proven", 10, "5-8 s (H200)", "the facts the checks judged"),
    Step("timers", "proven", 30, "8-11 s (H100)", "event and graph times against the "
         "profiler's kernel time"),
    Step("graph", "proven", 35, "10-16 s (H200)", "CUDA-graph timing"),
    Step("tests", "unfinished", 400, "not finished in 150 s and 200 s (H200)",
         "the whole of the four GPU test files"),
]
BY_NAME = {s.name: s for s in STEPS}


def ordered() -> list[Step]:
    """Every step but summary, most unproven first (the listed order within a state), check
    first whatever its state: nothing after a blocker means anything."""
    return sorted(STEPS, key=lambda s: (s.name != "check", STATES.index(s.state)))


def plan(kind: str) -> list[tuple[str, int | None]]:
    """(step, budget in seconds) in running order. ``full``: every step, no budget (the
    script's STEP_TIMEOUT, if set, applies); ``quick``: the ordered steps that fit."""
    if kind == "full":
        return [(s.name, None) for s in ordered() if not s.part_of] + [("summary", None)]
    if kind != "quick":
        raise ValueError(f"unknown plan {kind!r}: use quick or full")
    left, chosen = QUICK_TOTAL_S - SUMMARY_S, []
    for s in ordered():
        if s.part_of in {name for name, _ in chosen}:
            continue  # its wider step already runs it
        if s.name == "check" or s.budget_s <= left:
            chosen.append((s.name, s.budget_s))
            left -= s.budget_s
    return chosen + [("summary", SUMMARY_S)]


def table(kind: str) -> str:
    rows = plan(kind)
    lines = [f"{kind} plan: {len(rows)} steps"
             + (f", {sum(b for _, b in rows)} s of {QUICK_TOTAL_S} s" if kind == "quick"
                else "")]
    for name, budget in rows:
        s = BY_NAME.get(name)
        state = s.state if s else "always"
        what = s.proves if s else "ingest stopped runs; counts, failures, headline figures"
        limit = f"{budget:>4} s" if budget is not None else "   - "
        lines.append(f"  {name:<11} {limit}  {state:<10} {what}")
    if kind == "quick":
        chosen = {n for n, _ in rows}
        left_out = [s.name for s in ordered()
                    if s.name not in chosen and s.part_of not in chosen]
        if left_out:
            lines.append(f"  not in this plan (over its {QUICK_TOTAL_S} s): "
                         + ", ".join(left_out))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("quick", "full") or argv[1:] not in ([], ["--table"]):
        print("usage: python3 ci/gpu_plan.py quick|full [--table]", file=sys.stderr)
        return 2
    if argv[1:] == ["--table"]:
        print(table(argv[0]))
    else:
        for name, budget in plan(argv[0]):
            print(name, budget if budget is not None else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
