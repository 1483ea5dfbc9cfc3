"""The precision lens sized on emulated float32 accumulation orders, and the double roundings
it must catch.

For the linear-family shapes of the smoke and nightly tiers (bf16 inputs, K from 1024 to
7168, with and without a residual) and for rmsnorm, each output is computed the ways a correct
GPU kernel may compute it: torch's float32 matmul, a sequential K loop, split-K with 2 to 16
float32 partials, 64-wide K tiles accumulated in turn, a pairwise tree; each then rounded once
to bf16. And the ways a wrong one does: the GEMM result rounded to bf16 before the residual
add, rmsnorm's normalised value rounded before the weight, a float32 output computed through
bf16. For each it prints the lens's two figures against the float64 value: the fraction of
elements that are not that value correctly rounded (``off``), and the largest distance in
bf16 ulps. The tolerance ``harness.core.compare.rounding`` uses (ROUNDING_OFF below) sits between
the correct orders' worst ``off`` and the double roundings' least. The distance is not
bounded by default: where a K = 4096 dot product nearly cancels, correct orders land up to
20 ulps of the small result away.

    python benchmarks/precision_lens.py [--quick]  # records benchmarks/results/precision_lens.json
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from _figures import command, machine, record

from harness.core import compare
from harness.core.inputs import generate
from harness.engine.case_setup import EXACT_OFF

BF16 = torch.bfloat16
F32 = torch.float32
SHAPES = [(4, 384, 1024), (3, 96, 1096), (2, 130, 1544), (16, 512, 4096), (16, 256, 7168)]
QUICK = SHAPES[:3]


def _inputs(b: int, n: int, k: int, seed: int):
    bound = math.sqrt(3.0 / k)  # unit-order outputs, as the Hopper suites scale their weights
    x = generate((b, k), BF16, seed=seed, dist="uniform", low=-1.0, high=1.0)
    w = generate((n, k), BF16, seed=seed + 1, dist="uniform", low=-bound, high=bound)
    r = generate((b, n), BF16, seed=seed + 2, dist="uniform", low=-1.0, high=1.0)
    return x, w, r


def _sequential(x32: torch.Tensor, w32: torch.Tensor, step: int = 1) -> torch.Tensor:
    acc = torch.zeros(x32.shape[0], w32.shape[0], dtype=F32)
    for s in range(0, x32.shape[1], step):
        acc = acc + x32[:, s : s + step] @ w32[:, s : s + step].T
    return acc


def _split_k(x32: torch.Tensor, w32: torch.Tensor, splits: int) -> torch.Tensor:
    parts = [xp @ wp.T for xp, wp in zip(x32.chunk(splits, 1), w32.chunk(splits, 1), strict=True)]
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def _pairwise(x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    terms = [x32[:, i : i + 1] * w32[:, i].unsqueeze(0) for i in range(x32.shape[1])]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def gemm_orders(x32: torch.Tensor, w32: torch.Tensor, quick: bool) -> dict[str, torch.Tensor]:
    """float32 results of x @ w.T in the orders correct kernels use."""
    orders = {"torch matmul": x32 @ w32.T, "64-wide K tiles": _sequential(x32, w32, 64),
              **{f"split-K {s}": _split_k(x32, w32, s) for s in (2, 4, 8, 16)}}
    if not quick:
        orders["sequential K"] = _sequential(x32, w32, 1)
        orders["pairwise tree"] = _pairwise(x32, w32)
    return orders


def lens(actual: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(off fraction, max ulps) of ``actual`` against the float64 ``exact``, as the check
    measures them."""
    m = compare.measure(actual, exact, compare.rounding(1.0, ulps=10**9))
    return m.n_mismatch / m.numel, m.max_ulp


