"""Collective results laid out as nccl-tests prints them.

One block per (op, world size, implementation); one line per message size and variant, with
out-of-place and in-place results side by side (time, algbw, busbw, #wrong, plus the peak
memory of the call), and the block's average bus bandwidth at the end::

    # allreduce  world size 4  impl torch
    #                                            out-of-place                       in-place
    #       size      count  type redop root   time  algbw  busbw #wrong peak  time ...
    #        (B) (elements)                    (us) (GB/s) (GB/s)       (MB)  (us) ...
            4124       1031   f32   sum    -  812.3  0.005  0.008      0 0.01 790.2 ...
    # Avg bus bandwidth    : 0.0079 GB/s
    # Wrong elements       : 0 OK

#wrong is the number of elements outside tolerance summed over ranks (nccl-tests' #wrong);
a case that did not finish shows its status (error, timeout, crash) there instead. A time
marked ``~`` was taken while ranks contended for CPUs or a GPU, ``*`` is launch-bound, ``i``
is an interpreter's (Triton kernels on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.core.results import CaseResult
from harness.core.spec import Work, format_value

#: parameters with a column of their own; the others make up the line's variant
_COLUMNS = ("n", "dtype", "op", "root", "inplace")


def _side(r: CaseResult | None) -> list[str]:
    """time, algbw, busbw, #wrong, peak of one result (or dashes)."""
    if r is None:
        return ["-"] * 5
    median = (r.timing or {}).get("median")
    time_us = f"{median / 1e3:.1f}{r.time_marks}" if median else "-"
    algbw = r.derived.get("gbps")
    busbw = r.derived.get("busbw_gbps")
    wrong = str(r.wrong) if r.status in ("pass", "fail") else r.status
    peak = f"{r.peak_memory_bytes / 1e6:.2f}" if r.peak_memory_bytes is not None else "n/m"
    return [time_us, f"{algbw:.3f}" if algbw is not None else "-",
            f"{busbw:.3f}" if busbw is not None else "-", wrong, peak]


def _variant(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={format_value(params[k])}" for k in sorted(params) if k not in _COLUMNS)


def format_blocks(results: Iterable[CaseResult],
                  work: Callable[[str, Mapping[str, Any], int], Work | None]) -> str:
    """The nccl-tests text of ``results`` (collectives whose params have a count ``n``).

    ``work(op, params, world_size)`` gives the op's work model, whose ``bytes`` (the algbw
    numerator) is the size column, as in nccl-tests.
    """
    blocks: dict[tuple[str, int, str], dict[tuple[Any, ...], dict[bool, CaseResult]]] = {}
    for r in results:
        if "n" not in r.params:
            continue
        line_params = {k: v for k, v in r.params.items() if k != "inplace"}
        line_key = (_variant(line_params), str(r.params.get("dtype", "")),
                    str(r.params.get("op", "")), str(r.params.get("root", "")),
                    int(r.params["n"]), tuple(sorted(line_params.items())))
        block = blocks.setdefault((r.op, r.world_size, r.impl), {})
        block.setdefault(line_key, {})[bool(r.params.get("inplace", False))] = r
    widths = [12, 11, 5, 6, 5] + [10, 8, 8, 7, 7] * 2 + [0]
    out: list[str] = []

    def row(cells: list[str]) -> str:
        return " ".join(c.rjust(w) if w else c for c, w in zip(cells, widths, strict=True))

    for (op, world, impl), lines in sorted(blocks.items()):
        out.append(f"# {op}  world size {world}  impl {impl}")
        out.append("#" + " " * 47 + "out-of-place".center(44) + " " + "in-place".center(44))
        out.append("#" + row(["size", "count", "type", "redop", "root"]
                             + ["time", "algbw", "busbw", "#wrong", "peak"] * 2 + ["variant"])[1:])
        out.append("#" + row(["(B)", "(elements)", "", "", ""]
                             + ["(us)", "(GB/s)", "(GB/s)", "", "(MB)"] * 2 + [""])[1:])
        busbws: list[float] = []
        wrong_total, all_ok = 0, True
        for key in sorted(lines):
            sides = lines[key]
            first = sides.get(False) or sides[True]
            w = work(op, first.params, world)
            size = f"{w.bytes:.0f}" if w is not None and w.bytes is not None else "-"
            redop = str(first.params.get("op", "-"))
            root = str(first.params.get("root", "-"))
            out.append(row([size, str(first.params["n"]), str(first.params.get("dtype", "-")),
                            redop, root] + _side(sides.get(False)) + _side(sides.get(True))
                           + [_variant(first.params)]))
            for r in sides.values():
                wrong_total += r.wrong
                all_ok = all_ok and r.status == "pass"
                if r.derived.get("busbw_gbps") is not None:
                    busbws.append(r.derived["busbw_gbps"])
        avg = f"{sum(busbws) / len(busbws):.4g} GB/s" if busbws else "- (not timed)"
        out.append(f"# Avg bus bandwidth    : {avg}")
        out.append(f"# Wrong elements       : {wrong_total} {'OK' if all_ok else 'FAILED'}")
        out.append("")
    return "\n".join(out)
