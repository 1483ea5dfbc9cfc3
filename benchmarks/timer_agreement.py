"""Do the harness's CUDA timers agree with the profiler? One kernel, three clocks.

The kernel is the built-in CUDA C++ strided copy (compiled with NVRTC, launched through
cuda.core on torch's current stream), on a transposed bf16 view of --n x --n elements. It is
timed by ``harness.core.timing.time_call`` with CUDA events around eager calls, with events around
CUDA-graph replays, and by torch.profiler (the kernel's own device time, CUPTI). Prints one
line per clock with the median in microseconds, its ratio to the profiler's, and the copy's
GB/s (bytes read + written). Needs a CUDA GPU and NVRTC.

    python benchmarks/timer_agreement.py [--n 8192] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from types import SimpleNamespace

import torch
from _figures import command, machine, record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("timer_agreement: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2

    from harness.core.discovery import registry
    from harness.core.timing import TimingConfig, time_call

    device = torch.device("cuda", 0)
    impl = registry().specs["strided_copy"].implementations["cuda"]
    n = args.n
    storage = torch.randn(n * n, device=device).to(torch.bfloat16)
    out = torch.empty((n, n), dtype=torch.bfloat16, device=device)

    def call() -> None:
        impl(storage=storage, size=(n, n), stride=(1, n), offset=0, out=out)

    call()
    torch.cuda.synchronize()
    assert torch.equal(out, storage.view(n, n).T), "the kernel copied wrong"
    world = SimpleNamespace(device=device, backend=None)
    figures = {}
    for mode in ("events", "graph"):
        config = TimingConfig(warmup=5, min_repeats=args.repeats, max_repeats=args.repeats,
                              budget_s=0.0, mode=mode)
        stats = time_call(call, world, distributed=False, config=config)
        figures[f"harness {stats['mode']}"] = stats["median"] / 1e3

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.repeats):
            call()
        torch.cuda.synchronize()
    kernel_us = [e.device_time for e in prof.events()
                 if e.device_time > 0 and "strided_copy" in e.name]
    if not kernel_us:
        print("timer_agreement: the profiler saw no strided_copy kernel", file=sys.stderr)
        return 1
    figures["profiler (kernel)"] = statistics.median(kernel_us)

    ref = figures["profiler (kernel)"]
    nbytes = 2 * 2 * n * n
    print(f"# strided_copy.cu, transposed bf16 {n}x{n}, {args.repeats} repeats, "
          f"{torch.cuda.get_device_name(device)}")
    for name, us in figures.items():
        print(f"{name:20s} {us:10.2f} us  x{us / ref:6.3f}  {nbytes / us / 1e3:8.1f} GB/s")
    record("timer_agreement",
           figure=f"The harness's CUDA timers against the profiler's kernel time, strided_copy.cu "
                  f"on a transposed bf16 {n}x{n} view: events / graph replay",
           value=" / ".join(f"{figures[k] / ref:.3f}" for k in figures if k.startswith("harness")),
           unit="x the profiler's time", command=command(__file__, *sys.argv[1:]),
           machine=machine("cuda"),
           details={"us": {k: round(v, 2) for k, v in figures.items()},
                    "repeats": args.repeats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
