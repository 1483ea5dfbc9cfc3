"""The GPU bring-up checklist and the `harness run` blockers, driven through the situations a
site can be in (bringup works on plain facts: no GPU is needed to judge one)."""

from __future__ import annotations

import pytest

from harness.device import bringup
from harness.device.bringup import SiteFacts, checklist, run_blockers, worst
from harness.device.placement import GpuFacts

H100 = "NVIDIA H100 80GB HBM3"


def gpus(n: int, mode: str = "default") -> tuple[GpuFacts, ...]:
    return tuple(GpuFacts(f"GPU-{i:08d}-0000-0000-0000-000000000000", H100, mode)
                 for i in range(n))


def healthy(**changes) -> SiteFacts:
    """An 8-GPU Hopper node with CUDA 13 everywhere: the reference good site."""
    base = dict(torch_version="2.13.0+cu130", torch_cuda="13.0", torch_gpu_count=8,
                bindings_version="13.4.4", driver_present=True, driver_version=13000,
                gpus=gpus(8), nvrtc_version="13.5", headers_version=13000,
                headers_path="/usr/local/cuda-13.0/include", shm_bytes=64 << 30,
                nccl_version="2.27.5", mpi_library="MPICH Version: 5.0.2", mpi_gpu=False,
                launcher="/usr/bin/mpiexec", triton=True)
    base.update(changes)
    return SiteFacts(**base)


def levels(facts: SiteFacts) -> dict[str, str]:
    return {c.name: c.level for c in checklist(facts)}


def test_a_healthy_gpu_node_passes_every_check():
    checks = checklist(healthy())
    assert worst(checks) == "ok", [c.line() for c in checks]
    assert run_blockers(healthy(), "auto", [1, 4, 8]) == []
    assert "8 x NVIDIA H100" in next(c.detail for c in checks if c.name == "GPUs")


def test_a_cpu_machine_is_notes_not_problems():
    cpu = SiteFacts(torch_version="2.13.0+cpu", bindings_version="13.4.4", nvrtc_version="13.5",
                    shm_bytes=24 << 30, mpi_library="MPICH", launcher="/x/mpiexec")
    assert worst(checklist(cpu)) == "note"
    assert run_blockers(cpu, "auto", [1, 4, 8]) == []


@pytest.mark.parametrize("listed", [True, False], ids=["driver-lists-gpus", "nvml-only"])
def test_a_cpu_only_torch_on_a_gpu_host_is_a_blocker_naming_the_build(listed):
    facts = healthy(torch_version="2.13.0+cpu", torch_cuda=None, torch_gpu_count=None,
                    gpus=gpus(8) if listed else (), nvml_gpu_count=0 if listed else 8)
    assert levels(facts)["torch"] == "blocker"
    (line,) = run_blockers(facts, "auto", [1])
    assert "torch 2.13.0+cpu is a CPU-only build but 8 GPU(s)" in line
    assert "--device cpu" in line
    assert run_blockers(facts, "cpu", [1, 4, 8]) == []


def test_an_old_driver_with_cuda_python_13_warns_and_names_the_cuda_12_install():
    # R550 (CUDA 12.4): cuda-bindings 13 documents R580+; torch cu126 still sees the GPUs
    facts = healthy(driver_version=12040, torch_version="2.13.0+cu126", torch_cuda="12.6")
    checks = {c.name: c for c in checklist(facts)}
    assert checks["CUDA driver"].level == "warn"
    assert "cuda-bindings 13.4.4 needs a CUDA 13 driver" in checks["CUDA driver"].detail
    assert "nvidia-cuda-nvrtc-cu12" in checks["CUDA driver"].detail
    # both NVRTC wheels installed, cuda-python loads 13's: the remedy removes it first
    assert "pip uninstall -y nvidia-cuda-nvrtc &&" in checks["CUDA driver"].detail
    assert checks["NVRTC"].level == "warn"
    assert "cannot load" in checks["NVRTC"].detail and "cu12" in checks["NVRTC"].detail
    assert run_blockers(facts, "auto", [1, 4, 8]) == []  # torch runs; CUDA C++ skips


