"""Ad hoc implementations used by the integration tests (loaded with --impl module:callable).

They stand for a user's own kernels: one wrong, one wrong on one rank for unaligned inputs
only, one that raises on one rank for one case, one
that deadlocks in every case, one that kills a rank for one case, two that end their processes
cleanly for one case, one that leaves flush-to-zero on, one that floods its job's log.
Everything else they compute correctly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from suites._collectives.allreduce import allreduce_torch


def _is_target(x: torch.Tensor, op: str) -> bool:
    # one case of the smoke grid: float32, n=1031, op=min, out of place
    return op == "min" and x.dtype == torch.float32 and x.numel() == 1031


def unaligned_wrong_on_rank_1(world, x, out, op):
    """Right on aligned buffers; on rank 1, a scalar fallback for unaligned ones whose tail
    element is wrong (the other ranks are right)."""
    allreduce_torch(world, x, out, op)
    if world.rank == 1 and x.data_ptr() % 16:
        out[-1] = 1 if bool(out[-1] == 0) else 0
    return out


def avg_premultiplied(world, x, out, op):
    """NCCL's float avg: each rank's value times 1/W held in the dtype, then summed (right)."""
    import torch.distributed as dist

    if op != "avg" or not x.dtype.is_floating_point:
        return allreduce_torch(world, x, out, op)
    scaled = x * torch.tensor(1.0 / world.size, dtype=x.dtype)
    out.copy_(scaled)
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=world.group)
    return out


def off_by_one(world, x, out, op):
    """Wrong on every case: adds one to the result."""
    allreduce_torch(world, x, out, op)
    return out.add_(1)


def raise_on_last_rank(world, x, out, op):
    """Raises on the last rank for one case, leaving the others waiting in the collective;
    correct elsewhere."""
    if _is_target(x, op) and world.rank == world.size - 1:
        raise ValueError("uneven splits are not supported")
    return allreduce_torch(world, x, out, op)


def hang_every_case(world, x, out, op):
    """Deadlocks in every case: the last rank never joins the collective."""
    if world.rank == world.size - 1:
        while True:
            time.sleep(1)
    return allreduce_torch(world, x, out, op)


def exits_zero(world, x, out, op):
    """Every rank's process ends with exit code 0 in one case (os._exit, as a library might)."""
    if _is_target(x, op):
        os._exit(0)
    return allreduce_torch(world, x, out, op)


def calls_sys_exit(world, x, out, op):
    """Every rank raises SystemExit in one case (sys.exit in a kernel's wrapper)."""
    if _is_target(x, op):
        sys.exit(0)
    return allreduce_torch(world, x, out, op)


def flush_on_rank_one(world, x, out, op):
    """Right, but for one case leaves flush-to-zero on in rank 1's process, and in every
    thread it starts, for every later case."""
    if _is_target(x, op) and world.rank == min(1, world.size - 1):
        torch.set_flush_denormal(True)
    return allreduce_torch(world, x, out, op)


def crash_on_rank_one(world, x, out, op):
    """Rank 1 dies (as a segfaulting kernel would) on one case; correct elsewhere."""
    if _is_target(x, op) and world.rank == min(1, world.size - 1):
        os._exit(13)
    return allreduce_torch(world, x, out, op)


def floods_its_log(world, x, out, op):
    """Prints in a loop on one case, until stopped (a debug print left in a kernel's loop):
    50 MiB a second on each rank; right elsewhere."""
    if _is_target(x, op):
        line = "x" * (1 << 20) + "\n"
        while True:
            sys.stdout.write(line)
            sys.stdout.flush()
            time.sleep(0.02)
    return allreduce_torch(world, x, out, op)


def writes_input_on_rank_one(world, x, out, op):
    """Right, but rank 1 alone then writes its read-only input in one case: only that rank's
    contract check fails, and every rank must still make the case's later calls."""
    allreduce_torch(world, x, out, op)
    if _is_target(x, op) and world.rank == min(1, world.size - 1) and x is not out:
        x.view(-1)[0] += 1
    return out


#: exposed through a test-made entry point in group harness.implementations
ENTRY = {"allreduce": allreduce_torch}


def sleepy(world, x, out, op):
    """Correct, and slow by design: 20 ms plus $HARNESS_TEST_DELAY_S (the planted slowdown the
    regression tests look for). Sleep keeps the timing steady on a loaded machine; 20 ms, not
    2, because a sleep's overshoot and the allreduce beside it move by a few tenths of a ms
    between processes, which was 10% of 2 ms: a false regression in 1 to 2 runs of 5."""
    time.sleep(0.02 + float(os.environ.get("HARNESS_TEST_DELAY_S", "0")))
    return allreduce_torch(world, x, out, op)


_FAULTED = False


def sticky_on_rank_one(world, x, out, op):
    """Rank 1 faults on one case as a kernel with an illegal address does on a GPU: the call
    raises, and the process is unusable after it (every later call raises, and the harness's
    probe of the context says so). Correct before the fault, and in any new process. On that
    case the other ranks return at once (a rank left in a collective would wait for the
    faulted one until its deadline)."""
    global _FAULTED
    if _FAULTED:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (an earlier "
                           "case's, sticky)")
    if _is_target(x, op) and world.rank != min(1, world.size - 1):
        return out
    if _is_target(x, op):
        import harness.device.runtime

        _FAULTED = True
        harness.device.runtime.broken_context = lambda device, probe=None: (
            "CUDA error: an illegal memory access was encountered")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return allreduce_torch(world, x, out, op)


