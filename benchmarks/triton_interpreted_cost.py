"""What Triton's interpreter costs per case on the CPU: every built-in Triton implementation
against its op's torch implementation, on the op's smoke cases at world size 1, in this
process, each case through every check a run makes (no timing). Both run in the same process
one after the other, so the ratio holds on a noisy machine better than either time.

    python benchmarks/triton_interpreted_cost.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from _figures import command, machine, record  # noqa: E402

from harness.core.discovery import registry  # noqa: E402
from harness.engine.local import run_cases  # noqa: E402

OPS = {"hopper_tasks.rmsnorm": ("torch", "triton"), "hopper_tasks.silu_mul": ("torch", "triton"),
       "hopper_tasks.embedding": ("torch", "triton"), "hopper_tasks.argmax": ("torch", "triton"),
       "fp8_gemm.quantize": ("torch", "triton"), "moe.permute": ("torch", "triton"),
       "strided_copy": ("torch", "triton"), "allreduce": ("tile", "tile_triton")}


def per_case(spec, impl: str) -> tuple[float, int]:
    first: list[int] = []
    # warm on one case: the imports and the interpreter's set-up are paid once per process
    run_cases(spec, impl, keep=lambda c: not first and not first.append(1))
    t0 = time.perf_counter()
    results = run_cases(spec, impl)
    ran = [r for r in results if r.status == "pass"]
    assert len(ran) == len([r for r in results if r.status != "skip"]), results
    return (time.perf_counter() - t0) / max(len(ran), 1), len(ran)


def _ratio(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def main() -> None:
    specs = registry().specs
    print(f"{'op':24} {'cases':>5} {'torch ms':>9} {'triton ms':>10} {'ratio':>6}")
    per_op = {}
    for op, (base, triton) in OPS.items():
        t_base, _ = per_case(specs[op], base)
        t_tri, n = per_case(specs[op], triton)
        print(f"{op:24} {n:5d} {t_base * 1e3:9.1f} {t_tri * 1e3:10.1f} {t_tri / t_base:6.1f}")
        per_op[op if base == "torch" else f"{op} ({base} / {triton})"] = {
            "torch": round(t_base * 1e3, 1), "triton": round(t_tri * 1e3, 1),
            "ratio": round(t_tri / t_base, 1), "cases": n}
    ratios = [r["ratio"] for r in per_op.values()]
    record("triton_interpreted_cost",
           figure="Triton's interpreter on the CPU: time per smoke case of each built-in Triton "
                  "implementation against the op's torch one, every check, no timing",
           value=f"{_ratio(min(ratios))} to {_ratio(max(ratios))}",
           unit="x torch's time per case", command=command(__file__, *sys.argv[1:]),
           machine=machine(), details={"per_op_ms": per_op})


if __name__ == "__main__":
    main()
