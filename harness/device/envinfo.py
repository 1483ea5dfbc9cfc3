"""The machine and software environment of a run, without touching CUDA or initialising MPI.

``machine()`` identifies the hardware a history series belongs to (its fingerprint leaves the
hostname out, since CI containers get a new one every run; set ``HARNESS_MACHINE`` to name a
machine explicitly). ``environment()`` lists the software versions that can change results.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import __version__
from harness.device import cuda, cuda_compile, triton_impl


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fingerprint(data: dict[str, Any]) -> str:
    """Short stable hash of a JSON-able dict."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def machine() -> dict[str, Any]:
    """Hardware identity: CPU model and count, memory, GPUs (from the driver alone)."""
    gpus = [{k: d[k] for k in ("name", "capability", "memory_bytes")} for d in cuda.devices()]
    ident = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round((_memory_bytes() or 0) / 2**30),
        "gpus": gpus,
        "arch": platform.machine(),
    }
    name = os.environ.get("HARNESS_MACHINE")
    fp = fingerprint({"name": name} if name else ident)
    return {"fingerprint": fp, "name": name or socket.gethostname(),
            "hostname": socket.gethostname(), **ident}


def find_launcher(explicit: str | None = None) -> str | None:
    """The mpiexec to use: explicit, $HARNESS_MPIEXEC, the one beside this Python (the mpich
    wheel installs it there), or the first on PATH."""
    for candidate in (explicit, os.environ.get("HARNESS_MPIEXEC")):
        if candidate:
            return shutil.which(candidate) or (candidate if Path(candidate).exists() else None)
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec") or shutil.which("mpirun")


def launcher_version(path: str | None) -> str | None:
    """First informative line of ``mpiexec --version``."""
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith("version") or "mpirun" in ln.lower() or "mpiexec" in ln.lower():
            return ln
    return lines[0] if lines else None


def mpi_library() -> str | None:
    """MPI library version, read without initialising MPI."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # this process only asks; the ranks initialise
        from mpi4py import MPI

        return MPI.Get_library_version().splitlines()[0].strip()
    except Exception as exc:  # report, never fail: env is a diagnostic
        return f"unavailable ({exc})"


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the working tree the harness runs from, if it is a git checkout."""
    here = cwd or str(Path(__file__).resolve().parent.parent)
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(launcher: str | None = None) -> dict[str, Any]:
    """Software versions relevant to results. Torch is imported, CUDA is not initialised."""
    import numpy
    import torch

    try:
        import mpi4py

        mpi4py_version = mpi4py.__version__
    except ImportError:
        mpi4py_version = None
    nccl = None
    if torch.version.cuda:  # NCCL's version needs its library, not a GPU
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {
        "harness": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numpy": numpy.__version__,
        "mpi4py": mpi4py_version,
        "mpi_library": mpi_library(),
        "launcher": launcher,
        "launcher_version": launcher_version(launcher),
        "cuda_driver": cuda.driver_version(),
        "cuda_driver_error": cuda.driver_state().error or None,
        "cuda_devices": cuda.devices(),
        "nccl": nccl,
        "nvrtc": cuda.nvrtc_version(),
        "git_commit": git_commit(),
    }


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory file system NCCL keeps its buffers in; None without one."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _leftovers() -> tuple[int, int]:
    """Files and bytes of this user's MPI segments in /dev/shm that no process holds."""
    from harness.device import shm

    found = shm.leftovers()
    return len(found), sum(size for _, size in found)


def mpi_links_cuda() -> bool | None:
    """Whether the MPI library mpi4py loads was built with GPU support (it names the CUDA
    runtime or driver: an MPICH configured with CUDA, a CUDA-aware Open MPI); None when
    unknown. MPICH's configure line does not say (its MPL finds CUDA by itself), so the
    library file is read; MPI is not initialised."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI  # noqa: F401 - loads libmpi into this process
        maps = Path("/proc/self/maps").read_text()
    except Exception:  # noqa: BLE001
        return None
    lib = next((line.split()[-1] for line in maps.splitlines()
                if "/libmpi" in line and ".so" in line), None)
    if lib is None:
        return None
    try:
        data = Path(lib).read_bytes()
    except OSError:
        return None
    return any(name in data
               for name in (b"libcudart.so", b"cudaGetDeviceCount", b"cuCtxGetCurrent"))


def site_facts(launcher: str | None = None, *, env: dict[str, Any] | None = None,
               mpi: bool = True) -> Any:
    """The bring-up facts of this machine (``bringup.SiteFacts``) as this process sees them;
    ``mpi=False`` skips reading the MPI library and the MPI segments left in /dev/shm (what
    ``harness run`` does not need)."""
    import torch

    from harness.device.bringup import SiteFacts
    from harness.device.placement import usable_cpus

    env = env if env is not None else environment(launcher)
    state = cuda.driver_state()
    torch_count = None
    if torch.version.cuda:
        try:
            torch_count = torch.cuda.device_count()
        except Exception:  # noqa: BLE001
            torch_count = 0
    headers, headers_version = cuda_compile.runtime_headers()
    gpus = cuda.visible_gpus()
    triton = triton_impl.available()
    # Triton's launcher needs are read (an ldconfig call) only where kernels would compile
    triton_problem = (triton_impl.host_driver_problem() or "") \
        if triton and (gpus or torch_count) else ""
    return SiteFacts(
        torch_version=torch.__version__, torch_cuda=torch.version.cuda,
        torch_gpu_count=torch_count, bindings_version=cuda.bindings_version(),
        driver_present=state.present, driver_error=state.error,
        driver_version=cuda.driver_api_version(), gpus=gpus,
        nvml_gpu_count=cuda.nvml_gpu_count(), gpu_errors=tuple(cuda.device_errors()),
        nvrtc_version=cuda.nvrtc_version(), nvrtc_error=cuda.nvrtc_missing() or "",
        headers_version=headers_version, headers_path=str(headers or ""),
        shm_bytes=shm_bytes(), shm_leftovers=_leftovers() if mpi else (0, 0),
        nccl_shm_disabled=os.environ.get("NCCL_SHM_DISABLE") == "1",
        nccl_version=env.get("nccl"), mpi_library=env.get("mpi_library"),
        mpi_gpu=mpi_links_cuda() if mpi else None,
        mpich_gpu_setting=os.environ.get("MPIR_CVAR_ENABLE_GPU"),
        launcher=launcher, mps=cuda.mps_running(), cpus=len(usable_cpus()),
        triton=triton, triton_problem=triton_problem)


def env_id(env: dict[str, Any]) -> str:
    """Short fingerprint of the versions that matter for comparing results."""
    keys = ("harness", "python", "torch", "torch_cuda", "mpi_library", "cuda_driver", "nccl")
    return fingerprint({k: env.get(k) for k in keys})
