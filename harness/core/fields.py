"""The fields a run record and a case result must hold for the history DB, the reports and
the exports to use them: each field's kind, checked on the JSON object before a
``RunInfo`` or ``CaseResult`` is made of it (a file ingested with ``"started_at":
"yesterday"`` was stored, and every later report of the DB failed on it)."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone
from typing import Any

from harness.core import results as results_mod
from harness.core.results import CaseResult, RunInfo


def is_int(v: Any) -> bool:  # what an SQL INTEGER holds
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _is_num(v: Any) -> bool:
    return is_int(v) or isinstance(v, float)


def _is_text(v: Any) -> bool:  # a lone surrogate (JSON's "\\ud800") cannot be stored
    try:
        return isinstance(v, str) and v.encode("utf-8") is not None
    except UnicodeEncodeError:
        return False


def _is_time(v: Any) -> bool:
    try:
        return _is_num(v) and math.isfinite(v) and bool(datetime.fromtimestamp(v, timezone.utc))
    except (OverflowError, OSError, ValueError):
        return False


#: kind of a field: its check and how a message names it; "?" after a kind allows null
_KINDS: dict[str, tuple[Any, str]] = {
    "str": (_is_text, "a string"),
    "id": (lambda v: _is_text(v) and v != "", "a non-empty string"),
    "int": (is_int, "an integer"),
    "size": (lambda v: is_int(v) and v >= 1, "a positive integer"),
    "num": (lambda v: _is_num(v) and math.isfinite(v), "a finite number"),
    "stat": (_is_num, "a number"),
    "time": (_is_time, "a Unix time in seconds"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "strs": (lambda v: isinstance(v, list) and all(map(_is_text, v)), "a list of strings"),
    "sizes": (lambda v: isinstance(v, list) and all(map(_KINDS["size"][0], v)),
              "a list of positive integers"),
    "stats": (lambda v: isinstance(v, list) and all(map(_KINDS["num"][0], v)),
              "a list of finite numbers"),
    "dicts": (lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
              "an object of objects"),
    "nums": (lambda v: isinstance(v, dict) and all(x is None or _is_num(x) for x in v.values()),
             "an object of numbers"),
    "status": (lambda v: v in results_mod.STATUSES, "one of " + ", ".join(results_mod.STATUSES)),
}  # fmt: skip
#: what the store, reports and exports rely on, by dataclass; nested objects by "name."
_FIELDS: dict[Any, dict[str, str]] = {
    RunInfo: {
        "run_id": "id", "started_at": "time", "tier": "str", "world_sizes": "sizes",
        "machine": "dict", "env": "dict", "finished_at": "time?", "selectors": "strs",
        "impls": "strs", "argv": "strs", "git_commit": "str?", "options": "dict",
        "status": "str", "schema": "int",
        "machine.fingerprint": "id", "machine.hostname": "str?", "machine.name": "str?",
    },
    CaseResult: {
        "run_id": "id", "case_id": "id", "op": "str", "family": "str", "impl": "str",
        "world_size": "size", "params": "dict", "status": "status", "reason": "str",
        "outputs": "dicts", "wrong": "int", "timing": "dict?", "derived": "nums",
        "peak_memory_bytes": "int?", "peak_memory_kind": "str?", "checks": "strs",
        "output_hash": "str?", "golden": "dict?", "device": "str", "interpreter": "str",
        "backend": "str?", "started_at": "num", "duration_s": "num", "env_id": "str",
        "schema": "int",
        **{f"timing.{k}": "stat?" for k in ("median", "p10", "p90", "min", "mean", "std",
                                            "max")},
        "timing.n": "int?", "timing.samples": "stats", "timing.iterations": "int?",
    },
}  # fmt: skip


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def problem(data: Any, cls: Any) -> str | None:
    """What makes ``data`` (one JSON object) no ``cls`` (RunInfo or CaseResult) the store,
    reports and exports can use, or None: a missing field, or one of the wrong kind."""
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string", type(None): "null"}.get(type(data), "a value")
        return f"it is {kind} ({shown(data)}), not a JSON object"
    for f in dataclasses.fields(cls):
        if f.name not in data and f.default is f.default_factory is dataclasses.MISSING:
            return f"field {f.name!r} is missing"
    for name, kind in _FIELDS[cls].items():
        outer, _, inner = name.rpartition(".")
        holder = data.get(outer) if outer else data
        if not isinstance(holder, dict) or inner not in holder:
            continue
        value = holder[inner]
        check, label = _KINDS[kind.rstrip("?")]
        if isinstance(value, str) and not _is_text(value):
            label = "text that UTF-8 can hold (a lone surrogate cannot be stored)"
        if not (kind.endswith("?") and value is None) and not check(value):
            return (f"field {name!r} is {shown(value)}, not {label}"
                    + (" or null" if kind.endswith("?") else ""))
    return None
