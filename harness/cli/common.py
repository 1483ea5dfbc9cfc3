"""What every ``harness`` subcommand shares: exit codes, consoles, one-line user errors."""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REGRESSION, EXIT_INFRA = 0, 1, 2, 3, 4

# logs (CI, pipes) get wide lines so case ids are never folded; terminals keep their width.
# emoji=False: rich turns ":name:" into a picture, and names here are the user's
# (`--impl mod:sleepy` printed as "mod😪")
console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False, emoji=False,
                      width=None if sys.stderr.isatty() else 200)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``): a name read from a
    user's file must not move the cursor or recolour the terminal it is printed on."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class HarnessExit(Exception):
    """A user-facing error: one line and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> None:
    raise HarnessExit(message, code)


#: the most ranks one job may have (MPI counts ranks in a C int; past this, a typing error)
MAX_WORLD_SIZE = 1 << 20


def parse_world_sizes(text: str) -> list[int]:
    """``1,4,8`` -> [1, 4, 8]; anything else is a usage error."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        _fail(f"--world-sizes {text!r} is not a comma-separated list of positive integers "
              "(e.g. 1,4,8)", EXIT_USAGE)
    if max(sizes) > MAX_WORLD_SIZE:
        _fail(f"--world-sizes {text!r}: {max(sizes)} ranks is past the {MAX_WORLD_SIZE} a "
              "launch takes; give the world sizes your machines hold (e.g. 1,4,8)", EXIT_USAGE)
    return sorted(dict.fromkeys(sizes))


def fmt_us(ns: float | None) -> str:
    """Nanoseconds as microseconds for tables; "-" when there is no time."""
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def open_history(db: str | None, *, writes: bool = False) -> sqlite3.Connection:
    """The history DB (``--db``, ``$HARNESS_DB`` or the default) for reading what runs stored
    (and, with ``writes``, storing what a command adds to them); one line and exit 2 when it
    does not exist (reading never creates one). A command that only reads reads a DB it
    cannot write too (a read-only mount, another user's file)."""
    from harness.history import sql, store

    path = store.resolve_db_path(db)
    if isinstance(path, Path) and not path.is_file():  # a PostgreSQL URL: connect says
        raise HarnessExit(f"history DB {path} does not exist: run `harness run` first, or pass "
                          "--db (or set HARNESS_DB) to the DB that holds the runs", EXIT_USAGE)
    try:
        return store.connect(path, read_only=not writes)
    except sql.StoreError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc


# ------------------------------------------------------------------ project file and suites
def load_project(ctx: click.Context) -> None:
    """Find the project file (``harness.toml`` or ``[tool.harness]``) and make its settings
    the defaults of every subcommand's ``--tier``, ``--world-sizes`` and ``--db``, so that
    flags win over it (click's default_map) and ``$HARNESS_DB`` wins over its ``db``."""
    import os

    from harness.core import project as project_mod

    try:
        project = project_mod.find()
    except project_mod.ProjectError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    ctx.ensure_object(dict)["project"] = project
    if project is None:
        return
    values: dict[str, str] = {}
    if project.tier:
        values["tier"] = project.tier
    if project.world_sizes:
        values["world_sizes"] = ",".join(map(str, project.world_sizes))
    if project.db and not os.environ.get("HARNESS_DB"):
        values["db"] = str(project.db)
    if values and isinstance(ctx.command, click.Group):
        ctx.default_map = _defaults_for(ctx.command, values)


def _defaults_for(group: click.Group, values: dict[str, str]) -> dict[str, Any]:
    """default_map entries for every subcommand (nested groups too) with such a parameter;
    a tier a command does not offer (golden has no stress) is left out for it."""
    out: dict[str, Any] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out[name] = _defaults_for(command, values)
            continue
        mine = {}
        for param in command.params:
            value = values.get(param.name or "")
            if value is None:
                continue
            if isinstance(param.type, click.Choice) and value not in param.type.choices:
                continue
            mine[param.name] = value
        out[name] = mine
    return out


def project_of(ctx: click.Context) -> Any:
    """The project file the group found (harness.core.project.Project), or None."""
    root = ctx.find_root()
    return (root.obj or {}).get("project") if isinstance(root.obj, dict) else None


def _use_suites(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    from pathlib import Path

    from harness.core.discovery import use_suites
    from harness.core.project import resolve_source

    project = project_of(ctx)
    ctx.meta["harness.suites"] = tuple(value)  # for a command that launches another
    if value:
        # their goldens: by the project file of each suite's own repository (see discovery)
        use_suites([resolve_source(v, Path.cwd()) for v in value])
    elif project is not None:
        use_suites(project.suites, project.golden_dir, f"listed in {project.path}:")
    else:
        use_suites([])


def suite_option(fn: Any) -> Any:
    """``--suite PATH_OR_MODULE`` (repeatable): the op suites to load besides the built-in and
    installed ones; without it, those of the project file."""
    return click.option(
        "--suite", "suites", multiple=True, expose_value=False, callback=_use_suites,
        metavar="PATH_OR_MODULE",
        help="Load the op suite in this .py file, directory or module besides the built-in "
             "and installed ones (repeatable; default: the project file's suites).")(fn)
