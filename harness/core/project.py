"""The project file: a repository's own settings, so that ``harness run`` there needs no flags.

``harness.toml`` (top-level keys) or the ``[tool.harness]`` table of ``pyproject.toml``, found
in the working directory or the nearest parent that has one (``harness.toml`` first in each).
Keys::

    suites = ["my_ops/"]           # --suite: .py files, directories or module names
    golden_dir = "golden"          # where those suites' goldens live
    db = "harness-results/history.db"   # --db
    world_sizes = [1, 4]           # --world-sizes
    tier = "smoke"                 # --tier

Relative paths are relative to the file's directory. Command-line flags win over the file, and
``$HARNESS_DB`` wins over its ``db``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

KEYS = ("suites", "golden_dir", "db", "world_sizes", "tier")
_TIERS = ("smoke", "nightly", "stress")


class ProjectError(ValueError):
    """A project file that cannot be used; the message names the file and the key."""


@dataclass
class Project:
    """What a project file sets (None: not set)."""

    path: Path
    suites: list[str] = field(default_factory=list)
    golden_dir: Path | None = None
    db: Path | None = None
    world_sizes: list[int] | None = None
    tier: str | None = None

    @property
    def root(self) -> Path:
        return self.path.parent


def find(start: Path | None = None) -> Project | None:
    """The project file governing ``start`` (default: the working directory), or None."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        own = directory / "harness.toml"
        if own.is_file():
            return parse(own, _read(own))
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            table = _read(pyproject).get("tool", {}).get("harness")
            if table is not None:
                return parse(pyproject, table, where="[tool.harness]")
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProjectError(f"project file {path} cannot be read ({exc}): fix it, or run "
                           "harness from another directory") from exc


def parse(path: Path, table: Mapping[str, Any], where: str = "") -> Project:
    """Check and resolve one project table (paths made absolute against its directory)."""
    label = f"{path}{' ' + where if where else ''}"
    if not isinstance(table, Mapping):
        raise ProjectError(f"{label} must be a table of settings")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ProjectError(f"{label}: unknown key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
    root = path.parent.resolve()
    project = Project(path=path.resolve())
    suites = table.get("suites", [])
    if isinstance(suites, str):
        suites = [suites]
    if not isinstance(suites, list) or not all(isinstance(s, str) and s for s in suites):
        raise ProjectError(f"{label}: suites must be a list of paths or module names, "
                           'e.g. suites = ["my_ops/"]')
    project.suites = [resolve_source(s, root) for s in suites]
    for key in ("golden_dir", "db"):
        value = table.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise ProjectError(f"{label}: {key} must be a path (a string)")
        setattr(project, key, (root / Path(value).expanduser()).resolve())
    sizes = table.get("world_sizes")
    if sizes is not None:
        if isinstance(sizes, int):
            sizes = [sizes]
        if not (isinstance(sizes, list) and sizes
                and all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                        for w in sizes)):
            raise ProjectError(f"{label}: world_sizes must be a list of positive integers, "
                               "e.g. world_sizes = [1, 4]")
        project.world_sizes = sorted(set(sizes))
    tier = table.get("tier")
    if tier is not None:
        if tier not in _TIERS:
            raise ProjectError(f"{label}: tier {tier!r} is not one of {', '.join(_TIERS)}")
        project.tier = tier
    return project


def resolve_source(source: str, root: Path) -> str:
    """A suite source as the ranks (run elsewhere) can find it: a path made absolute against
    ``root``; a module name as it is."""
    path = Path(source).expanduser()
    if source.endswith(".py") or "/" in source or (root / path).exists():
        return str((root / path).resolve())
    return source
