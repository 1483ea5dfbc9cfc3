"""What a job's launcher log says: the nodes srun reported lost, the PMI requests Slurm cut,
the signal that killed a rank, its last lines. The launcher reads its jobs' logs as they grow
and after they end."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path

from harness.engine.srun import PMI1_CUT

#: pytest exit codes after which the job ended normally (tests passed/failed/none collected)
PYTEST_NORMAL = (0, 1, 5)


#: srun's line when slurmctld sets a node of the job's allocation DOWN (Slurm 22.05: "srun:
#: error: Node failure on n2"). SLURM cancels the step, but srun then waits for the lost
#: node's tasks, whose end never comes, until it is killed
_NODE_FAILURE = re.compile(rb"^srun: error: Node failure on (\S+)", re.M)


class SlurmLines:
    """What srun and slurmstepd wrote into a job's log that ends the job, read incrementally
    as it grows: the nodes srun reported lost (``nodes``), and whether Slurm's pmi2 plugin
    cut a rank's PMI-1 request (``pmi_cut``, harness.engine.srun: the job can no longer wire
    up, and one of its ranks aborts or all wait)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.nodes: list[str] = []
        self.pmi_cut = False

    def update(self) -> bool:
        """Read what the log gained; whether the job must be stopped now."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_BYTES)  # what a flood wrote since, a piece at a time
        except FileNotFoundError:
            return self.ends
        end = data.rfind(b"\n") + 1 or (len(data) if len(data) == READ_BYTES else 0)
        self.offset += end
        for match in _NODE_FAILURE.finditer(data[:end]):
            node = match.group(1).decode(errors="replace")
            if node not in self.nodes:
                self.nodes.append(node)
        self.pmi_cut = self.pmi_cut or any(line.encode() in data[:end] for line in PMI1_CUT)
        return self.ends

    @property
    def ends(self) -> bool:
        return bool(self.nodes) or self.pmi_cut


def lost_node_message(world_size: int, nodes: Sequence[str], in_progress: str | None,
                      recorded: int, planned: int, run_id: str) -> str:
    """The one line a run ends with when SLURM lost a node of its job."""
    during = f" during {in_progress}" if in_progress else ""
    return (f"world size {world_size}: SLURM lost node {', '.join(nodes)}{during} (srun: Node "
            f"failure); {recorded} of {planned} case(s) at this size were recorded and are "
            f"kept, the other {planned - recorded} and any later world size did not run: once "
            f"the node is back, `harness run --resume {run_id}` runs them")


#: the most bytes of a job's log read at once (a line longer than this is skipped)
READ_BYTES = 4 << 20
#: MiB of output a job's ranks may write to its log before the launcher stops the job
#: (``--max-output-mib``): an implementation printing in a loop fills the run folder's disk
#: at hundreds of MiB a second, and the case's deadline comes too late to stop it
MAX_OUTPUT_MIB = 1024
#: what a stopped job's flooded log keeps of its start and of its end (``cut``)
KEPT_BYTES = 64 << 10


def flooded(path: Path, max_mib: int) -> int | None:
    """The size of a job's log past ``max_mib`` MiB (0: no limit), else None."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return size if max_mib and size > max_mib << 20 else None


def cut(path: Path, keep: int = KEPT_BYTES) -> None:
    """A stopped job's log shortened to its first and last ``keep`` bytes, a line between
    saying how much went (written beside it, then moved over it)."""
    head, end, size = _ends(path, keep)
    if size <= 2 * keep:
        return
    note = f"\nharness: {size - 2 * keep} bytes of the ranks' output cut here\n".encode()
    part = path.with_name(path.name + ".cut")
    part.write_bytes(head + note + end)
    os.replace(part, path)


def flood_reason(size: int, max_mib: int, log_path: Path, when: str = "during this case"
                 ) -> str:
    """Why a job was stopped for its log's size."""
    return (f"the job was stopped: its ranks wrote {size / 2**20:.0f} MiB of output to its log "
            f"{when}, past --max-output-mib {max_mib} (an implementation printing in every "
            f"call?); its log keeps the first and last {KEPT_BYTES >> 10} KiB: {log_path}")


def start_and_end(path: Path, nbytes: int = KEPT_BYTES) -> str:
    """The first and the last ``nbytes`` of a log, as text ('' if it cannot be read)."""
    try:
        head, end, _ = _ends(path, nbytes)
    except OSError:
        return ""
    return (head + end).decode(errors="replace")


def _ends(path: Path, nbytes: int) -> tuple[bytes, bytes, int]:
    """A file's first ``nbytes``, its last ``nbytes`` past those, and its size."""
    with open(path, "rb") as fh:
        head = fh.read(nbytes)
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(len(head), size - nbytes))
        return head, fh.read(), size


def _end_of(path: Path, nbytes: int) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - nbytes))
        return fh.read().decode(errors="replace")


#: a job log past this size is named after its world size
BIG_LOG_BYTES = 100 << 20


def big_logs(paths: Sequence[Path], limit: int = BIG_LOG_BYTES) -> list[str]:
    """A note for each job log past ``limit`` bytes: an implementation that prints in every
    call fills the run folder's disk (a job whose log passes ``--max-output-mib`` is
    stopped)."""
    notes = []
    for path in paths:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if size > limit:
            notes.append(f"the job's log {path} holds {size / 2**20:.0f} MiB of its ranks' "
                         "output (an implementation printing in every call?): mind the run "
                         "folder's disk")
    return notes


_SIGNALLED = re.compile(r"signal (\d+)\)")


def _rank_signal(log_path: Path) -> int | None:
    """The signal that killed a rank, where the launcher's log names one (MPICH: "EXIT
    STRING: Killed (signal 9)")."""
    try:
        found = _SIGNALLED.findall(_end_of(log_path, 20000))
    except OSError:
        found = []
    return int(found[-1]) if found else None


def launcher_signal(rc: int | None, log_path: Path) -> int | None:
    """The signal that killed the launcher itself (a negative return code) where its log
    names no rank's: a signal from outside the job, since a rank killed by one makes the
    launcher report it and exit with a code of its own."""
    if rc is None or rc >= 0 or _rank_signal(log_path) is not None:
        return None
    return -rc


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def death(rc: int | None, log_path: Path) -> str:
    """How a job died: the signal that killed a rank where the launcher's log names one,
    the one that killed the launcher itself (a negative return code), else the launcher's
    exit code."""
    number, who = _rank_signal(log_path), "a rank"
    if number is None and rc is not None and rc < 0:
        number, who = -rc, "the launcher"
    elif number is None and rc in PYTEST_NORMAL:
        return (f"exit code {rc} (a rank's process ended in the middle of the case: "
                "os._exit, or a library's exit())")
    elif number is None:
        return f"exit code {rc}"
    why = " (the kernel's OOM killer sends it when memory runs out: see dmesg)" \
        if number == signal.SIGKILL else ""
    return f"{who} killed by {signal_name(number)}{why}"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(_end_of(path, KEPT_BYTES).splitlines()[-lines:])
    except OSError:
        return ""
