"""Smoke cases picked by their params, and one implementation's status on one of them
through the real runner (every check, in process, world size 1)."""

from __future__ import annotations

from collections.abc import Callable

from harness.core.discovery import registry
from harness.core.spec import Case
from harness.device.runtime import World
from harness.engine.runner import run_case


def smoke_case(op: str, **match) -> dict:
    """The first smoke case of ``op`` whose params include ``match``."""
    return next(p for p in registry().specs[op].grid["smoke"]
                if all(p.get(k) == v for k, v in match.items()))


def status(world: World, op: str, params: dict, impl: Callable) -> str:
    spec = registry().specs[op]
    return run_case(world, Case(spec, params, 1), "candidate", impl, bench=False).status
