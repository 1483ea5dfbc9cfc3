"""What to say where a job's ranks failed in ``MPI_Init``: MPICH prints its error stack
("Fatal error in internal_Init_thread: Other MPI error") without naming a cause, and the
usual cause is the user's environment, whose MPICH, hydra, UCX and libfabric settings MPICH
reads as it starts (an invalid ``MPIR_CVAR_*`` value ends ``MPI_Init`` so, seen with the
mpich 4 wheel)."""

from __future__ import annotations

from collections.abc import Mapping

#: MPICH's words for an MPI_Init that failed (src/mpi/init/init_impl.c's error stack)
INIT_FAILED = ("Fatal error in internal_Init_thread", "Fatal error in PMPI_Init",
               "MPI_Init_thread(")
#: the environment variables MPICH and the libraries under it read as MPI starts
SETTINGS = ("MPIR_CVAR_", "MPICH_", "HYDRA_", "UCX_", "FI_")


def init_failed(log: str, environ: Mapping[str, str]) -> str:
    """The hint for a job log showing MPI_Init failing: the MPI settings ``environ`` (the
    user's, not the ranks' additions) holds, to check; "" where the log shows no such
    failure."""
    if not any(words in log for words in INIT_FAILED):
        return ""
    settings = sorted(f"{k}={v}" for k, v in environ.items() if k.startswith(SETTINGS))
    if not settings:
        return ("MPI_Init failed in the ranks and the environment sets no MPICH, hydra, UCX "
                "or libfabric variable: `harness env --check` tests the MPI installation")
    shown = ", ".join(settings[:8]) + (f" and {len(settings) - 8} more" if len(settings) > 8
                                       else "")
    return (f"MPI_Init failed in the ranks; the environment sets {shown}: MPICH reads these "
            "as it starts, so check or unset them (an invalid value fails MPI_Init so)")
