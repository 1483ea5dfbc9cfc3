"""The environment a job's ranks start with: the user's, plus what the harness needs of
them (where relative paths resolve, unbuffered output, no other pytest plugin, MPICH's GPU
support off) and, where ranks outnumber the CPUs, MPI waits that yield the CPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def rank_environment(base: Mapping[str, str], run_id: str) -> dict[str, str]:
    """The ranks' environment: ``base`` plus the run id, where harness was started (relative
    ``--impl`` paths resolve there; ranks run in the run directory's ``work`` folder),
    unbuffered output, and ``MPIR_CVAR_ENABLE_GPU=0`` unless the user set it. A GPU-enabled
    MPICH initialises CUDA in every rank at MPI_Init (MPICH 4.0's yaksa makes a context on
    every visible GPU, which an exclusive compute mode refuses); the harness never hands MPI
    device memory (its ``mpi`` implementations stage through the host), so it turns that off.
    An implementation that passes device memory to MPI runs with MPIR_CVAR_ENABLE_GPU=1 set
    by its user.

    And ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: the ranks' pytest loads the harness's plugin
    (``-p``) and no other installed one. A plugin that reorders items (pytest-randomly
    shuffles with a seed of its own in every process) would have the ranks run their cases in
    different orders and meet in the wrong collectives: wrong results, or a hang."""
    invoked_from = base.get("HARNESS_INVOKED_FROM", os.getcwd())
    env = {**base, "PYTHONUNBUFFERED": "1", "HARNESS_RUN_ID": run_id,
           "HARNESS_INVOKED_FROM": invoked_from, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.setdefault("MPIR_CVAR_ENABLE_GPU", "0")
    # a relative PYTHONPATH entry (an empty one is the working directory) names a folder
    # where the user started; the ranks start in the run's work folder: `PYTHONPATH=helpers
    # --impl mine:fn` passed the launcher's check, then every rank failed to import it
    given = base.get("PYTHONPATH")
    paths = [os.path.join(invoked_from, p) for p in given.split(os.pathsep)] if given else []
    if _importable_from_cwd(invoked_from):
        # `python -m harness` imports modules from where it was started (sys.path[0]); the
        # ranks, started in the run's work folder, must too: `--impl my_kernels:fn` with
        # my_kernels.py beside the user passed the launcher's check, then failed every rank
        paths.insert(0, invoked_from)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _importable_from_cwd(directory: str) -> bool:
    """Whether this process imports from ``directory`` as its working directory ('' on
    sys.path, as ``python -m`` puts it, or the directory itself)."""
    here = os.path.realpath(directory)
    return any(os.path.realpath(p or os.getcwd()) == here for p in sys.path)


#: MPICH: ranks waiting in MPI sleep briefly between polls instead of calling sched_yield.
#: mpi4py initialises MPI_THREAD_MULTIPLE, so a waiting rank's progress loop yields MPICH's
#: global lock on every turn; with this set the yield is a nanosleep (mpidu_thread_fallback.h,
#: MPIR_CVAR_ENABLE_HEAVY_YIELD), which takes the rank off the run queue for the timer slack.
#: chosen by benchmarks/wait_cpu.py (benchmarks/RESULTS.md)
HEAVY_YIELD = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
def wait_environment(world_size: int, cpus: int, single_node: bool) -> dict[str, str]:
    """Settings for ranks that wait politely: where more ranks than CPUs share this host, a
    rank spinning in MPI steals the core the rank it waits for needs. Never otherwise: the
    sleep between polls would add to the latency of the ``mpi`` implementations' timings."""
    if single_node and world_size > cpus:
        return {HEAVY_YIELD: "1"}
    return {}
