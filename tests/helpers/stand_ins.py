"""Stand-ins for an MPI launcher: a script the launcher starts in its place, in the run folder
with the ranks' environment, to drive harness.engine.launch through what a job can do without
starting one (record, hang, crash, lose a node)."""

from __future__ import annotations

from pathlib import Path

#: the one allreduce case the stand-ins' runs plan, at world size 4 on the CPU
CASE = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]"


def launcher(directory: Path, script: str, name: str = "mpiexec") -> Path:
    """``script`` as an executable named ``name`` in ``directory``. Started as the ranks are,
    in the run folder's ``work/``, it first steps up into the run folder, where it writes the
    run's files by relative path (the ranks use the run folder's absolute path)."""
    shebang, _, body = script.partition("\n")
    up = 'import os; os.chdir("..")' if "python" in shebang else "cd .."
    path = directory / name
    path.write_text(f"{shebang}\n{up}\n{body}")
    path.chmod(0o755)
    return path


def two_items() -> list:
    """The case's torch and mpi items at world size 4, planned as a run plans them."""
    from harness.core.discovery import registry

    return registry().plan("smoke", 4, [CASE], ["torch", "mpi"], "cpu")
