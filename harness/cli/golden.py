"""`harness golden generate|verify|show`: the stored golden results.

``generate`` runs the reference on the CPU for every selected case and world size and stores
what it produced; a golden that exists and differs is only overwritten with ``--accept``, after
printing what changed. ``verify`` re-derives every stored golden and reports ``drift`` (bits
changed, still within the op's tolerance) and ``MISMATCH`` (outside it); it fails on mismatches
and on selected cases that have no golden, and names the orphans (goldens of the selected ops
that no case has any more), which ``--prune`` deletes. ``show`` lists what is stored.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.cli.common import (
    EXIT_FAIL,
    EXIT_USAGE,
    HarnessExit,
    console,
    err_console,
    parse_world_sizes,
    suite_option,
)

_TIERS = click.Choice(["smoke", "nightly"])


def _shelf(golden_dir: str | None) -> Any:
    """Each op's golden store: its suite's directory, or ``golden_dir`` for all."""
    from harness.core.discovery import registry
    from harness.core.golden import GoldenShelf
    from harness.core.spec import SpecError

    try:
        return GoldenShelf(registry().golden_dir_of, golden_dir)
    except SpecError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc


def _store(shelf: Any, op: str) -> Any:
    """The store of ``op``'s goldens, its manifest read now: a broken one is one clear line."""
    from harness.core.golden import GoldenError

    store = shelf.for_op(op)
    try:
        store.manifest  # noqa: B018
    except GoldenError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    return store


def _cases(selectors: Sequence[str], tier: str, sizes: Sequence[int]) -> list[Any]:
    """The selected cases (not items: goldens do not depend on the implementation)."""
    from harness.core.discovery import registry
    from harness.core.spec import SpecError

    try:
        reg = registry()
        reg.select(list(selectors), tier)
        seen: dict[tuple[str, int], Any] = {}
        for w in sizes:
            for item in reg.plan(tier, w, list(selectors), []):
                seen.setdefault((item.case.id, w), item.case)
    except SpecError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    if not seen:
        raise HarnessExit(f"the selection has no case in tier {tier!r}: try `harness list`",
                          EXIT_USAGE)
    return list(seen.values())


@dataclass
class Derived:
    """A case's golden as the reference makes it now."""

    key: str
    rel: str
    tensors: dict[str, Any]
    entry: dict[str, Any]
    #: the reference's outputs by rank, as made (the tolerances follow their dtypes)
    outputs: dict[int, dict[str, Any]]
    #: by rank, each output's per-element magnitudes where the op has them (never stored:
    #: a tolerance that scales with them needs them to compare two goldens too)
    magnitudes: dict[int, dict[str, Any]]


def derive(case: Any, tier: str) -> Derived:
    """Run the reference on the CPU for every rank of ``case`` and encode the outputs."""
    import torch

    from harness.core import golden, inputs
    from harness.engine.case_setup import EXACT_SUFFIX, expected_with_magnitudes

    key = golden.entry_key(case.id, case.world_size)
    made = {rank: expected_with_magnitudes(case, rank) for rank in range(case.world_size)}
    # the precision lens's float64 values are recomputed at every check, never stored
    outputs = {rank: {k: v for k, v in expected.items() if not k.endswith(EXACT_SUFFIX)}
               for rank, (expected, _) in made.items()}
    tensors, meta = golden.encode(outputs, key)
    spec = case.spec
    entry = {"op": spec.name, "family": spec.family, "case_id": case.id,
             "world_size": case.world_size, "tier": tier, "outputs": meta,
             "inputs_generator": inputs.GENERATOR_VERSION, "torch": torch.__version__,
             "generator": f"kernel-harness golden v{golden.SCHEMA}"}
    rel = golden.relative_file(spec.family, spec.name, case.id, case.world_size)
    return Derived(key, rel, tensors, entry, outputs,
                   {rank: magnitudes for rank, (_, magnitudes) in made.items()})


def _same_bits(a: Derived, b: Derived) -> bool:
    import torch

    def raw(t: Any) -> Any:
        return t.contiguous().reshape(-1).view(torch.uint8)

    return a.tensors.keys() == b.tensors.keys() and all(
        torch.equal(raw(a.tensors[k]), raw(b.tensors[k])) for k in a.tensors)


