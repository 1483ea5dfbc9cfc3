"""The World: this process's place among the MPI ranks, its device and its process group.

Every rank of a launch builds one ``World`` from ``MPI.COMM_WORLD``. Its device and the
group's backend come from ``placement.place`` over the facts every rank reports (the GPUs it
sees, by UUID): device ``auto`` is CUDA when the ranks see GPUs, each rank on
``cuda:(local_rank % visible)``; the backend is ``nccl`` when no two ranks chose the same
GPU, ``gloo`` otherwise. The torch.distributed group is made on first use; its rendezvous goes
through MPI (rank 0 opens a TCPStore on a port the OS picks and broadcasts host and port), so
no fixed port is ever needed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.device import cuda
from harness.device.placement import (
    Placement,
    PlacementError,
    RankFacts,
    contention,
    place,
    usable_cpus,
)


class RuntimeSetupError(RuntimeError):
    """The device or process group cannot be set up as asked (exit code 2 or 4)."""


def _probe_cuda(device: torch.device) -> None:
    torch.cuda.synchronize(device)
    torch.ones(1, device=device).add_(1).item()


def broken_context(device: torch.device, probe: Any = None) -> str | None:
    """Why this process's CUDA context can run nothing more, or None. A kernel that reads or
    writes an illegal or misaligned address, traps, asserts or fails its launch leaves a
    sticky error: CUDA returns it from every later call in the process (the CUDA runtime
    API's error reference marks these "the process must be terminated and relaunched"), so
    every later case would error too. ``probe(device)`` (a synchronize and a tiny kernel)
    raising says so; a case's error that leaves the context working was not sticky. A CPU
    device has no context to break."""
    if device.type != "cuda":
        return None
    try:
        (probe or _probe_cuda)(device)
    except Exception as exc:  # torch raises AcceleratorError (a RuntimeError) or RuntimeError
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


#: what torch.distributed's backends say when a connection between ranks is gone: gloo's
#: pairs never reconnect (third_party/gloo/gloo/transport/tcp/pair.cc), and a NCCL
#: communicator that met an error is aborted (ProcessGroupNCCL.cpp: "NCCL communicator was
#: aborted on rank N", a DistBackendError; NCCL's own ncclRemoteError, ncclSystemError);
#: every later collective of the job then fails too
BROKEN_COMMUNICATOR = ("gloo/transport/", "Connection closed by peer",
                       "Connection reset by peer", "NCCL communicator was aborted",
                       "ncclRemoteError", "ncclSystemError")


def broken_communicator(error: str | None) -> str | None:
    """Why this rank's torch.distributed group can carry no more collectives, from the
    error its case raised (a forked copy of a rank that ran a collective on the rank's
    sockets, a peer's crash), or None."""
    if not error:
        return None
    found = next((m for m in BROKEN_COMMUNICATOR if m in error), None)
    return f"its torch.distributed connections are broken ({found})" if found else None


def world_mismatch(started: int | None, seen: int) -> str | None:
    """Why a rank must not run when its MPI world (``seen`` ranks) is not the job the launcher
    started (``started`` processes), or None. Ranks that did not wire up each come up as a
    world of their own: run on, each would record every case at the wrong world size."""
    if started is None or started == seen:
        return None
    return (f"the launcher started {started} processes but this one sees an MPI world of "
            f"{seen}: the ranks did not wire up into one job. Under srun the MPI library needs "
            "a PMI it speaks (the mpich wheel: --mpi=pmi2, which harness passes unless "
            "--launcher-args names an --mpi); with mpiexec, use the mpiexec of the MPI that "
            "mpi4py was built with")


def rank_facts(requested: str, node: str = "", local_rank: int = 0,
               local_size: int = 1) -> RankFacts:
    """What this process sees: its GPUs (none asked for under --device cpu, so a CPU run never
    touches CUDA), its torch build, an MPS daemon."""
    gpus = cuda.visible_gpus() if requested != "cpu" else ()
    return RankFacts(node or socket.gethostname(), local_rank, gpus, torch.__version__,
                     torch.version.cuda, mps=bool(gpus) and cuda.mps_running(),
                     cpus=usable_cpus(), local_size=local_size)


def resolve_device(requested: str) -> Placement:
    """This process's placement as the only rank (the CLI's view before any rank starts):
    RuntimeSetupError with one line when it cannot run as asked."""
    try:
        return place(requested, [rank_facts(requested)], 0)
    except PlacementError as exc:
        raise RuntimeSetupError(str(exc)) from exc


@dataclass
class World:
    """One rank's view of the job."""

    comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device
    backend: str
    timeout_s: float = 300.0
    #: every rank's placement (the same list on every rank)
    placements: list[Placement] = field(default_factory=list, repr=False)
    #: what every rank reported of its machine, the placements' input (the same list on
    #: every rank)
    facts: list[RankFacts] = field(default_factory=list, repr=False)
    #: why times taken here measure contention (ranks oversubscribed on CPUs, a shared
    #: GPU), or "" (``placement.contention``; the same on every rank)
    contention: str = ""
    _group: Any = field(default=None, repr=False)
    _store: Any = field(default=None, repr=False)
    #: whether ``default_group`` has tried to make the group
    _group_tried: bool = field(default=False, repr=False)

    @classmethod
    def from_mpi(cls, device: str = "auto", timeout_s: float = 300.0) -> World:
        """Build the World of this process from MPI.COMM_WORLD: every rank's facts gathered,
        the same placement decided on every rank (RuntimeSetupError where there is none)."""
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank, local_size = local.Get_rank(), local.Get_size()
        local.Free()
        facts = comm.allgather(rank_facts(device, MPI.Get_processor_name(), local_rank,
                                          local_size))
        try:
            placements = [place(device, facts, r) for r in range(len(facts))]
        except PlacementError as exc:
            raise RuntimeSetupError(str(exc)) from exc
        mine = placements[comm.Get_rank()]
        dev = torch.device(mine.device)
        if dev.type == "cuda":
            # before the group: init_process_group(device_id=) binds NCCL's communicator to
            # the device but sets no current device (torch 2.13 distributed_c10d.py)
            torch.cuda.set_device(dev)
        if mine.warning and local_rank == 0:
            warnings.warn(mine.warning, stacklevel=2)
        # under mpiexec torch starts with one intra-op thread; give each rank its share of the
        # node's cores instead (one rank on 2 cores: 2), unless the user said otherwise
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, len(facts[comm.Get_rank()].cpus) // local_size))
        return cls(comm, comm.Get_rank(), comm.Get_size(), local_rank, local_size, dev,
                   mine.backend, timeout_s, placements=placements, facts=facts,
                   contention=contention(facts, placements))

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def group(self) -> Any:
        """The torch.distributed default group, initialised through MPI on first use."""
        import torch.distributed as dist

        if self._group is None:
            if not dist.is_initialized():
                self._init_process_group()
            self._group = dist.group.WORLD
        return self._group

    def default_group(self) -> None:
        """Make torch.distributed's default group (``group``) unless it was made or tried
        before in this process: tried once, so that a job whose implementations use MPI alone
        does not wait on it case by case; where it cannot be made, an implementation that
        reads ``group`` raises torch's error itself."""
        if self._group is None and not self._group_tried:
            self._group_tried = True
            with contextlib.suppress(Exception):  # said where an implementation needs it
                self.group  # noqa: B018 - made on first read

    def _init_process_group(self) -> None:
        import torch.distributed as dist

        single_host = self.local_size == self.size
        host = "127.0.0.1" if single_host else _routable_host()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = None
        port = 0
        if self.rank == 0:
            # port 0: the OS picks a free one, so concurrent jobs never collide
            store = dist.TCPStore(host, 0, self.size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            port = store.port
        host, port = self.comm.bcast((host, port), root=0)
        if self.rank != 0:
            store = dist.TCPStore(host, port, self.size, is_master=False, timeout=timeout)
        dist.init_process_group(self.backend, store=store, rank=self.rank,
                                world_size=self.size, timeout=timeout,
                                device_id=self.device if self.backend == "nccl" else None)
        self._store = store

    def barrier(self) -> None:
        """An MPI barrier (independent of the torch group, so it works before it exists)."""
        self.comm.Barrier()

    def allreduce_max(self, value: float) -> float:
        from mpi4py import MPI

        return float(self.comm.allreduce(value, op=MPI.MAX))

    def allreduce_sum(self, value: int) -> int:
        from mpi4py import MPI

        return int(self.comm.allreduce(value, op=MPI.SUM))

    def synchronize(self) -> None:
        """Wait for this rank's device work to finish."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Tear down the torch group (MPI is finalised by mpi4py at exit)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self._group = None


def _routable_host() -> str:
    """An address of this host that the other nodes can reach."""
    override = os.environ.get("HARNESS_MASTER_ADDR")
    if override:
        return override
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name
