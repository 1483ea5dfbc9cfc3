"""A real two-node SLURM cluster on one Linux machine, for the tests.

Each node (``n1``, ``n2``) is a ``slurmd`` in namespaces of its own: network, UTS (its
hostname), mount, IPC and PID; ``slurmctld`` runs in a third (``ctl``). Their network
namespaces are joined by veth pairs to a bridge on a private /24 that this machine also has an
address on (.1), so the test process is the cluster's login node: its ``srun`` and ``sbatch``
reach slurmctld, and the nodes reach back to it. One ``munged`` on this machine serves all of
them through its socket (a path on the file system every namespace shares). The file system is
this machine's, so every directory is "shared storage", except what each node mounts privately:

- a fresh ``/sys`` (the one of its network namespace: MPI's UCX transport then sees the node's
  veth, not this machine's interfaces, and the host's cgroup tree bound back on top, without
  which slurmd exits with "No filesystem mounted on /sys/fs/cgroup", as it does under
  ``ip netns exec``, which hides it);
- ``/proc`` of its PID namespace and a ``/dev/shm`` of its own: with the IPC namespace, no
  shared memory joins ranks of different nodes, so their traffic crosses the bridge;
- an ``/etc/hosts`` naming ctl, n1 and n2 by their bridge addresses (torch's TCPStore and gloo
  find a rank's address from its hostname).

A node's namespaces but the network one live as long as the first process in its PID
namespace (a small init, this file run as a script, that mounts the above and reaps orphans):
killing it takes down its slurmd, slurmstepd and ranks at once, which is how a test loses a
node. Each network namespace is held by a process of its own (``unshare --net sleep``), so a
node can be started again on the same address, and nothing is mounted on this machine (``ip
netns add`` would mount /run/netns).

Only what this helper made is torn down: the processes it started (by pid; a network namespace
goes with the last of its processes, and its veth pair with it), its bridge (by its name, which
carries a random tag), its munged, and its temporary directory.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_cluster import Unavailable, common_conf, require_slurm, start_munged

NODES = ("n1", "n2")
CONTROLLER = "ctl"
#: seconds slurmctld waits for an unanswering slurmd before it sets the node DOWN (and kills
#: the jobs on it); SLURM's default is 300, a test that loses a node waits this long
SLURMD_TIMEOUT_S = 2


class TwoNodeCluster:
    """The running cluster; ``env`` is the environment its commands need (``SLURM_CONF``)."""

    def __init__(self, cpus_per_node: int = 2) -> None:
        require_slurm()
        missing = [b for b in ("unshare", "nsenter", "ip") if shutil.which(b) is None]
        if missing:
            raise Unavailable(f"{', '.join(missing)} missing: the two-node cluster needs "
                              "util-linux's unshare and nsenter and iproute2's ip")
        self.cpus = cpus_per_node
        self.tag = f"{random.randrange(16**5):05x}"
        self.bridge = f"hkb{self.tag}"
        self.root = Path(tempfile.mkdtemp(prefix="harness-slurm2-"))
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        self._inits: dict[str, subprocess.Popen] = {}
        self._netns: dict[str, subprocess.Popen] = {}  # the process holding each one
        self._bridge_made = False
        self._munged = False
        atexit.register(self.stop)  # also when the session ends without its teardown
        try:
            self._bring_up()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ bring-up

    def _bring_up(self) -> None:
        net = _free_subnet()
        self.login_addr = str(net[1])
        self.addr = {CONTROLLER: str(net[10]), **{n: str(net[11 + i])
                                                  for i, n in enumerate(NODES)}}
        r = self.root
        (r / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{a} {name}\n" for name, a in self.addr.items()))
        sock = start_munged(r)
        self._munged = True
        (r / "state").mkdir()
        for name in NODES:
            (r / "spool" / name).mkdir(parents=True)
        nodes = "".join(
            f"NodeName={n} NodeAddr={self.addr[n]} CPUs={self.cpus} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={self.cpus} ThreadsPerCore=1 State=UNKNOWN\n" for n in NODES)
        (r / "slurm.conf").write_text(f"""\
