"""After each job: the MPI shared-memory files its ranks left on this node, removed.

A job that ends normally finalizes MPI, which unlinks them; one the harness stops, or whose
rank crashed, leaves them in /dev/shm until the machine reboots (harness.device.shm). Rank 0
names them in the job's ``wN.shm.json`` as soon as MPI is up (:func:`record`), before a warm
job waits for its go file; the launcher removes them once the job is over (:func:`sweep`).
Only those on the launcher's own node can be removed from here: where rank 0 runs elsewhere
(a multi-node srun job), the nodes keep theirs.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from harness.device import shm

#: how long the ranks of an aborted job may take to die after their launcher exited (MPICH's
#: mpiexec returns from MPI_Abort while its proxies' SIGKILLed ranks are still going)
RANKS_GONE_S = 5.0


def record(path: Path) -> None:
    """Rank 0's note of this node and the shared-memory files MPI mapped in this process."""
    part = path.with_name(path.name + ".part")  # whole or absent for the launcher's read
    part.write_text(json.dumps({"node": socket.gethostname(), "shm": shm.mapped()}))
    os.replace(part, path)


def sweep(path: Path, log_path: Path | None = None, wait_s: float = RANKS_GONE_S,
          host: str | None = None) -> list[tuple[str, int]]:
    """Remove the files a job's ``record`` at ``path`` names, once no process holds them,
    where its rank 0 ran on this host, waiting up to ``wait_s`` for the job's ranks to let
    them go; note each in the job's log, and consume the record. Returns (path, bytes) of
    each removed. Finalized MPI leaves none: then it returns at once."""
    try:
        noted = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    path.unlink(missing_ok=True)
    if not isinstance(noted, dict) or noted.get("node") != (host or socket.gethostname()):
        return []
    left = [str(p) for p in noted.get("shm") or [] if Path(str(p)).exists()]
    removed: list[tuple[str, int]] = []
    end, pause = time.monotonic() + wait_s, 0.05
    while left:
        removed += shm.remove_unheld(left)  # reads every process's maps: not too often
        left = [p for p in left if Path(p).exists()]
        if not left or time.monotonic() >= end:
            break
        pause = min(2 * pause, 1.0)
        time.sleep(pause)
    if removed and log_path is not None:
        with open(log_path, "a") as log:
            for name, size in removed:
                log.write(f"harness: removed {name} ({size >> 10} KiB of memory), which the "
                          "job's MPI left behind\n")
    return removed
