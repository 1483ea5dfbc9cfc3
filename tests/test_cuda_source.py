"""CUDA C++ implementations on a machine without a GPU: every built-in kernel compiles for sm_90
with NVRTC (the ``nvidia-cuda-nvrtc`` wheel), compile errors name the file and line, the cache
works, the launch descriptions' host logic is right, and a CUDA implementation is left out of a
CPU run or skips with its reason. The kernels themselves run in tests/test_cuda_gpu.py, on a GPU.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.core.discovery import registry
from harness.core.spec import SpecError, load_callable
from harness.device import cuda, cuda_compile, kernel_launch
from harness.device.cuda_impl import CudaSourceImplementation, load

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "cuda_embedding"
needs_nvrtc = pytest.mark.skipif(cuda.nvrtc_missing() is not None,
                                 reason=f"no NVRTC here: {cuda.nvrtc_missing()}")


def builtin_cuda_impls() -> dict[str, CudaSourceImplementation]:
    """Every CUDA C++ implementation and control the suites register, as op@name."""
    return {f"{spec.name}@{name}": fn for spec in registry().specs.values()
            for name, fn in spec.all_impls().items()
            if isinstance(fn, CudaSourceImplementation)}


#: the kernels each built-in launch description launches (all must be in the cubin)
_COPIES = [f"strided_copy_{unit}_{index}" for unit in (1, 2, 4, 8, 16)
           for index in ("ii", "il", "ll")]
KERNELS = {
    "strided_copy@cuda": _COPIES,
    "strided_copy@cuda_int32_index": _COPIES,
    "fp8_gemm.quantize@cuda": ["quantize_1x128_e4m3", "quantize_1x128_e5m2"],
    "allreduce@tile_cuda": [f"tile_reduce_{t}" for t in ("f32", "bf16", "f16", "i32")],
}


def elf_symbols(cubin: bytes) -> set[str]:
    """Names in a cubin's string tables (an ELF file): its kernels' names among them."""
    return {s.decode(errors="replace") for s in cubin.split(b"\0") if s}


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A disk cache of this test's own, and an empty in-memory one."""
    monkeypatch.setenv("HARNESS_CUDA_CACHE", str(tmp_path / "nvrtc"))
    monkeypatch.setattr(cuda_compile, "_MODULES", {})
    return tmp_path / "nvrtc"


def test_the_suites_register_the_three_builtin_cuda_kernels_and_their_control():
    assert set(builtin_cuda_impls()) == set(KERNELS)


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_builtin_kernel_compiles_for_sm_90(name, private_cache):
    impl = builtin_cuda_impls()[name]
    module = impl.compile("sm_90")
    assert module.arch == "sm_90" and not module.from_cache
    assert module.cubin[:4] == b"\x7fELF"  # a cubin, machine code for sm_90
    symbols = elf_symbols(module.cubin)
    missing = [k for k in KERNELS[name] if k not in symbols]
    assert not missing, f"{impl.source.name} lacks the kernels {missing} its launch uses"


@needs_nvrtc
def test_the_int32_control_compiles_to_different_code_from_the_same_source(private_cache):
    impls = builtin_cuda_impls()
    good, control = impls["strided_copy@cuda"], impls["strided_copy@cuda_int32_index"]
    assert good.source == control.source
    assert control.options == {"define_macro": "INDEX_32BIT"}
    assert good.compile().cubin != control.compile().cubin


@needs_nvrtc
def test_a_compile_error_names_the_file_and_line_and_keeps_the_log(tmp_path, private_cache):
    src = tmp_path / "broken.cu"
    src.write_text('extern "C" __global__ void k(float* x) {\n'
                   "  x[0] = 1.0f\n"          # line 2: the missing semicolon
                   "}\n")
    impl = CudaSourceImplementation(src, lambda kernels: None)
    with pytest.raises(cuda.CudaCompileError) as info:
        impl.compile("sm_90")
    err = info.value
    assert err.headline.startswith((f"{src}:3: error:", f"{src}:2: error:"))
    assert "expected a \";\"" in err.headline
    assert "1 error detected" in err.log and str(src) in err.log
    # str() carries the log too: a case whose kernel fails to compile keeps it in its reason
    assert str(err).splitlines()[0] == err.headline and "NVRTC log:" in str(err)
    assert "1 error detected" in str(err)