def derived(case: Any, tier: str, checked: set[str]) -> Derived:
    """``derive``, as a golden is stored: the first case of each op derived twice, whose
    bits must agree (a ``make_inputs`` drawing from an unseeded generator would store a
    golden every later run fails against); the spec's own exception is one line naming the
    case (HarnessExit, exit 2)."""
    from harness.core.spec import raised

    where = f"{case.id} at world size {case.world_size}"
    try:
        new = derive(case, tier)
        if case.spec.name not in checked:
            checked.add(case.spec.name)
            if not _same_bits(new, derive(case, tier)):
                raise HarnessExit(
                    f"{where}: two derivations of its golden differ: its make_inputs (or "
                    "reference) is not deterministic; draw inputs with harness.api.case_tensor "
                    "or a torch.Generator seeded with seed_from(...), not torch.rand; no golden "
                    "of it was stored", EXIT_USAGE)
    except HarnessExit:
        raise
    except Exception as exc:  # noqa: BLE001 (the spec's code: its error, said as its)
        raise HarnessExit(f"{where}: its reference or make_inputs raised {raised(exc)}; no "
                          "golden of it was stored", EXIT_USAGE) from exc
    return new


@dataclass
class Difference:
    """How a stored golden and a re-derived one differ."""

    verdict: str  # "same", "drift" (within the op's tolerance) or "mismatch"
    lines: list[str]


def differences(store: Any, case: Any, new: Derived) -> Difference:
    """Compare a re-derived golden with the stored one, output by output, on every rank."""
    from harness.core import compare, golden
    from harness.engine.case_setup import tolerances

    entry = store.entry(case.id, case.world_size)
    old_tensors = store.read_file(store.path_of(entry), entry)
    if set(entry["outputs"]) != set(new.entry["outputs"]):
        return Difference("mismatch", [f"outputs {sorted(entry['outputs'])} -> "
                                       f"{sorted(new.entry['outputs'])}"])
    verdict, lines = "same", []
    for rank in range(case.world_size):
        old = golden.decode(old_tensors, entry["outputs"], rank, str(store.path_of(entry)))
        fresh = golden.decode(new.tensors, new.entry["outputs"], rank, "(re-derived)")
        tols = tolerances(case, new.outputs[rank])
        for name in sorted(fresh):
            if golden.same_bits(old[name], fresh[name]):
                continue
            got, magnitude = fresh[name], new.magnitudes[rank].get(name)
            if isinstance(got, golden.Fingerprint):  # compare sample to sample, sums to sums
                check = golden.check_fingerprint(got, old[name], tols[name], magnitude)
            else:
                check = golden.check_output(got, old[name], tols[name], magnitude=magnitude)
            ok, why = compare.verdict(check.metrics, check.tolerance)
            if ok and check.sums_error:
                ok, why = False, check.sums_error
            m = check.metrics
            text = why or (f"bits changed within {tols[name].describe()} "
                           f"(max_abs={m.max_abs:.3g}, {m.n_mismatch} elements off)")
            if not ok:
                verdict = "mismatch"
            elif verdict == "same":
                verdict = "drift"
            lines.append(f"r{rank}/{name}: {text}")
    return Difference(verdict, lines)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)


def _walk(cases: Sequence[Any], label: str) -> Iterator[Any]:
    with _progress() as progress:
        task = progress.add_task(label, total=len(cases))
        for case in cases:
            yield case
            progress.advance(task)


@click.group()
def golden() -> None:
    """Stored golden results (each suite's golden/ directory): generate, verify, show."""


def _common(fn: Any) -> Any:
    for option in reversed([
        click.argument("selectors", nargs=-1),
        click.option("--tier", default="smoke", show_default=True, type=_TIERS),
        click.option("--world-sizes", default="1,4,8", show_default=True,
                     help="World sizes whose per-rank goldens to cover."),
        click.option("--golden-dir", default=None, type=click.Path(file_okay=False),
                     help="One golden directory for every op (default $HARNESS_GOLDEN_DIR, "
                          "else each suite's own: suites/golden for the built-in ops)."),
        suite_option,
    ]):
        fn = option(fn)
    return fn


