"""A rank's signs of life, and where it is when it is stuck before or after its cases.

A job's pytest loads this plugin first (``-p harness.engine.alive``, before the harness's own),
so it runs before the rank imports torch or wires up MPI, either of which can hang. It touches
the file the launcher named in ``ALIVE_ENV``: the launcher's stall clock starts there
(harness.engine.stall). And it arms faulthandler's alarm to write every thread's Python
stack into the job's log a moment before the launcher would stop the job as stuck
(``STALL_ENV``'s seconds): a C thread, which writes even where the rank is stuck in C code
holding the GIL (MPI_Init inside ``import mpi4py.MPI``), where no Python thread runs. The
harness's plugin stops it at the first case (its watchdog thread watches the cases and the
time between them) and arms it again when the job's cases are done, for MPI_Finalize. It
imports nothing heavy (the watchdog module and the standard library: a few milliseconds).
"""

import faulthandler
import os
import sys
from pathlib import Path

from harness.engine.watchdog import ahead

#: the environment variable a job's ranks find their "up" file in (harness.engine.launch)
ALIVE_ENV = "HARNESS_ALIVE_FILE"
#: the environment variable with the launcher's stall limit in seconds (0: none)
STALL_ENV = "HARNESS_STALL_S"


def stall_s() -> float:
    """The launcher's stall limit in seconds (0: none)."""
    try:
        return float(os.environ.get(STALL_ENV, "0"))
    except ValueError:
        return 0.0


def watch_quiet() -> None:
    """Before the first case and after the last: the stacks a moment before the launcher's
    stall limit, if one is set."""
    stall = stall_s()
    if stall > 0:
        faulthandler.dump_traceback_later(ahead(stall), file=sys.stderr)
    else:
        faulthandler.cancel_dump_traceback_later()


def stop_watching() -> None:
    """The cases are under way: the harness's watchdog thread watches from here."""
    faulthandler.cancel_dump_traceback_later()


if os.environ.get(ALIVE_ENV):
    Path(os.environ[ALIVE_ENV]).touch()
    watch_quiet()
