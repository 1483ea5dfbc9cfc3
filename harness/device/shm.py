"""Shared-memory files an MPI job leaves behind when it is killed.

MPICH keeps its intra-node segment as a named file, ``/dev/shm/mpich_shm_<world>_<node>``,
for the whole job: the first local rank creates it (``shm_open(O_CREAT | O_EXCL)``), every
local rank maps it and holds it open, and ``MPI_Finalize`` unlinks it (MPICH's
src/mpl/src/shm/mpl_initshm.c, ``MPL_initshm_open`` / ``MPL_initshm_free``). A job the
harness stops (a timeout, a stall, a crashed rank's abort) never finalizes, so the file stays,
1-8 MiB of memory each, until the machine reboots. Docker gives a container 64 MiB of
``/dev/shm``: a handful of killed 8-rank jobs fill it, and then NCCL and MPICH fail to start.

Rank 0 names the files it maps right after MPI's start (:func:`mapped`, into the job's
``wN.shm.json``: harness.engine.shm_sweep); when the job has ended the launcher removes those
of them that no process maps or holds open any more (:func:`remove_unheld`). A file no
process holds cannot be used again: every rank of a job attaches during its start, while the
creator holds it. UCX unlinks its segments as soon as they are mapped, and Open MPI's
runtime removes its own (``opal_pmix_register_cleanup``). ``harness env --check`` counts the
MPI and NCCL segments no process holds (:func:`leftovers`), such as those of jobs killed
outside the harness, and ``harness env --clean-shm`` removes them. Linux only (``/proc``);
elsewhere nothing is found.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
#: names of the segments communication libraries keep named while a job runs: MPICH's until
#: finalize (above), Open MPI's shared-memory BTL's (``vader_segment.*`` in 4.x,
#: ``sm_segment.*`` in 5.x; its runtime removes them unless it is killed too); UCX's and
#: NCCL's (``nccl-XXXXXX``, mkstemp) until every peer mapped them, left by a rank killed in
#: between. Each is held by its creator from creation on, so one no process holds is garbage
SEGMENTS = ("mpich_shm_*", "mpich_vci_*", "vader_segment.*", "sm_segment.*",
            "ucx_shm_posix_*", "nccl-??????")


def mapped(maps: Path = Path("/proc/self/maps"), shm_dir: Path | None = None) -> list[str]:
    """The files directly in ``shm_dir`` (``SHM_DIR``) this process maps that still have a
    name."""
    shm_dir = shm_dir or SHM_DIR
    try:
        text = maps.read_text()
    except OSError:
        return []
    found: dict[str, None] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5].endswith(" (deleted)"):
            continue
        path = Path(fields[5])
        if path.parent == shm_dir:
            found[str(path)] = None
    return list(found)


def _pid_dirs(proc: Path) -> Iterable[Path]:
    try:
        return [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def held(paths: Iterable[str], proc: Path = Path("/proc")) -> set[str]:
    """Those of ``paths`` some process this one can see maps or holds open. A process of
    another user whose /proc entries are closed to this one counts as holding none; files of
    this user's jobs are held by this user's processes."""
    wanted = set(paths)
    found: set[str] = set()
    for pid in _pid_dirs(proc):
        if found >= wanted:
            break
        try:
            maps = (pid / "maps").read_text()
        except OSError:
            maps = ""
        found |= {p for p in wanted - found if p in maps}
        try:
            fds = list((pid / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in wanted:
                found.add(target)
    return found


def _own_file(path: Path, shm_dir: Path) -> int | None:
    """The size of ``path`` when it is a plain file directly in ``shm_dir`` owned by this
    user, else None."""
    if path.parent != shm_dir:
        return None
    try:
        st = path.lstat()
    except OSError:
        return None
    if not path.is_file() or path.is_symlink() or st.st_uid != os.getuid():
        return None
    return st.st_blocks * 512


def _unheld(paths: Iterable[str], proc: Path, shm_dir: Path) -> list[tuple[str, int]]:
    """Those of ``paths`` that are this user's plain files directly in ``shm_dir`` and that
    no process maps or holds open: (path, bytes of memory) each."""
    sizes = {p: _own_file(Path(p), shm_dir) for p in dict.fromkeys(paths)}
    owned = [p for p, size in sizes.items() if size is not None]
    busy = held(owned, proc) if owned else set()
    return [(p, sizes[p] or 0) for p in owned if p not in busy]


def remove_unheld(paths: Iterable[str], proc: Path = Path("/proc"),
                  shm_dir: Path | None = None) -> list[tuple[str, int]]:
    """Unlink those of ``paths`` that are this user's plain files directly in ``shm_dir``
    (``SHM_DIR``) and that no process maps or holds open; return (path, bytes of memory
    freed) for each."""
    removed = []
    for path, size in _unheld(paths, proc, shm_dir or SHM_DIR):
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append((path, size))
    return removed


def segments(shm_dir: Path | None = None) -> list[str]:
    """The MPI and NCCL segments in ``shm_dir`` (``SHM_DIR``), by name (``SEGMENTS``)."""
    shm_dir = shm_dir or SHM_DIR
    return [str(p) for pattern in SEGMENTS for p in shm_dir.glob(pattern)]


def leftovers(proc: Path = Path("/proc"), shm_dir: Path | None = None
              ) -> list[tuple[str, int]]:
    """This user's MPI and NCCL segments in ``shm_dir`` (``SHM_DIR``; ``SEGMENTS``) that no
    process maps or holds open: (path, bytes of memory) each."""
    shm_dir = shm_dir or SHM_DIR
    return _unheld(segments(shm_dir), proc, shm_dir)
