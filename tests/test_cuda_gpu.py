"""The CUDA C++ implementations on a real GPU: each built-in kernel against its op's reference
(the same checks as every implementation, through `harness run --device cuda`), the int32
control failing past 2**31, CUDA-graph timing of a kernel launched through cuda.core, and the
example of docs/cuda-and-triton.md. Skipped, with the reason, on a machine without a GPU or
NVRTC."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.device import cuda, kernel_launch

ROOT = Path(__file__).parent.parent
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(cuda.nvrtc_missing() is not None,
                       reason=f"needs NVRTC: {cuda.nvrtc_missing()}"),
]


def harness(tmp_path: Path, *args: str, timeout: float = 1800):
    env = {**os.environ, "HARNESS_DB": str(tmp_path / "h.db"),
           "HARNESS_CUDA_CACHE": str(tmp_path / "nvrtc")}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def results(tmp_path: Path) -> list[dict]:
    with sqlite3.connect(tmp_path / "h.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT case_id, impl, world_size, status, reason, record FROM results")]


def test_builtin_kernels_match_their_references(tmp_path):
    out = harness(tmp_path, "run", "strided_copy", "fp8_gemm.quantize", "--device", "cuda",
                  "--world-sizes", "1", "--impl", "cuda", "--no-bench")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rows = results(tmp_path)
    copy = [r for r in rows if r["case_id"].startswith("strided_copy[")]
    quant = [r for r in rows if r["case_id"].startswith("fp8_gemm.quantize[")]
    assert copy and all(r["status"] == "pass" for r in copy)
    token = [r for r in quant if "granularity=token" in r["case_id"]]
    assert token and all(r["status"] == "pass" for r in token)
    others = [r for r in quant if "granularity=token" not in r["case_id"]]
    assert all(r["status"] == "skip" and "per token" in r["reason"] for r in others)


def test_tile_allreduce_on_the_gpu_at_1_and_4_ranks(tmp_path):
    out = harness(tmp_path, "run", "allreduce", "--device", "cuda", "--world-sizes", "1,4",
                  "--impl", "tile_cuda", "--no-bench")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rows = results(tmp_path)
    assert {r["world_size"] for r in rows} == {1, 4}
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"]


def test_the_int32_control_fails_only_past_2_31(tmp_path):
    out = harness(tmp_path, "run", "strided_copy", "--tier", "stress", "--device", "cuda",
                  "--world-sizes", "1", "--impl", "cuda", "--impl", "cuda_int32_index",
                  "--no-bench")
    rows = {(r["case_id"], r["impl"]): r for r in results(tmp_path)}
    good = [r for (c, i), r in rows.items() if i == "cuda"]
    assert all(r["status"] in ("pass", "skip") for r in good), good
    ran = [c for (c, i), r in rows.items() if i == "cuda" and r["status"] == "pass"]
    if not ran:
        pytest.skip("this GPU holds none of the stress cases")
    assert out.returncode == 1  # the control
    for case in ran:
        assert rows[(case, "cuda_int32_index")]["status"] == "fail", case


def test_graph_timing_captures_a_kernel_launched_through_cuda_core(tmp_path):
    out = harness(tmp_path, "run", "strided_copy[*dtype=f32*]", "--device", "cuda",
                  "--world-sizes", "1", "--impl", "cuda", "--timing-mode", "graph")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    timed = [json.loads(r["record"])["timing"] for r in results(tmp_path)
             if r["status"] == "pass"]
    assert timed and all(t.get("mode") == "graph" for t in timed), timed[:1]


def test_the_guide_example_runs(tmp_path):
    out = harness(tmp_path, "run", "hopper_tasks.embedding", "--device", "cuda",
                  "--world-sizes", "1",
                  "--impl", "examples/cuda_embedding/embedding.cu:launch_embedding")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert all(r["status"] == "pass" for r in results(tmp_path))


def test_a_python_int_argument_is_refused_on_the_gpu(tmp_path):
    from harness.device.cuda_impl import CudaSourceImplementation

    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x, long long n) {}\n')
    x = torch.zeros(4, device="cuda")
    impl = CudaSourceImplementation(src, lambda kernels, x: kernels.k(1, 32, (x, x.numel())))
    with pytest.raises(kernel_launch.KernelArgumentError, match="Python int"):
        impl(x=x)


def _faulting_kernel(tmp_path: Path) -> str:
    """A CUDA C++ strided_copy that writes to an address no allocation holds."""
    (tmp_path / "fault.cu").write_text(
        'extern "C" __global__ void fault(float* out) {\n'
        "  ((float*)8)[threadIdx.x] = out[0];  // an address no allocation holds\n}\n")
    (tmp_path / "fault.py").write_text(
        "def launch(kernels, storage, size, stride, offset, out):\n"
        "    kernels.fault(grid=1, block=32, args=(out,))\n"
        "    return out\n")
    return f"{tmp_path / 'fault.cu'}:launch"


_FAULT_SELECTORS = ["strided_copy[dtype=f32,*,view=contiguous]",
                    "strided_copy[dtype=f32,*,view=transpose]"]


def test_a_kernel_that_faults_costs_its_own_case_only(tmp_path):
    """A write to an illegal address leaves a sticky error in the process's CUDA context: the
    job ends after that case and the rest (the torch cases too) run in a new process."""
    out = harness(tmp_path, "run", *_FAULT_SELECTORS, "--device", "cuda", "--world-sizes", "1",
                  "--impl", "torch", "--impl", _faulting_kernel(tmp_path), "--no-bench")
    rows = results(tmp_path)
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr[-4000:]
    faults = [r for r in rows if r["impl"] != "torch"]
    assert len(faults) == 2 and len(rows) == 4, rows
    for r in faults:
        assert r["status"] == "error" and "unusable" in r["reason"], r
    assert all(r["status"] == "pass" for r in rows if r["impl"] == "torch"), rows


def test_sanitize_names_the_faulting_kernel(tmp_path):
    from harness.device import sanitizer

    if sanitizer.find() is None:
        pytest.skip("no compute-sanitizer (CUDA toolkit) on this machine")
    out = harness(tmp_path, "run", _FAULT_SELECTORS[0], "--device", "cuda", "--world-sizes",
                  "1", "--impl", "torch", "--impl", _faulting_kernel(tmp_path), "--sanitize")
    rows = results(tmp_path)
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr[-4000:]
    (fault,) = [r for r in rows if r["impl"] != "torch"]
    assert fault["status"] == "error", fault
    assert "compute-sanitizer: Invalid __global__ write" in fault["reason"], fault["reason"]
    assert " in fault" in fault["reason"], fault["reason"]
    assert all(r["status"] == "pass" for r in rows if r["impl"] == "torch"), rows
