"""Triton local step of Mirage's tile allreduce (suites/_cuda/tile_reduce.cu in Triton).

After the allgather, rows [W, n] holds every rank's input; out[i] = op over w of rows[w, i],
accumulated in float32 for floating-point data (int64 for int32) in rank order, rounded
once to the data type; avg divides the float32 sum by W first; min and max keep a NaN.

bf16 is rounded by hand (round to nearest even on the float32 bits), not with
``.to(tl.bfloat16)``: Triton 3.9's interpreter converts float32 to bf16 by truncation
(runtime/interpreter.py ``cast_impl`` passes no rounding mode), which would make a CPU run
disagree with the GPU's ``cvt.rn``. The control keeps the partial results in bf16 (rounded
after every step), the accumulation-precision bug.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

#: elements per program: 32 per thread at 4 warps on a GPU, and few programs for the
#: interpreter, whose cost is per program (a 65539-element case at 8 ranks: 4.7 s at 1024)
BLOCK = 4096
OPS = {"sum": 0, "avg": 1, "prod": 2, "min": 3, "max": 4}
#: data type -> (kind for the kernel: 0 float32, 1 bf16, 2 f16, 3 int32)
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int32: 3}


@triton.jit
def _round_bf16(x):
    """float32 -> the nearest bf16 (ties to even), as float32; NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _combine(acc, v, OP: tl.constexpr):
    if OP == 2:
        return acc * v
    elif OP == 3:
        return tl.where((acc != acc) | (acc < v), acc, v)
    elif OP == 4:
        return tl.where((acc != acc) | (acc > v), acc, v)
    else:
        return acc + v


@triton.jit
def _load_f32(ptr, mask, KIND: tl.constexpr):
    """float32 values of float32/fp16 elements, or of bf16 ones read as int16 bits (KIND 1):
    shifting the bits up is exact for every value, subnormals included, where Triton's
    interpreter converts bf16 to float32 with its subnormals flushed to zero."""
    if KIND == 1:
        bits = tl.load(ptr, mask=mask, other=0).to(tl.uint16, bitcast=True).to(tl.uint32)
        return (bits << 16).to(tl.float32, bitcast=True)
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _tile_reduce(rows_ptr, out_ptr, n, world, OP: tl.constexpr, KIND: tl.constexpr,
                 PARTIALS_IN_BF16: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    if KIND == 3:
        acc = tl.load(rows_ptr + i, mask=mask, other=0).to(tl.int64)
        for w in range(1, world):
            acc = _combine(acc, tl.load(rows_ptr + w * n + i, mask=mask, other=0).to(tl.int64),
                           OP)
        tl.store(out_ptr + i, acc.to(tl.int32), mask=mask)
    else:
        acc = _load_f32(rows_ptr + i, mask, KIND)
        for w in range(1, world):
            v = _load_f32(rows_ptr + w * n + i, mask, KIND)
            acc = _combine(acc, v, OP)
            if PARTIALS_IN_BF16:  # the control
                acc = _round_bf16(acc)
        if OP == 1:
            acc = acc / world
        if KIND == 1:
            # the bits of the rounded value, stored through an int16 view of the output
            bits = (_round_bf16(acc).to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
            tl.store(out_ptr + i, bits.to(tl.int16, bitcast=True), mask=mask)
        else:
            tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _allreduce(world: Any, x: torch.Tensor, out: torch.Tensor, op: str, partials_in_bf16: bool
               ) -> torch.Tensor:
    from suites._collectives.common import gather_rows  # (that package imports this one)

    rows = gather_rows(world, x).reshape(world.size, -1).contiguous()
    n = rows.shape[1]
    kind = KINDS[x.dtype]
    # bf16 travels as its int16 bits both ways (_load_f32, and the store below)
    target = out.view(torch.int16) if kind == 1 else out
    source = rows.view(torch.int16) if kind == 1 else rows
    if n:
        _tile_reduce[(triton.cdiv(n, BLOCK),)](
            source, target, n, world.size, OP=OPS[op], KIND=kind,
            PARTIALS_IN_BF16=partials_in_bf16, BLOCK=BLOCK)
    return out


def allreduce_tile(world: Any, x: torch.Tensor, out: torch.Tensor, op: str) -> torch.Tensor:
    """The allgather through torch.distributed, then the Triton kernel reduces the W rows."""
    return _allreduce(world, x, out, op, False)


def allreduce_tile_partials_in_bf16(world: Any, x: torch.Tensor, out: torch.Tensor, op: str
                                    ) -> torch.Tensor:
    """Control: every partial result rounded to bf16, whatever the data type."""
    return _allreduce(world, x, out, op, True)
