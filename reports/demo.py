"""`harness demo`: a history of real runs on this machine, so the dashboard has trends to show.

Every "night" is a real ``harness run`` (real MPI ranks, checks, timing, the history DB) of a
small selection across the families, plus a run of the kernel under development
(``suites/_demo.py``: torch's strided copy). On the last nights the demo plants what the
harness exists to catch: that kernel gets slower (a sleep after the copy, which the history
analysis must flag as a regression) and, on the final night, wrong in the last element of its
larger outputs (a failure with its first bad index). Nothing else is staged: every other
number is measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from harness.cli.common import EXIT_INFRA, EXIT_USAGE, HarnessExit, console, parse_world_sizes

#: a few cheap cases of every family: collectives of several sizes (busbw curves), Hopper
#: tasks, FP8, MoE, strided copy, DTensor
SELECTION = (
    "allreduce[dtype=f32,inplace=false,mode=exact,*op=sum]",
    "allreduce[dtype=bf16,inplace=*,mode=exact,n=*,op=sum]",
    "allgather[dtype=*,inplace=false,mode=exact,n=*,tensors=1]",
    "hopper_tasks.rmsnorm",
    "fp8_gemm.quantize",
    "moe.permute",
    "strided_copy[dtype=f32,*]",
    "dtensor.redistribute[dst=R,dtype=f32,mesh=4,shape=13x5,src=*]",
)
#: the quick demo (the browser test): fewer cases, the same shapes of charts, on the last
#: QUICK_SELECTION_NIGHTS nights only (the kernel under development runs every night: its
#: change point needs LEVEL_NIGHTS at the old level and SLOWDOWN_NIGHTS at the new)
QUICK_SELECTION_NIGHTS = 2
QUICK_SELECTION = (
    "allreduce[dtype=f32,inplace=false,mode=exact,*op=sum]",
    "allreduce[dtype=f32,inplace=true,mode=exact,n=65539,op=sum]",
    "hopper_tasks.rmsnorm",
)
KERNEL = "suites._demo:copy_under_development"
KERNEL_CASES = ("strided_copy[dtype=f32,*]",)
#: quick: one case the planted bug hits (1961 elements) and one it spares (324)
QUICK_KERNEL_CASES = ("strided_copy[dtype=f32,*view=contiguous]",
                      "strided_copy[dtype=f32,*view=step]")
#: the planted slowdown: far above the copy's own time and this machine's noise
DELAY_S = 0.002
#: --slow-night: the night before the slowdown a little slow, as a busy machine makes a night:
#: each call busy this much longer (a short sleep overshoots more the more loaded the machine
#: is), several times a call's time so as to stand clear of a plain night that a loaded
#: machine slowed (a 2-core VM's nights of this copy ranged from 10 to 22 us), and far below
#: DELAY_S
SLOW_NIGHT_SPIN_S = 50e-6


#: the nights at the new level that pass: three runs there keep the change point significant
#: when a loaded machine made the nights before it differ (two beside a slow night and plain
#: nights slowed 2x fall short of alpha). The final night, slowed too, plants the bug as well:
#: its failing case's times leave the series, so it is one night more
SLOWDOWN_NIGHTS = 3
#: nights at the old level before the slowdown, at least (the slow night is not one of them)
LEVEL_NIGHTS = 3


def _night_env(night: int, nights: int, slow_night: bool = False) -> dict[str, str]:
    """What the kernel under development does on this night (1-based)."""
    env: dict[str, str] = {}
    first_slow = nights - SLOWDOWN_NIGHTS
    if night >= first_slow:
        env["HARNESS_DEMO_DELAY_S"] = str(DELAY_S)
    elif slow_night and night == first_slow - 1:
        env["HARNESS_DEMO_SPIN_S"] = str(SLOW_NIGHT_SPIN_S)
    if night == nights:
        env["HARNESS_DEMO_BUG"] = "1"
    return env


def _harness(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], env={**os.environ, **env},
                          capture_output=True, text=True)


def _summary(out: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in out.stdout.splitlines() if " in " in ln and "stored in" in ln]
    return lines[-1].split(";")[0] if lines else f"exit {out.returncode}"


@click.command("demo")
@click.option("--db", default="harness-results/demo/history.db", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="History DB the demo fills (its own, not your real history).")
@click.option("--out", "out_dir", default="harness-results/demo/site", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Where the site goes.")
@click.option("--nights", default=LEVEL_NIGHTS + SLOWDOWN_NIGHTS + 1, show_default=True,
              type=click.IntRange(LEVEL_NIGHTS + SLOWDOWN_NIGHTS + 1, 50),
              help="Runs of the selection to make: the last four plant the slowdown (the "
                   "last of them the bug too), and at least three before them set the level "
                   "it leaves (four with --slow-night).")
@click.option("--world-sizes", default="1,4", show_default=True)
@click.option("--quick", is_flag=True,
              help="Fewer cases, and on the last 2 nights only (about a minute on 2 "
                   "cores): what the browser test runs.")
@click.option("--slow-night", is_flag=True,
              help="Also slow the night before the slowdown a little, as a busy machine "
                   "would: the change point is dated at the slowdown's first night all the "
                   "same, with the slow night as the earliest it may have begun.")
@click.pass_context
def demo(ctx: click.Context, db: Path, out_dir: Path, nights: int, world_sizes: str,
         quick: bool, slow_night: bool) -> None:
    """Build a demo history with real runs on this machine, then render its dashboard."""
    from harness.cli.main import command_named

    sizes = ",".join(map(str, parse_world_sizes(world_sizes)))
    if slow_night and nights < LEVEL_NIGHTS + 1 + SLOWDOWN_NIGHTS + 1:
        raise HarnessExit(f"--slow-night needs --nights {LEVEL_NIGHTS + SLOWDOWN_NIGHTS + 2} "
                          f"or more: {LEVEL_NIGHTS} nights at the old level, the slow one, "
                          f"and {SLOWDOWN_NIGHTS + 1} slower", EXIT_USAGE)
    if db.exists():
        raise HarnessExit(f"{db} exists: the demo writes a fresh history; remove it or pass "
                          "another --db", EXIT_USAGE)
    selection = list(QUICK_SELECTION if quick else SELECTION)
    kernel_cases = list(QUICK_KERNEL_CASES if quick else KERNEL_CASES)
    common = ["--db", str(db), "--fail-on", "never"]
    start = time.perf_counter()
    for night in range(1, nights + 1):
        t0 = time.perf_counter()
        # --bench: the charts need points even where the ranks outnumber the cores (there
        # the times are taken fully, marked, and measure the contention as well)
        main = None
        if not quick or night > nights - QUICK_SELECTION_NIGHTS:
            main = _harness(["run", *selection, "--world-sizes", sizes, "--bench", *common], {})
        kernel = _harness(["run", *kernel_cases, "--impl", KERNEL, "--world-sizes", "1",
                           *common], _night_env(night, nights, slow_night))
        for out in (main, kernel):
            if out is None:
                continue
            if out.returncode != 0:
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise HarnessExit(f"demo night {night}: `harness run` exited "
                                  f"{out.returncode} ({tail}); rerun it by hand to see why",
                                  EXIT_INFRA)
        planted = ", ".join(f"{k}={v}"
                            for k, v in _night_env(night, nights, slow_night).items())
        ran = _summary(main) if main is not None else "selection not run (--quick)"
        console.print(escape(f"night {night}/{nights}: {ran}; kernel under "
                             f"development: {_summary(kernel)}"
                             + (f" (planted: {planted})" if planted else "")
                             + f" [{time.perf_counter() - t0:.0f} s]"), soft_wrap=True)
    console.print(f"{nights} nights in {time.perf_counter() - start:.0f} s; rendering")
    try:
        ctx.invoke(command_named(ctx, "report"), db=str(db), out_dir=out_dir)
    except click.exceptions.Exit:
        pass
    console.print(escape(f"open {(out_dir / 'index.html').resolve()}"))
