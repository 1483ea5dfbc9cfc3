"""A rank says it is up. A job's pytest loads this plugin first (``-p harness.engine.alive``,
before the harness's own), and it touches the file the launcher named in ``ALIVE_ENV``
before the rank imports torch or wires up MPI, either of which can hang: the launcher's stall
clock starts there (harness.engine.stall). It imports nothing else, so it costs nothing."""

import os
from pathlib import Path

#: the environment variable a job's ranks find their "up" file in (harness.engine.launch)
ALIVE_ENV = "HARNESS_ALIVE_FILE"

if os.environ.get(ALIVE_ENV):
    Path(os.environ[ALIVE_ENV]).touch()