ClusterName=harness-two
SlurmctldHost={CONTROLLER}({self.addr[CONTROLLER]})
SlurmctldPort=6817
SlurmdPort=6818
SlurmdSpoolDir={r / 'spool'}/%n
SlurmdPidFile={r / 'spool'}/%n/slurmd.pid
SlurmdLogFile={r}/slurmd-%n.log
SlurmdTimeout={SLURMD_TIMEOUT_S}
MessageTimeout=2
{common_conf(r, sock)}
{nodes}PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP \
OverSubscribe=YES
""")
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        self._ip("addr", "add", f"{self.login_addr}/{net.prefixlen}", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for name in (CONTROLLER, *NODES):
            holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"],
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=_die_with_parent)
            self._netns[name] = holder
            inside = ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]
            veth = f"hk{self.tag}{name}"
            self._until_own_netns(holder)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
                     str(holder.pid))
            self._ip("link", "set", veth, "master", self.bridge, "up")
            self._ip("addr", "add", f"{self.addr[name]}/{net.prefixlen}", "dev", "eth0",
                     prefix=inside)
            self._ip("link", "set", "eth0", "up", prefix=inside)
            self._ip("link", "set", "lo", "up", prefix=inside)
        self._start(CONTROLLER, ["slurmctld", "-D", "-i"])
        for name in NODES:
            self.start_node(name)

    @staticmethod
    def _until_own_netns(holder: subprocess.Popen, timeout_s: float = 10) -> None:
        """Wait until ``holder`` (``unshare --net``) is in its new network namespace."""
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if holder.poll() is not None:
                raise Unavailable("`unshare --net` failed: the two-node cluster needs network "
                                  "namespaces")
            try:
                if os.readlink(f"/proc/{holder.pid}/ns/net") != mine:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise Unavailable("`unshare --net` did not make a network namespace")

    def _ip(self, *args: str, prefix: tuple[str, ...] | list[str] = ()) -> None:
        out = subprocess.run([*prefix, "ip", *args], capture_output=True, text=True,
                             timeout=30)
        if out.returncode != 0:
            raise Unavailable(f"`ip {' '.join(args)}` failed: {out.stderr.strip()} (the "
                              "two-node cluster needs network namespaces, veth and bridges)")

    def _start(self, name: str, daemon: list[str]) -> None:
        """``daemon`` as the one child of a node's init, in the node's network namespace and
        new UTS, mount, IPC and PID namespaces."""
        log = open(self.root / f"init-{name}.log", "ab")  # noqa: SIM115 (the init's, kept)
        proc = subprocess.Popen(
            ["nsenter", f"--net=/proc/{self._netns[name].pid}/ns/net",
             "unshare", "--uts", "--ipc", "--pid", "--mount", "--fork", "--kill-child",
             "--propagation", "private",
             sys.executable, __file__, name, str(self.root / "hosts"),
             str(self.root / f"cgroup-{name}"), *daemon],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        self._inits[name] = proc

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env,
                             capture_output=True, text=True, timeout=30)
        return dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)

    def wait_idle(self, names: tuple[str, ...] = NODES, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in names):
                return
            for name in (CONTROLLER, *names):
                proc = self._inits.get(name)
                if proc is not None and proc.poll() is not None:
                    raise Unavailable(f"{name}'s daemon exited:\n{self._logs(name)}")
            time.sleep(0.1)
        raise Unavailable(f"nodes {', '.join(names)} never came up idle ({states}):\n"
                          + "\n".join(self._logs(n) for n in (CONTROLLER, *names)))

    def _logs(self, name: str, lines: int = 10) -> str:
        """The last lines of a node's logs (the directory goes with the cluster)."""
        daemon = "slurmctld.log" if name == CONTROLLER else f"slurmd-{name}.log"
        out = []
        for log in (self.root / f"init-{name}.log", self.root / daemon):
            try:
                tail = log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"{log.name}:\n" + "\n".join(tail))
        return "\n".join(out)

    def start_node(self, name: str) -> None:
        """Start ``name``'s slurmd (again, after ``kill_node``) and wait until it is idle."""
        self._start(name, ["slurmd", "-D", "-N", name])
        self.wait_idle((name,))

    def running(self) -> list[str]:
        """The nodes (and the controller) whose processes run."""
        return [name for name, proc in self._inits.items() if proc.poll() is None]

    def traffic(self, name: str) -> int:
        """The bytes that crossed ``name``'s link to the bridge so far, both ways."""
        stats = Path(f"/sys/class/net/hk{self.tag}{name}/statistics")
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))

    def kill_node(self, name: str) -> None:
        """Lose ``name`` as a machine is lost: SIGKILL to its init, which takes its slurmd,
        slurmstepd and job processes with it (the kernel kills a PID namespace whole when its
        first process dies). Returns once they are gone; slurmctld learns it by itself."""
        proc = self._inits.pop(name)
        init = _child_of(proc.pid)
        if init is not None:
            os.kill(init, signal.SIGKILL)
        proc.wait(timeout=30)

    # ------------------------------------------------------------------ teardown

    def stop(self) -> None:
        for name in list(self._inits):
            proc = self._inits.pop(name)
            if proc.poll() is None:
                init = _child_of(proc.pid)
                if init is not None:
                    os.kill(init, signal.SIGKILL)
                proc.kill()  # --kill-child: unshare takes its init with it
            proc.wait(timeout=30)
        if self._munged:
            pid_file = self.root / "munged.pid"
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass
            self._munged = False
        for holder in self._netns.values():  # the namespace goes, its veth pair with it
            holder.kill()
            holder.wait(timeout=30)
        self._netns.clear()
        if self._bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
            self._bridge_made = False
        shutil.rmtree(self.root, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, however it dies (prctl(2)
    PR_SET_PDEATHSIG), so no namespace outlives it; unshare --kill-child passes it on."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _child_of(pid: int) -> int | None:
    """The one child of ``pid`` (unshare --fork's: the node's init), or None."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no interface or route of this machine uses."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    out += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    used = []
    for word in out.split():
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randrange(64, 250)}.{random.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used if u.version == 4 and u.prefixlen > 0):
            return net
    raise Unavailable("no free private /24 in 10.0.0.0/8 for the two-node cluster's bridge")


def _init(name: str, hosts: str, stash: str, daemon: list[str]) -> int:
    """A node's first process: its hostname, a fresh /sys (with the host's cgroup tree bound
    back), /proc, /dev/shm and /etc/hosts; then ``daemon``, whose exit it returns, reaping
    every orphan of the namespace meanwhile."""
    def mount(*args: str) -> None:
        subprocess.run(["mount", *args], check=True)

    os.makedirs(stash, exist_ok=True)
    mount("--rbind", "/sys/fs/cgroup", stash)
    mount("-t", "sysfs", "sysfs", "/sys")
    mount("--rbind", stash, "/sys/fs/cgroup")
    subprocess.run(["umount", "-l", stash], check=True)
    mount("-t", "proc", "proc", "/proc")
    mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm")
    mount("--bind", hosts, "/etc/hosts")
    subprocess.run(["hostname", name], check=True)
    child = subprocess.Popen(daemon)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(_init(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
