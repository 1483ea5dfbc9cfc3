"""What Triton's interpreter costs per case on the CPU: every built-in Triton implementation
against its op's torch implementation, on the op's smoke cases at world size 1, in this
process, each case through every check a run makes (no timing). Both run in the same process
one after the other, so the ratio holds on a noisy machine better than either time.

    python benchmarks/triton_interpreted_cost.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

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


def main() -> None:
    specs = registry().specs
    print(f"{'op':24} {'cases':>5} {'torch ms':>9} {'triton ms':>10} {'ratio':>6}")
    for op, (base, triton) in OPS.items():
        t_base, _ = per_case(specs[op], base)
        t_tri, n = per_case(specs[op], triton)
        print(f"{op:24} {n:5d} {t_base * 1e3:9.1f} {t_tri * 1e3:10.1f} {t_tri / t_base:6.1f}")


if __name__ == "__main__":
    main()
