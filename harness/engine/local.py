"""Run an op's cases in this process at world size 1, with every check a run makes and no
timing: for a suite's own tests and for sizing tolerances (``harness tolerance``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core.results import CaseResult
from harness.core.spec import OpSpec, SpecError, load_callable
from harness.device import triton_impl

_WORLD: Any = None


def world() -> Any:
    """This process as a world of one rank on the CPU (MPI and torch.distributed set up once)."""
    global _WORLD
    if _WORLD is None:
        from harness.device.runtime import World

        _WORLD = World.from_mpi("cpu", timeout_s=120)
        triton_impl.configure_rank("cpu")  # before a Triton implementation is imported
    return _WORLD


def resolve(spec: OpSpec, impl: str | Callable[..., Any]) -> tuple[str, Callable[..., Any]]:
    """(name, callable) of an implementation or control of ``spec``, a ``module:callable``,
    or a callable."""
    if callable(impl):
        return getattr(impl, "__name__", "candidate"), impl
    known = spec.all_impls()
    if impl in known:
        return impl, known[impl]
    if ":" in impl:
        return impl, load_callable(impl)
    raise SpecError(f"{spec.name} has no implementation or control {impl!r}; it has "
                    f"{', '.join(known)} (or pass module:callable)")


def run_cases(spec: OpSpec, impl: str | Callable[..., Any], tier: str = "smoke",
              keep: Callable[[Any], bool] = lambda case: True) -> list[CaseResult]:
    """Every case of ``tier`` at world size 1 (those ``keep`` accepts) through the runner with
    ``impl``: the results say pass or fail and why, as a ``harness run`` would, without timing
    and without comparing with the stored goldens."""
    from harness.engine.runner import run_case

    name, fn = resolve(spec, impl)
    cases = [c for c in spec.cases(tier, 1) if keep(c)]
    return [run_case(world(), case, name, fn, bench=False) for case in cases]
