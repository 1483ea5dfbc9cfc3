"""Deterministic, device-independent, shard-addressable input tensors.

Every element is a pure function of (seed, stream, flat row-major index in the GLOBAL tensor),
so any slice of a global tensor can be made alone (rank r makes only its shard) and the same call
gives bit-identical tensors on the CPU and on CUDA. Only integer ops and exactly rounded float64
``+ - * /`` and casts produce values: no ``torch.Generator``, no transcendental functions.

The function, exactly (``M = 2**32 - 1``, all arithmetic on non-negative Python-style ints)::

    lowbias32(x):  x ^= x >> 16; x = x * 0x7FEB352D & M; x ^= x >> 15
                   x = x * 0x846CA68B & M; x ^= x >> 16
    k0 = lowbias32(seed ^ lowbias32((2 * stream + 1) & M))
    k1 = lowbias32(k0 ^ 0x9E3779B9)
    hash32(i) = lowbias32(lowbias32((i & M) ^ k0) ^ (((i >> 32) * 0x9E3779B9 & M) ^ k1))
    uniform01(h) = (h >> 8) * 2**-24                      # top 24 bits, exact in float64

A distribution drawn at ``stream=s`` uses streams ``4s .. 4s+3`` (``normal`` needs four draws).
Inside ``reseeded(salt)`` every seed is XOR-ed with ``salt`` first: the same generators, the
same shapes and planted positions' rules, other values, whatever parts an op keys its seeds on
(a case's twin, checked for results kept by shape, is made so). Inside ``nudged(salt)`` each
tensor holds its own values but at a few elements, which take the values ``seed ^ salt`` gives
there: the case's values but for a few elements (its near twin, checked for results kept by a
sample of the inputs).
Change any of this (or the distributions below, or ``special_values``) and bump
``GENERATOR_VERSION``: goldens record it. Version 2: ``special_values`` holds a negative NaN
and one with a payload.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import operator
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from harness.core.recent import Recent

GENERATOR_VERSION = 2

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_SQRT3 = 1.7320508075688772  # math.sqrt(3), a constant so that no device computes a sqrt
_DRAWS_PER_STREAM = 4
_MAX_STREAM = (1 << 32) // _DRAWS_PER_STREAM
#: torch's grain size (at::internal::GRAIN_SIZE in ATen/Parallel.h): an op on n elements runs
#: on min(threads, ceil(n / grain)) intra-op threads (invoke_parallel, ATen/ParallelOpenMP.h)
_GRAIN = 1 << 15


def _cpu_chunk() -> int:
    """Elements per chunk on the CPU: one grain for each of torch's intra-op threads.

    The hash's ~20 int64 passes run ~10x faster on cache-resident blocks than on chunks that
    spill to DRAM (on CUDA, large chunks amortise the kernel launches instead). A grain per
    thread keeps each thread on its own 256 KiB block and every thread busy: on 2 cores
    2**15 left the second idle and 2**16 makes 2**27 int32 values in 1.2 s instead of 2.1 s;
    a fixed 2**16 held a 16-core GPU host to 2 of them for the stress tier's 2**31-element
    storages. The values never depend on it."""
    return _GRAIN * max(1, torch.get_num_threads())


DISTS = ("uniform", "normal", "int", "sign")

_SHORT_NAMES: dict[str, torch.dtype] = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
    "bool": torch.bool,
}
_NAME_OF = {dt: name for name, dt in _SHORT_NAMES.items()}
_TORCH_NAMES = {str(dt).removeprefix("torch."): dt for dt in _SHORT_NAMES.values()}
_FLOATS = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
# Same-width integer types used to step between neighbouring floats bit by bit.
_BITS_OF = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def dtype_from_name(name: str) -> torch.dtype:
    """Dtype for a short name (``bf16``, ``e4m3``, ``i32``...) or a torch name (``bfloat16``)."""
    key = name.strip().removeprefix("torch.")
    dt = _SHORT_NAMES.get(key) or _TORCH_NAMES.get(key)
    if dt is None:
        valid = ", ".join(list(_SHORT_NAMES) + sorted(set(_TORCH_NAMES) - set(_SHORT_NAMES)))
        raise ValueError(f"unknown dtype name {name!r}; valid names: {valid}")
    return dt


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a supported dtype (the inverse of :func:`dtype_from_name`)."""
    try:
        return _NAME_OF[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported dtype {dtype}; supported: {', '.join(_SHORT_NAMES)}"
        ) from None


