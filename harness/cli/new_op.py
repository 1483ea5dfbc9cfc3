"""`harness new-op NAME`: scaffold an op in the user's repository."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli.common import EXIT_USAGE, HarnessExit, console, project_of


@click.command("new-op")
@click.argument("name")
@click.option("--into", "into", default=None, type=click.Path(file_okay=False),
              help="The suite package to add it to (default: the project file's first suite "
                   "directory, else ./ops, made a suite with a harness.toml).")
@click.pass_context
def new_op(ctx: click.Context, name: str, into: str | None) -> None:
    """Write a new op NAME: its reference, spec (smoke and nightly grids), torch
    implementation, one negative control, and a test of both, ready to run; then edit them
    into your op."""
    from harness.cli import scaffold

    if not name.isidentifier() or name.startswith("_"):
        raise HarnessExit(f"op name {name!r} must be a Python identifier not starting with _ "
                          "(it names the op's package): e.g. fused_rmsnorm", EXIT_USAGE)
    project = project_of(ctx)
    root = project.root if project is not None else Path.cwd()
    if into is None:
        dirs = [Path(s) for s in (project.suites if project else []) if Path(s).is_dir()]
        suite_dir = dirs[0] if dirs else root / "ops"
    else:
        suite_dir = Path(into).resolve()
    package = suite_dir.name
    if not package.isidentifier():
        raise HarnessExit(f"suite directory {suite_dir} is not a Python package name: pass "
                          "--into a directory named like one", EXIT_USAGE)
    op = f"{package}.{name}"
    files = {suite_dir.parent / rel: text
             for rel, text in scaffold.op_files(package, name, op).items()}
    tests = root / "tests" / f"test_{name}.py"
    files[tests] = scaffold.test_file(package, name, op)
    if not (suite_dir / "__init__.py").exists():
        files[suite_dir / "__init__.py"] = scaffold.SUITE_INIT
    if not (root / "conftest.py").exists() and suite_dir.parent == root:
        files[root / "conftest.py"] = scaffold.CONFTEST
    if project is None:
        files[root / "harness.toml"] = scaffold.render(scaffold.PROJECT, package=package)
    taken = next((p for p in (suite_dir / name, tests) if p.exists()), None)
    if taken is not None:
        raise HarnessExit(f"{taken} exists already: pick another op name (nothing was "
                          "written)", EXIT_USAGE)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        console.print(f"wrote {path.relative_to(root) if path.is_relative_to(root) else path}")
    console.print(f"\nnext, in {root}:\n"
                  f"  harness run {op} --world-sizes 1 --no-golden   # runs, checks, times\n"
                  f"  python -m pytest -q {tests.relative_to(root)}   # the control is caught\n"
                  f"  harness tolerance {op}                # size the tolerance\n"
                  f"  harness golden generate {op}          # store the goldens, then commit")
