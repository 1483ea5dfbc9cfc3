"""The host side of every CUDA path, on a machine without a GPU: the driver's answers read with
every error kept (a stand-in driver plays the situations), launch dimensions, the NVRTC disk
cache that cannot be written, runtime headers of another CUDA major, the launch-bound verdict,
graph-mode eligibility, GPU free memory, the ranks' environment, the skip of a CUDA C++
implementation that cannot compile here, and the built-in launches against their kernels'
parameter lists (count and width, read off the PTX)."""

from __future__ import annotations

import os
import re
import sys
from enum import IntEnum
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.core import timing
from harness.device import cuda, cuda_compile, kernel_launch, memory
from harness.engine import rank_env

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_source import (  # noqa: E402
    builtin_cuda_impls,
    entry_instructions,
    needs_nvrtc,
    ptx_of,
)

ROOT = Path(__file__).parent.parent


# ---------------------------------------------------------------- a stand-in driver
class CUresult(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_UNKNOWN = 999
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101


class Attr(IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class Uuid:
    def __init__(self, raw: bytes):
        self.bytes = raw


class FakeDriver:
    """cuda.bindings.driver's shape (every call returns (CUresult, *values)), with the errors
    a test plants: {("uuid", 1): CUDA_ERROR_UNKNOWN} fails device 1's UUID query."""

    CUresult = CUresult
    CUdevice_attribute = Attr

    def __init__(self, count=2, init=CUresult.CUDA_SUCCESS, fail=None, modes=None):
        self.count, self.init, self.fail = count, init, fail or {}
        self.modes = modes or {}

    def _err(self, what, i):
        return self.fail.get((what, i), CUresult.CUDA_SUCCESS)

    def cuInit(self, flags):
        if isinstance(self.init, Exception):
            raise self.init
        return (self.init,)

    def cuGetErrorName(self, err):
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def cuDeviceGetCount(self):
        return self._err("count", None), self.count

    def cuDeviceGet(self, i):
        return self._err("get", i), i

    def cuDeviceGetUuid(self, dev):
        return self._err("uuid", dev), Uuid(bytes(range(dev, dev + 16)))

    def cuDeviceGetName(self, n, dev):
        return self._err("name", dev), b"NVIDIA H100 80GB HBM3\0\0\0"

    def cuDeviceGetAttribute(self, attr, dev):
        if attr == Attr.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
            return self._err("mode", dev), self.modes.get(dev, 0)
        major = attr == Attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        return CUresult.CUDA_SUCCESS, 9 if major else 0

    def cuDeviceTotalMem(self, dev):
        return CUresult.CUDA_SUCCESS, 80 * 2**30


def test_a_driver_whose_cuinit_fails_keeps_its_error():
    assert cuda.init_driver(FakeDriver()).module is not None
    no_gpu = cuda.init_driver(FakeDriver(init=CUresult.CUDA_ERROR_NO_DEVICE))
    assert (no_gpu.module, no_gpu.present, no_gpu.error) == (None, True, "")
    broken = cuda.init_driver(FakeDriver(init=CUresult.CUDA_ERROR_UNKNOWN))
    assert broken.module is None and broken.error == "cuInit failed with CUDA_ERROR_UNKNOWN"

    class FunctionNotFoundError(RuntimeError):
        pass

    class DynamicLibNotFoundError(RuntimeError):
        pass

    old = cuda.init_driver(FakeDriver(init=FunctionNotFoundError("function cuInit is not found")))
    assert old.present and "FunctionNotFoundError: function cuInit is not found" in old.error
    absent = cuda.init_driver(FakeDriver(init=DynamicLibNotFoundError("libcuda")))
    assert (absent.present, absent.error) == (False, "")


def test_device_records_check_every_query_and_keep_what_failed():
    records, errors = cuda.device_records(FakeDriver(count=3, modes={2: 3}))
    assert errors == [] and [r["index"] for r in records] == [0, 1, 2]
    assert records[0]["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert records[0]["name"] == "NVIDIA H100 80GB HBM3" and records[0]["capability"] == "9.0"
    assert [r["compute_mode"] for r in records] == ["default", "default", "exclusive_process"]
    # a device whose UUID the driver will not give cannot be told apart: out, and said
    records, errors = cuda.device_records(FakeDriver(
        count=3, fail={("uuid", 1): CUresult.CUDA_ERROR_UNKNOWN,
                       ("mode", 2): CUresult.CUDA_ERROR_INVALID_DEVICE}))
    assert [r["index"] for r in records] == [0, 2]
    assert errors == ["device 1 uuid: CUDA_ERROR_UNKNOWN",
                      "device 2 compute mode: CUDA_ERROR_INVALID_DEVICE"]
    assert records[1]["compute_mode"] == "unknown"
    records, errors = cuda.device_records(FakeDriver(fail={("count", None):
                                                           CUresult.CUDA_ERROR_UNKNOWN}))
    assert records == [] and errors == ["cuDeviceGetCount: CUDA_ERROR_UNKNOWN"]


def test_uuids_read_alike_from_the_driver_and_from_torch():
    raw = bytes.fromhex("5f1c2a7e0d3b4c9a8e7f6a5b4c3d2e1f")
    assert cuda.uuid_text(raw) == "GPU-5f1c2a7e-0d3b-4c9a-8e7f-6a5b4c3d2e1f"
    assert cuda.uuid_text("5f1c2a7e-0d3b-4c9a-8e7f-6a5b4c3d2e1f") == cuda.uuid_text(raw)
    assert cuda.uuid_text("MIG-1234") == "MIG-1234"


def test_nvml_counts_what_cuda_visible_devices_leaves(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cuda.nvml_gpu_count() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert cuda.nvml_gpu_count() == 0


# ---------------------------------------------------------------- launch set-up
def test_launch_dims_take_numpy_and_torch_integers_as_python_ints():
    assert kernel_launch.launch_dims(np.int64(4), "grid") == 4
    assert type(kernel_launch.launch_dims(np.int64(4), "grid")) is int
    assert kernel_launch.launch_dims((np.int32(2), 3, torch.tensor(5)), "grid") == (2, 3, 5)
    assert all(type(d) is int for d in kernel_launch.launch_dims([np.uint32(2), 3], "block"))
    for bad, why in ((2.0, "not an integer"), (True, "not an integer"), (-1, "negative"),
                     ((1, 1, 1, 1), "4 dims"), ("8", "not an integer"),
                     (np.float32(4), "not an integer")):
        with pytest.raises(kernel_launch.KernelArgumentError, match=why):
            kernel_launch.launch_dims(bad, "grid")


def test_the_launch_bound_verdict_and_graph_eligibility():
    assert timing.launch_bound(9_000, 10_000) and timing.launch_bound(12_000, 10_000)
    assert not timing.launch_bound(3_000, 10_000)
    assert not timing.launch_bound(None, 10_000) and not timing.launch_bound(5, None)
    assert "needs CUDA" in timing.graph_mode_refusal("cpu", False, "gloo")
    assert "gloo" in timing.graph_mode_refusal("cuda", True, "gloo")
    assert timing.graph_mode_refusal("cuda", True, "nccl") == ""
    assert timing.graph_mode_refusal("cuda", False, "gloo") == ""


def test_a_cpu_timing_reports_no_host_split():
    from harness.device.runtime import World

    stats = timing.time_call(lambda: None, World.from_mpi("cpu"), False,
                             timing.TimingConfig(warmup=1, min_repeats=3, max_repeats=3))
    assert stats["host_median"] is None and stats["launch_bound"] is False


def test_gpu_free_memory_counts_what_torchs_cache_holds_unused():
    # 45 GiB free to the driver, torch reserves 40 and uses 8: 77 GiB for a new tensor
    gib = 2**30
    assert memory.cuda_free_bytes(45 * gib, 40 * gib, 8 * gib) == 77 * gib
    assert memory.cuda_free_bytes(10, 0, 0) == 10


def test_the_ranks_run_with_mpichs_gpu_support_off_unless_the_user_says():
    env = rank_env.rank_environment({"PATH": "/bin"}, "r1")
    assert env["MPIR_CVAR_ENABLE_GPU"] == "0" and env["HARNESS_RUN_ID"] == "r1"
    assert rank_env.rank_environment({"MPIR_CVAR_ENABLE_GPU": "1"}, "r1")[
        "MPIR_CVAR_ENABLE_GPU"] == "1"


def test_relative_pythonpath_entries_reach_the_ranks_as_the_folders_the_user_meant(tmp_path):
    # the ranks start in the run's work folder, not where the user typed the command
    base = {"HARNESS_INVOKED_FROM": str(tmp_path),
            "PYTHONPATH": os.pathsep.join(["helpers", "/abs/site", "", "../up"])}
    got = rank_env.rank_environment(base, "r1")["PYTHONPATH"].split(os.pathsep)
    assert [os.path.normpath(p) for p in got] == [
        str(tmp_path / "helpers"), "/abs/site", str(tmp_path), str(tmp_path.parent / "up")]
    assert "PYTHONPATH" not in rank_env.rank_environment({"HARNESS_INVOKED_FROM": "/nowhere"},
                                                       "r1")


def test_a_cuda_kernel_that_cannot_compile_here_skips_naming_the_install(monkeypatch):
    impl = builtin_cuda_impls()["strided_copy@cuda"]
    monkeypatch.setattr(cuda, "run_problem", lambda: "NVRTC is not installed: pip install x")
    why = impl.skip_reason({"size": (4,), "stride": (1,)}, 1, torch.device("cuda", 0))
    assert why.startswith("strided_copy.cu is CUDA C++ and cannot be compiled here")
    assert "pip install x" in why


def test_run_problem_names_the_cuda_12_wheel_on_a_cuda_12_driver(monkeypatch):
    monkeypatch.setattr(cuda, "driver_api_version", lambda: 12040)
    monkeypatch.setattr(cuda, "nvrtc_version", lambda: "13.5")
    cuda.run_problem.cache_clear()
    try:
        assert "nvidia-cuda-nvrtc-cu12" in cuda.run_problem()
        monkeypatch.setattr(cuda, "driver_api_version", lambda: 13000)
        cuda.run_problem.cache_clear()
        assert cuda.run_problem() == cuda.nvrtc_missing()
    finally:
        cuda.run_problem.cache_clear()


# ---------------------------------------------------------------- headers and the disk cache
def test_runtime_headers_of_another_major_stay_off_nvrcs_include_path(tmp_path, monkeypatch):
    (tmp_path / "cuda_runtime_api.h").write_text("#pragma once\n#define CUDART_VERSION  12040\n")
    assert cuda_compile.cudart_version(tmp_path) == 12040
    assert cuda_compile.cudart_version(tmp_path / "none") is None
    monkeypatch.setattr(cuda_compile, "runtime_headers", lambda: (tmp_path, 12040))
    monkeypatch.setattr(cuda, "nvrtc_version", lambda: "13.5")
    assert cuda_compile._toolkit_include() is None
    monkeypatch.setattr(cuda_compile, "runtime_headers", lambda: (tmp_path, 13000))
    assert cuda_compile._toolkit_include() == tmp_path


SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


@needs_nvrtc
@pytest.mark.parametrize("spoil", ["a file", "entries a file"])
def test_an_unusable_disk_cache_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch,
                                                                      spoil):
    where = tmp_path / "cache"
    if spoil == "a file":
        where.write_text("not a directory")  # the constructor's mkdir fails
    else:
        where.mkdir()
        (where / "entries").write_text("")  # construction works, every write fails
    monkeypatch.setenv("HARNESS_CUDA_CACHE", str(where))
    monkeypatch.setattr(cuda_compile, "_MODULES", {})
    monkeypatch.setattr(cuda_compile, "_UNUSABLE_CACHES", set())
    with pytest.warns(RuntimeWarning, match="NVRTC disk cache .* is unusable"):
        module = cuda_compile.compile_source(SOURCE, filename="k.cu")
    assert module.cubin[:4] == b"\x7fELF" and not module.from_cache
    assert cuda_compile.compile_source(SOURCE, filename="k.cu") is module  # memory still caches


# ---------------------------------------------------------------- the built-in launches
def _entries(ptx: str) -> dict[str, list[int]]:
    """Each kernel's parameter widths in bytes, from its .entry declaration."""
    out = {}
    for name, params in re.findall(r"\.entry\s+(\w+)\(\s*(.*?)\)", ptx, re.DOTALL):
        widths = []
        for p in params.split(","):
            arr = re.search(r"\.b8\s+\w+\[(\d+)\]", p)
            kind = re.search(r"\.param\s+\.(?:[us](\d+)|[bf](\d+))", p)
            widths.append(int(arr.group(1)) if arr else int(next(
                g for g in kind.groups() if g)) // 8)
        out[name] = widths
    return out


class RecordingKernels:
    """A `kernels` stand-in that records each launch instead of making it."""

    sm_count = 132

    def __init__(self):
        self.launches = []

    def __getitem__(self, name):
        return lambda grid, block, args, shared_mem=0: self.launches.append((name, grid, block,
                                                                             args))

    def __getattr__(self, name):
        return self[name]


def _width(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return 8  # a pointer
    return int(np.dtype(type(arg)).itemsize)


@needs_nvrtc
def test_every_builtin_launch_passes_its_kernels_parameter_list(monkeypatch):
    from suites._collectives import common
    from suites._cuda import fp8_quant, strided_copy, tile_reduce

    monkeypatch.setattr(common, "gather_rows", lambda world, x: torch.stack([x] * world.size))
    world = type("W", (), {"size": 4})()
    kernels = RecordingKernels()
    storage = torch.zeros(64, dtype=torch.float32)
    strided_copy.launch_strided_copy(kernels, storage, (4, 8), (1, 4), 0, torch.empty(4, 8))
    strided_copy.launch_strided_copy_int32(kernels, storage.to(torch.int8), (8,), (2,), 1,
                                           torch.empty(8, dtype=torch.int8))
    fp8_quant.launch_quantize_per_token(kernels, torch.zeros(4, 256, dtype=torch.bfloat16),
                                        "e4m3", "token", False, None)
    tile_reduce.launch_allreduce_tile(kernels, world, torch.zeros(10), torch.empty(10), "sum")
    sources = {"strided_copy": "strided_copy.cu", "quantize": "fp8_quant.cu",
               "tile_reduce": "tile_reduce.cu"}
    entries = {}
    for src in set(sources.values()):
        entries.update(_entries(ptx_of(ROOT / "suites/_cuda" / src)))
    assert len(kernels.launches) == 4
    for name, grid, block, args in kernels.launches:
        assert name in entries, name
        assert [_width(a) for a in args] == entries[name], name
        assert kernel_launch.launch_dims(grid, "grid") and kernel_launch.launch_dims(block, "block")


@needs_nvrtc
def test_the_int32_control_clamps_every_read_into_the_storage():
    # the wrapped 32-bit position is bounded (two compare-and-select per element, UNROLL 4 a
    # thread) before the load in every entry, so the control reads wrong values, never
    # outside the storage (an illegal address would be sticky and end the process's cases)
    copy = entry_instructions(ptx_of(ROOT / "suites/_cuda/strided_copy.cu"))
    control = entry_instructions(ptx_of(ROOT / "suites/_cuda/strided_copy.cu", "-DINDEX_32BIT"))
    assert set(copy) == set(control) and len(copy) == 15
    for name in copy:
        assert control[name]["selp.b64"] - copy[name]["selp.b64"] >= 8, name
        assert control[name]["setp.lt.s64"] - copy[name]["setp.lt.s64"] >= 4, name


def test_the_results_table_marks_a_launch_bound_time(capsys):
    from harness.cli.show import print_results
    from harness.core.results import CaseResult

    def result(bound: bool, case: str) -> CaseResult:
        return CaseResult("r", case, "strided_copy", "strided_copy", "cuda", 1, {}, "pass",
                          timing={"median": 7_000.0, "launch_bound": bound})

    print_results([result(True, "strided_copy[a]"), result(False, "strided_copy[b]")])
    out = capsys.readouterr().out
    assert "7.0*" in out and out.count("7.0*") == 1
    assert "1 time(s) launch-bound" in out and "--timing-mode graph" in out
    print_results([result(False, "strided_copy[b]")])
    assert "launch-bound" not in capsys.readouterr().out


def test_gpus_come_from_torch_when_cuda_python_cannot_use_the_driver(monkeypatch):
    from harness.device.placement import GpuFacts

    from_torch = (GpuFacts("GPU-t0", "H100"),)
    monkeypatch.setattr(cuda, "torch_gpus", lambda: from_torch)
    # cuInit failed: the error is kept for harness env, the devices come from torch
    monkeypatch.setattr(cuda, "driver_state",
                        lambda: cuda.DriverState(None, True, "cuInit failed with X"))
    monkeypatch.setattr(cuda, "_device_records", lambda: ([], []))
    assert cuda.visible_gpus() == from_torch
    # the driver works but could not describe its devices: torch's list too
    monkeypatch.setattr(cuda, "driver_state", lambda: cuda.DriverState(object(), True))
    monkeypatch.setattr(cuda, "_device_records", lambda: ([], ["device 0 uuid: E"]))
    assert cuda.visible_gpus() == from_torch
    # the driver works and sees none: no GPU, torch is not asked
    monkeypatch.setattr(cuda, "_device_records", lambda: ([], []))
    assert cuda.visible_gpus() == ()
    record = {"index": 0, "uuid": "GPU-d0", "name": "H100",
              "compute_mode": "exclusive_process"}
    monkeypatch.setattr(cuda, "_device_records", lambda: ([record], []))
    assert cuda.visible_gpus() == (GpuFacts("GPU-d0", "H100", "exclusive_process", 0),)


def test_a_broken_cuda_context_is_read_off_a_probe_and_never_on_the_cpu():
    import torch

    from harness.device.runtime import broken_context

    calls = []

    def sticky(device):
        calls.append(device)
        raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                           "CUDA kernel errors might be asynchronously reported")

    assert broken_context(torch.device("cpu"), sticky) is None and calls == []
    gpu = torch.device("cuda", 0)
    assert broken_context(gpu, sticky) == "CUDA error: an illegal memory access was encountered"
    assert broken_context(gpu, lambda device: None) is None  # an error that was not sticky
    assert broken_context(gpu, lambda device: (_ for _ in ()).throw(RuntimeError())) == \
        "RuntimeError"


@pytest.mark.parametrize("error, broken", [
    # gloo's own words (torch 2.13's third_party/gloo/gloo/transport/tcp/pair.cc), as a
    # forked copy of a rank that ran a collective on the rank's sockets left them
    ("implementation raised RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/"
     "transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:58015.", True),
    ("implementation raised RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/"
     "transport/tcp/pair.cc:537] Read error [127.0.0.1]:4261: Connection reset by peer.", True),
    ("implementation raised DistBackendError: NCCL communicator was aborted on rank 1.", True),
    ("implementation raised ValueError: uneven splits are not supported", False),
    ("out: 3/1031 elements not bitwise equal", False),
    (None, False),
])
def test_a_broken_torch_distributed_connection_is_read_off_the_ranks_error(error, broken):
    from harness.device.runtime import broken_communicator

    assert (broken_communicator(error) is not None) is broken


def test_a_device_left_out_for_its_uuid_keeps_the_others_on_their_own_ordinals(monkeypatch):
    """The driver will not give device 1's UUID: devices 0 and 2 stay, and the rank that takes
    the second of them runs on cuda:2, the GPU whose UUID it reports, not on cuda:1."""
    from harness.device.placement import RankFacts, place

    drv = FakeDriver(count=3, fail={("uuid", 1): CUresult.CUDA_ERROR_UNKNOWN})
    monkeypatch.setattr(cuda, "_device_records", lambda: cuda.device_records(drv))
    seen = cuda.visible_gpus()
    assert [g.index for g in seen] == [0, 2]
    facts = [RankFacts("a", i, seen, "2.13.0+cu130", "13.0") for i in range(2)]
    got = [place("auto", facts, r) for r in range(2)]
    assert [p.device for p in got] == ["cuda:0", "cuda:2"]
    assert got[1].gpu_uuid == seen[1].uuid and got[1].backend == "nccl"
