"""The shape of the package, read from the source alone (AST, no imports):

- no import circle among the harness's modules, late imports inside functions counted;
- the layers: ``harness/device``, ``core``, ``history``, ``engine``, ``cli``, bottom to top, and
  every import (a late one too) points into the importer's own layer or one below it; on top,
  ``harness/api.py`` (the suites' surface) may import any layer and ``pytest_plugin.py`` the
  engine and below;
- no module of harness/ or suites/ over MAX_MODULE_LINES lines, no function of harness/,
  suites/ or benchmarks/ over MAX_FUNCTION_LINES (from its ``def`` line to its last);
- the engine names the built-in ``suites`` package in one place only (harness/core/
  discovery.py's ``SUITES_PACKAGE``); the built-in suites' side of the rule is
  tests/test_external_suites.py's.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"

#: the layers, bottom to top: a module may import its own layer and the ones below it
LAYERS = ("device", "core", "history", "engine", "cli")
#: the modules above the layers, and the highest layer each may import
TOP = {"api": "cli", "pytest_plugin": "engine", "__main__": "cli"}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _modules() -> dict[str, Path]:
    """Every module of the harness by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(HARNESS.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _named(path: Path, package: str = "") -> set[str]:
    """Every module an import statement in ``path`` names, at any depth (``from a import b``:
    a and a.b); a relative import is read from ``package``."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The harness modules (``known``) that module ``name`` at ``path`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return {n for n in _named(path, package) if n in known and n != name}


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    mods = _modules()
    return {m: frozenset(_imports(p, m, set(mods))) for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[str] | None:
    """One import circle, as the path around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:  # on the current path: the circle closes here
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n, path + [n])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def _layer(module: str) -> int | None:
    """The layer of a harness module (its index in LAYERS; the modules on top above them),
    -1 for the ``harness`` package itself, None for a module outside every layer."""
    parts = module.split(".")
    if parts == ["harness"]:
        return -1
    if len(parts) >= 2 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if len(parts) == 2 and parts[1] in TOP:
        return len(LAYERS)
    return None


def _may_import(module: str) -> int:
    """The highest layer ``module`` may import from."""
    name = module.split(".")[-1]
    if module.count(".") == 1 and name in TOP:
        return LAYERS.index(TOP[name])
    layer = _layer(module)
    assert layer is not None, module
    return layer


def _upward_edges(graph: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[str]:
    """Each import that points above what its importer may import, as "a -> b"."""
    return [f"{m} -> {n}" for m in sorted(graph) for n in sorted(graph[m])
            if _layer(n) is not None and _layer(n) > _may_import(m)]


def test_the_harness_has_no_import_circle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_cycle_finder_finds_a_circle_through_late_imports():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_sits_in_a_layer():
    stray = [m for m in _modules() if _layer(m) is None]
    assert not stray, (f"{stray}: put each module in one of harness/{{{','.join(LAYERS)}}}/ "
                       "(or add it to TOP in this test, with the layers it may import)")


def test_every_import_points_to_its_own_layer_or_one_below():
    upward = _upward_edges(_graph())
    assert not upward, ("imports into a higher layer (order: "
                        f"{' < '.join(LAYERS)}): {'; '.join(upward)}")


def test_the_layer_check_catches_an_upward_import():
    made_up = {"harness.device.cuda": {"harness.cli.main", "harness.device.bringup"},
               "harness.core.spec": {"harness.history.store"},
               "harness.pytest_plugin": {"harness.cli.common", "harness.engine.runner"},
               "harness.api": {"harness.cli.main"},
               "harness.cli.main": {"harness.device.cuda", "harness"}}
    assert _upward_edges(made_up) == ["harness.core.spec -> harness.history.store",
                                      "harness.device.cuda -> harness.cli.main",
                                      "harness.pytest_plugin -> harness.cli.common"]


def test_the_import_reader_sees_late_and_relative_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from harness.core import spec\nimport harness.device.cuda\n"
                    "def f():\n    from harness.history import store as s\n"
                    "    from ..cli.main import main\n    from . import runner\n")
    known = {"harness", "harness.core.spec", "harness.device.cuda", "harness.history.store",
             "harness.cli.main", "harness.engine.runner"}
    assert _imports(path, "harness.engine.m", known) == known - {"harness"}


def test_each_layer_package_holds_its_docstring_only():
    for layer in LAYERS:
        tree = _tree(HARNESS / layer / "__init__.py")
        doc = ast.get_docstring(tree)
        assert doc and "import" in doc, f"harness/{layer}/__init__.py: say what it may import"
        assert len(tree.body) == 1, (f"harness/{layer}/__init__.py holds more than its "
                                     "docstring (importing it would import the layer)")


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def _over(found: dict[str, int], limit: int) -> list[str]:
    """Each of ``found`` (name: lines) over ``limit``, in words."""
    return [f"{k} has {n} lines (at most {limit})" for k, n in sorted(found.items())
            if n > limit]


def test_no_module_is_over_600_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in _sources("harness", "suites")}
    assert not _over(sizes, MAX_MODULE_LINES), _over(sizes, MAX_MODULE_LINES)


def test_no_function_is_over_80_lines():
    lengths = {}
    for path in _sources("harness", "suites", "benchmarks"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(ROOT)}::{node.name}"
                lengths[key] = max(lengths.get(key, 0), node.end_lineno - node.lineno + 1)
    over = _over(lengths, MAX_FUNCTION_LINES)
    assert not over, "; ".join(over)


def test_the_size_checks_name_what_is_too_long():
    assert _over({"harness/x.py::f": 81, "harness/x.py::g": 80}, 80) == [
        "harness/x.py::f has 81 lines (at most 80)"]


def test_only_discovery_names_the_suites_package():
    # the word as a string elsewhere is a click option's name or a project-file key
    allowed = {"core/discovery.py", "cli/common.py", "core/project.py"}
    for path in HARNESS.rglob("*.py"):
        rel = str(path.relative_to(HARNESS))
        named = {n for n in _named(path) if n == "suites" or n.startswith("suites.")}
        assert not named, (rel, named)
        if rel not in allowed:
            assert '"suites"' not in path.read_text(), f"{rel} names the suites package"
