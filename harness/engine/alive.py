"""A rank's signs of life, and where it is when it is stuck.

A job's pytest loads this plugin first (``-p harness.engine.alive``, before the harness's own),
so it runs before the rank imports torch or wires up MPI, either of which can hang. It touches
the file the launcher named in ``ALIVE_ENV``: the launcher's stall clock starts there
(harness.engine.stall). And it arms faulthandler to write every thread's Python stack into
the job's log a moment before the launcher would stop the rank as stuck (``STALL_ENV``'s
seconds); the harness's plugin moves that alarm to just before each case's deadline while
the case runs (``watch_case``) and back after it (``watch_quiet``). faulthandler's alarm is a
C thread: it writes even where the rank is stuck in C code holding the GIL, where no Python
watchdog runs. It imports nothing else, so it costs nothing.
"""

import faulthandler
import os
import sys
from pathlib import Path

#: the environment variable a job's ranks find their "up" file in (harness.engine.launch)
ALIVE_ENV = "HARNESS_ALIVE_FILE"
#: the environment variable with the launcher's stall limit in seconds (0: none)
STALL_ENV = "HARNESS_STALL_S"


def _stall_s() -> float:
    try:
        return float(os.environ.get(STALL_ENV, "0"))
    except ValueError:
        return 0.0


def watch_quiet() -> None:
    """Between cases: the stacks a little before the launcher's stall limit, if one is set."""
    stall = _stall_s()
    if stall > 0:
        faulthandler.dump_traceback_later(stall - min(5.0, stall / 4), file=sys.stderr)
    else:
        faulthandler.cancel_dump_traceback_later()


def watch_case(deadline_s: float) -> None:
    """While a case runs: the stacks a moment before its deadline, when the watchdog aborts
    the job (every rank's, where the aborting rank 0 would show only its own)."""
    faulthandler.dump_traceback_later(deadline_s - min(1.0, deadline_s / 10), file=sys.stderr)


def stop_watching() -> None:
    faulthandler.cancel_dump_traceback_later()


if os.environ.get(ALIVE_ENV):
    Path(os.environ[ALIVE_ENV]).touch()
    watch_quiet()
