"""What srun needs beside the command line: the PMI plugin it serves the ranks, and what its
log says when that plugin refused MPICH's requests.

Slurm's mpi/pmi2 plugin serves both PMI wire protocols. A PMI-2 request carries its length
and slurmstepd reads all of it; a PMI-1 request it reads with one ``read()`` of at most 1024
bytes (Slurm's src/plugins/mpi/pmi2/pmi1.c, ``handle_pmi1_cmd``: "TODO: read until newline").
The mpich wheel's MPICH speaks PMI-1 (``MPIR_CVAR_PMI_VERSION=2`` fails its ``MPI_Init`` under
Slurm 22.05's plugin, measured) and puts its business card, hex encoded, in segments of up to
511 bytes (src/util/mpir_pmi.c, ``put_ex``: ``(vallen_max - 2) / 2`` with the plugin's
vallen_max of 1024), compressing runs of zeros: one ``cmd=put`` line can pass 1024 bytes.
The card, exchanged through PMI where ranks are on more than one node, is a 4096-byte buffer:
UCX's worker address, then whatever that memory held before (decoded from hydra's verbose
log), so its lines grow and shrink with the install and the environment (846 bytes from one
venv, 723 from it with one more variable set). A line past 1024 bytes is cut: slurmstepd
logs "value not properly terminated in client request" and "invalid client request", and the
job's wire-up fails or hangs; the launcher stops it at once (harness.engine.joblog.SlurmLines).
"""

from __future__ import annotations

from collections.abc import Sequence

#: the PMI that srun serves the ranks unless told otherwise: the mpich wheel's MPICH (and any
#: MPICH built with its own "simple" PMI) speaks the PMI-1/PMI-2 wire protocol, which Slurm's
#: mpi/pmi2 plugin serves (Slurm's mpi_guide: "srun --mpi=pmi2" for MPICH). Under a
#: cluster's MpiDefault of none each rank came up alone, as its own world of one (seen on
#: Slurm 22.05 with the mpich 4 wheel: four ranks of "world size 4" each ran every case at 1).
SRUN_MPI = "--mpi=pmi2"


def srun_args(launcher_args: Sequence[str]) -> list[str]:
    """srun's own options: the user's, with SRUN_MPI first unless they chose an --mpi."""
    chosen = any(a == "--mpi" or a.startswith("--mpi=") for a in launcher_args)
    return list(launcher_args) if chosen else [SRUN_MPI, *launcher_args]


#: slurmstepd's lines for a PMI-1 request it read in part (above)
PMI1_CUT = ("mpi/pmi2: value not properly terminated in client request",
            "mpi/pmi2: invalid client request")


#: what to do where srun's pmi2 plugin cut MPICH's PMI-1 requests (the launcher stops
#: such a job as soon as PMI1_CUT's lines reach its log: harness.engine.joblog.SlurmLines)
PMI1_CUT_ADVICE = (
    "srun's pmi2 plugin cut MPICH's PMI-1 requests (slurmstepd logged \"value not properly "
    "terminated in client request\": it reads a PMI-1 request in one read of 1024 bytes, and "
    "MPICH's business-card puts across nodes can be longer); inside the allocation run "
    "MPICH's own launcher (--launcher mpiexec, which starts its ranks through srun and serves "
    "PMI itself), or an MPI built against Slurm's PMI-2 or PMIx library with "
    "--launcher-args=--mpi=pmix")
