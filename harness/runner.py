"""run_case: inputs -> implementation -> compare -> time -> CaseResult.

Every rank calls ``run_case`` for the same case in the same order. The verdict is reached
collectively (metrics of all ranks merged on rank 0 and broadcast), so every rank agrees on
pass or fail and pytest's ``-x`` stops all ranks at the same item. Only rank 0 returns the full
``CaseResult``; the others return one with the same status.
"""

from __future__ import annotations

import hashlib
import resource
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness import compare
from harness.results import CaseResult
from harness.runtime import World
from harness.spec import Case
from harness.timing import TimingConfig, derived, time_call


class CaseError(Exception):
    """The implementation broke a contract (raised, wrong output type, clobbered an input)."""


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def normalize_outputs(value: Any, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """An implementation's return value as {output name: tensor}."""
    if isinstance(value, torch.Tensor):
        return {names[0]: value}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise CaseError(f"returned {len(value)} outputs, expected {len(names)} {names}")
        return dict(zip(names, value, strict=True))
    raise CaseError(f"returned a {type(value).__name__}; expected a tensor, tuple or dict")


def tolerances(case: Case, expected: Mapping[str, torch.Tensor]) -> dict[str, compare.Tolerance]:
    """The tolerance of each output: the spec's (fixed, per output, or a function of the case),
    else the dtype's default."""
    tol = case.spec.tolerance
    if callable(tol) and not isinstance(tol, compare.Tolerance):
        tol = tol(case.params, case.world_size)
    out = {}
    for name, exp in expected.items():
        if isinstance(tol, compare.Tolerance):
            out[name] = tol
        elif isinstance(tol, Mapping) and name in tol:
            out[name] = tol[name]
        else:
            out[name] = compare.default_for(exp.dtype)
    return out


def _expected(case: Case, rank: int) -> dict[str, torch.Tensor]:
    spec = case.spec
    if spec.expected is not None:
        value = spec.expected(case.params, rank, case.world_size)
    else:
        value = spec.reference(**spec.make_inputs(case.params, rank, case.world_size))
    return normalize_outputs(value, spec.outputs)


def _hash(outputs: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(outputs):
        t = outputs[name]
        if isinstance(t, torch.Tensor):
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _peak_memory(world: World) -> tuple[int | None, str | None]:
    if world.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(world.device)), "cuda_max_allocated"
    # best effort on the CPU: the process's resident high-water mark, not this case's own peak
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "cpu_process_maxrss"


def run_case(
    world: World,
    case: Case,
    impl_name: str,
    impl: Callable[..., Any],
    *,
    run_id: str = "",
    bench: bool = True,
    timing: TimingConfig | None = None,
    env_id: str = "",
) -> CaseResult:
    """Run, check and time one implementation on one case, on every rank."""
    spec = case.spec
    started = time.time()
    t0 = time.perf_counter()
    result = CaseResult(
        run_id=run_id, case_id=case.id, op=spec.name, family=spec.family, impl=impl_name,
        world_size=case.world_size, params=dict(case.params), status="pass",
        device=str(world.device), backend=world.backend if spec.distributed else None,
        started_at=started, env_id=env_id,
    )
    local_error = ""
    outputs: dict[str, torch.Tensor] = {}
    metrics: dict[str, dict[str, Any]] = {}
    inputs: dict[str, Any] = {}
    if world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(world.device)
    try:
        inputs = {k: _to_device(v, world.device)
                  for k, v in spec.make_inputs(case.params, world.rank, case.world_size).items()}
        writable = set(spec.inplace_inputs) if case.params.get("inplace") else set()
        guards = {k: v.clone() for k, v in inputs.items()
                  if isinstance(v, torch.Tensor) and k not in writable}
        try:
            raw = impl(world, **inputs) if spec.distributed else impl(**inputs)
            world.synchronize()
        except Exception as exc:
            raise CaseError(f"implementation raised {type(exc).__name__}: {exc}") from exc
        outputs = normalize_outputs(raw, spec.outputs)
        for k, before in guards.items():
            if not torch.equal(inputs[k], before):
                raise CaseError(f"input {k!r} was modified, but this case may not write it")
        if writable:
            first_in = inputs[spec.inplace_inputs[0]]
            first_out = outputs.get(spec.outputs[0])
            aliased = isinstance(first_out, torch.Tensor) and (
                first_out.data_ptr() == first_in.data_ptr())
            if not aliased:
                raise CaseError(f"in-place case: output {spec.outputs[0]!r} does not alias input "
                                f"{spec.inplace_inputs[0]!r}")
        expected = _expected(case, world.rank)
        missing = set(expected) - set(outputs)
        if missing:
            raise CaseError(f"missing outputs {sorted(missing)}")
        for name, tol in tolerances(case, expected).items():
            m = compare.measure(outputs[name], expected[name], tol, rank=world.rank)
            metrics[name] = {"metrics": m.to_dict(), "tolerance": tol.to_dict()}
    except CaseError as exc:
        local_error = str(exc)
    except Exception as exc:  # a bug in the spec or harness: say where
        local_error = f"harness error {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"

    # ---- collective verdict: every rank learns the same status
    gathered = world.comm.gather((local_error, metrics), root=0) if world.size > 1 else [
        (local_error, metrics)]
    verdict: tuple[str, str, dict[str, Any], int] | None = None
    if world.rank == 0:
        verdict = _judge(gathered, case)
    if world.size > 1:
        verdict = world.comm.bcast(verdict, root=0)
    assert verdict is not None
    result.status, result.reason, result.outputs, result.wrong = verdict

    # ---- output hash of every rank's outputs, in rank order
    if result.status in ("pass", "fail") and outputs:
        digest = _hash(outputs)
        digests = world.comm.gather(digest, root=0) if world.size > 1 else [digest]
        if world.rank == 0:
            result.output_hash = hashlib.sha256("".join(digests).encode()).hexdigest()

    # ---- timing, only of implementations that are correct
    if bench and result.status == "pass":
        cfg = timing or TimingConfig()
        call = (lambda: impl(world, **inputs)) if spec.distributed else (lambda: impl(**inputs))
        try:
            result.timing = time_call(call, world, spec.distributed, cfg)
        except Exception as exc:
            result.status, result.reason = "error", f"failed while timing: {exc}"
        if result.timing and spec.work is not None:
            result.derived = derived(spec.work(case.params, case.world_size),
                                     result.timing.get("median"))
    peak, kind = _peak_memory(world)
    if world.size > 1:
        peak = world.comm.reduce(peak, op=_mpi_max(), root=0)
    result.peak_memory_bytes, result.peak_memory_kind = peak, kind
    result.duration_s = time.perf_counter() - t0
    return result


def _mpi_max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _judge(gathered: list[tuple[str, dict[str, Any]]], case: Case
           ) -> tuple[str, str, dict[str, Any], int]:
    """Merge every rank's metrics into (status, reason, outputs, #wrong)."""
    errors = [(r, e) for r, (e, _) in enumerate(gathered) if e]
    if errors:
        rank, msg = errors[0]
        more = f" (and {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
        return "error", f"rank {rank}: {msg}{more}", {}, 0
    outputs: dict[str, Any] = {}
    reasons: list[str] = []
    wrong = 0
    names = list(gathered[0][1])
    for name in names:
        tol_dict = gathered[0][1][name]["tolerance"]
        tol = compare.Tolerance.from_dict(tol_dict)
        merged = compare.Metrics.merge(
            [compare.Metrics.from_dict(m[name]["metrics"]) for _, m in gathered])
        ok, why = compare.verdict(merged, tol)
        wrong += merged.n_mismatch
        outputs[name] = {"metrics": merged.to_dict(), "tolerance": tol_dict, "passed": ok}
        if not ok:
            reasons.append(f"{name}: {why}")
    status = "pass" if not reasons else "fail"
    return status, "; ".join(reasons), outputs, wrong
