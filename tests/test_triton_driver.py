"""What Triton's first compiled launch needs from a GPU host (a C compiler, Python.h, libcuda
and a writable cache: triton backends/nvidia/driver.py and runtime/build.py), read as Triton
reads it, and the skip a Triton implementation gets when one is missing. No GPU is needed: the
facts come from the environment and the file system."""

from __future__ import annotations

import os

import pytest
import torch

from harness.device import triton_impl
from harness.device.triton_impl import DriverFacts, driver_facts, driver_problem

GOOD = DriverFacts(compiler="/usr/bin/gcc", python_include="/usr/include/python3.12",
                   python_h=True, libcuda_dirs=("/usr/lib/x86_64-linux-gnu",),
                   ldconfig_error="", cache_dir="/root/.triton/cache", cache_writable=True)


def test_a_host_with_everything_has_no_problem():
    assert driver_problem(GOOD) is None


@pytest.mark.parametrize("change, needle", [
    ({"compiler": None}, "no C compiler"),
    ({"python_h": False}, "no Python.h in /usr/include/python3.12"),
    ({"libcuda_dirs": ()}, "TRITON_LIBCUDA_PATH"),
    ({"libcuda_dirs": (), "ldconfig_error": "/sbin/ldconfig -p failed: no such file"},
     "/sbin/ldconfig -p failed"),
    ({"cache_writable": False}, "set TRITON_CACHE_DIR"),
])
def test_each_missing_piece_is_named_with_its_remedy(change, needle):
    facts = DriverFacts(**{**GOOD.__dict__, **change})
    problem = driver_problem(facts)
    assert problem and problem.startswith("compiled Triton kernels cannot launch here: ")
    assert needle in problem and len(problem.splitlines()) == 1


def test_the_facts_are_read_as_triton_reads_them(tmp_path):
    libdir = tmp_path / "driver"
    libdir.mkdir()
    (libdir / "libcuda.so.1").write_bytes(b"")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"CC": "/opt/cc", "TRITON_LIBCUDA_PATH": str(libdir),
           "TRITON_CACHE_DIR": str(blocker / "cache")}
    f = driver_facts(env)
    assert f.compiler == "/opt/cc" and f.libcuda_dirs == (str(libdir),)
    assert f.cache_dir == str(blocker / "cache") and not f.cache_writable  # under a file
    # no TRITON_LIBCUDA_PATH: ldconfig's list, else LD_LIBRARY_PATH's directories that hold
    # libcuda.so.1 (this machine's ldconfig may list a real one as well)
    f = driver_facts({"LD_LIBRARY_PATH": f"{tmp_path}:{libdir}",
                      "TRITON_HOME": str(tmp_path / "home")})
    assert f.libcuda_dirs and all(os.path.exists(os.path.join(d, "libcuda.so.1"))
                                  for d in f.libcuda_dirs)
    assert f.cache_dir == str(tmp_path / "home" / ".triton" / "cache") and f.cache_writable
    assert f.python_h == os.path.exists(os.path.join(f.python_include, "Python.h"))


def test_a_triton_implementation_on_cuda_skips_naming_what_is_missing(monkeypatch):
    from harness.core.discovery import registry

    if not triton_impl.available():
        pytest.skip("triton is not installed")
    impl = registry().specs["strided_copy"].implementations["triton"]
    params = registry().specs["strided_copy"].grid["smoke"][0]
    # compiled, as on a GPU rank (the environment keeps TRITON_INTERPRET=1: the kernels'
    # module, if imported here, must stay interpreted for the rest of this process)
    monkeypatch.setattr(triton_impl, "interprets", lambda kind, environ=None: False)
    monkeypatch.setattr(triton_impl, "host_driver_problem",
                        lambda: "compiled Triton kernels cannot launch here: no C compiler")
    assert impl.skip_reason(params, 1, torch.device("cuda", 0)).endswith("no C compiler")
    monkeypatch.setattr(triton_impl, "host_driver_problem", lambda: None)
    assert impl.skip_reason(params, 1, torch.device("cuda", 0)) is None
