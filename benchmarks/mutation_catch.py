"""How many plausible bugs the smoke tier catches: mutants of every op's ``torch``
implementation (benchmarks/mutants.py), each run through ``harness run --impl`` like a user's
candidate, with every check and the golden comparison.

    python benchmarks/mutation_catch.py [OPS...] [--json out.json] [--show-survivors]
                                        [--families F,G]

Each project function is mutated once, for the op with the smallest call tree that reaches it
(``route`` belongs to moe.router, not moe.layer); one ``harness run`` per op and world size
takes all of that op's mutants (``--impl`` repeated). Non-distributed ops run at world size 1.
Distributed ops run at 4, and their survivors at 1 and 8, the rest of the smoke tier's sizes.
A mutant that survives its op is tried on the other ops that reach its function (the smoke
tier runs them all). A mutant is caught when any of its items fails, errs, times out or
crashes: exit 1 for a user.

A survivor is either listed in benchmarks/data/mutation_equivalent.json with the reason it
computes the same thing (an equivalent mutant), or a gap in the cases. Prints one row per op
and per family: generated, caught (of which by a crash or exception), equivalent, missed.
Exit 1 when a non-equivalent mutant survives.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import mutants as mut  # noqa: E402
from _figures import command, machine, record  # noqa: E402

from harness.core.results import FAILING  # noqa: E402

FIRST_CASES = 3
#: the families that model a tiled, padded, mixed-precision kernel's bugs (``--families``)
KERNEL_FAMILIES = ("padded_block", "extra_rounding", "narrow_output", "tail_mask", "drop_last")
EQUIVALENT_FILE = HERE / "data" / "mutation_equivalent.json"
MODULE_TEMPLATE = '''\
from harness.core.discovery import registry
from mutants import mutant_callable

_IMPL = registry().specs[{op!r}].implementations["torch"]
'''


def plan(selected: list[str], families: list[str] | None = None
         ) -> tuple[dict[str, list[mut.Mutant]], dict[str, list[str]], dict[str, bool]]:
    """({op: its own mutants}, {function key: every op that reaches it}, {op: distributed}),
    of the ``families`` given (default: all)."""
    from harness.core.discovery import registry

    specs = registry().specs
    trees = {name: mut.project_functions(spec.implementations["torch"])
             for name, spec in specs.items() if "torch" in spec.implementations}
    reach: dict[str, list[str]] = collections.defaultdict(list)
    for name, fns in trees.items():
        for fn in fns:
            reach[f"{fn.__module__}:{fn.__qualname__}"].append(name)
    owned: dict[str, list[mut.Mutant]] = collections.defaultdict(list)
    taken: set[str] = set()
    for name in sorted(trees, key=lambda n: (len(trees[n]), n)):
        for fn in trees[name]:
            key = f"{fn.__module__}:{fn.__qualname__}"
            if key in taken:
                continue
            taken.add(key)
            # an output narrowed where the op returns it: the root's return (a helper's
            # return may be a flag or a dict, where narrowing changes nothing)
            owned[name].extend(m for m in mut.mutants_of(fn)
                               if (not families or m.family in families)
                               and (m.family != "narrow_output" or fn is trees[name][0]))
    ops = [n for n in sorted(owned) if not selected or n in selected]
    return ({n: owned[n] for n in ops}, dict(reach),
            {n: specs[n].distributed for n in specs})


def write_module(folder: Path, tag: str, op: str, batch: list[mut.Mutant]) -> str:
    """A module binding ``m<i>`` to the i-th mutant; returns its name."""
    lines = [MODULE_TEMPLATE.format(op=op)]
    for i, m in enumerate(batch):
        lines.append(f"m{i} = mutant_callable(_IMPL, {m.module!r}, {m.function.split('.')[-1]!r}, "
                     f"{m.source!r})")
    name = f"kh_mutants_{tag}"
    (folder / f"{name}.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


def case_ids(op: str, world_size: int) -> list[str]:
    from harness.core.discovery import registry

    return [c.id for c in registry().specs[op].cases("smoke", world_size)]


def run_batch(folder: Path, batch: list[mut.Mutant], world_size: int, runner_op: str,
              tag: str, cases: list[str]) -> dict[int, str]:
    """{mutant index: worst status} after one ``harness run`` of ``cases`` of ``runner_op``
    at one world size with every mutant of ``batch``."""
    from harness.core.results import read_run_dir

    module = write_module(folder, tag, runner_op, batch)
    out_dir = folder / f"runs-{tag}"
    # short deadlines: a mutant that deadlocks its ranks costs one deadline per case
    cmd = [sys.executable, "-m", "harness", "run", *cases, "--tier", "smoke",
           "--world-sizes", str(world_size), "--no-bench", "--timeout", "10", "--grace", "5",
           "--db", str(folder / "history.db"), "--out-dir", str(out_dir), "--fail-on", "never"]
    for i in range(len(batch)):
        cmd += ["--impl", f"{module}:m{i}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(folder), str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    runs = sorted(p for p in out_dir.iterdir() if p.is_dir()) if out_dir.is_dir() else []
    if not runs:
        sys.exit(f"harness run {runner_op} at world size {world_size} left no run "
                 f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    status: dict[int, str] = {}
    rank = {"pass": 0, "skip": 0, "fail": 3, "error": 2, "timeout": 2, "crash": 2}
    for run_dir in runs:
        for r in read_run_dir(run_dir)[1]:
            i = int(r.impl.rpartition(":m")[2])
            now = status.get(i, "pass")
            status[i] = r.status if rank[r.status] > rank[now] else now
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="ops to mutate (default: all)")
    parser.add_argument("--json", help="write every mutant's outcome here (after each op)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the outcomes --json holds and skip the ops it covers")
    parser.add_argument("--show-survivors", action="store_true",
                        help="print each survivor's key and the lines it changed")
    parser.add_argument("--families", help="comma-separated families only (e.g. "
                        "padded_block,extra_rounding,narrow_output,tail_mask,drop_last)")
    args = parser.parse_args()
    owned, reach, distributed = plan(args.ops, args.families.split(",") if args.families else None)
    equivalent = json.loads(EQUIVALENT_FILE.read_text()) if EQUIVALENT_FILE.is_file() else {}
    outcome: dict[str, dict] = {}
    if args.resume and args.json and Path(args.json).is_file():
        outcome = json.loads(Path(args.json).read_text())
        done = {o["op"] for o in outcome.values()}
        owned = {op: batch for op, batch in owned.items() if op not in done}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tag = 0
        for op, batch in owned.items():
            if not batch:
                continue
            sizes = [4, 1, 8] if distributed[op] else [1]
            left = list(range(len(batch)))
            key_of = {i: batch[i].key for i in left}
            rounds = []
            for runner in [op] + sorted({o for m in batch
                                         for o in reach[f"{m.module}:{m.function}"]} - {op}):
                for w in (sizes if runner == op else ([4] if distributed[runner] else [1])):
                    ids = case_ids(runner, w)
                    # the first cases first: most mutants fail there, and one that deadlocks
                    # costs a deadline per case it runs
                    rounds += [(runner, w, ids[:FIRST_CASES]), (runner, w, ids[FIRST_CASES:])]
            for runner, w, ids in rounds:
                if not left or not ids:
                    continue
                tag += 1
                got = run_batch(folder, [batch[i] for i in left], w, runner, f"{tag}", ids)
                still = []
                for j, i in enumerate(left):
                    st = got.get(j, "missing")
                    if st in FAILING:
                        outcome[key_of[i]] = {"op": op, "family": batch[i].family,
                                              "status": st, "by": f"{runner}@w{w}"}
                    else:
                        still.append(i)
                left = still
            for i in left:
                k = key_of[i]
                outcome[k] = {"op": op, "family": batch[i].family,
                              "status": "equivalent" if k in equivalent else "survived",
                              "reason": equivalent.get(k, ""), "diff": diff(batch[i])}
            print(f"{op}: {len(batch)} mutants, {len(left)} survive "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(outcome, indent=1), encoding="utf-8")
    missed = report(outcome)
    if args.show_survivors:
        for k, o in outcome.items():
            if o["status"] == "survived":
                print(f"\n## {k}\n{o['diff']}")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    families = args.families.split(",") if args.families else None
    if not args.ops and (families is None or set(families) == set(KERNEL_FAMILIES)):
        record_figure(outcome, kernel=families is not None)
    else:
        print("(a selection of ops or families: no figure recorded)", file=sys.stderr)
    return 1 if missed else 0


def record_figure(outcome: dict[str, dict], kernel: bool) -> None:
    """The catch rate of all ops' mutants, or of the kernel families'."""
    total: collections.Counter = collections.Counter()
    for c in tally(outcome, "family").values():
        total.update(c)
    record("mutation_kernel_classes" if kernel else "mutation_catch",
           figure=("Kernel-class mutants (a padded block, an extra rounding, a narrowed output, "
                   "a tail mask one short, a dropped last piece): caught / equivalent / missed"
                   if kernel else "Single-site mutants of every op's torch implementation, each "
                   "run through harness run --impl: caught / equivalent / missed"),
           value=f"{total['caught']} / {total['equivalent']} / {total['survived']}",
           unit=f"of {total['generated']} mutants",
           command=command(__file__, *sys.argv[1:]), machine=machine(), headline=not kernel,
           details={**_counts(total),
                    **{f"{field}s" if field == "op" else "families":
                       {k: _counts(c) for k, c in sorted(tally(outcome, field).items())}
                       for field in ("family", "op")},
                    "outcomes": outcome})


def _counts(c: collections.Counter) -> dict[str, int]:
    return {"generated": c["generated"], "caught": c["caught"],
            "caught_by_exception": c["crashed"], "equivalent": c["equivalent"],
            "missed": c["survived"]}


def diff(m: mut.Mutant) -> str:
    """The lines the mutant changed, as ``-``/``+`` lines."""
    import difflib

    original = mut.unparsed_original(m.module, m.function).splitlines()
    return "\n".join(line for line in difflib.unified_diff(
        original, m.source.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---")))


def tally(outcome: dict[str, dict], field: str) -> dict[str, collections.Counter]:
    """{op or family: Counter of generated, caught, crashed (caught by an exception),
    equivalent, survived}."""
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcome.values():
        c = rows[o[field]]
        c["generated"] += 1
        if o["status"] in FAILING:
            c["caught"] += 1
            c["crashed"] += o["status"] != "fail"
        else:
            c[o["status"]] += 1
    return rows


def report(outcome: dict[str, dict]) -> int:
    """Print the per-op and per-family tables; return the number of missed mutants."""
    for field in ("op", "family"):
        rows = tally(outcome, field)
        print(f"\n{field:<44} {'generated':>9} {'caught':>7} {'(crash)':>8} "
              f"{'equivalent':>10} {'missed':>7}")
        total: collections.Counter = collections.Counter()
        for name in sorted(rows):
            c = rows[name]
            total.update(c)
            print(f"{name:<44} {c['generated']:>9} {c['caught']:>7} {c['crashed']:>8} "
                  f"{c['equivalent']:>10} {c['survived']:>7}")
        print(f"{'total':<44} {total['generated']:>9} {total['caught']:>7} "
              f"{total['crashed']:>8} {total['equivalent']:>10} {total['survived']:>7}")
    return sum(o["status"] == "survived" for o in outcome.values())


if __name__ == "__main__":
    sys.exit(main())
