"""Run an op's cases in this process at world size 1, with every check a run makes and no
timing: for a suite's own tests and for sizing tolerances (``harness tolerance``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core.results import CaseResult
from harness.core.spec import OpSpec, SpecError, load_callable
from harness.device import process_state, triton_impl

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
    and without comparing with the stored goldens. Once a case taints this process (a
    flush-to-zero its threads keep, inference mode left on), the cases after it, here and in
    later calls, are skips saying so: a job would end there, this process cannot."""
    from harness.engine.runner import run_case

    name, fn = resolve(spec, impl)
    results = []
    for case in (c for c in spec.cases(tier, 1) if keep(c)):
        if process_state.tainted():
            # a job would end here and run the rest in new processes; this process cannot
            results.append(CaseResult(
                run_id="", case_id=case.id, op=spec.name, family=spec.family, impl=name,
                world_size=1, params=dict(case.params), status="skip", reason=TAINTED,
                device="cpu"))
            continue
        results.append(run_case(world(), case, name, fn, bench=False))
    return results


#: why a case is not run in a process an earlier case tainted
TAINTED = ("not run: an earlier case in this process left a setting that cannot be put back "
           "(flush-to-zero its threads keep, inference mode), so no later result here can be "
           "trusted; `harness run` runs each job's remaining cases in new processes")
