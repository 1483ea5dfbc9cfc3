"""Buffer tricks that make wrong kernels visible: poison, overlap, relocation.

- ``poison_`` fills a buffer with a value no correct kernel leaves behind (NaN for floats, the
  most negative integer for signed types), so an element an implementation forgot to write
  fails the check (nccl-tests initialises its receive buffers the same way).
- ``fresh_memory_poisoned`` makes the memory an implementation allocates during a case's
  first checked call start as poison, so an element it never writes in an output it
  allocates itself cannot hold the right value left there by the reference or an earlier
  call (allocators hand the block just freed straight back). On CUDA the caching
  allocator's free blocks are filled with 0xFF first (NaN in every float format); on a glibc
  CPU, malloc fills what it hands out with 0xFE (``M_PERTURB``: -1.7e38 in f32 and bf16, NaN
  in f16 and e5m2, -448 in e4m3).
- ``relocate`` copies a set of inputs to fresh memory at a byte offset, keeping which inputs
  are the same tensor or views of one buffer (an in-place case passes ``out`` as ``x``, or
  ``x`` as a slice of ``out``). Calling an implementation on relocated inputs after poisoning
  the old ones catches caches keyed by address and reads of stale buffers; nccl-tests shifts
  its buffers between iterations for the same reason.
- ``Redzones``: a relocation can also fill the bytes just before and just after each new
  storage with a canary; a kernel that writes past either end of a buffer (a store mask one
  too long, a negative index) changes them, where nothing else would show it: the allocator
  rounds a block up, so such a write lands in slack or in a neighbour and is lost silently
  (compute-sanitizer's memcheck finds the same on a GPU, much more slowly).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from harness.device.memory import libc

#: offsets are multiples of this, so every dtype stays aligned as cudaMalloc would align it
ALIGN_BYTES = 256


def poison_value(dtype: torch.dtype) -> float | int | bool:
    """The fill value of a poisoned buffer of ``dtype``."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with its dtype's poison value, in place."""
    return t.fill_(poison_value(t.dtype))


def poison_behind(t: torch.Tensor) -> None:
    """Poison ``t`` through an alias of its memory that torch's version counter does not see,
    as another kernel writing through the pointer would: an implementation that skips its work
    while ``t._version`` has not moved ("the output already holds it") returns the poison."""
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    poison_(alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride()))


#: the byte free device memory is filled with: 0xFF is a NaN in f32, bf16, f16 and both fp8s
FREE_POISON_BYTE = 0xFF


def free_blocks_to_poison(segments: list[Mapping[str, Any]], device_index: int
                          ) -> list[tuple[int, int]]:
    """(address, size) of every free block of the caching allocator's default pool on
    ``device_index``, from ``torch.cuda.memory_snapshot()``'s segments (their keys as
    torch/csrc/cuda/memory_snapshot.cpp writes them). None of an expandable segment (a free
    range there may be unmapped: a write would be an illegal address) and none of a CUDA
    graph's private pool (its replays own that memory)."""
    blocks = []
    for seg in segments:
        if (seg.get("device") != device_index or seg.get("is_expandable", True)
                or tuple(seg.get("segment_pool_id", (-1, -1))) != (0, 0)):
            continue
        blocks += [(b["address"], b["size"]) for b in seg.get("blocks", ())
                   if b.get("state") == "inactive" and b.get("size", 0) > 0]
    return blocks


class _DeviceBytes:
    """Raw device memory as a uint8 array for ``torch.as_tensor`` (CUDA array interface v2:
    torch wraps the pointer with ``at::from_blob``, copying nothing)."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (address, False), "version": 2}


def poison_free_device_memory(device: torch.device) -> int:
    """Fill the caching allocator's free blocks on CUDA ``device`` with ``FREE_POISON_BYTE``
    and wait for it; the bytes filled (0 on another device)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    blocks = free_blocks_to_poison(torch.cuda.memory_snapshot(), index)
    with torch.cuda.device(index):
        for address, size in blocks:
            torch.as_tensor(_DeviceBytes(address, size), device=device).fill_(FREE_POISON_BYTE)
        # before an allocation on another stream reuses a block this stream is filling
        torch.cuda.synchronize(index)
    return sum(size for _, size in blocks)