def connection_lost_on_rank_zero(world, x, out, op):
    """On one case rank 0's collective raises what gloo raises when a peer's socket closed
    (as a forked copy of a rank that ran a collective on the rank's sockets leaves them:
    gloo's pairs never reconnect, so every later collective of the job fails). The other
    ranks return at once, as after sticky_on_rank_one's fault."""
    if _is_target(x, op) and world.size > 1:
        if world.rank == 0:
            raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                               "Connection closed by peer [127.0.0.1]:58015")
        return out
    return allreduce_torch(world, x, out, op)


def stall_while_flagged(world, x, out, op):
    """Correct, after waiting on every rank while the file $HARNESS_TEST_STALL names exists:
    a test holds a job inside a case this way while it takes a node away, and removes the
    file for the run that finishes it."""
    flag = os.environ.get("HARNESS_TEST_STALL")
    while flag and os.path.exists(flag):
        time.sleep(0.05)
    return allreduce_torch(world, x, out, op)


# ---- wrong reductions only more ranks and the edge cases show (test_cli_integration's
# reduction_edges_run): each computes every rank's rows, then reduces them its own wrong way

def _rows(world, x: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    rows = [torch.empty_like(x) for _ in range(world.size)]
    dist.all_gather(rows, x.contiguous(), group=world.group)
    return torch.stack(rows)


def _fold(rows: torch.Tensor, op: str, order: list[int], start: torch.Tensor | None = None
          ) -> torch.Tensor:
    def wide(t: torch.Tensor) -> torch.Tensor:  # float32, or int64 for integers
        return t.float() if t.dtype.is_floating_point else t.long()

    acc = wide(rows[order[0]] if start is None else start)
    for r in order[1:] if start is None else order:
        v = wide(rows[r])
        acc = {"sum": acc + v, "avg": acc + v, "prod": acc * v, "min": torch.fmin(acc, v),
               "max": torch.fmax(acc, v)}[op]
    return acc / len(order) if op == "avg" else acc


def rank_rotated(world, x, out, op):
    """Each rank sums from its own row on: every rank within tolerance, no two alike."""
    rows = _rows(world, x)
    order = [(world.rank + i) % world.size for i in range(world.size)]
    return out.copy_(_fold(rows, op, order).to(out.dtype))


def folded_into_out(world, x, out, op):
    """min and max folded into whatever out held (fmin/fmax skip a NaN poison)."""
    rows = _rows(world, x)
    start = out.clone() if op in ("min", "max") else None
    return out.copy_(_fold(rows, op, list(range(world.size)), start).to(out.dtype))


def flushing_subnormals(world, x, out, op):
    """A reduction whose loads flush subnormals to zero."""
    rows = _rows(world, x)
    tiny = torch.finfo(x.dtype).tiny
    rows = torch.where(rows.abs() < tiny, torch.zeros_like(rows), rows)
    return out.copy_(_fold(rows, op, list(range(world.size))).to(out.dtype))


def product_in_bf16(world, x, out, op):
    """A product whose running value is kept in bf16 (a reduction kernel's narrow
    accumulator); every other op right. Powers of two, the exact mode's factors, survive it."""
    rows = _rows(world, x)
    if op != "prod" or not x.dtype.is_floating_point:
        return out.copy_(_fold(rows, op, list(range(world.size))).to(out.dtype))
    acc = rows[0].to(torch.bfloat16)
    for r in range(1, world.size):
        acc = (acc.float() * rows[r].float()).to(torch.bfloat16)
    return out.copy_(acc.to(out.dtype))


def vector_tail_unreduced(world, x, out, op):
    """An aligned fast path (a count of whole 4-element vectors) whose last vector keeps this
    rank's own values; odd counts take the general path, right."""
    rows = _rows(world, x)
    result = _fold(rows, op, list(range(world.size))).to(out.dtype)
    if x.numel() and x.numel() % 4 == 0:
        result[-4:] = x[-4:]
    return out.copy_(result)


def default_group_allreduce(world, x, out, op):
    """torch.distributed on its default group (no ``group=``), as most libraries call it."""
    import torch.distributed as dist

    out.copy_(x)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


# ---- processes an implementation starts (test_cli_integration's children test): each
# computes the right result first, then starts one

#: in the command line of every process these start, to find any left behind
SLEEPER = "harness-test-sleeper"


def _right(world, x, out, op):
    return out.copy_(_fold(_rows(world, x), op, list(range(world.size))).to(out.dtype))


def forks_and_returns(world, x, out, op):
    """os.fork() without exec: the child returns into the harness as the parent does."""
    _right(world, x, out, op)
    os.fork()
    return out


def forks_a_sleeper(world, x, out, op):
    """A forked child that sleeps, holding the launcher's output pipes."""
    _right(world, x, out, op)
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                  SLEEPER])
    return out


def double_forks_a_sleeper(world, x, out, op):
    """A daemon's double fork without exec: the first child exits at once, the grandchild
    sleeps (holding the launcher's output pipes) with the rank's environment as it was at
    the rank's start, which carries no mark. Its pid goes to a file in the working folder."""
    _right(world, x, out, op)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            with open(f"{SLEEPER}.{os.getpid()}.pid", "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    return out


def detaches_a_daemon(world, x, out, op):
    """A process in a session of its own (a daemonising compile server)."""
    _right(world, x, out, op)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", SLEEPER],
                     start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    return out


def writes_run_files(world, x, out, op):
    """Debug files by relative path, named as the run's own."""
    for name in ("results.jsonl", "run.json", "w1.progress.json", "w2.skip"):
        with open(name, "a") as f:
            f.write("{not json\n")
    return _right(world, x, out, op)