def measure(quick: bool) -> dict:
    rows = []
    for b, n, k in QUICK if quick else SHAPES:
        x, w, r = _inputs(b, n, k, seed=1000 + k)
        x32, w32, r32 = x.float(), w.float(), r.float()
        exact = x.double() @ w.double().T
        exact_res = exact + r.double()
        for name, acc in gemm_orders(x32, w32, quick).items():
            rows.append({"op": "linear", "shape": [b, n, k], "variant": name, "correct": True,
                         **dict(zip(("off", "max_ulp"), lens(acc.to(BF16), exact), strict=True))})
            rows.append({"op": "linear_with_residual", "shape": [b, n, k], "variant": name,
                         "correct": True, **dict(zip(("off", "max_ulp"),
                                                      lens((acc + r32).to(BF16), exact_res),
                                                      strict=True))})
        acc = x32 @ w32.T
        twice = (acc.to(BF16).float() + r32).to(BF16)
        rows.append({"op": "linear_with_residual", "shape": [b, n, k], "correct": False,
                     "variant": "GEMM rounded to bf16 before the residual add",
                     **dict(zip(("off", "max_ulp"), lens(twice, exact_res), strict=True))})
        through = acc.to(BF16).to(F32)
        m = compare.measure(through, exact, compare.rounding(1.0))
        rows.append({"op": "linear (float32 out)", "shape": [b, n, k], "correct": False,
                     "variant": "float32 output computed through bf16",
                     "off": m.n_mismatch / m.numel, "max_ulp": None})
        m = compare.measure(acc, exact, compare.rounding(1.0))
        rows.append({"op": "linear (float32 out)", "shape": [b, n, k], "correct": True,
                     "variant": "torch matmul", "off": m.n_mismatch / m.numel, "max_ulp": None})
    for b, h in ((4, 768), (16, 4096), (16, 7168)):
        x = generate((b, h), BF16, seed=h, dist="uniform", low=-2.0, high=2.0)
        wt = generate((h,), BF16, seed=h + 1, dist="uniform", low=0.5, high=1.5)
        x64 = x.double()
        exact = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * wt.double()
        x32 = x.float()
        scale = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
        once = (x32 * scale * wt.float()).to(BF16)
        twice = (x32 * scale).to(BF16).float().mul(wt.float()).to(BF16)
        for variant, got, ok in (("float32, one rounding", once, True),
                                 ("normalised value rounded before the weight", twice, False)):
            rows.append({"op": "rmsnorm", "shape": [b, h], "variant": variant, "correct": ok,
                         **dict(zip(("off", "max_ulp"), lens(got, exact), strict=True))})
    correct = [r["off"] for r in rows if r["correct"]]
    wrong = [r["off"] for r in rows if not r["correct"]]
    return {"rows": rows, "worst_correct_off": max(correct), "least_wrong_off": min(wrong),
            "worst_correct_ulp": max(r["max_ulp"] for r in rows
                                     if r["correct"] and r["max_ulp"] is not None),
            "rounding_off": ROUNDING_OFF, "quick": quick}


#: the lens's default bound on the share of elements not rounded once (harness.engine.runner)
ROUNDING_OFF = EXACT_OFF


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three small shapes, fewer orders")
    args = parser.parse_args()
    result = measure(args.quick)
    for r in result["rows"]:
        ulp = "-" if r["max_ulp"] is None else f"{r['max_ulp']:.3g}"
        print(f"{'ok ' if r['correct'] else 'BUG'} {r['op']:<22} {str(r['shape']):<18} "
              f"{r['variant']:<46} off {r['off']:.4f}  max ulp {ulp}")
    print(f"worst correct off {result['worst_correct_off']:.4f} "
          f"(max {result['worst_correct_ulp']:.3g} ulp), "
          f"least wrong off {result['least_wrong_off']:.4f}; bound {ROUNDING_OFF}")
    if not args.quick:
        # the double roundings of a bf16 output (a float32 output through bf16 is off at 100%)
        twice = [r["off"] for r in result["rows"]
                 if not r["correct"] and r["op"] != "linear (float32 out)"]
        record("precision_lens",
               figure="Precision lens: bf16 elements not the float64 value rounded once, correct "
                      "float32 orders (worst) / a second rounding",
               value=f"{100 * result['worst_correct_off']:.2f} / {100 * min(twice):.0f} to "
                     f"{100 * max(twice):.0f}",
               unit="% of elements", command=command(__file__, *sys.argv[1:]),
               machine=machine(), details=result, headline=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