def test_a_driver_cuda_python_cannot_use_keeps_its_error_and_falls_back_to_torch():
    facts = healthy(driver_error="cuInit failed with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
                    bindings_version="12.9.4", driver_version=12040, torch_cuda="12.6",
                    nvrtc_version="12.9")
    check = next(c for c in checklist(facts) if c.name == "CUDA driver")
    assert check.level == "warn" and "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" in check.detail
    assert "devices are taken from torch" in check.detail
    alone = healthy(driver_error="cuInit failed with CUDA_ERROR_UNKNOWN", gpus=(),
                    torch_gpu_count=0)
    assert levels(alone)["CUDA driver"] == "blocker"


def test_a_torch_newer_than_the_driver_sees_no_gpu_and_says_why():
    facts = healthy(driver_version=12040, bindings_version="12.9.4", torch_gpu_count=0,
                    nvrtc_version="12.9", headers_version=12090)
    check = next(c for c in checklist(facts) if c.name == "torch")
    assert check.level == "blocker" and "CUDA 13.0 is newer than the driver's CUDA 12.4" in \
        check.detail
    assert run_blockers(facts, "auto", [1]) == [check.detail]


@pytest.mark.parametrize("driver,install", [(13000, "nvidia-cuda-nvrtc>=13"),
                                            (12080, "nvidia-cuda-nvrtc-cu12"),
                                            (None, "nvidia-cuda-nvrtc>=13")])
def test_no_nvrtc_names_the_wheel_of_the_drivers_cuda_major(driver, install):
    problem = bringup.nvrtc_problem(None, driver)
    assert "NVRTC is not installed" in problem and install in problem


def test_nvrtc_of_the_drivers_major_or_older_is_fine():
    assert bringup.nvrtc_problem("12.9", 12040) == ""
    assert bringup.nvrtc_problem("12.9", 13000) == ""
    assert bringup.nvrtc_problem("13.0", None) == ""


def test_runtime_headers_of_another_major_are_a_warning():
    facts = healthy(headers_version=12040, headers_path="/usr/local/cuda-12.4/include")
    check = next(c for c in checklist(facts) if c.name == "CUDA headers")
    assert check.level == "warn" and "CUDA 12.4" in check.detail
    assert bringup.headers_problem("13.5", 13000) == ""
    assert bringup.headers_problem("13.5", None) == ""


def test_exclusive_compute_mode_blocks_world_sizes_that_share_a_gpu():
    facts = healthy(gpus=gpus(1, "exclusive_process"), torch_gpu_count=1)
    assert levels(facts)["GPU 0 compute mode"] == "warn"
    (line,) = run_blockers(facts, "auto", [1, 4, 8])
    assert "world size 4 puts several ranks on a GPU" in line and "MPS" in line
    assert run_blockers(facts, "auto", [1]) == []
    assert run_blockers(healthy(gpus=gpus(1, "exclusive_process"), torch_gpu_count=1,
                                mps=True), "auto", [1, 4, 8]) == []
    eight = healthy(gpus=gpus(8, "exclusive_process"))
    assert run_blockers(eight, "auto", [1, 4, 8]) == []


def test_a_prohibited_gpu_is_a_blocker():
    facts = healthy(gpus=(*gpus(7), GpuFacts("GPU-x", H100, "prohibited")))
    assert levels(facts)["GPU 7 compute mode"] == "blocker"
    (line,) = run_blockers(facts, "auto", [1])
    assert "prohibited compute mode" in line


@pytest.mark.parametrize("shm,disabled,level", [(64 << 20, False, "blocker"),
                                                (64 << 20, True, "warn"),
                                                (512 << 20, False, "warn"),
                                                (1 << 30, False, "ok")])
