"""What an OpSpec's grid and tolerance must hold, checked where the spec is made (and a
tolerance function's answer where a case asks it): a mistake is one line naming the field,
not a TypeError from deep inside a run, nor a tolerance silently replaced by the default."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: what a parameter may be: it names the case in the history (``spec.case_id``) and travels
#: to the ranks as JSON
PARAM_TYPES = (bool, int, float, str, type(None))


@functools.cache
def constructors() -> dict[str, Callable[..., Any]]:
    """compare's constructors: a spec that names one without calling it gets a function of
    (params, world_size) that builds nonsense. (compare imports torch: read when a spec has
    a tolerance, not when harness starts, whose warm job would wait for it.)"""
    from harness.core import compare

    return {f.__name__: f for f in (compare.allclose, compare.exact, compare.ulp,
                                    compare.rounding, compare.rounded_near, compare.cos_diff,
                                    compare.rel_l2, compare.cos_diff_per_row, compare.all_of,
                                    compare.default_for)}


_PARAM_RULE = ("a parameter is a number, a string, a bool or None, or a list or tuple of "
               "them (it names the case in the history)")


def _param_problem(where: str, value: Any) -> str | None:
    if isinstance(value, PARAM_TYPES):
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _param_problem(f"{where}[{i}]", item)
            if problem:
                return problem
        return None
    why = (": a set has no order, so the case's id would change from one process to the "
           "next; use a tuple" if isinstance(value, (set, frozenset)) else "")
    return f"{where} is a {type(value).__name__}; {_PARAM_RULE}{why}"


def grid_problem(grid: Any) -> str | None:
    """Why ``grid`` is not {tier: [params, ...]} of plain parameters, or None."""
    if not isinstance(grid, Mapping):
        return (f"grid must be a dict of tiers, {{'smoke': [params, ...], 'nightly': [...]}}, "
                f"not a {type(grid).__name__}")
    for tier, cases in grid.items():
        if isinstance(cases, Mapping) or not isinstance(cases, Sequence) \
                or isinstance(cases, str):
            return (f"grid[{tier!r}] must be a list of parameter dicts, one per case, not a "
                    f"{type(cases).__name__}")
        for i, params in enumerate(cases):
            where = f"grid[{tier!r}][{i}]"
            if not isinstance(params, Mapping):
                return f"{where} must be a dict of parameters, not a {type(params).__name__}"
            for key, value in params.items():
                if not isinstance(key, str):
                    return f"{where} has a parameter named {key!r}: names are strings"
                problem = _param_problem(f"{where}[{key!r}]", value)
                if problem:
                    return problem
    return None


def tolerance_problem(tol: Any, outputs: Sequence[str], *, answer: bool = False) -> str | None:
    """Why ``tol`` is not a tolerance an op can have, or None: a ``compare.Tolerance``, a
    dict of them keyed by output (or ``OUTPUT:label``, an output's second reference), or
    (unless it is a tolerance function's ``answer``) a function of (params, world_size)
    returning one of those."""
    if tol is None:
        return None
    from harness.core import compare

    if isinstance(tol, compare.Tolerance):
        return None
    named = next((name for name, f in constructors().items() if tol is f), None)
    if named:
        return (f"tolerance={named} is the constructor, not a tolerance: call it "
                f"({named}(...))")
    if isinstance(tol, Mapping):
        for key, value in tol.items():
            base = key.split(":", 1)[0] if isinstance(key, str) else None
            if base not in outputs:
                return (f"the tolerance names {key!r}, which is not an output {tuple(outputs)}"
                        " (or an output's second reference, OUTPUT:label): a misspelt name "
                        "would leave its output to the dtype's default")
            if value is not None and not isinstance(value, compare.Tolerance):
                return (f"the tolerance of {key!r}: "
                        f"{tolerance_problem(value, outputs, answer=True)}")
        return None
    if callable(tol) and not answer:
        return None
    what = "its tolerance function returned" if answer else "got"
    return ("a tolerance is allclose(rtol=..., atol=...), exact(), ulp(n), cos_diff(bound)... "
            "from harness.api, a dict of them per output, or a function of (params, "
            f"world_size) returning one; {what} a {type(tol).__name__} ({tol!r:.60})")