def seed_from(*parts: str | int) -> int:
    """A stable 32-bit seed from the parts' text (sha256, so it survives processes and hosts).

    Each part is length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` differ; ``1`` and
    ``"1"`` are the same text and give the same seed.
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, str | int):
            raise TypeError(f"seed_from takes str and int parts, not {type(part).__name__}")
        text = str(part).encode()
        h.update(f"{len(text)}:".encode() + text)
    return int.from_bytes(h.digest()[:4], "little")


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    # Chris Wellons' lowbias32: a bijective 32-bit mixer with near-ideal avalanche. The int64
    # product of two values below 2**32 may wrap past 2**63; torch's int64 multiply wraps in
    # two's complement on every backend, so its low 32 bits (all we keep) are still exact.
    x = x ^ (x >> 16)  # a new tensor: the in-place steps below never touch the caller's
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x846CA68B).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def _lowbias32_int(x: int) -> int:
    x ^= x >> 16
    x = x * 0x7FEB352D & _M32
    x ^= x >> 15
    x = x * 0x846CA68B & _M32
    return x ^ (x >> 16)


#: the tensors ``generate`` made last, handed out again as copies
RECENT = Recent()

#: XOR-ed into every seed while set (``reseeded``); 0 outside
_SEED_SALT: contextvars.ContextVar[int] = contextvars.ContextVar("seed_salt", default=0)


@contextlib.contextmanager
def reseeded(salt: int) -> Iterator[None]:
    """Every input made inside takes other values: each seed XOR-ed with ``salt`` (32 bits;
    0 changes nothing)."""
    token = _SEED_SALT.set(salt & _M32)
    try:
        yield
    finally:
        _SEED_SALT.reset(token)


#: while set (``nudged``), the salt of the few elements each generated tensor changes; 0 outside
_NUDGE_SALT: contextvars.ContextVar[int] = contextvars.ContextVar("nudge_salt", default=0)
#: a nudge changes this many elements of a tensor, the first of ``_NUDGE_TRIES`` candidate
#: positions whose value the salt changes: few enough that a sample of a few elements of each
#: input (a fingerprint) most likely misses them all, enough that one of them changes a
#: max or a min over 8 ranks most of the time
_NUDGED, _NUDGE_TRIES = 4, 16


@contextlib.contextmanager
def nudged(salt: int) -> Iterator[None]:
    """Every tensor made inside holds the values it holds outside but at a few elements
    (``_NUDGED``), chosen from its seed, stream and ``salt`` among its first 2**32 global
    indices (so every rank and device agrees which, whatever region it makes), which take
    other values of the same distribution: those ``seed ^ salt`` give there (0 changes
    nothing)."""
    token = _NUDGE_SALT.set(salt & _M32)
    try:
        yield
    finally:
        _NUDGE_SALT.reset(token)


def _keys(seed: int, stream: int) -> tuple[int, int]:
    seed ^= _SEED_SALT.get()
    k0 = _lowbias32_int(seed ^ _lowbias32_int((2 * stream + 1) & _M32))
    return k0, _lowbias32_int(k0 ^ _GOLDEN)


def hash32(index: torch.Tensor, seed: int, stream: int = 0) -> torch.Tensor:
    """The 32-bit hash (int64 values in [0, 2**32)) of non-negative int64 flat indices.

    Both 32-bit words of the index are mixed in, so tensors with numel > 2**32 get no repeats
    of the low word's pattern; different (seed, stream) keys give independent streams.
    """
    k0, k1 = _keys(seed, stream)
    index = index.to(torch.int64)  # narrower index types would lose the high word
    if index.device.type == "cpu":
        return torch.from_numpy(_hash32_np(index.numpy(), k0, k1))
    return _hash32_torch(index, k0, k1)


def _hash32_torch(index: torch.Tensor, k0: int, k1: int) -> torch.Tensor:
    """``hash32`` in int64 torch ops, on any device."""
    lo = index & _M32
    hi = (index >> 32) * _GOLDEN & _M32  # index < 2**63, so this product stays below 2**63
    return _lowbias32(_lowbias32(lo ^ k0) ^ (hi ^ k1))


def _lowbias32_np(x: np.ndarray) -> np.ndarray:
    # uint32 arithmetic wraps modulo 2**32: the low 32 bits _lowbias32 keeps, with no masks
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def _hash32_np(index: np.ndarray, k0: int, k1: int) -> np.ndarray:
    """``hash32`` on the CPU in 32-bit words: the same values, 3 to 4 times faster than the
    int64 torch ops (half the bytes, no masking); as int64, as ``hash32`` returns."""
    hi = (index >> 32).astype(np.uint32)  # index < 2**63: the high word fits
    hi *= np.uint32(_GOLDEN)
    x = _lowbias32_np(index.astype(np.uint32) ^ np.uint32(k0))  # astype keeps the low word
    x ^= hi
    x ^= np.uint32(k1)
    return _lowbias32_np(x).astype(np.int64)


def uniform01(h: torch.Tensor) -> torch.Tensor:
    """float64 in [0, 1) from the top 24 bits of a 32-bit hash: ``k * 2**-24``, exact."""
    return (h >> 8).to(torch.float64) * 2.0**-24


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    dt = dtype_from_name(dtype) if isinstance(dtype, str) else dtype
    dtype_name(dt)  # raises for unsupported dtypes
    return dt


def _step(value: float, dtype: torch.dtype, up: bool) -> float:
    """The neighbour of ``value`` (representable in ``dtype``) towards +inf or -inf."""
    ibits = _BITS_OF[dtype]
    width = torch.iinfo(ibits).bits
    sign = 1 << (width - 1)
    bits = torch.tensor([value], dtype=dtype).view(ibits).item() & ((1 << width) - 1)
    mag, neg = bits & (sign - 1), bool(bits & sign)
    if mag == 0:
        bits = 1 if up else sign | 1  # through zero to the smallest subnormal
    elif neg == up:
        bits -= 1  # towards zero
    else:
        bits += 1  # away from zero
    if ibits is not torch.uint8 and bits >= sign:
        bits -= 1 << width  # back to the signed view
    return torch.tensor([bits], dtype=ibits).view(dtype).item()


def _uniform_bounds(low: float, high: float, dtype: torch.dtype) -> tuple[float, float]:
    """The least ``dtype`` value >= low and the greatest < high.

    Clamping the float64 values to these before the cast keeps ``[low, high)`` true after
    rounding (rounding is monotonic), where e.g. bf16 would otherwise round 1 - 2**-20 up to 1.
    """
    fmax = torch.finfo(dtype).max
    if not -fmax <= low < high <= fmax:
        raise ValueError(
            f"dist 'uniform' needs -{fmax} <= low < high <= {fmax} for {dtype_name(dtype)},"
            f" got [{low}, {high})"
        )
    lo, hi = (_cast(torch.tensor([v], dtype=torch.float64), dtype).item() for v in (low, high))
    if lo < low:
        lo = _step(lo, dtype, up=True)
    if hi >= high:
        hi = _step(hi, dtype, up=False)
    if lo > hi:
        raise ValueError(f"no {dtype_name(dtype)} value lies in [{low}, {high}); widen the range")
    return lo, hi


def _cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype in _FLOATS and dtype not in (torch.float64, torch.float32):
        # Pin the rounding path (float64 -> float32 -> dtype, each round-to-nearest-even). It is
        # what torch's own conversions do today; spelling it out keeps CPU and CUDA identical
        # even where a kernel might round float64 to 16/8 bits directly.
        return values.to(torch.float64).to(torch.float32).to(dtype)
    return values.to(dtype)


def _check_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    try:
        dims = tuple(operator.index(n) for n in dims)
    except TypeError:
        raise ValueError(f"shape {shape!r} must be a sequence of ints") from None
    if any(n < 0 for n in dims):
        raise ValueError(f"shape {dims} has a negative extent")
    return dims


def _plan(shape: tuple[int, ...], region: object) -> tuple[int, list[tuple[int, int]]]:
    """Base flat index of the region and, per kept dim, its (extent, flat-index step)."""
    if region is None:
        region = ()
    elif not isinstance(region, tuple):
        region = (region,)
    if len(region) > len(shape):
        raise ValueError(f"region {region!r} has more entries than shape {shape} has dims")
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    base, dims = 0, []
    for d, (n, stride) in enumerate(zip(shape, strides, strict=True)):
        r = region[d] if d < len(region) else slice(None)
        if isinstance(r, slice):
            try:
                start, stop, step = (
                    None if v is None else operator.index(v) for v in (r.start, r.stop, r.step)
                )
            except TypeError:
                raise ValueError(f"region entry {r!r} (dim {d}) must hold ints") from None
            if step is not None and step <= 0:
                raise ValueError(f"region entry {r!r} (dim {d}) needs a step > 0")
            for v in (start, stop):
                if v is not None and not -n <= v <= n:
                    raise ValueError(f"region entry {r!r} is out of bounds for dim {d} of size {n}")
            start, stop, step = slice(start, stop, step).indices(n)
            base += start * stride
            dims.append((len(range(start, stop, step)), step * stride))
        else:
            if isinstance(r, bool):
                raise ValueError(f"region entry {r!r} (dim {d}) must be an int or a slice")
            try:
                i = operator.index(r)
            except TypeError:
                raise ValueError(
                    f"region entry {r!r} (dim {d}) must be an int or a slice"
                ) from None
            if not -n <= i < n:
                raise ValueError(f"region index {i} is out of bounds for dim {d} of size {n}")
            base += (i % n) * stride
    return base, dims


def _int_range(low: float, high: float, dtype: torch.dtype) -> tuple[int, int]:
    if low != int(low) or high != int(high):
        raise ValueError(f"dist 'int' needs integral low and high, got [{low}, {high}]")
    lo, hi = int(low), int(high)
    if dtype is torch.bool:
        lo, hi = 0, 1
    if lo > hi:
        raise ValueError(f"dist 'int' needs low <= high, got [{lo}, {hi}]")
    if hi - lo + 1 > 1 << 32:
        raise ValueError(f"dist 'int' range [{lo}, {hi}] exceeds 2**32 values; narrow it")
    if dtype not in _FLOATS and dtype is not torch.bool:
        info = torch.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"dist 'int' range [{lo}, {hi}] does not fit {dtype_name(dtype)}; narrow it"
            )
    return lo, hi


def generate(
    shape: int | Sequence[int],
    dtype: torch.dtype | str,
    *,
    seed: int,
    dist: str = "uniform",
    low: float = -1.0,
    high: float = 1.0,
    mean: float = 0.0,
    std: float = 1.0,
    region: object = None,
    stream: int = 0,
    device: str | torch.device = "cpu",
    chunk_elems: int = 1 << 22,
) -> torch.Tensor:
    """``whole[region]`` of a deterministic global tensor of ``shape``, as a new contiguous tensor.

    ``region`` is None (everything) or a tuple of ints and slices (step > 0), one per leading
    dim, meaning what it means in indexing; a bound past the extent is a ValueError. Only the
    region is computed, in chunks of at most ``chunk_elems`` elements, so memory stays bounded by
    the output plus one chunk. Values are made in float64 (or int64) and then rounded to
    ``dtype`` (through float32 for 16- and 8-bit floats, see ``_cast``):

    - ``uniform``: ``low + (high - low) * u`` in ``[low, high)``, float dtypes only; values are
      kept inside the range after rounding to ``dtype``.
    - ``normal``: Irwin-Hall sum of 4 uniforms, standardised, ``* std + mean``; bounded by
      ``mean +- 2*sqrt(3)*std``, so a moderate std never overflows an fp8 format.
    - ``int``: integers uniform in ``[low, high]`` inclusive, any dtype (exact small integers in
      float dtypes, for order-independent exact sums); for ``bool`` the range is always [0, 1].
    - ``sign``: +1 or -1, float and signed integer dtypes.

    Different ``stream`` values give independent tensors for the same seed.
    """
    dt = _as_dtype(dtype)
    seed, stream = _checked(dt, dtype, dist, seed, stream, chunk_elems)
    values = _sampler(dt, dist, seed, stream, low, high, mean, std)
    dims = _check_shape(shape)
    salted, numel = seed ^ _NUDGE_SALT.get(), math.prod(dims)
    base, kept = _plan(dims, region)
    # every input of the values (the hash too: a test may replace it), the region as planned
    key = (dims, dt, seed, dist, repr((low, high, mean, std)), base, tuple(kept), stream,
           chunk_elems, _SEED_SALT.get(), salted, hash32, str(device))
    made = RECENT.get(key)
    if made is not None:
        return made
    if salted != seed and numel:
        values = _nudge(values, _sampler(dt, dist, salted, stream, low, high, mean, std),
                        salted, stream, numel)
    out_shape = tuple(n for n, _ in kept)
    out = torch.empty(math.prod(out_shape), dtype=dt, device=device)
    if out.numel() == 0:
        return out.reshape(out_shape)
    if out.device.type == "cpu":
        chunk_elems = min(chunk_elems, _cpu_chunk())  # values never depend on the chunking
    _fill(out, values, base, kept, chunk_elems, device)
    out = out.reshape(out_shape)
    RECENT.put(key, out)
    return out


def _checked(dt: torch.dtype, dtype: torch.dtype | str, dist: str, seed: int, stream: int,
             chunk_elems: int) -> tuple[int, int]:
    """``generate``'s arguments checked, a ValueError saying what is wrong; the seed and the
    stream as ints."""
    if dist not in DISTS:
        raise ValueError(f"unknown dist {dist!r}; valid: {', '.join(DISTS)}")
    if dt not in _FLOATS and dist in ("uniform", "normal"):
        raise ValueError(f"dist {dist!r} needs a float dtype, not {dtype_name(dt)}; use 'int'")
    if dist == "sign" and dt in (torch.bool, torch.uint8):
        raise ValueError(f"dist 'sign' needs a signed dtype, not {dtype_name(dt)}")
    if dt is torch.bool and dist != "int":
        raise ValueError(f"dtype bool takes dist 'int' (a fair coin), not {dist!r}")
    seed = operator.index(seed)
    if not 0 <= seed <= _M32:
        raise ValueError(f"seed {seed} must lie in [0, 2**32); use seed_from(...) to make one")
    stream = operator.index(stream)
    if not 0 <= stream < _MAX_STREAM:
        raise ValueError(f"stream {stream} must lie in [0, {_MAX_STREAM})")
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    return seed, stream


def _sampler(dt: torch.dtype, dist: str, seed: int, stream: int, low: float, high: float,
             mean: float, std: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The values of ``dist`` in ``dt`` at global element indices (an int64 tensor)."""
    if dist == "uniform":
        bounds = _uniform_bounds(low, high, dt)
    elif dist == "int":
        int_lo, int_hi = _int_range(low, high, dt)

    def values(index: torch.Tensor) -> torch.Tensor:
        s0 = _DRAWS_PER_STREAM * stream
        if dist == "uniform":
            u = uniform01(hash32(index, seed, s0))
            return _cast((low + (high - low) * u).clamp_(*bounds), dt)
        if dist == "normal":
            total = uniform01(hash32(index, seed, s0))
            for j in range(1, 4):
                total += uniform01(hash32(index, seed, s0 + j))  # exact: 24-bit fractions
            return _cast((total - 2.0) * _SQRT3 * std + mean, dt)
        h = hash32(index, seed, s0)
        if dist == "sign":
            v = 1 - 2 * (h >> 31)
        else:
            v = int_lo + h % (int_hi - int_lo + 1)
        return _cast(v.to(torch.float64), dt) if dt in _FLOATS else v.to(dt)

    return values


