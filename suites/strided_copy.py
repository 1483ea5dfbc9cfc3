"""Strided copy: ``storage.as_strided(size, stride, offset)`` into a contiguous buffer, bitwise.

Views: contiguous, transposes and permutations, stepped slices, broadcast (stride 0) dims,
offsets, 0 to 6 dims, empty and 0-d; every dtype the harness knows. The stress tier is the
large-tensor class: more than 2**31 elements, strides and offsets beyond 2**31, where index
arithmetic in 32 bits wraps (Paddle's StridedCopy fix). A stress case that does not fit in
this machine's free memory is skipped with a reason that says how much it needs. GB/s counts
bytes read plus bytes written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.api import (
    OpSpec,
    Work,
    available_bytes,
    dtype_from_name,
    exact,
    from_source,
    generate,
    plant_specials,
    poisoned,
    seed_from,
)
from reference_kernels import strided_copy as ref
from suites._cuda import source
from suites._cuda.strided_copy import launch_strided_copy, launch_strided_copy_int32
from suites._triton import triton_impl

FAMILY = "strided_copy"
ALL_DTYPES = ("bool", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "e4m3",
              "e5m2")
#: storage elements past the view's last one (an over-read has somewhere to land)
SLACK = 17
GiB = 1 << 30


def _storage_len(params: Mapping[str, Any]) -> int:
    return ref.source_span(params["size"], params["stride"], params["offset"]) + SLACK


#: storages at least this big are generated once per case and handed out as copies (the
#: runner asks for the inputs twice, for the call and for the reference; a 2**31-element
#: storage takes ~35 s to generate and ~1 s to copy)
_CACHE_ELEMS = 1 << 28
_cache: dict[tuple, torch.Tensor] = {}


def storage(params: Mapping[str, Any]) -> torch.Tensor:
    """The 1-D storage the view reads: random values of the dtype (any misplaced read shows
    with probability 255/256 even for 8-bit types), special floats planted below the stress
    sizes. Always a new tensor."""
    key = (params["dtype"], _storage_len(params))
    if key[1] < _CACHE_ELEMS:
        return _generate_storage(params)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _generate_storage(params)
    return _cache[key].clone()


#: a byte storage this long (the stress tier) is hashed four bytes at a time: full-range int32
#: values viewed as bytes are the same uniform bytes for a quarter of the hashing (~10 s
#: instead of ~40 s for 2**31 bytes on a 2-core machine)
_PACKED_ELEMS = 1 << 31


def _generate_storage(params: Mapping[str, Any]) -> torch.Tensor:
    dtype = dtype_from_name(params["dtype"])
    seed = seed_from("strided_copy", params["dtype"], _storage_len(params))
    n = _storage_len(params)
    if dtype in (torch.int8, torch.uint8) and n >= _PACKED_ELEMS:
        words = generate((-(-n // 4),), torch.int32, seed=seed, dist="int", low=-(1 << 31),
                         high=(1 << 31) - 1)
        return words.view(dtype)[:n]
    if dtype == torch.bool:
        return generate((n,), dtype, seed=seed, dist="int")
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)  # at most 2**32 distinct values (the generator's range)
        return generate((n,), dtype, seed=seed, dist="int", low=max(info.min, -(1 << 31)),
                        high=min(info.max, (1 << 31) - 1))
    values = generate((n,), dtype, seed=seed, low=-100.0, high=100.0)
    # -0.0, subnormals, +-inf and NaN among them: a copy moves bits, and a kernel that moves
    # values through arithmetic (x + 0 turns -0.0 into +0.0; a flush-to-zero load drops
    # subnormals) changes these
    return plant_specials(values) if n < _CACHE_ELEMS else values


def copy_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    dtype = dtype_from_name(params["dtype"])
    return {"storage": storage(params), "size": tuple(params["size"]),
            "stride": tuple(params["stride"]), "offset": params["offset"],
            "out": poisoned(tuple(params["size"]), dtype)}


def copy_reference(storage, size, stride, offset, out):
    return ref.strided_copy(storage, size, stride, offset)


def _nbytes(params: Mapping[str, Any]) -> tuple[int, int]:
    """(storage bytes, output bytes)."""
    item = dtype_from_name(params["dtype"]).itemsize
    return _storage_len(params) * item, math.prod(params["size"]) * item


def needs_bytes(params: Mapping[str, Any]) -> int:
    """Peak memory of a case: the storage four times (the cached original, the input, the
    runner's read-only guard copy, the reference's own inputs) and the output twice (the
    buffer and the expected), plus index chunks."""
    storage_b, out_b = _nbytes(params)
    return 4 * storage_b + 2 * out_b + 64 * ref.CHUNK


def fits(params: Mapping[str, Any], world_size: int, device: Any) -> str | None:
    """Skip reason for a case this machine has too little free memory for."""
    need = needs_bytes(params)
    free = available_bytes(torch.device(device))
    if free is None or need <= 2 * GiB:
        return None
    if need > free:
        return (f"needs {need / GiB:.1f} GiB (storage, output and reference copies), "
                f"{free / GiB:.1f} GiB free on {device}")
    return None


# ---------------------------------------------------------------- implementations
def copy_torch(storage, size, stride, offset, out):
    """torch's own strided copy. as_strided's offset counts from the start of the underlying
    storage, not of the tensor, so a storage tensor that is itself a view (the runner's
    shifted copy is one) needs its own offset added: without it the shifted check fails."""
    return out.copy_(torch.as_strided(storage, size, stride, storage.storage_offset() + offset))


def _gather(storage: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int,
            out: torch.Tensor, *, int32: bool = False, last_stride_one: bool = False
            ) -> torch.Tensor:
    """A hand-written gather kernel, chunked; the switches plant the controls' bugs."""
    stride = list(stride)
    if last_stride_one and stride:
        stride[-1] = 1
    index_dtype = torch.int32 if int32 else torch.int64

    def narrow(v: int) -> int:  # what a 32-bit register holds
        return ((v + (1 << 31)) % (1 << 32)) - (1 << 31) if int32 else v

    flat_out = out.view(-1)
    numel, top = flat_out.numel(), storage.numel() - 1
    for start in range(0, numel, ref.CHUNK):
        flat = torch.arange(start, min(numel, start + ref.CHUNK), dtype=torch.int64,
                            device=storage.device).to(index_dtype)
        source = torch.full_like(flat, narrow(offset))
        rest = flat
        for extent, step in zip(reversed(size), reversed(stride), strict=True):
            source += (rest % extent) * narrow(step)
            rest = rest // extent
        # a wrapped index reads whatever lies there: clamp it into the storage
        flat_out[start : start + flat.numel()] = storage[source.long().clamp(0, top)]
    return out


