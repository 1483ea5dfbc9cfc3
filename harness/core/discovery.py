"""Where op specs come from: this project's ``suites`` package, installed plugins, ad hoc paths.

A *suite* is a set of op specs with a name, an origin a user can read, and a golden directory:

- the built-in suite, every non-underscore module of the ``suites`` package (``SPECS``);
- each entry point of the group ``harness.suites`` in an installed distribution: its object is
  a module with ``SPECS`` or a callable returning a list of OpSpec (or such a module);
- each ``--suite PATH_OR_MODULE`` (or a project file's ``suites``): a ``.py`` file, a directory
  (its non-underscore modules with ``SPECS``; a package directory is imported as the package),
  or a dotted module name.

A suite's goldens live in the golden directory of the project file that lists it, else in its
module's ``GOLDEN_DIR``, else in that of the project file of the suite's own repository (found
from its source upwards), else in ``golden/`` beside its source. Op names are global (they key
the history): two suites defining one op is a SpecError naming both.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.core.spec import (
    OpSpec,
    Registry,
    SpecError,
    add_entry_point_impls,
    import_failure,
)

BUILTIN_SUITE = "kernel-harness"
SUITES_PACKAGE = "suites"
SUITE_ENTRY_POINT_GROUP = "harness.suites"


@dataclass
class Suite:
    """Op specs from one source."""

    name: str
    #: where it came from, in words: "built-in", "entry point NAME in DIST", "--suite PATH"
    origin: str
    #: None: the built-in golden directory (``harness.core.golden.default_dir``)
    golden_dir: Path | None
    specs: list[OpSpec] = field(default_factory=list)


def builtin_suite_dir() -> Path | None:
    """The directory of the built-in ``suites`` package, found without importing it (None
    where it is not importable): the one place the harness names that package."""
    spec = importlib.util.find_spec(SUITES_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def builtin_suite() -> Suite:
    """Every non-underscore module of the ``suites`` package that has ``SPECS``."""
    package = importlib.import_module(SUITES_PACKAGE)
    specs: list[OpSpec] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{SUITES_PACKAGE}.{info.name}")
        specs.extend(getattr(module, "SPECS", ()))
    return Suite(BUILTIN_SUITE, "built-in", None, specs)


def entry_point_suites() -> list[Suite]:
    """One suite per entry point of ``harness.suites``; a broken one names itself."""
    suites = []
    for ep in sorted(importlib.metadata.entry_points(group=SUITE_ENTRY_POINT_GROUP),
                     key=lambda e: e.name):
        dist = f" in {ep.dist.name}" if ep.dist is not None else ""
        origin = f"entry point {ep.name}{dist}"
        try:
            obj = ep.load()
        except Exception as exc:  # a broken third-party package must say which one
            raise SpecError(f"{origin} ({ep.value}, group {SUITE_ENTRY_POINT_GROUP}) failed to "
                            f"load: {type(exc).__name__}: {exc}") from exc
        module = obj if isinstance(obj, ModuleType) else sys.modules.get(
            getattr(obj, "__module__", ""))
        suites.append(Suite(ep.name, origin,
                            _golden_dir_of(module, None, module and _module_dir(module)),
                            _specs_of(obj, origin)))
    return suites


def load_suite(source: str, golden_dir: Path | None = None, how: str = "--suite") -> Suite:
    """The suite at ``source``: a ``.py`` file, a directory, or a dotted module name.

    A path's directory goes on ``sys.path`` first (as pytest's rootdir insertion does), so the
    suite's modules import their siblings by plain name. ``golden_dir`` is that of the project
    file listing the suite (see ``_golden_dir_of``).
    """
    origin = f"{how} {source}"
    path = Path(source).expanduser()
    looks_like_path = source.endswith(".py") or "/" in source or path.exists()
    if looks_like_path and not path.exists():
        raise SpecError(f"{origin}: no such file or directory; pass a .py file, a directory of "
                        "suite modules, or an importable module name")
    try:
        if not looks_like_path:
            module = importlib.import_module(source)
            return Suite(source.rpartition(".")[2], origin,
                         _golden_dir_of(module, golden_dir, _module_dir(module)),
                         _specs_of(module, origin))
        path = path.resolve()
        if path.is_file():
            module = _import_file(path)
            return Suite(path.stem, origin, _golden_dir_of(module, golden_dir, path.parent),
                         _specs_of(module, origin))
        if (path / "__init__.py").is_file():
            _on_sys_path(path.parent)
            package = importlib.import_module(path.name)
            where = _module_dir(package)
            if where is None or where.resolve() != path:
                raise SpecError(f"{origin}: importing {path.name!r} gives the package at "
                                f"{where}, not this directory: rename the directory")
            return Suite(path.name, origin, _golden_dir_of(package, golden_dir, path),
                         _specs_of(package, origin))
        _on_sys_path(path)
        modules = []
        for child in sorted(path.iterdir()):
            if _skipped(child.stem):
                continue
            if child.suffix == ".py" or (child / "__init__.py").is_file():
                modules.append(importlib.import_module(child.stem))
        specs = [s for m in modules for s in _specs_of(m, origin, required=False)]
    except SpecError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code: name the suite, keep its message
        raise SpecError(f"{origin} failed to import: {import_failure(exc)}") from exc
    if not specs:
        raise SpecError(f"{origin}: no module there defines SPECS (a list of OpSpec)")
    return Suite(path.name, origin, _golden_dir_of(None, golden_dir, path), specs)


def build_registry(sources: Sequence[str] = (), golden_dir: Path | None = None,
                   how: str = "--suite") -> Registry:
    """The registry of the built-in suite, every installed suite plugin and ``sources`` (its
    focus: what a selection without selectors runs), with every installed implementation
    plugin added; clashing op names are a SpecError."""
    reg = Registry()
    for suite in [builtin_suite(), *entry_point_suites()]:
        reg.add_suite(suite)
    for source in sources:
        suite = load_suite(source, golden_dir, how)
        ids = [id(s) for s in suite.specs]
        same = next((s for s in reg.suites.values() if [id(x) for x in s.specs] == ids), None)
        if same is None:
            reg.add_suite(suite)
        else:  # an installed plugin that the project file lists too (pip install -e .)
            if golden_dir is not None:
                same.golden_dir = golden_dir
            suite = same
        reg.focus.add(suite.name)
    add_entry_point_impls(reg)
    return reg


# ------------------------------------------------------------------------------- helpers
def _specs_of(obj: Any, origin: str, required: bool = True) -> list[OpSpec]:
    """``SPECS`` of a module; of every module of a package without its own, recursively
    (names starting with ``_`` or ``test`` left out); or what a callable returns (a list of
    OpSpec, or such a module)."""
    if callable(obj) and not isinstance(obj, ModuleType):
        try:
            obj = obj()
        except Exception as exc:
            raise SpecError(f"{origin}: calling it failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, ModuleType) and not hasattr(obj, "SPECS"):
        found = ([s for m in _walk(obj) for s in _specs_of(m, origin)]
                 if hasattr(obj, "__path__") else [])
        if not found and required:
            raise SpecError(f"{origin}: module {obj.__name__} defines no SPECS (a list of "
                            "OpSpec), nor does any module inside it")
        return found
    specs = getattr(obj, "SPECS", obj)
    if not isinstance(specs, Iterable) or isinstance(specs, (str, bytes)):
        raise SpecError(f"{origin} gives {type(specs).__name__}, not a list of OpSpec: expose "
                        "SPECS = [OpSpec(...), ...] or a function returning that list")
    specs = list(specs)
    wrong = [s for s in specs if not isinstance(s, OpSpec)]
    if wrong:
        raise SpecError(f"{origin}: SPECS holds {type(wrong[0]).__name__}, not OpSpec "
                        "(import it from harness.api)")
    return specs


def _walk(package: ModuleType) -> list[ModuleType]:
    """The modules inside a package that define SPECS, at any depth, in name order."""
    found = []
    for info in sorted(pkgutil.walk_packages(package.__path__, package.__name__ + "."),
                       key=lambda i: i.name):
        if any(_skipped(part) for part in info.name.split(".")[1:]):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "SPECS"):
            found.append(module)
    return found


def _skipped(name: str) -> bool:
    return name.startswith(("_", "test")) or name == "conftest"


def _golden_dir_of(module: ModuleType | None, listed: Path | None,
                   source: Path | None) -> Path | None:
    """A suite's golden directory: that of the project file listing it, else its module's
    ``GOLDEN_DIR``, else that of the project file governing its source (the suite's own
    repository), else ``golden/`` beside its source; None without a source (built-in)."""
    if listed is not None:
        return listed
    own = getattr(module, "GOLDEN_DIR", None) if module is not None else None
    if own:
        return Path(own)
    if source is None:
        return None
    from harness.core.project import ProjectError, find

    try:
        governing = find(source)
    except ProjectError as exc:
        raise SpecError(str(exc)) from exc
    if governing is not None and governing.golden_dir is not None:
        return governing.golden_dir
    return source / "golden"


def _module_dir(module: ModuleType) -> Path | None:
    if getattr(module, "__path__", None):  # a package: its own directory
        return Path(next(iter(module.__path__)))
    file = getattr(module, "__file__", None)
    return Path(file).parent if file else None


def _import_file(path: Path) -> ModuleType:
    """Import one file as the module named by its stem, its directory on ``sys.path``."""
    _on_sys_path(path.parent)
    existing = sys.modules.get(path.stem)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
        return existing
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"--suite {path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module


def _on_sys_path(directory: Path) -> None:
    text = str(directory)
    if text not in sys.path:
        sys.path.insert(0, text)


_REGISTRY: Registry | None = None
#: suites named by --suite or the project file, and the project's golden directory
_EXTRA_SUITES: tuple[tuple[str, ...], Any, str] = ((), None, "--suite")


def use_suites(sources: Sequence[str], golden_dir: Any = None, how: str = "--suite") -> None:
    """Load these suites (paths or module names) besides the built-in and installed ones,
    their goldens in ``golden_dir`` if given; ``how`` they were named ("--suite", "project
    file PATH") is their origin in ``harness list``. The next ``registry()`` call rebuilds
    the registry with them."""
    global _EXTRA_SUITES, _REGISTRY
    wanted = (tuple(sources), golden_dir, how)
    if wanted != _EXTRA_SUITES:
        _EXTRA_SUITES, _REGISTRY = wanted, None


def extra_suites() -> tuple[tuple[str, ...], Any, str]:
    """What ``use_suites`` was last given: (sources, golden_dir, how)."""
    return _EXTRA_SUITES


def registry(reload: bool = False) -> Registry:
    """The registry of every suite (built-in, installed, and those of ``use_suites``) and
    every entry-point implementation (built once)."""
    global _REGISTRY
    if _REGISTRY is None or reload:
        _REGISTRY = build_registry(*_EXTRA_SUITES)
    return _REGISTRY
