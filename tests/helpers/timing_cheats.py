"""Implementations of hopper_tasks.rmsnorm that return right answers with times that lie
(loaded with --impl timing_cheats:NAME): each must fail its case."""

from __future__ import annotations

import threading

import torch

from reference_kernels import hopper_tasks as ref

_calls: dict[str, int] = {}
_kept: dict[object, torch.Tensor] = {}


def _honest(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return ref.rmsnorm(x, weight)


def by_address(x, weight):
    """Keeps each result by the inputs' addresses: repeats over the same buffers are free."""
    key = (x.data_ptr(), weight.data_ptr(), tuple(x.shape))
    if key not in _kept:
        _kept[key] = _honest(x, weight)
    return _kept[key].clone()


def by_call(x, weight):
    """Computes the first calls of a case, then returns the last result: the timed calls."""
    key = tuple(x.shape)
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] <= 3 or key not in _kept:
        _kept[key] = _honest(x, weight)
    return _kept[key].clone()


def _fingerprint(*tensors: torch.Tensor) -> tuple:
    """Shapes and 8 elements of each tensor at evenly spaced positions."""
    key: list = []
    for t in tensors:
        flat = t.reshape(-1)
        step = max(1, flat.numel() // 8)
        key += [tuple(t.shape), t.dtype, tuple(flat[::step][:8].tolist())]
    return tuple(key)


def by_fingerprint(x, weight):
    """Keeps each result by a sample of the inputs' values: the timed repeats (the same
    values) cost a lookup, and inputs that differ elsewhere get a stale result."""
    key = ("fingerprint",) + _fingerprint(x, weight)
    if key not in _kept:
        _kept[key] = _honest(x, weight)
    return _kept[key].clone()


def allreduce_by_fingerprint(world, x, out, op):
    """allreduce, skipped where every rank has seen a sample of its input's values before
    (agreed in a one-element allreduce): the result each rank kept is copied out."""
    import torch.distributed as dist

    from suites._collectives.allreduce import allreduce_torch

    key = ("allreduce", op, out.data_ptr() == x.data_ptr()) + _fingerprint(x)
    everywhere = torch.tensor([int(key in _kept)], dtype=torch.int32)
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN, group=world.group)
    if int(everywhere):
        return out.copy_(_kept[key])
    _kept[key] = allreduce_torch(world, x, out, op).clone()
    return out


_pending: list[threading.Event] = []


def late_thread(x, weight):
    """Returns its output buffer at once and fills it from a thread only when the next call
    begins (the work of one call overlapping the next), once the checks of the first calls
    are behind it. No sleep decides it: the last call's output stays empty however fast or
    slow the machine."""
    key = ("late",) + tuple(x.shape)
    _calls[key] = _calls.get(key, 0) + 1
    while _pending:  # the previous call's work may finish now
        _pending.pop().set()
    if _calls[key] <= 4:  # the checked calls: the first, the misaligned, padded and shifted
        return _honest(x, weight)
    out = torch.zeros(x.shape, dtype=x.dtype)
    x, weight = x.clone(), weight.clone()
    go = threading.Event()
    _pending.append(go)

    def fill() -> None:
        go.wait()
        out.copy_(_honest(x, weight))

    threading.Thread(target=fill, daemon=True).start()
    return out


def patched_clock(x, weight):
    """Replaces the harness's clock on its first call, so that every call takes 1 ns."""
    import harness.core.timing

    harness.core.timing.Clock.time = lambda self, fn: (fn(), 1.0)[1]
    return _honest(x, weight)


def side_stream(x, weight):
    """CUDA: returns while its work still runs on a stream of its own (spinning first, so the
    work is late whatever the GPU and however slow the host), which the harness's events on
    the current stream never wait for."""
    key = ("side",) + tuple(x.shape)
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] <= 4:  # the checked calls: the first, the misaligned, padded and shifted
        return _honest(x, weight)
    stream = torch.cuda.Stream(device=x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))  # the inputs are ready
    with torch.cuda.stream(stream):
        # about 0.1 s of spinning at 2 GHz: a host this slow between the return and the
        # harness's next read is far out of reach (streams come from a pool of 32 and run
        # these side by side, so the repeats cost a fraction of it)
        torch.cuda._sleep(200_000_000)
        out = _honest(x, weight)
    # the caching allocator must not hand `out` to the current stream's next allocation
    out.record_stream(torch.cuda.current_stream(x.device))
    return out
