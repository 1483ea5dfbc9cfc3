"""`harness run --sanitize`: each rank under compute-sanitizer's memcheck with a log of its
own, the first error of a log read back with its kernel, and the refusals. The wrapper runs
for real under mpiexec with a stand-in sanitizer (a script that writes its log and runs the
rank); the real compute-sanitizer runs in tests/test_cuda_gpu.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.device import sanitizer
from harness.device.envinfo import find_launcher

#: what compute-sanitizer 2025.3 wrote on an H100 for tests/test_cuda_gpu.py's faulting kernel
H100 = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at fault+0x80
=========     by thread (0,0,0) in block (0,0,0)
=========     Access to 0x8 is out of bounds
=========     and is 140,654,113,980,408 bytes before the nearest allocation at 0x7fec96800000 \
 of size 2,097,152 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame:  [0x4cd39] in cydriver.cpython-312-x86_64-linux-gnu.so
"""
NEW = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at fault+0x70 in /tmp/fault.cu:2
=========     by thread (1,0,0) in block (0,0,0)
=========     Address 0xc is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2ed4c7] in libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""
OLD = """========= CUDA-MEMCHECK
========= Invalid __global__ read of size 8
=========     at 0x00000150 in strided_copy_8
=========     by thread (31,0,0) in block (3,0,0)
"""
DEMANGLED = """========= Misaligned Shared or Local Address
=========     at k(float *, long long)+0x40 in k.cu:9
"""


@pytest.mark.parametrize("text, want", [
    (H100, "Invalid __global__ write of size 4 bytes in fault"),
    (NEW, "Invalid __global__ write of size 4 bytes in fault"),
    (OLD, "Invalid __global__ read of size 8 in strided_copy_8"),
    (DEMANGLED, "Misaligned Shared or Local Address in k(float *, long long)"),
    ("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", None),
    ("", None),
])
def test_the_first_error_is_named_with_its_kernel(text, want):
    assert sanitizer.first_error(text) == want


def test_compute_sanitizer_is_found_on_path_or_in_the_toolkit(tmp_path):
    tool = tmp_path / "cuda" / "bin" / "compute-sanitizer"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert sanitizer.find({"PATH": str(tool.parent)}) == str(tool)
    assert sanitizer.find({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "cuda")}) \
        == str(tool)


def test_every_rank_writes_a_log_of_its_own_under_one_command_line(tmp_path):
    """The command prefix under a real mpiexec: 2 ranks, one command line, two logs."""
    launcher = find_launcher()
    if launcher is None:
        pytest.skip("no MPI launcher")
    fake = tmp_path / "compute-sanitizer"
    # the stand-in: checks the options memcheck gets, writes the log, runs the program
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "--tool memcheck" ] || exit 9\n'
                    'shift 4\n[ "$1" = --log-file ] || exit 8\n'
                    'echo "========= COMPUTE-SANITIZER" > "$2"\nshift 2\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    prefix = str(tmp_path / "w2.sanitizer")
    proc = subprocess.run([launcher, "-n", "2", *sanitizer.command_prefix(str(fake), prefix),
                           sys.executable, "-c", "print('ran')"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ran") == 2
    for rank in (0, 1):
        assert sanitizer.log_path(prefix, rank).read_text().startswith("========= COMPUTE")


def test_sanitize_on_the_cpu_is_refused_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "run", "strided_copy",
                          "--device", "cpu", "--sanitize", "--world-sizes", "1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "HARNESS_DB": str(tmp_path / "h.db")})
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--sanitize" in lines[0] and "needs a GPU" in lines[0]
    assert not Path(tmp_path / "h.db").exists()
