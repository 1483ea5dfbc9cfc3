"""A real single-node SLURM cluster for the tests: Debian's ``slurm-wlm`` (slurmctld, slurmd)
and ``munge``, started in a temporary directory on free ports and shut down afterwards.

The slurm.conf is the smallest that runs jobs: no cgroups (proctrack/linuxproc, task/none),
no accounting, one node that declares 8 CPUs whatever the host has (``config_overrides``:
8 ranks on a 2-core machine, oversubscribed as the harness's other tests are). Every SLURM
command of the tests finds it through ``SLURM_CONF``; munged gets a socket of its own, so a
system munged, if any, is left alone. slurmd launches jobs as their user, so it needs root.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from services import free_port

MUNGE_KEY = Path("/etc/munge/munge.key")


def wait_for_job(env: dict[str, str], job: str, timeout_s: float = 600) -> dict[str, str]:
    """A SLURM job's fields (``scontrol show job``) once it has ended, polled: ``sbatch --wait``
    backs off to 32 s sleeps."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                             capture_output=True, text=True)
        fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
        if fields.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING",
                                          "COMPLETING"):
            return fields
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not end in {timeout_s} s")


class Unavailable(Exception):
    """No cluster can be started here: the message says why and how to get one."""


def require_slurm() -> None:
    """Unavailable unless SLURM's daemons and commands are installed and this is root."""
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol")
               if shutil.which(b) is None]
    if missing:
        raise Unavailable(f"SLURM is not installed ({', '.join(missing)} missing; Debian: "
                          "apt-get install slurm-wlm; .ci/run installs it)")
    if os.geteuid() != 0:
        raise Unavailable("slurmd starts jobs as their user and must run as root")


def start_munged(root: Path) -> Path:
    """A munged of the cluster's own in ``root`` (the system's key if there is one, else a
    new one), so a system munged, if any, is left alone; returns its socket. munged wants the
    directory of its socket readable by all and that of its key 0700."""
    keys = root / "munge"
    keys.mkdir(mode=0o700)
    key = keys / "munge.key"
    if MUNGE_KEY.is_file():
        shutil.copyfile(MUNGE_KEY, key)
    else:  # a key of our own: munge's is 1024 random bytes
        key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    root.chmod(0o755)
    sock = root / "munge.sock"
    out = subprocess.run(["munged", "--force", f"--socket={sock}", f"--key-file={key}",
                          f"--pid-file={root / 'munged.pid'}", f"--log-file={keys / 'munged.log'}",
                          f"--seed-file={keys / 'munged.seed'}"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise Unavailable(f"munged failed: {out.stderr.strip()[-2000:]}")
    return sock


def common_conf(root: Path, sock: Path) -> str:
    """The slurm.conf lines every test cluster shares: root runs everything, munge through
    ``sock``, no cgroups (proctrack/linuxproc, task/none), no accounting, nodes that declare
    the CPUs slurm.conf gives them whatever the host has (config_overrides), and a node that
    comes back once its slurmd does (ReturnToService=2)."""
    return f"""\
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2"""


class Cluster:
    """One running cluster; ``env`` is the environment its commands need."""

    def __init__(self, cpus: int = 8) -> None:
        require_slurm()
        self.root = Path(tempfile.mkdtemp(prefix="harness-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        sock = start_munged(self.root)
        (self.root / "state").mkdir()
        (self.root / "spool").mkdir()
        r = self.root
        (r / "slurm.conf").write_text(f"""\
ClusterName=harness-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmdSpoolDir={r / 'spool'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmdLogFile={r / 'slurmd.log'}
{common_conf(r, sock)}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} Boards=1 SocketsPerBoard=1 \
CoresPerSocket={cpus} ThreadsPerCore=1 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        atexit.register(self.stop)  # also when the session ends without its teardown
        self._run(["slurmctld", "-i"])
        self._run(["slurmd", "-N", self.node])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env,
                                 capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip() == "idle":
                return
            time.sleep(0.2)
        self.stop()
        raise Unavailable(f"the test cluster's node never came up idle: see {r}/slurmd.log")

    def _run(self, cmd: list[str]) -> None:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise Unavailable(f"{cmd[0]} failed: {out.stderr.strip()[-2000:]}")

    def stop(self) -> None:
        if not self.root.exists():
            return
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=60)
        for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            pid_file = self.root / name
            deadline = time.monotonic() + 10
            while pid_file.exists() and time.monotonic() < deadline:
                try:
                    pid = int(pid_file.read_text().split()[0])
                    os.kill(pid, 15 if name == "munged.pid" else 0)
                except (ValueError, IndexError, ProcessLookupError):
                    break
                time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
