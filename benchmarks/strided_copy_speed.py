"""The built-in strided copy (suites/_cuda/strided_copy.cu) against torch's own copy, on the
nightly tier's views: bytes per second as a ratio to torch's, timed alike (CUDA-graph replay
through harness.core.timing, so neither side's Python launch cost counts), the two interleaved
in rounds on the same buffers. Needs a CUDA GPU and NVRTC.

    python benchmarks/strided_copy_speed.py [--rounds 3] [--json PATH]

Prints one line per view (both times, GB/s read + written, the ratio ours / torch's speed) and
the median ratio per view kind, and records them as a figure (benchmarks/_figures.py) in PATH
(default benchmarks/results/strided_copy_speed.json). The goal: >= 0.9 on the contiguous and
transposed views.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _figures import command, machine, record  # noqa: E402


def measure_view(p: dict, impls: dict, world, config, rounds: int) -> dict | None:
    """One nightly view: both copies checked bitwise, then timed in interleaved rounds. None
    when ours copied wrong (said on stderr)."""
    from harness.core.inputs import dtype_from_name
    from harness.core.timing import time_call
    from suites._cuda.strided_copy import plan
    from suites.strided_copy import _storage_len

    device = world.device
    dtype = dtype_from_name(p["dtype"])
    n = _storage_len(p)
    # values do not change a copy's speed: random bytes, made on the GPU (0 or 1 for
    # bool, whose other bytes torch's copy would turn into 1)
    high = 2 if dtype == torch.bool else 256
    storage = torch.randint(0, high, (n * dtype.itemsize,), dtype=torch.uint8,
                            device=device).view(dtype)
    size, stride = tuple(p["size"]), tuple(p["stride"])
    outs = {k: torch.empty(size, dtype=dtype, device=device) for k in impls}
    calls = {k: functools.partial(f, storage=storage, size=size, stride=stride,
                                  offset=p["offset"], out=outs[k])
             for k, f in impls.items()}
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    if not torch.equal(outs["cuda"].view(raw), outs["torch"].view(raw)):
        print(f"strided_copy_speed: {p['view']} {p['dtype']}: the kernel copied wrong",
              file=sys.stderr)
        return None
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for k, call in calls.items():
            times[k].append(time_call(call, world, distributed=False,
                                      config=config)["median"] / 1e3)
    us = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * math.prod(size) * dtype.itemsize
    entry = plan(size, stride, p["offset"], dtype.itemsize, src_addr=storage.data_ptr(),
                 out_addr=outs["cuda"].data_ptr()).kernel
    row = {"view": p["view"], "dtype": p["dtype"], "size": list(size), "kernel": entry,
           "us": us, "gbps": {k: nbytes / v / 1e3 for k, v in us.items()},
           "ratio": us["torch"] / us["cuda"]}
    print(f"{p['view']:>14} {p['dtype']:>4} {str(size):>18}  cuda {us['cuda']:9.1f} us "
          f"{row['gbps']['cuda']:7.0f} GB/s  torch {us['torch']:9.1f} us "
          f"{row['gbps']['torch']:7.0f} GB/s  x{row['ratio']:.2f}  {entry}")
    del storage, outs, calls
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path,
                        help="where the figure goes (default "
                             "benchmarks/results/strided_copy_speed.json)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("strided_copy_speed: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2

    from harness.core.discovery import registry
    from harness.core.timing import TimingConfig

    device = torch.device("cuda", 0)
    spec = registry().specs["strided_copy"]
    impls = {"cuda": spec.implementations["cuda"], "torch": spec.implementations["torch"]}
    world = SimpleNamespace(device=device, backend=None)
    config = TimingConfig(warmup=3, min_repeats=args.repeats, max_repeats=args.repeats,
                          budget_s=0.0, mode="graph")
    rows = []
    for p in spec.grid["nightly"]:
        row = measure_view(p, impls, world, config, args.rounds)
        if row is None:
            return 1
        rows.append(row)
    kinds = sorted({r["view"] for r in rows})
    by_kind = {k: statistics.median(r["ratio"] for r in rows if r["view"] == k) for k in kinds}
    print("# median ratio (our GB/s / torch's) by view kind:")
    for k, v in by_kind.items():
        print(f"  {k:>14} x{v:.2f}")
    overall = statistics.median(r["ratio"] for r in rows)
    print(f"  {'all':>14} x{overall:.2f} over {len(rows)} views")
    record("strided_copy_speed",
           figure=f"strided_copy@cuda against torch's copy on the nightly tier's {len(rows)} "
                  "views, bitwise: GB/s ratio (CUDA-graph replay), median",
           value=round(overall, 2), unit="x torch's GB/s",
           command=command(__file__, *sys.argv[1:]), machine=machine("cuda"), headline=True,
           details={"goal": "at least 0.9x on the contiguous and transposed views",
                    "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                    "timing": "CUDA-graph replay, median of rounds", "rounds": args.rounds,
                    "median_ratio_by_kind": by_kind, "median_ratio": overall, "views": rows},
           out=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
