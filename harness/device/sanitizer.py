"""compute-sanitizer around the ranks (``harness run --sanitize``): where it is, the command
that runs a rank under memcheck with a log of its own, and the first error in that log, named
with its kernel, for the case's reason.

memcheck catches an illegal or misaligned access before the hardware does, reports it with the
kernel and the thread, and fails the kernel's launch; the CUDA context is then as unusable as
after a real fault, so the case ends its job (``runtime.broken_context``) and its reason
carries the report.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

#: the rank's number in its job as the launchers give it (MPICH's hydra and PMI, SLURM's
#: srun, Open MPI), read by the shell that starts the rank
_RANK_VARIABLE = "${PMI_RANK:-${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-0}}}"
#: the lines of a report that follow its headline
_DETAIL = ("at ", "by thread", "Address", "Saved host", "Host Frame", "and is", "Device Frame",
           "=")


def find(environ: Mapping[str, str] | None = None) -> str | None:
    """compute-sanitizer: on PATH, else in $CUDA_HOME/bin, else the default toolkit's."""
    environ = os.environ if environ is None else environ
    found = shutil.which("compute-sanitizer", path=environ.get("PATH"))
    if found:
        return found
    for home in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), "/usr/local/cuda"):
        tool = os.path.join(home, "bin", "compute-sanitizer") if home else ""
        if tool and os.access(tool, os.X_OK):
            return tool
    return None


def command_prefix(tool: str, log_prefix: str) -> list[str]:
    """What runs a rank under memcheck, its report in ``log_path(log_prefix, rank)``: one
    command line serves every rank, so a shell reads the rank's number from the launcher's
    environment."""
    script = ('san=$1; log=$2; shift 2; exec "$san" --tool memcheck --print-limit 20 '
              f'--log-file "$log.{_RANK_VARIABLE}.log" "$@"')
    return ["sh", "-c", script, "sh", tool, log_prefix]


def log_path(log_prefix: str, rank: int) -> Path:
    return Path(f"{log_prefix}.{rank}.log")


def first_error(text: str) -> str | None:
    """The first error of a memcheck log, one line: what happened and in which kernel
    (``Invalid __global__ write of size 4 bytes in fault``), or None when it holds none."""
    lines = [line.split("=========", 1)[1].strip() for line in text.splitlines()
             if line.startswith("=========")]
    for i, line in enumerate(lines):
        if not line or line.startswith(("COMPUTE-SANITIZER", "CUDA-MEMCHECK", "ERROR SUMMARY",
                                            *_DETAIL)):
            continue
        for detail in lines[i + 1:i + 4]:
            # "at fault+0x70 in /k.cu:3", "at fault(float *)+0x70", "at 0x70 in fault"
            m = re.match(r"at (?:0x[0-9a-fA-F]+ in )?(.+?)(?:\+0x[0-9a-fA-F]+)?(?: in \S+)?$",
                         detail)
            if m:
                return f"{line} in {m.group(1)}"
        return line
    return None
