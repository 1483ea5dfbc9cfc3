"""How much room the MoE FFN tolerances leave a legitimate implementation, and how far out the
negative controls land.

For a few FFN shapes (bf16 and FP8) it runs the reference, the ``torch`` implementation, the
``fused_epilogue`` variant (gate/up kept in float32: different rounding, still correct) and
the ``gate_up_swapped`` control, and prints per output the calc_diff and the worst
elementwise |diff| / (atol + rtol * |expected|), each as a multiple of the op's bound: below
1 passes. The fused variant's figures say how close legitimate arithmetic comes to a false
alarm; the control's how far out a real bug lands.

    python benchmarks/moe_tolerance_margins.py [--large]
"""

from __future__ import annotations

import argparse
import sys

import torch
from _figures import command, machine, record

from reference_kernels import fp8
from suites._moe import ffn

SHAPES = [(200, 256, 128, 8, 4), (2000, 1024, 512, 8, 4)]
LARGE = [(1000, 2048, 1024, 16, 8)]


def _row(name: str, got: torch.Tensor, expected: dict, tols: dict,
         margins: dict | None = None) -> str:
    """One printed line; ``margins`` ({output: {"calc_diff": x, "worst_element": y}}, each a
    multiple of its bound) takes the largest seen for this implementation."""
    cells = []
    for key, exp in expected.items():
        tol = tols[key]
        cd = fp8.calc_diff(got, exp)
        parts = tol.parts or (tol,)
        bound = next(p.bound for p in parts if p.kind == "cos_diff")
        text = f"{key}: calc_diff {cd:.2e} ({cd / bound:.3g}x its bound {bound:g})"
        seen = {"calc_diff": float(cd / bound)}
        if tol.elementwise is not None:
            rtol, atol = tol.elementwise.rtol, tol.elementwise.atol
            ratio = ((got.float() - exp.float()).abs() / (atol + rtol * exp.float().abs())).max()
            text += f", worst |diff| {ratio:.3g}x allclose({rtol:g}, {atol:g})"
            seen["worst_element"] = float(ratio)
        if margins is not None:
            top = margins.setdefault(key, {})
            for k, v in seen.items():
                top[k] = max(top.get(k, v), v)
        cells.append(text)
    return f"  {name:<16} " + "; ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="add a 10M-output shape (slow)")
    args = parser.parse_args()
    # {precision: {impl: {output: its largest multiples of the bound over the shapes}}}
    margins: dict[str, dict[str, dict]] = {}
    outputs = 0  # of the largest shape
    for tokens, hidden, inter, experts, topk in SHAPES + (LARGE if args.large else []):
        for precision in ("bf16", "fp8"):
            case = ffn._case(tokens, hidden, inter, experts, topk, 128, precision)
            expected = ffn.ffn_expected(case, 0, 1)
            tols = ffn.ffn_tolerance(case, 1)
            outputs = max(outputs, expected["out"].numel())
            print(f"{precision} tokens={tokens} hidden={hidden} inter={inter} "
                  f"experts={experts} topk={topk} ({expected['out'].numel()} outputs)")
            for name, impl in (("torch", ffn.ffn_torch),
                               ("fused_epilogue", ffn.ffn_fused_epilogue),
                               ("gate_up_swapped", ffn.ffn_gate_up_swapped)):
                got = impl(**ffn.ffn_inputs(case, 0, 1))
                print(_row(name, got, expected, tols,
                           margins.setdefault(precision, {}).setdefault(name, {})))
    fused = [margins[p]["fused_epilogue"]["out"].get("worst_element") for p in ("bf16", "fp8")]
    rounded = {p: {impl: {out: {k: round(v, 3) for k, v in m.items()}
                          for out, m in by_out.items()}
                   for impl, by_out in by_impl.items()}
               for p, by_impl in margins.items()}
    record("moe_tolerance_margins",
           figure="MoE expert FFN: the worst element of the legitimate fused_epilogue variant as "
                  "a multiple of its bound (< 1 passes), bf16 / FP8",
           value=" / ".join("-" if v is None else f"{v:.2f}" for v in fused),
           unit="x the bound", command=command(__file__, *sys.argv[1:]), machine=machine(),
           details={"outputs_largest_shape": outputs, **rounded})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
