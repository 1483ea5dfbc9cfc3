"""The shape of the package: no import circle among the harness's modules (late imports
inside functions counted), and the engine names the built-in ``suites`` package in one place
only (harness/core/discovery.py's ``SUITES_PACKAGE``); the built-in suites' side of the rule is
tests/test_external_suites.py's."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _imports(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    mods = {f"harness.{p.stem}": p for p in HARNESS.glob("*.py") if p.stem != "__init__"}
    return {m: {n for n in _imports(p) if n in mods and n != m} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def test_the_harness_has_no_import_circle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_cycle_finder_finds_a_circle_through_late_imports():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_discovery_names_the_suites_package():
    for path in HARNESS.glob("*.py"):
        text = path.read_text()
        named = {n for n in _imports(path) if n == "suites" or n.startswith("suites.")}
        assert not named, (path.name, named)
        # the word as a string elsewhere is a click option's name or a project-file key
        if path.name not in ("discovery.py", "cli_common.py", "project.py"):
            assert '"suites"' not in text, f"{path.name} names the suites package"
