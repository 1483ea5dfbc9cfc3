"""`harness new-op NAME`: scaffold an op in the user's repository."""

from __future__ import annotations

import keyword
from pathlib import Path

import click

from harness.cli.common import EXIT_USAGE, HarnessExit, console, project_of


@click.command("new-op")
@click.argument("name")
@click.option("--into", "into", default=None, type=click.Path(file_okay=False),
              help="The suite package to add it to (default: the project file's first suite "
                   "directory, else ./ops, made a suite with a harness.toml).")
@click.option("--distributed", is_flag=True,
              help="An op that takes the World: each rank gets its shard of the inputs and "
                   "is expected to return its shard of the result; it runs at world sizes "
                   "1 and 4, and its control is wrong only across ranks.")
@click.pass_context
def new_op(ctx: click.Context, name: str, into: str | None, distributed: bool) -> None:
    """Write a new op NAME: its reference, spec (smoke and nightly grids), torch
    implementation, one negative control, and a test of both, ready to run; then edit them
    into your op. Also a .gitignore for what runs write (or the lines it lacks)."""
    from harness.cli import scaffold

    if not name.isidentifier() or name.startswith("_") or keyword.iskeyword(name):
        raise HarnessExit(f"op name {name!r} must be a Python identifier, not a keyword, not "
                          "starting with _ (it names the op's package): e.g. fused_rmsnorm",
                          EXIT_USAGE)
    project = project_of(ctx)
    root = project.root if project is not None else Path.cwd()
    if into is None:
        dirs = [Path(s) for s in (project.suites if project else []) if Path(s).is_dir()]
        suite_dir = dirs[0] if dirs else root / "ops"
    else:
        suite_dir = Path(into).resolve()
    package = suite_dir.name
    if not package.isidentifier() or keyword.iskeyword(package):
        raise HarnessExit(f"suite directory {suite_dir} is not a Python package name: pass "
                          "--into a directory named like one", EXIT_USAGE)
    op = f"{package}.{name}"
    files = {suite_dir.parent / rel: text
             for rel, text in scaffold.op_files(package, name, op, distributed).items()}
    tests = root / "tests" / f"test_{name}.py"
    files[tests] = scaffold.test_file(package, name, op, distributed)
    if not (suite_dir / "__init__.py").exists():
        files[suite_dir / "__init__.py"] = scaffold.SUITE_INIT
    if not (root / "conftest.py").exists() and suite_dir.parent == root:
        files[root / "conftest.py"] = scaffold.CONFTEST
    if project is None:
        files[root / "harness.toml"] = scaffold.project_file(package, distributed)
    taken = next((p for p in (suite_dir / name, tests) if p.exists()), None)
    if taken is not None:
        raise HarnessExit(f"{taken} exists already: pick another op name (nothing was "
                          "written)", EXIT_USAGE)
    ignore = root / ".gitignore"
    before = ignore.read_text(encoding="utf-8") if ignore.is_file() else None
    ignore_text, added = scaffold.gitignore(before)

    def shown(path: Path) -> Path:
        return path.relative_to(root) if path.is_relative_to(root) else path

    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        console.print(f"wrote {shown(path)}")
    if added:
        ignore.write_text(ignore_text, encoding="utf-8")
        console.print(f"{'wrote' if before is None else 'added to'} .gitignore: "
                      f"{', '.join(added)} (what runs write; not to be committed)")
    _warn_db_in_repo(project, root)
    sizes = "1,4" if distributed else "1"
    steps = [(f"harness run {op} --world-sizes {sizes} --no-golden", "runs, checks, times")]
    if distributed:
        steps.append((f"harness run {op} --world-sizes 1,4 --impl no_sum_reduce --no-golden",
                      "the control passes at 1, fails at 4"))
    steps += [(f"python -m pytest -q {shown(tests)}", "the control is caught"),
              (f"harness tolerance {op}" + (" --world-sizes 1,4" if distributed else ""),
               "size the tolerance"),
              (f"harness golden generate {op}", "store the goldens, then commit")]
    if distributed and project is not None and project.world_sizes \
            and 4 not in project.world_sizes:
        console.print(f"\nnote: {shown(project.path)} runs world sizes "
                      f"{project.world_sizes}: add 4 to its world_sizes for `harness run` to "
                      "run this op at 4 ranks without --world-sizes")
    width = max(len(command) for command, _ in steps)
    console.print(f"\nnext, in {root}:\n" + "\n".join(
        f"  {command:<{width}}   # {why}" for command, why in steps), soft_wrap=True)


def _warn_db_in_repo(project, root: Path) -> None:
    """A project file that keeps the history DB inside the repository, outside the ignored
    harness-results/: whether to commit it is the team's choice, so new-op says where it is
    rather than ignoring it."""
    db = project.db if project is not None else None
    if db is None or not db.is_relative_to(root) or db.is_relative_to(root / "harness-results"):
        return
    console.print(f"note: the history DB is {db.relative_to(root)} (the project file's db), "
                  f"inside the repository, with the run folders beside it in "
                  f"{(db.parent / 'runs').relative_to(root)}/: commit the DB or add both to "
                  ".gitignore")