def copy_int32_index(storage, size, stride, offset, out):
    """Bug: element and source indices computed in 32 bits, so they wrap past 2**31."""
    return _gather(storage, size, stride, offset, out, int32=True)


def copy_stride_ignored(storage, size, stride, offset, out):
    """Bug: the innermost dim is assumed contiguous (its stride ignored)."""
    return _gather(storage, size, stride, offset, out, last_stride_one=True)


# ---------------------------------------------------------------- grids
def _view(name: str, dtype: str, size: Sequence[int], stride: Sequence[int], offset: int = 0
          ) -> dict:
    return {"view": name, "dtype": dtype, "size": tuple(size), "stride": tuple(stride),
            "offset": offset}


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return strides[::-1]


def _permuted(shape: Sequence[int], order: Sequence[int]) -> tuple[list[int], list[int]]:
    strides = _contiguous_strides(shape)
    return [shape[d] for d in order], [strides[d] for d in order]


def _views(dtype: str, m: int, n: int) -> list[dict]:
    """The view kinds of an (m, n) base tensor (m, n >= 8)."""
    return [
        _view("contiguous", dtype, (m, n), (n, 1)),
        _view("transpose", dtype, (n, m), (1, n)),
        _view("step", dtype, (-(-(m - 1) // 3), -(-n // 2)), (3 * n, 2), n),  # x[1::3, ::2]
        _view("broadcast", dtype, (m, n), (0, 1), 5 * n),                      # row 5 expanded
        _view("offset", dtype, (m - 3, n - 4), (n, 1), 3 * n + 4),           # x[3:, 4:]
    ]


def _smoke() -> list[dict]:
    cases = [v for dt in ALL_DTYPES for v in _views(dt, 37, 53)]
    cases += [
        _view("scalar", "f32", (), (), 9),
        _view("empty", "f32", (0, 5), (5, 1)),
        _view("dims1", "bf16", (1000,), (3,), 7),
        _view("permute3", "f32", *_permuted((5, 7, 11), (2, 0, 1))),
        _view("dims4", "i16", *_permuted((3, 4, 5, 6), (3, 1, 0, 2))),
        _view("dims5", "f16", (2, 3, 4, 5, 6), (0, 240, 1, 48, 8), 11),     # stride-0 and mixed
        _view("dims6", "u8", *_permuted((2, 3, 2, 5, 3, 4), (5, 0, 3, 1, 4, 2))),
        # a transpose sliced, at an offset: the leading dimension is not the view's size
        # (x.t()[5:45, 2:30] of a (37, 53) x)
        _view("transpose_slice", "f32", (40, 28), (1, 53), 5 + 2 * 53),
        _view("transpose_slice", "bf16", (40, 28), (1, 53), 5 + 2 * 53),
        # rows of whole 16-byte units (32 elements) at a pitch that is not: a kernel that
        # takes such rows for one contiguous run (x[3:, 4:36])
        _view("rows16", "f32", (34, 32), (53, 1), 3 * 53 + 4),
        _view("rows16", "bf16", (34, 32), (53, 1), 3 * 53 + 4),
        # rows that start 16-byte aligned at an aligned pitch and end in a partial vector
        # (x[:, :99] of an (8, 128) x): a vector path taken on the start and pitch alone
        _view("aligned_pitch_tail", "f32", (8, 99), (128, 1)),
        _view("aligned_pitch_tail", "bf16", (8, 99), (128, 1)),
        # a dim of size 1 between others (x[:, 2:3, :] of a (4, 7, 5) x), and an empty view
        # whose innermost dim is the empty one
        _view("unit_dim", "f32", (4, 1, 5), (35, 5, 1), 10),
        _view("empty_inner", "i16", (5, 0), (7, 1)),
        # a contiguous block at an offset (x.view(-1)[7:37].view(3, 10)): a memcpy fast path
        # that starts at the storage, not the view; and rows that overlap (stride 6 over
        # every other element), where stride[0] == size[1] lets a kernel that coalesces dims
        # without the inner stride merge them
        _view("contiguous_offset", "f32", (3, 10), (10, 1), 7),
        _view("overlap", "bf16", (4, 6), (6, 2), 3),
        # a dim broadcast innermost (each element of a column repeated along the row); and
        # byte rows of whole 4-byte words at an offset no word boundary holds (a kernel that
        # loads 1-byte rows by the word reads from the word below the row's start)
        _view("broadcast_inner", "f32", (37, 8), (53, 0), 2),
        _view("rows16", "u8", (34, 32), (53, 1), 3 * 53 + 5),
    ]
    return cases


def _nightly() -> list[dict]:
    cases = [v for dt in ALL_DTYPES for v in _views(dt, 4099, 4097)]
    cases += [
        _view("transpose_big", "bf16", (8192, 8192), (1, 8192)),
        _view("broadcast_big", "f32", (64, 1 << 20), (0, 1), 12345),
        _view("dims6_big", "f32", *_permuted((8, 9, 10, 11, 12, 13), (5, 4, 3, 2, 1, 0))),
        _view("offset_big", "i8", (1 << 20, 100), (128, 1), (1 << 30) + 3),
        _view("transpose_slice", "bf16", (4000, 4000), (1, 4097), 5 + 2 * 4097),
        _view("rows16", "f32", (4090, 4064), (4097, 1), 3 * 4097 + 4),
        _view("aligned_pitch_tail", "bf16", (4096, 4000), (4096, 1)),
        _view("unit_dim", "f32", (64, 1, 4096), (4096 * 7, 4096, 1), 2 * 4096),
        _view("empty_inner", "i16", (4096, 0), (7, 1)),
        _view("contiguous_offset", "bf16", (4096, 4097), (4097, 1), 3 * 4097 + 5),
        _view("overlap", "f32", (4096, 4096), (4096, 2), 3),
    ]
    return cases


#: beyond 2**31: elements (a transposed int8 view of 2**31 + 65537 elements), a storage
#: offset, a stride; and a float32 view of 2**31 + 1 elements (17 GiB with its copies)
STRESS = [
    _view("numel_over_2_31", "i8", (32769, 65537), (1, 32769)),
    _view("offset_over_2_31", "i8", (1024, 1000), (1000, 1), (1 << 31) + 17),
    _view("stride_over_2_31", "i8", (3, 4096), ((1 << 31) + 1, 1), 5),
    _view("numel_over_2_31", "f32", ((1 << 31) + 1,), (1,)),
]


def _elements(params: Mapping[str, Any]) -> int:
    return math.prod(params["size"])


def _work(params: Mapping[str, Any], world_size: int) -> Work:
    return Work(bytes=2 * _nbytes(params)[1])


STRIDED_COPY = OpSpec(
    name="strided_copy", family=FAMILY, reference=copy_reference,
    description="as_strided(size, stride, offset) -> contiguous, bitwise.",
    make_inputs=copy_inputs, tolerance=exact(), work=_work,
    grid={"smoke": _smoke(), "nightly": _nightly(), "stress": STRESS},
    out_buffers={"out": "out"},
    implementations={"torch": copy_torch,
                     "cuda": from_source(source("strided_copy.cu"), launch_strided_copy),
                     "triton": triton_impl("strided_copy:strided_copy", elements=_elements)},
    negative_controls={"int32_index": copy_int32_index, "stride_ignored": copy_stride_ignored,
                       "cuda_int32_index": from_source(source("strided_copy.cu"),
                                                       launch_strided_copy_int32),
                       "triton_int32_index": triton_impl("strided_copy:strided_copy_int32_index",
                                                         elements=_elements),
                       "triton_store_one_past": triton_impl(
                           "strided_copy:strided_copy_store_one_past", elements=_elements)},
    requires=fits,
    deadline_s=1800.0,
    any_alignment=True,
    fixed_layout_inputs=("storage",),
)

SPECS = [STRIDED_COPY]
