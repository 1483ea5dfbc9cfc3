"""Where each rank runs and which backend its process group uses, decided from plain facts.

Every rank reports what it sees (``RankFacts``: its node, its place on the node, the GPUs
visible to it by UUID, whether its torch can use CUDA); the facts of all ranks are gathered,
and every rank makes the same decision with :func:`place`. Nothing here touches CUDA, so the
CPU tests drive it through every situation a site can be in:

- one GPU per rank by enumeration: every rank sees all GPUs of its node and takes
  ``local_rank % count``;
- one GPU per rank by binding (``srun --gpus-per-task=1``, ``--gpu-bind``, a per-rank
  ``CUDA_VISIBLE_DEVICES``): every rank sees one GPU, its device 0;
- several ranks on one GPU (4 or 8 ranks, 1 GPU): gloo, with a warning, since NCCL refuses
  two ranks of one communicator on the same GPU;
- a CPU-only torch on a GPU host, a compute mode that forbids sharing, ranks that see no GPU
  beside ranks that do: one line naming the problem and its remedy.

The backend is ``nccl`` exactly when the GPUs the ranks chose are pairwise distinct (UUIDs are
unique across nodes too), whatever the device count each rank sees.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
#: CUcomputemode values (cuda.h: CU_COMPUTEMODE_DEFAULT = 0, _PROHIBITED = 2,
#: _EXCLUSIVE_PROCESS = 3; 1 was exclusive-thread, removed in CUDA 8)
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
#: the modes that allow one process per GPU (several need an MPS daemon to share it)
EXCLUSIVE_MODES = ("exclusive_process", "exclusive_thread")
TORCH_CUDA_INSTALL = "https://pytorch.org/get-started/locally/"


class PlacementError(ValueError):
    """The ranks cannot be placed as asked; the message names the problem and the remedy
    (exit code 2)."""


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as a process sees it."""

    uuid: str
    name: str = ""
    #: one of COMPUTE_MODES' names, or "unknown" where nothing could read it
    compute_mode: str = "default"
    #: the device's CUDA ordinal in this process (``cuda:N``). A device whose UUID query
    #: failed is left out of a rank's list, so a GPU's place in the list is not its ordinal;
    #: None: the same as its place
    index: int | None = None


@dataclass(frozen=True)
class RankFacts:
    """What one rank sees of its machine."""

    node: str = "localhost"
    local_rank: int = 0
    #: the GPUs this process sees, in CUDA's order (after CUDA_VISIBLE_DEVICES)
    gpus: tuple[GpuFacts, ...] = ()
    #: torch.__version__, and torch.version.cuda (None: a CPU-only build)
    torch_version: str = ""
    torch_cuda: str | None = None
    #: an MPS control daemon serves this node (several processes may share an exclusive GPU)
    mps: bool = False
    #: the logical CPUs this process may run on (``os.sched_getaffinity``); () where unknown
    cpus: tuple[int, ...] = ()
    #: the ranks on this rank's node (its node-local communicator, MPI's shared-memory split)
    local_size: int = 1


@dataclass(frozen=True)
class Placement:
    """One rank's device and the job's backend; ``warning`` is said once by rank 0."""

    device: str
    backend: str
    gpu_uuid: str | None = None
    warning: str = ""

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def device_index(self) -> int | None:
        _, _, index = self.device.partition(":")
        return int(index) if index else None


