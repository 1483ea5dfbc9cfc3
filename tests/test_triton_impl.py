"""Triton implementations (harness.triton_impl, suites/_triton/): the decisions as plain
functions, every built-in kernel and control through Triton's interpreter in this process,
and the README's example through a real `harness run` with `--impl path.py:fn`, beside a wrong
kernel of the kind a new user writes."""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import triton_impl
from harness.spec import SpecError, load_callable

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: "
                                  "pip install -e '.[triton]'")

#: op -> (its Triton implementation, its Triton controls)
BUILT_IN = {
    "hopper_tasks.rmsnorm": ("triton", ["triton_eps_outside_rsqrt"]),
    "hopper_tasks.silu_mul": ("triton", ["triton_tail_mask_off_by_one"]),
    "hopper_tasks.embedding": ("triton", ["triton_zero_id_as_padding"]),
    "hopper_tasks.argmax": ("triton", ["triton_no_chunk_offset"]),
    "fp8_gemm.quantize": ("triton", ["triton_tail_mask_off_by_one"]),
    "moe.permute": ("triton", ["triton_tail_mask_off_by_one"]),
    "strided_copy": ("triton", ["triton_int32_index"]),
    "allreduce": ("tile_triton", ["tile_triton_partials_in_bf16"]),
}


def test_a_cpu_rank_interprets_and_a_gpu_rank_compiles_unless_asked():
    assert triton_impl.interprets("cpu", {})
    assert triton_impl.interprets("meta", {})
    assert not triton_impl.interprets("cuda", {})
    assert triton_impl.interprets("cuda", {"TRITON_INTERPRET": "1"})  # debugging on a GPU
    assert not triton_impl.interprets("cuda", {"TRITON_INTERPRET": "0"})
    env: dict[str, str] = {}
    triton_impl.configure_rank("cuda", env)
    assert env == {}  # a GPU rank's environment gets nothing
    triton_impl.configure_rank("cpu", env)
    assert env == {"TRITON_INTERPRET": "1"}


def test_only_triton_implementations_are_marked_interpreted():
    def plain_torch(x):
        return x

    impl = triton_impl.TritonImplementation("suites._triton.hopper:rmsnorm")
    assert triton_impl.interpreter_of(impl, "cpu", {}) == "triton"
    assert triton_impl.interpreter_of(impl, "cuda", {}) == ""
    assert triton_impl.interpreter_of(plain_torch, "cpu", {}) == ""
    # a CPU run plans them only when asked for; a GPU run always
    assert not impl.runs_on("cpu") and impl.runs_on("cuda")


def test_without_triton_an_implementation_is_a_skip_naming_the_install(tmp_path, monkeypatch):
    module = tmp_path / "needs_triton_kernels.py"
    module.write_text("import triton.no_such_part\n\ndef fn(x):\n    return x\n")
    impl = load_callable(f"{module}:fn")
    assert isinstance(impl, triton_impl.MissingTriton)
    assert "pip install -e '.[triton]'" in impl.skip_reason({}, 1, "cpu")
    monkeypatch.setattr(triton_impl, "available", lambda: False)
    built_in = triton_impl.TritonImplementation("suites._triton.hopper:rmsnorm")
    assert "triton is not installed: pip install" in built_in.skip_reason({}, 1, "cpu")


def test_an_impl_path_that_is_wrong_says_what_to_fix(tmp_path):
    with pytest.raises(SpecError, match="no file"):
        load_callable(f"{tmp_path}/missing.py:fn")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(SpecError, match="failed to import .*boom"):
        load_callable(f"{broken}:fn")


@needs_triton
@pytest.mark.parametrize("op", sorted(BUILT_IN))
def test_every_built_in_kernel_passes_and_its_control_fails_interpreted(op):
    from harness.local import run_cases
    from harness.spec import registry

    spec = registry().specs[op]
    impl, controls = BUILT_IN[op]
    results = run_cases(spec, impl)
    assert {r.status for r in results} <= {"pass", "skip"}, [
        (r.case_id, r.reason) for r in results if r.status not in ("pass", "skip")]
    ran = [r for r in results if r.status == "pass"]
    assert ran and all(r.interpreter == "triton" for r in ran)
    assert set(controls) == {c for c in spec.negative_controls if "triton" in c}
    for control in controls:
        statuses = [r.status for r in run_cases(spec, control)]
        if op in ("strided_copy", "allreduce"):
            # int32 wraps only past 2**31 (the stress tier's cases), and one rank has no
            # partial results to round: tests/test_cli_integration.py runs those
            assert "fail" not in statuses
        else:
            assert "fail" in statuses, (op, control, statuses)
        assert "error" not in statuses, (op, control, statuses)


def _run(tmp_path: Path, impl: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = subprocess.run([sys.executable, "-m", "harness", "run", "hopper_tasks.rmsnorm",
                          "--impl", impl, "--world-sizes", "1", "--db", str(tmp_path / "h.db")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    conn = sqlite3.connect(tmp_path / "h.db")
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT case_id, status, reason, record FROM results")]
    return out, rows


@needs_triton
@pytest.mark.mpi
def test_the_readme_example_passes_and_a_wrong_kernel_fails_through_harness_run(tmp_path):
    example = ROOT / "examples" / "triton_rmsnorm" / "rmsnorm.py"
    out, rows = _run(tmp_path, f"{example}:rmsnorm")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(rows) == 3 and {r["status"] for r in rows} == {"pass"}
    assert all('"interpreter": "triton"' in r["record"] for r in rows)
    assert "i 3 time(s) of Triton kernels run by Triton's interpreter" in out.stdout
    # a new user's slip: eps added outside the rsqrt, relative path from where harness runs
    wrong = tmp_path / "wrong_rmsnorm.py"
    wrong.write_text(example.read_text().replace(
        "tl.math.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)",
        "tl.math.rsqrt(tl.sum(x * x, axis=0) / hidden) + eps"))
    (tmp_path / "h.db").unlink()
    out, rows = _run(tmp_path, "wrong_rmsnorm.py:rmsnorm")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    failed = [r for r in rows if r["status"] == "fail"]
    assert [r["case_id"] for r in failed] == ["hopper_tasks.rmsnorm[b=3,hidden=256,rows=zero]"]
    assert "FAIL w1 hopper_tasks.rmsnorm[b=3,hidden=256,rows=zero]" in out.stdout