def _nudge(values: Callable[[torch.Tensor], torch.Tensor],
           other: Callable[[torch.Tensor], torch.Tensor], seed: int, stream: int, numel: int
           ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``values`` but at ``_NUDGED`` global indices, where ``other``'s values are taken: the
    first candidate indices (hashed from ``seed``, the salted one, and the stream) whose value
    ``other`` changes (fewer where fewer do: a tensor of a few elements, a coin)."""
    picks = hash32(torch.arange(_NUDGE_TRIES), seed ^ 0x5BD1E995, stream) % numel
    before, after = values(picks), other(picks)
    bits = _BITS_OF.get(before.dtype)
    changed = ((before.view(bits) != after.view(bits)) if bits else before != after).tolist()
    chosen: dict[int, int] = {}  # global index: its candidate's position in picks
    for j, (where, moved) in enumerate(zip(picks.tolist(), changed, strict=True)):
        if moved and where not in chosen and len(chosen) < _NUDGED:
            chosen[where] = j
    if not chosen:
        return values
    new = after.view(bits) if bits else after

    def nudged_values(index: torch.Tensor) -> torch.Tensor:
        out = values(index)
        target = out.view(bits) if bits else out  # as bits: float8 has no masked_fill kernel
        for where, j in chosen.items():
            hit = index == where
            if bool(hit.any()):
                target[hit] = new[j].to(out.device)
        return out

    return nudged_values


def _fill(out: torch.Tensor, values: Callable[[torch.Tensor], torch.Tensor], base: int,
          kept: list[tuple[int, int]], chunk_elems: int, device: str | torch.device) -> None:
    """``out`` (flat) filled with the ``values`` of the region ``_plan`` gave (its ``base``
    offset and (extent, step) of each kept dim), at most ``chunk_elems`` elements at a time."""
    # Split the kept dims into an inner block (the longest suffix of at most chunk_elems
    # elements, its offsets built once by broadcasting) and outer positions; a chunk is whole
    # inner blocks, so the div/mod unravelling runs per outer position, not per element.
    split, inner_n = len(kept), 1
    while split > 0 and inner_n * kept[split - 1][0] <= chunk_elems:
        split -= 1
        inner_n *= kept[split][0]
    inner = torch.zeros(1, dtype=torch.int64, device=device)
    for n, step in kept[split:]:
        ar = torch.arange(n, dtype=torch.int64, device=device) * step
        inner = (inner[:, None] + ar[None, :]).reshape(-1)
    outer = kept[:split]
    outer_total = math.prod(n for n, _ in outer)
    rows = chunk_elems // inner_n
    for a in range(0, outer_total, rows):
        b = min(outer_total, a + rows)
        pos = torch.arange(a, b, dtype=torch.int64, device=device)
        off = torch.full_like(pos, base)
        for n, step in reversed(outer[1:]):
            off += (pos % n) * step
            pos = pos // n
        if outer:
            off += pos * outer[0][1]  # pos < extent of the first dim: no modulo needed
        index = (off[:, None] + inner[None, :]).reshape(-1)
        out[a * inner_n : b * inner_n] = values(index)


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """The values a bitwise copy must carry unchanged and arithmetic does not: -0.0 (``x + 0``
    makes it +0.0), the smallest and largest subnormals (a kernel that flushes them to zero),
    +-inf, NaN, a negative NaN and one with a payload (a copy through a wider type and back
    returns one NaN for all: torch's float32 to bf16 on the CPU makes each 0xFFFF), the largest
    finite values and a normal neighbour. float8_e4m3fn has no infinity and one NaN per sign:
    its list has NaN, -NaN and +-448."""
    info = torch.finfo(dtype)
    bits, width = _BITS_OF[dtype], info.bits
    mantissa = round(-math.log2(info.eps))  # eps = 2**-mantissa bits
    sign = 1 << (width - 1)
    # subnormals and NaNs by their bit patterns (no float arithmetic touches them on the way)
    patterns = [1, (1 << mantissa) - 1]
    patterns += [p | sign for p in patterns]
    if dtype == torch.float8_e4m3fn:
        nans = [0x7F | sign]  # S.1111.111 is its only NaN
    else:
        quiet = (sign - 1) ^ ((1 << (mantissa - 1)) - 1)  # exponent all ones, top mantissa bit
        canonical = int(torch.tensor(math.nan, dtype=dtype).view(bits)) % (1 << width)
        payload = quiet | 1 if quiet | 1 != canonical else quiet  # e5m2's canonical is 0x7F
        nans = [quiet | sign, payload]
    values = [torch.tensor([-0.0, info.max, -info.max, info.tiny], dtype=dtype),
              _from_bits(patterns, bits, width, dtype)]
    if dtype != torch.float8_e4m3fn:
        values.append(torch.tensor([math.inf, -math.inf], dtype=dtype))
    values += [torch.tensor([math.nan], dtype=dtype), _from_bits(nans, bits, width, dtype)]
    return torch.cat([v.reshape(-1) for v in values])


def _from_bits(patterns: list[int], bits: torch.dtype, width: int, dtype: torch.dtype
               ) -> torch.Tensor:
    """Unsigned bit patterns as values of ``dtype`` (two's complement for the signed views)."""
    if bits != torch.uint8:
        patterns = [p - (1 << width) if p >> (width - 1) else p for p in patterns]
    return torch.tensor(patterns, dtype=torch.int64).to(bits).view(dtype)


def plant_specials(t: torch.Tensor, every: int = 7) -> torch.Tensor:
    """``t`` (a float tensor, changed in place and returned) with ``special_values`` written at
    every ``every``-th element, cycling through them; integers are left as they are."""
    if t.dtype not in _FLOATS or t.numel() == 0:
        return t
    if not t.is_contiguous():
        raise ValueError("plant_specials needs a contiguous tensor")
    specials = special_values(t.dtype).to(t.device)
    where = torch.arange(0, t.numel(), every, device=t.device)
    pick = torch.arange(where.numel(), device=t.device) % specials.numel()
    # written as integers: index_put has no float8 kernel everywhere, and bits stay bits
    ints = _BITS_OF[t.dtype]
    t.view(-1).view(ints)[where] = specials.view(ints)[pick]
    return t
