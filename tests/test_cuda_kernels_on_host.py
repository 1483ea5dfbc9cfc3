"""The built-in strided-copy kernel's index arithmetic run on the CPU: strided_copy.cu compiled
as host C++ (a prelude stands in for blockIdx, threadIdx, __ldg and uint4; the threads of the
grid run one after another, which a kernel whose threads write disjoint outputs allows), then
launched through its own launch description (suites/_cuda/strided_copy.py) on every smoke and
every small nightly view, bitwise against torch. What only a GPU shows (coalescing, the
16-byte loads' alignment faults, speed) stays in tests/test_cuda_gpu.py.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.core.discovery import registry
from suites._cuda.strided_copy import launch_strided_copy, launch_strided_copy_int32

ROOT = Path(__file__).parent.parent
SOURCE = ROOT / "suites" / "_cuda" / "strided_copy.cu"
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) to build the "
                                "kernel for the host: apt-get install g++")

PRELUDE = r"""
#include <cstdint>
struct uint4 { unsigned int x, y, z, w; };
struct dim3_ { unsigned int x; };
static dim3_ blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
// CUDA's __umulhi: the most significant 32 bits of the 64-bit product
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
"""

TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long",
         16: "uint4"}
ENTRIES = [f"strided_copy_{unit}_{index}" for unit in TYPES for index in ("ii", "il", "ll")]


def driver() -> str:
    """run_grid(entry, ...): every thread of the grid, one after another, of entry number
    ``entry`` (ENTRIES' order)."""
    calls = "\n".join(
        f"        case {k}: {name}(({TYPES[int(name.split('_')[2])]}*)out, "
        f"(const {TYPES[int(name.split('_')[2])]}*)src, numel, storage_numel, offset, CALL); "
        "break;" for k, name in enumerate(ENTRIES))
    return r"""
typedef long long i64;
#define ARGS i64 n0, i64 n1, i64 n2, i64 n3, i64 n4, i64 n5, i64 n6, i64 n7, i64 s0, i64 s1, \
  i64 s2, i64 s3, i64 s4, i64 s5, i64 s6, i64 s7, i64 m0, i64 m1, i64 m2, i64 m3, i64 m4, \
  i64 m5, i64 m6, i64 m7, int ndim, int tail
#define CALL n0, n1, n2, n3, n4, n5, n6, n7, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, \
  m4, m5, m6, m7, ndim, tail
extern "C" int run_grid(int entry, unsigned grid, unsigned block, void* out, const void* src,
                        i64 numel, i64 storage_numel, i64 offset, ARGS) {
  gridDim.x = grid; blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t) {
      blockIdx.x = b; threadIdx.x = t;
      switch (entry) {
""" + calls + r"""
        default: return 1;
      }
    }
  return 0;
}
"""


def build(tmp: Path, *defines: str, source: Path = SOURCE) -> ctypes.CDLL:
    src = tmp / "host.cpp"
    src.write_text(PRELUDE + source.read_text() + driver())
    lib = tmp / f"host{''.join(defines)}.so"
    subprocess.run([CXX, "-O2", "-shared", "-fPIC", "-std=c++17", *defines, str(src), "-o",
                    str(lib)], check=True, capture_output=True, text=True)
    so = ctypes.CDLL(str(lib))
    so.run_grid.restype = ctypes.c_int
    return so


class HostKernels:
    """What a launch description gets as ``kernels``, launching the host build: each launch
    runs the whole grid, as kernel_launch.launch would (a grid of 0 launches nothing). A
    unit's pointers must be aligned to its size, as the GPU's vector loads and stores need
    (a misaligned one is a sticky "misaligned address" fault there)."""

    sm_count = 1  # few blocks: every thread walks the grid-stride loop several times

    def __init__(self, so: ctypes.CDLL) -> None:
        self.so, self.launches = so, []

    def __getitem__(self, name: str):
        unit = int(name.split("_")[2])

        def launcher(grid: int, block: int, args) -> None:
            self.launches.append((name, grid, block))
            if grid == 0:
                return
            out, src, *rest = args
            assert all(isinstance(v, (np.int64, np.int32)) for v in rest)  # as the GPU needs
            offset = int(rest[2])
            assert out.data_ptr() % unit == 0, (name, out.data_ptr())
            assert (src.data_ptr() + offset * unit) % unit == 0, (name, src.data_ptr())
            c_args = [ctypes.c_int64(int(v)) for v in rest[:-2]] + [
                ctypes.c_int(int(v)) for v in rest[-2:]]
            rc = self.so.run_grid(ENTRIES.index(name), grid, block,
                                  ctypes.c_void_p(out.data_ptr()),
                                  ctypes.c_void_p(src.data_ptr()), *c_args)
            assert rc == 0

        return launcher


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host_kernel")
    return {"cuda": build(tmp), "cuda_int32_index": build(tmp, "-DINDEX_32BIT")}


def views(tier: str, limit: int) -> list[dict]:
    from suites.strided_copy import _storage_len

    return [p for p in registry().specs["strided_copy"].grid[tier]
            if _storage_len(p) <= limit]


def run(so: ctypes.CDLL, launch, storage: torch.Tensor, p: dict) -> torch.Tensor:
    out = torch.empty(tuple(p["size"]), dtype=storage.dtype)
    out.reshape(-1).view(torch.uint8).fill_(0xA5)  # poisoned: a byte the kernel skips shows
    kernels = HostKernels(so)
    got = launch(kernels, storage, tuple(p["size"]), tuple(p["stride"]),
                             p["offset"], out)
    assert got is out
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("tier,limit", [("smoke", 1 << 22), ("nightly", 1 << 21)])
def test_the_kernel_copies_every_view_bitwise(host, tier, limit):
    from suites.strided_copy import storage as make_storage

    cases = views(tier, limit)
    assert len(cases) >= (30 if tier == "smoke" else 3), len(cases)
    vector_path = 0
    for p in cases:
        s = make_storage(p)
        want = s.as_strided(tuple(p["size"]), tuple(p["stride"]), p["offset"])
        got = run(host["cuda"], launch_strided_copy, s, p)
        assert torch.equal(bits(got), bits(want)), p
        # the int32 control agrees wherever positions stay below 2**31
        control = run(host["cuda_int32_index"], launch_strided_copy_int32, s, p)
        assert torch.equal(bits(control), bits(want)), p
        vector_path += p["stride"][-1:] == (1,) and p["offset"] * s.element_size() % 16 == 0
    assert vector_path or tier != "smoke", "no smoke view takes the 16-byte path"


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_rows_of_every_length_and_alignment(host, width, offset):
    """Rows shorter and longer than a chunk, not a multiple of it, at offsets that misalign
    the 16-byte path: the chunks' tails and the scalar fallback."""
    dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    storage = torch.arange(4096, dtype=torch.int64).to(dtype)
    for rows, inner, pitch in [(1, 1, 1), (3, 5, 7), (4, 17, 17), (5, 31, 40), (2, 33, 64),
                               (7, 16, 16), (1, 250, 250), (6, 9, 9)]:
        p = {"size": (rows, inner), "stride": (pitch, 1), "offset": offset}
        want = storage.as_strided(p["size"], p["stride"], offset)
        assert torch.equal(run(host["cuda"], launch_strided_copy, storage, p), want), p
        t = {"size": (inner, rows), "stride": (1, pitch), "offset": offset}  # transposed
        want = storage.as_strided(t["size"], t["stride"], offset)
        assert torch.equal(run(host["cuda"], launch_strided_copy, storage, t), want), t


#: small views that take every path: 16-, 8-, 4- and 2-byte units, a one-dim tail, elements
#: (transposed, stepped, misaligned), broadcast rows, 0-d, several dims
PATHS = [
    ("f32", (6, 40), (40, 1), 0), ("i16", (5, 12), (12, 1), 4), ("u8", (3, 20), (20, 1), 2),
    ("u8", (7, 6), (6, 1), 0), ("u8", (1003,), (1,), 16), ("u8", (17,), (1,), 0),
    ("f64", (77,), (1,), 3),
    ("f32", (40, 6), (1, 40), 0), ("bf16", (9, 11), (33, 3), 5), ("i32", (5, 64), (0, 1), 8),
    ("f32", (), (), 9), ("u8", (2, 3, 4, 5, 6), (0, 240, 1, 48, 8), 11),
    ("i64", (3, 4, 5), (20, 1, 4), 1),
]


def _path_views():
    from harness.core.inputs import dtype_from_name

    for dtype, size, stride, offset in PATHS:
        storage = torch.arange(2048, dtype=torch.int64).to(dtype_from_name(dtype)) \
            if dtype != "bf16" else torch.arange(2048, dtype=torch.int16).view(torch.bfloat16)
        yield storage, {"size": size, "stride": stride, "offset": offset}


def test_the_small_views_take_every_unit_and_the_tail():
    from suites._cuda.strided_copy import plan

    plans = [plan(p["size"], p["stride"], p["offset"], s.element_size(),
                  src_addr=s.data_ptr(), out_addr=0) for s, p in _path_views()]
    assert {q.unit for q in plans} >= {16, 8, 4, 2, 1}
    assert any(q.tail for q in plans)


@pytest.mark.parametrize("index", [None, "il", "ll"])
def test_every_index_width_copies_every_path_bitwise(host, index):
    """The 64-bit paths (views past 2**31 units or spans, the stress tier) on small views:
    their arithmetic is the same whatever the size."""
    from suites._cuda.strided_copy import _launch

    for storage, p in _path_views():
        want = storage.as_strided(p["size"], p["stride"], p["offset"])
        out = torch.empty(p["size"], dtype=storage.dtype)
        out.reshape(-1).view(torch.uint8).fill_(0xA5)
        _launch(HostKernels(host["cuda"]), storage, p["size"], p["stride"], p["offset"], out,
                index=index)
        assert torch.equal(bits(out), bits(want)), (index, p)


#: planted bugs, each of a class the bitwise check must catch: a wrong quotient, a wrong
#: remainder, a dropped tail, a dropped unrolled element, the stride of the wrong dim, the
#: offset ignored, the last dim skipped
MUTANTS = [
    ("return (t + n) >> (u32)(magic >> 32);", "return (t + n) >> ((u32)(magic >> 32) + 1);"),
    ("at += (P)(rest - q * (I)v.size[d]) * (P)v.stride[d];",
     "at += (P)(rest - q * (I)v.size[d] + (d == 1)) * (P)v.stride[d];"),
    ("if (tail > 0 && blockIdx.x == 0", "if (tail > 1 && blockIdx.x == 0"),
    ("if (i < numel) out[i] = buf[u];", "if (i < numel && u != 3) out[i] = buf[u];"),
    ("* (P)v.stride[d];", "* (P)v.stride[d > 0 ? d - 1 : 0];"),
    ("  src += offset;  // 64-bit", "  src += 0;  // 64-bit"),
    ("if (d == v.ndim) break;", "if (d == v.ndim - 1) break;"),
]


@pytest.mark.parametrize("needle,bug", MUTANTS, ids=range(len(MUTANTS)))
def test_a_wrong_kernel_is_caught_by_this_check(tmp_path, needle, bug):
    """The check can fail: each planted bug changes some path view's bytes."""
    from suites._cuda.strided_copy import _launch

    text = SOURCE.read_text()
    assert text.count(needle) == 1, needle
    broken = tmp_path / "broken.cu"
    broken.write_text(text.replace(needle, bug))
    so = build(tmp_path, source=broken)
    caught = 0
    for storage, p in _path_views():
        want = storage.as_strided(p["size"], p["stride"], p["offset"])
        out = torch.empty(p["size"], dtype=storage.dtype)
        out.reshape(-1).view(torch.uint8).fill_(0xA5)
        _launch(HostKernels(so), storage, p["size"], p["stride"], p["offset"], out)
        caught += not torch.equal(bits(out), bits(want))
    assert caught, bug


def test_a_view_outside_its_storage_is_refused_before_any_launch(host):
    storage = torch.arange(100, dtype=torch.float32)
    kernels = HostKernels(host["cuda"])
    for size, stride, offset in [((10, 10), (10, 1), 1), ((5,), (30,), 0), ((2, 3), (1, -1), 5),
                                 ((4,), (1,), -1)]:
        out = torch.empty(math.prod(size))
        with pytest.raises(ValueError, match="strided_copy.cu: "):
            launch_strided_copy(kernels, storage, size, stride, offset,
                                            out.view(size))
    assert kernels.launches == []
    # the last element exactly at the storage's end is inside
    out = torch.empty(10, 10)
    launch_strided_copy(kernels, storage, (10, 10), (10, 1), 0, out)
    assert torch.equal(out, storage.view(10, 10))
