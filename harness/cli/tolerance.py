"""`harness tolerance OP`: how much of each tolerance the implementations use and how far out
the negative controls land, so that a new op's tolerance is chosen from numbers."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import click
from rich.markup import escape
from rich.table import Table

from harness.cli.common import (
    EXIT_FAIL,
    EXIT_USAGE,
    HarnessExit,
    console,
    parse_world_sizes,
    suite_option,
)


def _fmt(use: float | None) -> str:
    if use is None:
        return "-"
    return "inf" if math.isinf(use) else f"{use:.3g}x"


@click.command("tolerance")
@click.argument("op")
@suite_option
@click.option("--impl", "impls", multiple=True, metavar="NAME",
              help="Implementation, control or module:callable to measure (repeatable; "
                   "default: every implementation and control of the op).")
@click.option("--tier", default="smoke", show_default=True,
              type=click.Choice(["smoke", "nightly", "stress"]))
@click.option("--case", "case_glob", default=None, help="Only cases whose id matches this glob.")
@click.option("--world-sizes", default="1", show_default=True,
              help="World sizes to measure a distributed op at: 1 runs in this process; others "
                   "launch the ranks as `harness run` does (its multi-rank bugs show there).")
@click.option("--json", "as_json", is_flag=True, help="Every measurement, machine-readable.")
@click.pass_context
def tolerance(ctx: click.Context, op: str, impls: tuple[str, ...], tier: str,
              case_glob: str | None, world_sizes: str, as_json: bool) -> None:
    """Measure how much of OP's tolerances each implementation uses (1x is the edge) and how
    far out each negative control lands, on every case (at world size 1 in this process;
    --world-sizes 4 launches 4 ranks).

    A legitimate variant of your kernel (another summation order, another rounding) goes in
    with --impl module:callable. Exit 1 when a correct implementation fails or a control
    passes every case: the tolerance (or the cases) need another look."""
    from harness.core.discovery import registry
    from harness.core.spec import SpecError, glob_match
    from harness.engine import tolerance_use

    try:
        spec = registry().specs.get(op)
        if spec is None:
            raise SpecError(f"unknown op {op!r}: `harness list` names them")
        if not spec.grid.get(tier):
            raise SpecError(f"{op} has no case in tier {tier!r}")
        chosen = list(impls) or list(spec.all_impls())
        # a single-device op runs at world size 1 only, whatever the sizes asked for
        sizes = parse_world_sizes(world_sizes) if spec.distributed else [1]
        keep = (lambda c: glob_match(case_glob, c.id)) if case_glob else (lambda c: True)
        rows = tolerance_use.measure(spec, chosen, tier, keep) if 1 in sizes else []
        launched = [w for w in sizes if w != 1]
        if launched:
            results = _launched(case_glob or op, chosen, tier, launched, ctx)
            rows += tolerance_use.uses(spec, [r for r in results
                                              if not case_glob or glob_match(case_glob, r.case_id)])
    except SpecError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    if not rows:
        raise HarnessExit(f"no case of {op} in tier {tier!r} matches {case_glob!r} at world "
                          f"sizes {world_sizes}", EXIT_USAGE)
    worst = tolerance_use.worst_uses(rows)
    caught = tolerance_use.controls_caught(rows)
    wrong = sorted({r.impl for r in rows if not r.control and r.status != "pass"})
    # a distributed op's multi-rank bug cannot show at one rank alone: a note, not a verdict
    one_rank_only = spec.distributed and sizes == [1]
    missed = [c for c, ok in caught.items() if not ok and not one_rank_only]
    if as_json:
        click.echo(json.dumps({"rows": [asdict(r) for r in rows],
                               "worst": [asdict(w) for w in worst],
                               "controls_caught": caught, "failing_implementations": wrong},
                              indent=1, default=str))
    else:
        _print(op, rows, worst, caught, wrong, one_rank_only)
    if wrong or missed:
        ctx.exit(EXIT_FAIL)


def _launched(selector: str, impls: list[str], tier: str, sizes: list[int],
              ctx: click.Context):
    """The results of `harness run SELECTOR` (the op, or the --case glob) at ``sizes`` (no
    timing, every rank launched as a run launches them), in a scratch directory: what each
    output measured, merged over ranks."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from harness.core.results import read_run_dir

    suites = [a for s in ctx.meta.get("harness.suites", ()) for a in ("--suite", s)]
    with tempfile.TemporaryDirectory(prefix="harness-tolerance-") as tmp:
        cmd = [sys.executable, "-m", "harness", "run", selector, "--tier", tier, "--world-sizes",
               ",".join(map(str, sizes)), "--no-bench", "--fail-on", "never", "--db",
               str(Path(tmp) / "h.db"), "--out-dir", str(Path(tmp) / "runs"), *suites]
        for impl in impls:
            cmd += ["--impl", impl]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        runs = sorted(p for p in (Path(tmp) / "runs").glob("*") if p.is_dir())
        if not runs:
            raise HarnessExit(f"harness run {selector} at world sizes {sizes} left no results "
                              f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
                              EXIT_FAIL)
        return [r for run in runs for r in read_run_dir(run)[1]]


def _print(op: str, rows, worst, caught, wrong, one_rank_only: bool) -> None:
    """The table and verdict lines; ``one_rank_only``: a distributed op measured at one rank,
    where a control's multi-rank bug cannot show."""
    table = Table(title=f"{op}: tolerance used (1x is the edge)", header_style="bold")
    for col in ("case", "impl", "output", "tolerance part", "use", "status"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = "red" if (r.status != "pass") != r.control else ""
        table.add_row(escape(r.case_id), escape(r.impl + (" (control)" if r.control else "")),
                      r.output, escape(r.part), _fmt(r.use),
                      f"[{style}]{r.status}[/{style}]" if style else r.status)
    console.print(table)
    for w in worst:
        if not w.control:
            console.print(escape(f"{w.impl} uses at most {_fmt(w.use)} of {w.output}'s "
                                 f"{w.part} (on {w.case_id})"), soft_wrap=True)
    for w in worst:
        if w.control:
            console.print(escape(f"control {w.impl} reaches {_fmt(w.use)} at most (its "
                                 f"{w.output} against {w.part}, on {w.case_id})"),
                          soft_wrap=True)
    impl_max = max((w.use for w in worst if not w.control), default=0.0)
    reach = [w.use for w in worst if w.control]
    if reach and min(reach) > 1 and not wrong:
        console.print(f"room: correct implementations use at most {_fmt(impl_max)} of a "
                      f"tolerance; every control lands {_fmt(min(reach))} or further out")
    for name, ok in caught.items():
        if not ok and one_rank_only:
            console.print(f"[yellow]control {escape(name)} passes every case at world size 1"
                          f"[/yellow]: this command runs one rank; a multi-rank bug shows "
                          f"under `harness run {escape(op)} --world-sizes 4 --impl "
                          f"{escape(name)}`")
        elif not ok:
            console.print(f"[red]control {escape(name)} passes every case[/red]: it catches "
                          "nothing here; tighten the tolerance or add the case it is for")
    for name in wrong:
        console.print(f"[red]{escape(name)} fails[/red]: a correct implementation must pass; "
                      "widen the tolerance only if the difference is legitimate")