@golden.command()
@_common
@click.option("--accept", is_flag=True, help="Overwrite goldens that differ (after showing how).")
@click.pass_context
def generate(ctx: click.Context, selectors: tuple[str, ...], tier: str, world_sizes: str,
             golden_dir: str | None, accept: bool) -> None:
    """Run the reference for the selected cases and store the goldens that are new."""
    from harness.core.golden import GoldenError

    shelf = _shelf(golden_dir)
    cases = _cases(selectors, tier, parse_world_sizes(world_sizes))
    counts = {"new": 0, "unchanged": 0, "changed": 0, "refused": 0}
    today = datetime.date.today().isoformat()
    checked: set[str] = set()
    try:
        for case in _walk(cases, "goldens"):
            store = _store(shelf, case.spec.name)
            new = derived(case, tier, checked)
            old = store.entry(case.id, case.world_size)
            if old is not None:
                try:
                    diff = differences(store, case, new)
                except GoldenError as exc:  # a corrupt file is replaced only when accepted
                    diff = Difference("mismatch", [str(exc)])
                if diff.verdict == "same":
                    counts["unchanged"] += 1
                    continue
                word = "CHANGED" if accept else "DIFFERS"
                console.print(f"[yellow]{word}[/yellow] {escape(new.key)} ({diff.verdict})")
                for line in diff.lines[:8]:
                    console.print(f"    {escape(line)}", soft_wrap=True)
                if not accept:
                    counts["refused"] += 1
                    continue
                counts["changed"] += 1
            else:
                counts["new"] += 1
            store.write(new.key, new.rel, new.tensors, dict(new.entry, date=today))
    finally:  # goldens written before an interruption stay usable
        for store in shelf.stores:
            store.save_manifest()
    console.print(", ".join(f"{n} {k}" for k, n in counts.items()) + "; manifest "
                  + ", ".join(str(store.manifest_path) for store in shelf.stores))
    if counts["refused"]:
        err_console.print(f"{counts['refused']} golden(s) differ from what the reference makes "
                          "now and were kept: review the changes above, then rerun with --accept",
                          soft_wrap=True)
        ctx.exit(EXIT_FAIL)


@golden.command()
@_common
@click.option("--prune", is_flag=True,
              help="Delete the orphans: goldens of the selected ops that no case has any more.")
@click.pass_context
def verify(ctx: click.Context, selectors: tuple[str, ...], tier: str, world_sizes: str,
           golden_dir: str | None, prune: bool) -> None:
    """Re-derive the selected goldens and compare them with the stored ones."""
    from harness.core.golden import GoldenError

    shelf = _shelf(golden_dir)
    cases = _cases(selectors, tier, parse_world_sizes(world_sizes))
    counts = {"ok": 0, "drift": 0, "mismatch": 0, "missing": 0, "corrupt": 0}
    for case in _walk(cases, "verify"):
        store = _store(shelf, case.spec.name)
        key = f"w{case.world_size}:{case.id}"
        lost = store.lost_entry(case.id, case.world_size)
        if lost:
            counts["corrupt"] += 1
            console.print(f"[red]CORRUPT[/red] {escape(key)}: {escape(lost)}", soft_wrap=True)
            continue
        if store.entry(case.id, case.world_size) is None:
            counts["missing"] += 1
            console.print(f"[red]MISSING[/red] {escape(key)}: no golden; run "
                          "`harness golden generate`", soft_wrap=True)
            continue
        try:
            diff = differences(store, case, derive(case, tier))
        except GoldenError as exc:
            counts["corrupt"] += 1
            console.print(f"[red]CORRUPT[/red] {escape(key)}: {escape(str(exc))}", soft_wrap=True)
            continue
        if diff.verdict == "same":
            counts["ok"] += 1
            continue
        counts[diff.verdict] += 1
        label = "[yellow]drift[/yellow]" if diff.verdict == "drift" else "[red]MISMATCH[/red]"
        console.print(f"{label} {escape(key)}")
        for line in diff.lines[:8]:
            console.print(f"    {escape(line)}", soft_wrap=True)
    orphans = _orphans(shelf, cases, tier, parse_world_sizes(world_sizes), not selectors)
    for _, key, why, prunable in orphans[:10]:
        remedy = ("kept: a shared --golden-dir; pass the --suite that has it, or delete it"
                  if not prunable else "deleted" if prune else
                  "delete it with `harness golden verify --prune`, or restore the case")
        console.print(f"[yellow]orphan[/yellow] {escape(key)}: {why}; {remedy}", soft_wrap=True)
    if len(orphans) > 10:
        console.print(f"... and {len(orphans) - 10} more orphans")
    if prune:
        _prune([(store, key) for store, key, _, prunable in orphans if prunable])
    if orphans:
        counts["orphan"] = len(orphans)
    console.print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" of {len(cases)} goldens")
    if counts["mismatch"] or counts["missing"] or counts["corrupt"]:
        ctx.exit(EXIT_FAIL)


