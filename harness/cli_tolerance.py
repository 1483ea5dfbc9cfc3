"""`harness tolerance OP`: how much of each tolerance the implementations use and how far out
the negative controls land, so that a new op's tolerance is chosen from numbers."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import click
from rich.markup import escape
from rich.table import Table

from harness.cli_common import EXIT_FAIL, EXIT_USAGE, HarnessExit, console, suite_option


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
@click.option("--json", "as_json", is_flag=True, help="Every measurement, machine-readable.")
@click.pass_context
def tolerance(ctx: click.Context, op: str, impls: tuple[str, ...], tier: str,
              case_glob: str | None, as_json: bool) -> None:
    """Measure how much of OP's tolerances each implementation uses (1x is the edge) and how
    far out each negative control lands, on every case at world size 1 in this process.

    A legitimate variant of your kernel (another summation order, another rounding) goes in
    with --impl module:callable. Exit 1 when a correct implementation fails or a control
    passes every case: the tolerance (or the cases) need another look."""
    from harness import tolerance_use
    from harness.spec import SpecError, glob_match, registry

    try:
        spec = registry().specs.get(op)
        if spec is None:
            raise SpecError(f"unknown op {op!r}: `harness list` names them")
        if not spec.grid.get(tier):
            raise SpecError(f"{op} has no case in tier {tier!r}")
        chosen = list(impls) or list(spec.all_impls())
        rows = tolerance_use.measure(
            spec, chosen, tier, (lambda c: glob_match(case_glob, c.id)) if case_glob
            else (lambda c: True))
    except SpecError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    if not rows:
        raise HarnessExit(f"no case of {op} in tier {tier!r} matches {case_glob!r} at world "
                          "size 1", EXIT_USAGE)
    worst = tolerance_use.worst_uses(rows)
    caught = tolerance_use.controls_caught(rows)
    wrong = sorted({r.impl for r in rows if not r.control and r.status != "pass"})
    # a multi-rank bug cannot show at the one rank this command runs: a note, not a verdict
    missed = [c for c, ok in caught.items() if not ok and not spec.distributed]
    if as_json:
        click.echo(json.dumps({"rows": [asdict(r) for r in rows],
                               "worst": [asdict(w) for w in worst],
                               "controls_caught": caught, "failing_implementations": wrong},
                              indent=1, default=str))
    else:
        _print(op, rows, worst, caught, wrong, spec.distributed)
    if wrong or missed:
        ctx.exit(EXIT_FAIL)


def _print(op: str, rows, worst, caught, wrong, distributed: bool) -> None:
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
        if not ok and distributed:
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