#: glibc's mallopt parameter (malloc.h): malloc fills what it returns with the complement of
#: the byte given, free fills what it takes back with the byte; 0 turns it off
M_PERTURB = -6
HEAP_PERTURB_BYTE = 0x01

#: on the CPU a case whose inputs pass this size is not perturbed: its large blocks come from
#: fresh mmap'd pages (glibc's mmap threshold is at most 32 MiB), zero rather than a freed
#: right answer, so filling gigabytes of them would cost time and catch nothing
HEAP_POISON_CAP_BYTES = 1 << 28


@contextlib.contextmanager
def fresh_memory_poisoned(device: torch.device, case_bytes: int = 0) -> Iterator[None]:
    """Memory allocated inside the block starts as poison (see the module's docstring): on
    CUDA the free blocks are filled on entry; on the CPU glibc perturbs every allocation until
    the block ends, unless ``case_bytes`` passes ``HEAP_POISON_CAP_BYTES``. Outputs of up to
    1032 bytes can escape on the CPU: glibc's per-thread cache hands such blocks back without
    the perturbation (``tcache_get`` skips ``alloc_perturb``), and turning the cache off in the
    ranks slowed them by a quarter on the 2**31-element tests. Nothing where neither applies
    (another C library)."""
    if device.type == "cuda":
        poison_free_device_memory(device)
        yield
        return
    lib = libc() if device.type == "cpu" and case_bytes <= HEAP_POISON_CAP_BYTES else None
    if lib is None or not hasattr(lib, "mallopt") or not lib.mallopt(M_PERTURB, HEAP_PERTURB_BYTE):
        yield
        return
    try:
        yield
    finally:
        lib.mallopt(M_PERTURB, 0)


def poisoned(shape: int | tuple[int, ...], dtype: torch.dtype,
             device: str | torch.device = "cpu") -> torch.Tensor:
    """A new buffer of ``shape`` full of poison."""
    return poison_(torch.empty(shape, dtype=dtype, device=device))


