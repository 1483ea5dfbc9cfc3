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

from harness import __version__, cuda


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
    if torch.version.cuda and cuda.driver_available():
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
        "cuda_devices": cuda.devices(),
        "nccl": nccl,
        "nvrtc": cuda.nvrtc_version(),
        "git_commit": git_commit(),
    }


def env_id(env: dict[str, Any]) -> str:
    """Short fingerprint of the versions that matter for comparing results."""
    keys = ("harness", "python", "torch", "torch_cuda", "mpi_library", "cuda_driver", "nccl")
    return fingerprint({k: env.get(k) for k in keys})