def _tier_of(entry: dict[str, Any]) -> str:
    return str(entry.get("tier", "smoke"))


def _orphans(shelf: Any, cases: Sequence[Any], tier: str, sizes: Sequence[int],
             every_op: bool) -> list[tuple[Any, str, str, bool]]:
    """(store, entry key, why, prunable) of each stored golden of the selected cases' ops,
    tier and world sizes that none of those ops' cases has any more (a grid or a case id
    changed); with ``every_op`` (nothing selected) also those of an op no loaded suite has
    (removed or renamed, or of a suite not loaded: not prunable in a shared ``--golden-dir``,
    which may hold a suite not loaded now)."""
    from harness.core.discovery import registry

    ops = sorted({case.spec.name for case in cases})
    known = {f"w{c.world_size}:{c.id}" for c in _cases(ops, tier, sizes)}
    stores = {id(store): store for store in (_store(shelf, op) for op in ops)}
    loaded = registry().specs
    found = []
    for store in stores.values():
        for key, e in store.manifest["entries"].items():
            if e.get("world_size") not in sizes or _tier_of(e) != tier or key in known:
                continue
            if e.get("op") in ops:
                found.append((store, key, "no such case any more", True))
            elif every_op and e.get("op") not in loaded:
                found.append((store, key, f"no loaded suite has op {e.get('op')!r}",
                              shelf.override is None))
    return found


def _prune(orphans: Sequence[tuple[Any, str]]) -> None:
    """Each (store, entry key)'s manifest entry and file deleted, each manifest saved once."""
    for store, key in orphans:
        entry = store.manifest["entries"].pop(key)
        store.path_of(entry).unlink(missing_ok=True)
    for store in {id(store): store for store, _ in orphans}.values():
        store.save_manifest()


@golden.command()
@click.argument("selectors", nargs=-1)
@suite_option
@click.option("--golden-dir", default=None, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(selectors: tuple[str, ...], golden_dir: str | None, as_json: bool) -> None:
    """List the stored goldens (SELECTORS: globs over op names, case ids or entry keys)."""
    from harness.core.discovery import registry
    from harness.core.spec import glob_match

    shelf = _shelf(golden_dir)
    reg = registry()
    for op in reg.select([], "smoke") or reg.specs.values():
        _store(shelf, op.name)  # the stores of the selected suites, each read once
    entries = {k: (store, e) for store in shelf.stores
               for k, e in store.manifest["entries"].items()
               if not selectors or any(glob_match(s, e["op"]) or glob_match(s, e["family"])
                                       or glob_match(s, e["case_id"]) or glob_match(s, k)
                                       for s in selectors)}
    roots = ", ".join(str(store.root) for store in shelf.stores)
    if selectors and not entries:  # a typo, most often: as `ls` of a name that is not there
        stored = sum(len(store.manifest["entries"]) for store in shelf.stores)
        raise HarnessExit(f"no stored golden matches {' '.join(map(repr, selectors))}: "
                          f"`harness golden show` lists the {stored} in {roots or 'no store'}",
                          EXIT_USAGE)
    if as_json:
        click.echo(json.dumps({k: e for k, (_, e) in entries.items()}, indent=1,
                              sort_keys=True))
        return
    table = Table(title=f"goldens in {roots}", header_style="bold")
    for col in ("entry", "outputs", "bytes", "date"):
        table.add_column(col, overflow="fold")
    total = 0
    for key, (store, e) in entries.items():
        path = store.path_of(e)
        size = path.stat().st_size if path.exists() else 0
        total += size
        outs = ", ".join(f"{name} {info['kind'][:5]} {info['dtype']}{tuple(info['shape'])}"
                         for name, info in list(e["outputs"].items())[:3])
        more = len(e["outputs"]) - 3
        table.add_row(escape(key), escape(outs + (f" (+{more})" if more > 0 else "")),
                      str(size), e.get("date", ""))
    console.print(table)
    console.print(f"{len(entries)} goldens, {total / 2**20:.2f} MiB")