def tensors(values: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor among ``values``, lists and tuples included."""
    for name, v in values.items():
        if isinstance(v, torch.Tensor):
            yield name, v
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                if isinstance(item, torch.Tensor):
                    yield f"{name}[{i}]", item


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The elements of ``t`` as one flat uint8 tensor (on ``t``'s device), to read only: a view
    of ``t`` where its elements are already one dense run, else a copy."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.stride(0) == 1:  # dense (a 2 GiB input is compared without two copies)
        return flat.view(torch.uint8)
    # a single element may keep any stride, which view() to bytes refuses; a clone in
    # contiguous format has standard strides
    return flat.clone(memory_format=torch.contiguous_format).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of shape, dtype and elements (NaN equals the same NaN, unlike
    torch.equal; -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(flat_bytes(a), flat_bytes(b))


def same_value(now: Any, before: Any) -> bool:
    """Whether ``now`` still holds what ``before`` (a copy made before a call) does: tensors
    bit for bit, containers item by item and of the same type, floats with NaN equal to
    NaN."""
    if isinstance(before, torch.Tensor):
        return isinstance(now, torch.Tensor) and same_bits(now, before)
    if type(now) is not type(before):
        return False
    if isinstance(before, (list, tuple)):
        return len(now) == len(before) and all(map(same_value, now, before))
    if isinstance(before, dict):
        return now.keys() == before.keys() and all(same_value(now[k], v)
                                                   for k, v in before.items())
    if isinstance(before, float) and before != before:
        return now != now
    return bool(now == before)


def _byte_range(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage address, first byte, one past the last byte) that ``t`` can touch."""
    size = t.element_size()
    if t.numel() == 0:
        start = t.storage_offset() * size
        return t.untyped_storage().data_ptr(), start, start
    span = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    start = t.storage_offset() * size
    return t.untyped_storage().data_ptr(), start, start + (span + 1) * size


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` can touch a common byte (same storage, ranges intersect)."""
    if a.device != b.device:
        return False
    sa, a0, a1 = _byte_range(a)
    sb, b0, b1 = _byte_range(b)
    return sa == sb and a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


def lies_within(inner: torch.Tensor, outer: torch.Tensor) -> bool:
    """Whether every byte ``inner`` can touch belongs to ``outer``'s range."""
    si, i0, i1 = _byte_range(inner)
    so, o0, o1 = _byte_range(outer)
    return inner.device == outer.device and si == so and o0 <= i0 and i1 <= o1


class BytesOutside:
    """The bytes of a contiguous tensor outside the ranges of some others (an in-place
    reduce_scatter's input ``x`` outside its own-rank piece ``out``), copied, to ask later
    whether any changed."""

    def __init__(self, t: torch.Tensor, inside: list[torch.Tensor]) -> None:
        _, start, end = _byte_range(t)
        self.view = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
            t.untyped_storage(), start, (end - start,))
        self.keep = torch.ones(end - start, dtype=torch.bool, device=t.device)
        for other in inside:
            _, o0, o1 = _byte_range(other)
            self.keep[max(o0, start) - start: max(min(o1, end) - start, 0)] = False
        self.before = self.view[self.keep].clone()

    def changed(self) -> bool:
        return not torch.equal(self.view[self.keep], self.before)


def nbytes(values: Mapping[str, Any]) -> int:
    """Bytes of the distinct storages behind the tensors of ``values``."""
    seen: dict[tuple[str, int], int] = {}
    for _, t in tensors(values):
        seen[(str(t.device), t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return sum(seen.values())


#: the byte a redzone is filled with: no poison (0xFF, 0x00, 0x80...), no common value's byte
CANARY_BYTE = 0x5A
#: the redzone after each storage: a vector store, or a row of a tile, past the end lands in it
REDZONE_BYTES = 4096


class Redzones:
    """The canary-filled bytes around the storages one ``relocate`` made: the ``shift_bytes``
    before each and ``REDZONE_BYTES`` after it. ``damage()`` says which buffer an
    implementation wrote past, or None."""

    def __init__(self) -> None:
        #: (input names sharing the storage, the new storage's bytes, data start, data end)
        self._zones: list[tuple[list[str], torch.Tensor, int, int]] = []

    def add(self, names: list[str], fresh: torch.Tensor, start: int, end: int) -> None:
        fresh[:start].fill_(CANARY_BYTE)
        fresh[end:].fill_(CANARY_BYTE)
        self._zones.append((names, fresh, start, end))

    def damage(self) -> str | None:
        """One line naming every buffer whose redzone bytes changed, or None (after the
        device is synchronised)."""
        found = []
        for names, fresh, start, end in self._zones:
            if fresh.device.type == "meta":  # no values to read
                continue
            before = (fresh[:start] != CANARY_BYTE).nonzero()
            after = (fresh[end:] != CANARY_BYTE).nonzero()
            where = []
            if before.numel():
                where.append(f"{_bytes(start - int(before[0, 0]))} before its start")
            if after.numel():
                where.append(f"{_bytes(int(after[-1, 0]) + 1)} past its end")
            if where:
                found.append(f"{' / '.join(repr(n) for n in names)} ({' and '.join(where)})")
        if not found:
            return None
        return ("wrote outside the buffers it was given: " + "; ".join(found) + " (a store "
                "mask or an index one too far: on a GPU such a write lands in another "
                "allocation or is lost)")


def _widest_element(values: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    """Per storage of ``values``'s tensors (and tensors in lists and tuples), the widest
    element size of the views into it."""
    widest: dict[tuple[str, int], int] = {}
    for _, t in tensors(values):
        key = (str(t.device), t.untyped_storage().data_ptr())
        widest[key] = max(widest.get(key, 0), t.element_size())
    return widest


def _off_alignment(elements: int, width: int) -> int:
    """Bytes to move a storage whose widest element is ``width`` bytes ``elements`` elements
    off a 16-byte boundary: one element where ``elements`` would land on another."""
    return elements * width if elements * width % 16 else width


def _bytes(n: int) -> str:
    return f"{n} byte" if n == 1 else f"{n} bytes"


def relocate(values: Mapping[str, Any], *, shift_bytes: int = 0,
             device: torch.device | str | None = None,
             redzones: Redzones | None = None, misalign: int = 0) -> dict[str, Any]:
    """A copy of ``values`` whose tensors live in new storage, ``shift_bytes`` past its start,
    on ``device`` (default: where they are). Tensors that shared a storage share the new one
    with the same offsets and strides; the same tensor object maps to one new object. Plain
    containers (lists, tuples, dicts, sets) are copied through; other values are shared. With
    ``redzones``, every new storage gets ``REDZONE_BYTES`` more, and the bytes around its
    data are filled with the canary and recorded there. ``misalign`` (1, 2 or 4): each
    storage's data that many of its widest elements further (one where that is a multiple
    of 16 bytes), so that every pointer moves off the 16-byte boundary a vectorised kernel
    assumes, as ``x[1:]`` of a buffer does."""
    if shift_bytes % ALIGN_BYTES:
        raise ValueError(f"shift_bytes must be a multiple of {ALIGN_BYTES}")
    storages: dict[tuple[str, int], torch.UntypedStorage] = {}
    names_of: dict[tuple[str, int], list[str]] = {}
    memo: dict[int, torch.Tensor] = {}
    tail = REDZONE_BYTES if redzones is not None else 0
    extra = {key: _off_alignment(misalign, width)
             for key, width in _widest_element(values).items()} if misalign else {}

    def move(t: torch.Tensor, name: str) -> torch.Tensor:
        old = t.untyped_storage()
        key = (str(t.device), old.data_ptr())
        target = torch.device(device) if device is not None else t.device
        start = shift_bytes + extra.get(key, 0)  # a multiple of every view's element size
        if key not in storages:
            end = start + old.nbytes()
            fresh = torch.empty(end + tail, dtype=torch.uint8, device=target)
            src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(old, 0, (old.nbytes(),))
            fresh[start:end].copy_(src)
            storages[key] = fresh.untyped_storage()
            names_of[key] = []
            if redzones is not None:
                redzones.add(names_of[key], fresh, start, end)
        names_of[key].append(name)  # every name is met once: the keys, and list items by index
        if id(t) not in memo:
            memo[id(t)] = torch.empty(0, dtype=t.dtype, device=target).set_(
                storages[key], t.storage_offset() + start // t.element_size(), t.shape,
                t.stride())
        return memo[id(t)]

    out: dict[str, Any] = {}
    for name, v in values.items():
        if isinstance(v, torch.Tensor):
            out[name] = move(v, name)
        elif isinstance(v, (list, tuple)) and any(isinstance(i, torch.Tensor) for i in v):
            out[name] = type(v)(move(i, f"{name}[{j}]") if isinstance(i, torch.Tensor)
                                else copy.deepcopy(i) for j, i in enumerate(v))
        elif isinstance(v, (list, tuple, dict, set, bytearray)):
            # a list of split sizes is the copy's own too, and a list inside a tuple
            out[name] = copy.deepcopy(v)
        else:
            out[name] = v
    return out


#: ``pad_rows``' rows are a multiple of this many bytes apart, and at least this much wider
#: than the tensor's: a TMA descriptor's row strides are multiples of 16 bytes
ROW_PAD_BYTES = 16


def pad_rows(values: Mapping[str, Any], names: Collection[str]) -> dict[str, Any]:
    """``values`` with each tensor named in ``names`` copied into a buffer wider than it and
    viewed there: the same values at strides that are not contiguous ones, as q of a fused
    qkv projection or a slice of a wider buffer has. An N-D tensor's rows start 16 bytes
    past its last dimension rounded up to 16 bytes (every row 16-byte aligned, as in a
    pitched allocation or a TMA descriptor), and past 2-D each matrix one row apart more
    (w13 of a stack of experts sliced from a taller fused weight: an expert stride that is
    not rows x row stride); a 1-D one takes every other element. The
    bytes between are NaN for floating dtypes (all ones: NaN in every float and FP8 format
    torch has) and 0 otherwise, so that a kernel reading the tensor as dense rows reads
    wrong values."""
    out = dict(values)
    for name in names:
        t = values[name]
        if t.dim() == 1:
            wide = torch.empty((t.shape[0], 2), dtype=t.dtype, device=t.device)
        else:
            size = t.element_size()
            pitch = -(-t.shape[-1] * size // ROW_PAD_BYTES) * ROW_PAD_BYTES + ROW_PAD_BYTES
            # past 2-D one row more per matrix too: a batch stride that is not rows x pitch
            rows = t.shape[-2] + (t.dim() > 2)
            wide = torch.empty((*t.shape[:-2], rows, max(pitch // size, t.shape[-1] + 1)),
                               dtype=t.dtype, device=t.device)
        wide.view(torch.uint8).fill_(0xFF if t.is_floating_point() else 0)
        view = wide[:, 0] if t.dim() == 1 else wide[..., :t.shape[-2], :t.shape[-1]]
        view.copy_(t)
        out[name] = view
    return out