def test_a_small_dev_shm_is_judged_for_nccl(shm, disabled, level):
    facts = healthy(shm_bytes=shm, nccl_shm_disabled=disabled)
    assert levels(facts)["/dev/shm"] == level
    blockers = run_blockers(facts, "auto", [1, 4, 8])
    assert bool(blockers) == (level == "blocker")
    if blockers:
        assert "--shm-size=1g" in blockers[0]
    # one rank, or one GPU, needs no shared memory between GPUs
    assert run_blockers(facts, "auto", [1]) == []
    assert levels(healthy(shm_bytes=shm, gpus=gpus(1), torch_gpu_count=1))["/dev/shm"] == "ok"


def test_a_gpu_enabled_mpich_is_reported_with_what_the_ranks_run_with():
    assert "MPIR_CVAR_ENABLE_GPU=0" in next(
        c.detail for c in checklist(healthy(mpi_gpu=True)) if c.name == "MPI")
    forced = next(c for c in checklist(healthy(mpi_gpu=True, mpich_gpu_setting="1"))
                  if c.name == "MPI")
    assert forced.level == "warn" and "context on every visible GPU" in forced.detail


def test_no_launcher_and_failed_device_queries_are_said():
    facts = healthy(launcher=None, gpu_errors=("device 3 uuid: CUDA_ERROR_UNKNOWN",))
    checks = checklist(facts)
    assert levels(facts)["MPI launcher"] == "blocker"
    assert any(c.name == "GPU query" and "CUDA_ERROR_UNKNOWN" in c.detail for c in checks)
    assert worst(checks) == "blocker"


def test_versions_read_in_every_spelling():
    assert bringup.version_major("13.5") == 13 and bringup.version_major(12040) == 12
    assert bringup.version_major("12.4.1") == 12 and bringup.version_major(None) is None
    assert bringup.fmt_api_version(12040) == "12.4" and bringup.fmt_api_version(13000) == "13.0"


def test_the_timing_line_says_how_many_ranks_are_timed_fully():
    assert "timing" not in levels(healthy())  # CPUs unknown: no claim
    node = {c.name: c for c in checklist(healthy(cpus=64))}["timing"]
    assert node.level == "ok" and "up to 8 rank(s)" in node.detail
    assert "with --device cpu, up to 64" in node.detail
    small = SiteFacts(torch_version="2.13.0+cpu", launcher="/x/mpiexec", cpus=2)
    line = {c.name: c for c in checklist(small)}["timing"]
    assert line.level == "note" and line.detail.startswith("2 CPUs: up to 2 rank(s)")
    assert "token timed call" in line.detail and "--bench" in line.detail
    few_cpus = {c.name: c for c in checklist(healthy(cpus=4))}["timing"]
    assert few_cpus.level == "note" and "up to 4 rank(s)" in few_cpus.detail


def test_triton_on_a_gpu_host_is_judged_and_on_a_cpu_not_at_all():
    from harness.device import triton_impl

    assert levels(healthy())["Triton"] == "ok"
    assert levels(healthy(triton=False))["Triton"] == "note"
    problem = triton_impl.driver_problem(triton_impl.DriverFacts(
        compiler=None, python_include="/usr/include/python3.12", python_h=False,
        libcuda_dirs=(), ldconfig_error="", cache_dir="/ro/.triton/cache",
        cache_writable=False))
    check = next(c for c in checklist(healthy(triton_problem=problem)) if c.name == "Triton")
    assert check.level == "warn"
    for needle in ("no C compiler", "Python.h", "libcuda.so.1", "TRITON_CACHE_DIR", "skip"):
        assert needle in check.detail, needle
    cpu = SiteFacts(torch_version="2.13.0+cpu", triton=True, triton_problem=problem)
    assert "Triton" not in levels(cpu)  # the interpreter builds nothing