def ranges(ranks: Sequence[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0] if ordered else 0
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(out) if ordered else ""


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 16 else uuid[:15] + "…"


def place(requested: str, ranks: Sequence[RankFacts], rank: int) -> Placement:
    """The placement of ``rank`` among ``ranks`` for ``--device requested``; the same
    decision on every rank (the backend in particular). Raises PlacementError."""
    if requested not in DEVICES:
        raise PlacementError(f"unknown device {requested!r}; use auto, cpu or cuda")
    if requested == "cpu" or not ranks:
        return Placement("cpu", "gloo")
    seeing = [r for r, f in enumerate(ranks) if f.gpus]
    if not seeing:
        if requested == "cuda":
            raise PlacementError("--device cuda but no CUDA device is visible; use --device cpu"
                                 " (`harness env --check` says what the driver reported)")
        return Placement("cpu", "gloo")
    blind = [r for r, f in enumerate(ranks) if not f.gpus]
    if blind:
        nodes = sorted({ranks[r].node for r in blind})
        raise PlacementError(
            f"ranks {ranges(blind)} (on {', '.join(nodes)}) see no GPU while ranks "
            f"{ranges(seeing)} do: give every rank a GPU (CUDA_VISIBLE_DEVICES, srun "
            "--gpus-per-task) or run with --device cpu")
    cpu_torch = [r for r, f in enumerate(ranks) if f.torch_cuda is None]
    if cpu_torch:
        f = ranks[cpu_torch[0]]
        raise PlacementError(
            f"{len(f.gpus)} GPU(s) visible but torch {f.torch_version or '?'} is a CPU-only "
            f"build: install a CUDA build of torch ({TORCH_CUDA_INSTALL}) or run with "
            "--device cpu")
    chosen = [f.gpus[f.local_rank % len(f.gpus)] for f in ranks]
    for gpu in chosen:
        if gpu.compute_mode == "prohibited":
            raise PlacementError(
                f"GPU {gpu.uuid} ({gpu.name or 'unnamed'}) is in prohibited compute mode: no "
                "process may use it; an administrator sets `nvidia-smi -c DEFAULT`, or run "
                "with --device cpu")
    sharing: dict[str, list[int]] = {}
    for r, gpu in enumerate(chosen):
        sharing.setdefault(gpu.uuid, []).append(r)
    shared = {uuid: rs for uuid, rs in sharing.items() if len(rs) > 1}
    for uuid, rs in shared.items():
        gpu = chosen[rs[0]]
        if gpu.compute_mode in EXCLUSIVE_MODES and not all(
                ranks[r].mps for r in rs):
            raise PlacementError(
                f"ranks {ranges(rs)} would share GPU {uuid} ({gpu.name or 'unnamed'}), which "
                f"is in {gpu.compute_mode.replace('_', '-')} compute mode (one process per "
                "GPU): run at most one rank per GPU, start an MPS daemon, or have an "
                "administrator set `nvidia-smi -c DEFAULT`")
    mine = ranks[rank]
    position = mine.local_rank % len(mine.gpus)
    ordinal = mine.gpus[position].index
    device = f"cuda:{position if ordinal is None else ordinal}"
    if not shared:
        return Placement(device, "nccl", chosen[rank].uuid)
    groups = "; ".join(f"ranks {ranges(rs)} on GPU {_short(uuid)}"
                       for uuid, rs in sorted(shared.items(), key=lambda kv: kv[1][0]))
    warning = (f"{len(ranks)} ranks on {len(sharing)} GPU(s), some shared ({groups}): using "
               "gloo, not nccl (NCCL needs a GPU of its own per rank)")
    return Placement(device, "gloo", chosen[rank].uuid, warning)


def usable_cpus() -> tuple[int, ...]:
    """The logical CPUs this process may run on (its affinity; every CPU where the platform
    has no affinity call)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def contention(ranks: Sequence[RankFacts], placements: Sequence[Placement]) -> str:
    """Why times taken with these placements measure contention rather than the
    implementation, or "" when they can mean something; the same answer on every rank.

    A node runs more ranks than the CPUs they may use between them (the union of their
    affinities, so ranks bound one per core count as many cores as ranks), or two ranks share
    one GPU: a rank's time then includes the other ranks' turns on the same core or GPU. A
    node whose ranks report no CPUs is not judged by CPUs."""
    reasons: list[str] = []
    by_node: dict[str, list[RankFacts]] = {}
    for f in ranks:
        by_node.setdefault(f.node, []).append(f)
    for node, facts in sorted(by_node.items()):
        cpus = set().union(*(f.cpus for f in facts))
        if cpus and len(facts) > len(cpus):
            reasons.append(f"{len(facts)} ranks on {len(cpus)} CPU(s) of {node}")
    sharing: dict[str, list[int]] = {}
    for r, p in enumerate(placements):
        if p.gpu_uuid:
            sharing.setdefault(p.gpu_uuid, []).append(r)
    reasons += [f"ranks {ranges(rs)} share GPU {_short(uuid)}"
                for uuid, rs in sorted(sharing.items(), key=lambda kv: kv[1][0]) if len(rs) > 1]
    return "; ".join(reasons)