@needs_nvrtc
def test_compiled_modules_are_cached_in_memory_and_on_disk_by_source_options_and_headers(
        tmp_path, private_cache):
    (tmp_path / "scale.h").write_text('#include "sub/base.h"\n#define FACTOR 2.0f\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.h").write_text("#define BASE 1\n")
    src = tmp_path / "scale.cu"
    src.write_text('#include "scale.h"\n'
                   'extern "C" __global__ void scale(float* x, long long n) {\n'
                   "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                   "  if (i < n) x[i] *= FACTOR;\n}\n")
    impl = CudaSourceImplementation(src, lambda kernels: None)
    first = impl.compile()
    assert not first.from_cache and "scale" in elf_symbols(first.cubin)
    assert impl.compile() is first  # the same object: this process's cache
    cuda_compile._MODULES.clear()  # a new process: the disk cache answers
    again = impl.compile()
    assert again.from_cache and again.cubin == first.cubin and again.key == first.key
    assert any(private_cache.rglob("*"))
    # an edited header, other options or another architecture is another module
    (tmp_path / "scale.h").write_text('#include "sub/base.h"\n#define FACTOR 3.0f\n')
    edited = impl.compile()
    assert edited.key != first.key and not edited.from_cache
    assert edited.cubin != first.cubin
    (tmp_path / "sub" / "base.h").write_text("#define BASE 2\n")  # a nested header too
    assert impl.compile().key != edited.key
    other = CudaSourceImplementation(src, lambda kernels: None, options={"ftz": True})
    assert other.compile().key != edited.key
    assert impl.compile("sm_80").key != edited.key


@needs_nvrtc
def test_template_kernels_compile_through_name_expressions(tmp_path, private_cache):
    src = tmp_path / "t.cu"
    src.write_text("template <typename T> __global__ void fill(T* x, T v) { x[0] = v; }\n")
    impl = CudaSourceImplementation(src, lambda kernels: None,
                                    name_expressions=("fill<float>", "fill<int>"))
    module = impl.compile()
    assert set(module.symbol_mapping) == {"fill<float>", "fill<int>"}
    assert all(v in elf_symbols(module.cubin) for v in module.symbol_mapping.values())
    cuda_compile._MODULES.clear()  # the lowered names survive the disk cache
    assert impl.compile().symbol_mapping == module.symbol_mapping


def test_kernel_arguments_refuse_ambiguous_python_scalars_and_tensors_elsewhere():
    import numpy as np

    gpu = torch.device("cuda", 0)
    with pytest.raises(kernel_launch.KernelArgumentError,
                       match=r"argument 1: a Python int .*np.int64"):
        kernel_launch.kernel_arguments("k", [np.int64(3), 3], gpu)
    with pytest.raises(kernel_launch.KernelArgumentError, match=r"Python float .*np.float32"):
        kernel_launch.kernel_arguments("k", [2.5], gpu)
    with pytest.raises(kernel_launch.KernelArgumentError, match=r"tensor on cpu.*\.to\('cuda:0'\)"):
        kernel_launch.kernel_arguments("k", [torch.zeros(2)], gpu)
    cpu = torch.zeros(4)
    args = kernel_launch.kernel_arguments("k", [cpu, np.int32(7), np.float32(0.5)],
                                          torch.device("cpu"))
    assert args[0] == cpu.data_ptr() and type(args[1]) is np.int32


# ---------------------------------------------------------------- the launch descriptions
def _smoke_params(op: str) -> list[dict]:
    return registry().specs[op].grid["smoke"]


def positions(size, stride, offset) -> torch.Tensor:
    """The storage position each element of the view reads, row-major, in int64."""
    at = torch.full([*size], offset, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = n
        at = at + torch.arange(n, dtype=torch.int64).view(shape) * s
    return at.reshape(-1)


@pytest.mark.parametrize("tier", ["smoke", "nightly", "stress"])
def test_merged_dims_describe_the_same_view(tier):
    from suites._cuda.strided_copy import MAX_DIMS, merge_dims

    merged_any = False
    for p in registry().specs["strided_copy"].grid[tier]:
        size, stride = list(p["size"]), list(p["stride"])
        sizes, strides = merge_dims(size, stride)
        assert math.prod(sizes) == math.prod(size) and len(sizes) <= MAX_DIMS
        merged_any |= len(sizes) < len(size)
        if math.prod(size) > 1 << 22:
            continue
        got = positions(sizes, strides, p["offset"])
        assert torch.equal(got, positions(size, stride, p["offset"])), p
    assert merged_any or tier == "stress"


def test_unsupported_cases_are_skips_with_a_reason_and_the_rest_run():
    impls = builtin_cuda_impls()
    gpu = torch.device("cuda", 0)
    quant = impls["fp8_gemm.quantize@cuda"]
    reasons = {p["granularity"] + ("-static" if p.get("static") else ""):
               quant.skip_reason(p, 1, gpu) for p in _smoke_params("fp8_gemm.quantize")}
    assert reasons["token"] is None
    assert "per token" in reasons["tensor"] and "per token" in reasons["block"]
    assert "per token" in reasons["tensor-static"]
    tile = impls["allreduce@tile_cuda"]
    assert all(tile.skip_reason(p, 4, gpu) is None for p in _smoke_params("allreduce"))
    assert "reduces" in tile.skip_reason({"dtype": "f64"}, 4, gpu)
    copy = impls["strided_copy@cuda"]
    contiguous9 = {"size": (2,) * 9, "stride": tuple(2 ** i for i in reversed(range(9)))}
    assert copy.skip_reason(contiguous9, 1, gpu) is None  # merges into one dim
    nine = {"size": (2,) * 9, "stride": tuple(4 ** i for i in range(9))}
    assert "9 dims" in copy.skip_reason(nine, 1, gpu)
    # on the CPU every case is a skip that says why
    why = copy.skip_reason(_smoke_params("strided_copy")[0], 1, torch.device("cpu"))
    assert "needs a CUDA device" in why and "cpu" in why


def test_a_cpu_plan_leaves_cuda_implementations_out_unless_asked_for():
    reg = registry()
    cpu = {i.impl for i in reg.plan("smoke", 1, ["strided_copy"], (), "cpu")}
    gpu = {i.impl for i in reg.plan("smoke", 1, ["strided_copy"], (), "cuda")}
    asked = {i.impl for i in reg.plan("smoke", 1, ["strided_copy"], ["cuda"], "cpu")}
    # (Triton kernels compile on a GPU, and are interpreted on the CPU when asked for)
    assert cpu == {"torch"} and gpu == {"torch", "cuda", "triton"} and asked == {"cuda"}
    tiles = {i.impl for i in reg.plan("smoke", 4, ["allreduce"], (), "cuda")}
    assert "tile_cuda" in tiles


# ---------------------------------------------------------------- --impl path.cu:launch
def test_a_cu_reference_loads_its_launch_description_from_the_py_beside_it(tmp_path):
    impl = load_callable(f"{EXAMPLE / 'embedding.cu'}:launch_embedding")
    assert isinstance(impl, CudaSourceImplementation)
    assert impl.source == (EXAMPLE / "embedding.cu").resolve()
    assert impl.launch.__name__ == "launch_embedding"
    (tmp_path / "k.cu").write_text("")
    for ref, needle in [(f"{tmp_path}/none.cu:f", "no file"),
                        (f"{tmp_path}/k.cu:f", "no launch description"),
                        (f"{EXAMPLE}/embedding.cu:nothing", "defines no function 'nothing'"),
                        (f"{EXAMPLE}/embedding.cu:", "not of the form")]:
        with pytest.raises(SpecError, match=needle):
            load_callable(ref)


def test_relative_cu_paths_resolve_against_where_harness_was_started(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a rank runs in the run directory ...
    monkeypatch.setenv("HARNESS_INVOKED_FROM", str(ROOT))  # ... the launcher says from where
    impl = load("examples/cuda_embedding/embedding.cu:launch_embedding")
    assert impl.source == (EXAMPLE / "embedding.cu").resolve()


def harness_cli(tmp_path, *args):
    env = {**os.environ, "HARNESS_DB": str(tmp_path / "h.db"),
           "HARNESS_CUDA_CACHE": str(tmp_path / "nvrtc")}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@needs_nvrtc
def test_harness_run_stops_on_a_compile_error_before_any_rank_starts(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k() {\n  int x = ;\n}\n')
    (tmp_path / "k.py").write_text("def launch(kernels, x):\n    return x\n")
    out = harness_cli(tmp_path, "run", "hopper_tasks.identity", "--world-sizes", "1",
                      "--impl", "k.cu:launch")
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --impl k.cu:launch: ")
    assert f"{tmp_path}/k.cu:2: error: expected an expression" in lines[-1]
    assert "NVRTC log:" in out.stderr and "int x = ;" in out.stderr
    assert not (tmp_path / "harness-results" / "runs").exists() or \
        not any((tmp_path / "harness-results" / "runs").iterdir())


def test_registering_the_cuda_implementations_touches_nothing_of_cuda():
    # (torch itself imports cuda.bindings; cuda.core and the driver are ours to leave alone)
    code = ("import sys, harness, harness.device.cuda_impl\n"
            "from harness.device import cuda\n"
            "from harness.core.discovery import registry\n"
            "registry().plan('smoke', 1, ['strided_copy'], ['cuda'], 'cpu')\n"
            "print(sorted(m for m in sys.modules if m.startswith('cuda.core')),\n"
            "      cuda.driver_state.cache_info().currsize)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] 0"


@needs_nvrtc
def test_the_guide_example_compiles_for_sm_90(private_cache):
    impl = load_callable(f"{EXAMPLE / 'embedding.cu'}:launch_embedding")
    assert "embedding" in elf_symbols(impl.compile("sm_90").cubin)


def ptx_of(path: Path, *options: str) -> str:
    """PTX of a source for compute_90, through NVRTC directly (cuda.core's PTX target asks the
    driver whether it could load the result, and there is no driver here)."""
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(path.read_bytes(), path.name.encode(), 0, [], [])
    assert err == ok
    flags = [b"--gpu-architecture=compute_90", b"-std=c++17", *(o.encode() for o in options)]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
    assert err == ok, err
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    (err,) = nvrtc.nvrtcGetPTX(prog, buf)
    nvrtc.nvrtcDestroyProgram(prog)
    return buf.decode(errors="replace")


def ptxas_report(path: Path, *options: str) -> dict[str, dict[str, int]]:
    """What ptxas says of each kernel compiled for sm_90 (NVRTC's --ptxas-options=-v): its
    registers and its stack frame in bytes."""
    import re

    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(path.read_bytes(), path.name.encode(), 0, [], [])
    flags = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--ptxas-options=-v",
             *(o.encode() for o in options)]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(prog)
    text = log.decode(errors="replace")
    out = {}
    for name, body in re.findall(r"entry function '(\w+)'(.*?)(?=entry function|\Z)", text,
                                 re.DOTALL):
        out[name] = {"stack": int(re.search(r"(\d+) bytes stack frame", body).group(1)),
                     "registers": int(re.search(r"Used (\d+) registers", body).group(1))}
    return out


def entry_instructions(ptx: str) -> dict[str, dict[str, int]]:
    """instructions() of each kernel (.entry) of a PTX, by name."""
    import re

    return {part.split("(")[0]: instructions(part) for part in re.split(r"\.entry\s+", ptx)[1:]}


def instructions(ptx: str) -> dict[str, int]:
    import collections
    import re

    return collections.Counter(re.findall(r"^\s+([a-z]+\.[\w.]+)", ptx, re.MULTILINE))


@needs_nvrtc
def test_the_kernels_round_as_their_references_do():
    """What no CPU run can show, read off the PTX: the FP8 casts saturate and round to nearest
    even, divisions are IEEE (x / s as torch computes it), the 16-bit stores round to nearest
    even, and the int32 control's source positions are 32-bit where the kernel's are 64."""
    quant = instructions(ptx_of(ROOT / "suites/_cuda/fp8_quant.cu"))
    assert quant["cvt.rn.satfinite.e4m3x2.f32"] and quant["cvt.rn.satfinite.e5m2x2.f32"]
    assert quant["div.rn.f32"] and not any(i.startswith(("div.approx", "div.full"))
                                           for i in quant)
    tile = instructions(ptx_of(ROOT / "suites/_cuda/tile_reduce.cu"))
    assert tile["cvt.rn.bf16.f32"] and tile["cvt.rn.f16.f32"] and tile["div.rn.f32"]
    # the positions of the entries for large views (il, ll): 64-bit multiplies in the kernel,
    # 32-bit in the control (8 dims x UNROLL 4 a thread)
    copy = entry_instructions(ptx_of(ROOT / "suites/_cuda/strided_copy.cu"))
    control = entry_instructions(ptx_of(ROOT / "suites/_cuda/strided_copy.cu", "-DINDEX_32BIT"))
    wide = [name for name in copy if name.endswith(("_il", "_ll"))]
    assert len(wide) == 10
    for name in wide:
        assert copy[name]["mul.lo.s64"] - control[name]["mul.lo.s64"] >= 32, name
        assert control[name]["mad.lo.s32"] >= 28, name
    # the 32-bit division by magic numbers (a multiply-high) below 2**31 elements
    assert all(copy[name]["mul.hi.u32"] >= 32 for name in copy if not name.endswith("_ll"))


@needs_nvrtc
def test_the_strided_copy_runs_at_full_occupancy_without_a_stack_frame():
    """What the copy's speed rests on, read off ptxas: no kernel keeps its dims in local
    memory (a stack frame: arrays indexed at run time), and the entries of views below 2**31
    elements use at most 32 registers, so 2048 threads fit an SM (its 64K registers)."""
    for options in ((), ("-DINDEX_32BIT",)):
        report = ptxas_report(ROOT / "suites/_cuda/strided_copy.cu", *options)
        assert len(report) == 15, sorted(report)
        for name, used in report.items():
            assert used["stack"] == 0, (name, used, options)
            assert name.endswith("_ll") or used["registers"] <= 32, (name, used, options)


def test_a_package_registers_a_cuda_kernel_through_the_entry_point(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "vendorkern-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendorkern\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[harness.implementations]\nvendor_cuda = vendorkern:implementations\n")
    (site / "vendorkern.py").write_text(
        "from harness.device.cuda_impl import from_source\n"
        f"from importlib import util\n"
        f"spec = util.spec_from_file_location('emb', {str(EXAMPLE / 'embedding.py')!r})\n"
        "emb = util.module_from_spec(spec); spec.loader.exec_module(emb)\n"
        "def implementations():\n"
        f"    return {{'hopper_tasks.embedding': from_source({str(EXAMPLE / 'embedding.cu')!r},"
        " emb.launch_embedding)}\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        reg = registry(reload=True)
        impl = reg.specs["hopper_tasks.embedding"].implementations["vendor_cuda"]
        assert isinstance(impl, CudaSourceImplementation)
        on_cpu = {i.impl for i in reg.plan("smoke", 1, ["hopper_tasks.embedding"], (), "cpu")}
        on_gpu = {i.impl for i in reg.plan("smoke", 1, ["hopper_tasks.embedding"], (), "cuda")}
        assert on_cpu == {"torch"} and on_gpu == {"torch", "vendor_cuda", "triton"}
    finally:
        monkeypatch.undo()
        registry(reload=True)


@needs_nvrtc
def test_a_hopper_only_kernel_compiles_for_sm_90a(tmp_path, private_cache):
    from harness.device.cuda_impl import cuda_launch

    src = tmp_path / "fence.cu"  # wgmma.fence exists on sm_90a only
    src.write_text('extern "C" __global__ void k() {\n'
                   '  asm volatile("wgmma.fence.sync.aligned;");\n}\n')

    @cuda_launch(arch_suffix="a")
    def launch(kernels):
        return None

    assert CudaSourceImplementation(src, launch).compile("sm_90").arch == "sm_90a"
    with pytest.raises(cuda.CudaCompileError):  # the same source without the suffix
        CudaSourceImplementation(src, lambda kernels: None).compile("sm_90")
