"""MPI and NCCL shared-memory files a killed job leaves in /dev/shm (harness.device.shm,
harness.engine.shm_sweep): which files count as held, which are removed, and the bring-up
line that reports them. Processes here are real ones that map or hold the files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.device import bringup, shm
from harness.engine import shm_sweep

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")

_HOLDER = r"""
import mmap, os, sys, time
mapped, opened, gone = sys.argv[1:4]
with open(mapped, "r+b") as fh:  # mapped, its descriptor closed (MPICH's non-root ranks)
    m1 = mmap.mmap(fh.fileno(), 4096)
fd = os.open(opened, os.O_RDWR)  # held open, not mapped
with open(gone, "r+b") as fh:    # mapped, then unlinked (UCX's segments)
    m2 = mmap.mmap(fh.fileno(), 4096)
os.unlink(gone)
print("ready", flush=True)
time.sleep(600)
"""


def _segment(path: Path) -> Path:
    path.write_bytes(b"\0" * 4096)
    return path


@pytest.fixture
def holder(tmp_path):
    """A process mapping ``a``, holding ``b`` open and mapping the since-deleted ``gone``."""
    a, b, gone = (_segment(tmp_path / n) for n in ("mpich_shm_aa_0", "mpich_shm_bb_0", "gone"))
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(a), str(b), str(gone)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, a, b
    proc.kill()
    proc.wait()


def test_mapped_names_the_files_of_the_directory_a_process_maps_that_still_have_a_name(
        tmp_path, holder):
    proc, a, _ = holder
    # the file held open but not mapped is no mapping; the unlinked one has no name left
    assert shm.mapped(Path(f"/proc/{proc.pid}/maps"), shm_dir=tmp_path) == [str(a)]
    assert shm.mapped(Path(f"/proc/{proc.pid}/maps"), shm_dir=tmp_path / "other") == []
    assert shm.mapped(tmp_path / "no-such-maps") == []


def test_only_files_no_process_maps_or_holds_open_are_removed(tmp_path, holder):
    proc, a, b = holder
    free = _segment(tmp_path / "mpich_shm_cc_0")
    (tmp_path / "sub").mkdir()
    nested = _segment(tmp_path / "sub" / "mpich_shm_dd_0")  # not directly in the directory
    link = tmp_path / "mpich_shm_ee_0"
    link.symlink_to(free)                                   # a name, not a segment
    elsewhere = _segment(tmp_path.parent / f"mpich_shm_{uuid.uuid4().hex[:8]}_0")
    paths = [str(p) for p in (a, b, free, nested, link, elsewhere, tmp_path / "missing")]
    try:
        assert shm.held(paths) == {str(a), str(b)}
        removed = shm.remove_unheld(paths, shm_dir=tmp_path)
        assert [p for p, _ in removed] == [str(free)] and removed[0][1] >= 4096
        assert a.exists() and b.exists() and nested.exists() and elsewhere.exists()
        assert link.is_symlink()
        proc.kill()
        proc.wait()  # its mappings and descriptors go with it
        assert sorted(p for p, _ in shm.remove_unheld(paths, shm_dir=tmp_path)) == \
            sorted([str(a), str(b)])
    finally:
        elsewhere.unlink(missing_ok=True)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_another_users_file_is_never_removed(tmp_path):
    theirs = _segment(tmp_path / "mpich_shm_ff_0")
    os.chown(theirs, 65534, 65534)
    assert shm.remove_unheld([str(theirs)], shm_dir=tmp_path) == []
    assert shm.leftovers(shm_dir=tmp_path) == [] and theirs.exists()


def test_leftovers_are_the_mpi_segments_no_process_holds(tmp_path, holder):
    _, a, b = holder
    names = ("mpich_shm_1a2b_0", "mpich_vci_1a2b_0", "vader_segment.n1.0.1",
             "sm_segment.n1.0.1.0", "ucx_shm_posix_5c512549", "nccl-Ab12Cd")
    left = [_segment(tmp_path / n) for n in names]
    _segment(tmp_path / "torch_1234_5678")  # another program's: not ours to judge
    _segment(tmp_path / "nccl-Ab12Cd.lock")
    found = shm.leftovers(shm_dir=tmp_path)
    assert sorted(p for p, _ in found) == sorted(str(p) for p in left)
    assert str(a) not in dict(found) and str(b) not in dict(found)


def test_the_sweep_removes_what_the_record_names_on_this_node_only_and_consumes_it(tmp_path):
    record = tmp_path / "w2.shm.json"
    seg = _segment(tmp_path / "mpich_shm_77_0")
    # rank 0 ran on another node: its files are that node's, never this one's namesakes
    record.write_text(json.dumps({"node": "elsewhere", "shm": [str(seg)]}))
    assert shm_sweep.sweep(record, host=socket.gethostname(), wait_s=0) == []
    assert seg.exists() and not record.exists()
    log = tmp_path / "w2.launch-1.log"
    log.write_text("$ mpiexec\n")
    record.write_text(json.dumps({"node": socket.gethostname(), "shm": [str(seg)]}))
    # outside /dev/shm nothing is removed: the sweep goes through remove_unheld's checks
    assert shm_sweep.sweep(record, log, wait_s=0) == []
    assert seg.exists()
    assert shm_sweep.sweep(tmp_path / "absent.json") == []  # a job that never got to MPI


def test_the_sweep_waits_for_the_jobs_ranks_to_let_go(monkeypatch, tmp_path):
    """MPICH's mpiexec returns from an MPI_Abort while its ranks are still dying."""
    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    seg = _segment(tmp_path / "mpich_shm_88_0")
    rank = subprocess.Popen([sys.executable, "-c", _HOLDER, str(seg), str(seg),
                             str(_segment(tmp_path / "gone"))], stdout=subprocess.PIPE, text=True)
    assert rank.stdout.readline().strip() == "ready"
    record = tmp_path / "w2.shm.json"
    record.write_text(json.dumps({"node": socket.gethostname(), "shm": [str(seg)]}))
    killer = subprocess.Popen([sys.executable, "-c",
                               f"import os,time; time.sleep(0.5); os.kill({rank.pid}, 9)"])
    log = tmp_path / "w2.launch-1.log"
    log.write_text("")
    try:
        removed = shm_sweep.sweep(record, log, wait_s=30)
        assert rank.poll() is not None  # not before the rank let go of it
    finally:
        killer.wait()
        rank.kill()
        rank.wait()
    assert [p for p, _ in removed] == [str(seg)] and not seg.exists()
    assert f"harness: removed {seg}" in log.read_text()


def test_the_bring_up_check_reports_leftovers_and_the_remedy():
    assert bringup.check_shm_leftovers(bringup.SiteFacts()) is None
    check = bringup.check_shm_leftovers(bringup.SiteFacts(shm_leftovers=(12, 50 << 20)))
    assert check.level == "warn" and "12 MPI/NCCL shared-memory file(s)" in check.detail
    assert "50 MiB" in check.detail and "harness env --clean-shm" in check.detail


def test_env_clean_shm_removes_unheld_segments_and_keeps_held_ones(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from harness.cli.main import cli

    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)  # never the machine's own /dev/shm
    free = _segment(tmp_path / "mpich_shm_5e5e_0")
    busy = _segment(tmp_path / "mpich_shm_5e5e_1")
    other = _segment(tmp_path / "torch_5e5e_0")  # another program's: not the command's
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(busy), str(busy),
                             str(_segment(tmp_path / "gone"))], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = CliRunner().invoke(cli, ["env", "--clean-shm", "--check"])
        assert out.exit_code == 0, out.output[-2000:]
        assert "removed 1 MPI/NCCL shared-memory file(s)" in out.output
        assert not free.exists() and busy.exists() and other.exists()
        assert "leftovers" not in out.output  # the checklist after the clean-up
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
