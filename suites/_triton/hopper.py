"""Triton kernels of the Hopper tasks: rmsnorm, silu_mul, embedding, argmax (partial + reduce).

Arithmetic is in float32, rounded once at the store: Triton 3.9's interpreter keeps bf16
values as their raw 16 bits and computes on those bits (runtime/interpreter.py: "bfloat16
types are stored as uint16"), and converts float32 to bf16 by truncation (``cast_impl``
passes no rounding mode to ``_convert_float``), so a kernel that computes in bf16 cannot be
judged on the CPU, and an interpreted store may be one bf16 ulp below the compiled one's
(within these ops' tolerances).

Each launch function has its op's signature, allocates the outputs and launches; a negative
control sits beside each, with a bug that is natural in Triton. Imported on the first call
of a ``TritonImplementation`` (suites/_triton/__init__.py), after the rank chose compiled or
interpreted kernels. Program ids are widened to int64 before they scale a row: a row index
times the hidden size passes 2**31 in a real model's activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.hopper_tasks import EPS


# ---------------------------------------------------------------- rmsnorm
@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, hidden, x_row, w_step, eps, BLOCK: tl.constexpr,
             EPS_OUTSIDE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row + cols, mask=mask, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    if EPS_OUTSIDE:  # the control: rsqrt(0) of an all-zero row is inf, and 0 * inf NaN
        scale = tl.math.rsqrt(mean_square) + eps
    else:
        scale = tl.math.rsqrt(mean_square + eps)
    w = tl.load(w_ptr + cols * w_step, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (x * scale * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def _launch_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps_outside: bool) -> torch.Tensor:
    if x.stride(1) != 1:  # rows of a wider buffer are read in place; other layouts copied
        x = x.contiguous()
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    _rmsnorm[(rows,)](x, weight, out, hidden, x.stride(0), weight.stride(0), EPS,
                      BLOCK=triton.next_power_of_2(hidden), EPS_OUTSIDE=eps_outside)
    return out


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One program per row: the mean square in float32, one rounding at the store."""
    return _launch_rmsnorm(x, weight, False)


def rmsnorm_eps_outside_rsqrt(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Control: eps added after the rsqrt, not under it (NaN on an all-zero row)."""
    return _launch_rmsnorm(x, weight, True)


# ---------------------------------------------------------------- silu_mul
@triton.jit
def _silu_mul(x_ptr, out_ptr, inter, chunk, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter - TAIL  # TAIL = 1 is the control's off-by-one
    group, within = cols // chunk, cols % chunk
    src = x_ptr + row * 2 * inter + group * 2 * chunk + within  # [gate | up] of each group
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + chunk, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def _launch_silu_mul(x: torch.Tensor, groups: int, tail: int) -> torch.Tensor:
    x = x.contiguous()
    rows, width = x.shape
    inter = width // 2
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul[(rows, triton.cdiv(inter, block))](x, out, inter, inter // groups, BLOCK=block,
                                                 TAIL=tail)
    return out


def silu_mul(x: torch.Tensor, groups: int) -> torch.Tensor:
    """silu(gate) rounded to the output type, times up, over G interleaved groups."""
    return _launch_silu_mul(x, groups, 0)


def silu_mul_tail_mask_off_by_one(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Control: the store mask is ``cols < inter - 1``: each row's last element is never
    written."""
    return _launch_silu_mul(x, groups, 1)


# ---------------------------------------------------------------- embedding
@triton.jit
def _embedding(ids_ptr, w_ptr, out_ptr, hidden, BLOCK: tl.constexpr,
               ZERO_IS_PADDING: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    # int64 ids, loaded as a block: a vocab row times hidden passes 2**31
    token = tl.load(ids_ptr + row + tl.zeros([BLOCK], dtype=tl.int64))
    if ZERO_IS_PADDING:  # the control: id 0 taken for padding, as with padding_idx=0
        valid = token > 0
    else:
        valid = token >= 0
    values = tl.load(w_ptr + token * hidden + cols, mask=mask & valid, other=0.0)
    tl.store(out_ptr + row * hidden + cols, values, mask=mask)


def _launch_embedding(ids: torch.Tensor, weight: torch.Tensor, zero_is_padding: bool
                      ) -> torch.Tensor:
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    hidden = weight.shape[1]
    out = torch.empty((flat.numel(), hidden), dtype=weight.dtype, device=weight.device)
    block = min(1024, triton.next_power_of_2(hidden))
    _embedding[(flat.numel(), triton.cdiv(hidden, block))](
        flat, weight.contiguous(), out, hidden, BLOCK=block, ZERO_IS_PADDING=zero_is_padding)
    return out


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A masked row gather: a negative id loads nothing and stores a zero row."""
    return _launch_embedding(ids, weight, False)


def embedding_zero_id_as_padding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Control: the validity test is ``token > 0``, so id 0 reads as padding."""
    return _launch_embedding(ids, weight, True)


# ---------------------------------------------------------------- argmax
@triton.jit
def _argmax_partial(x_ptr, values_ptr, index_ptr, vocab, n_chunks, CHUNK: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    col = c * CHUNK + cols
    # past the vocab the chunk is padded with zeros (the LM head's zero rows), which take part
    x = tl.load(x_ptr + row * vocab + col, mask=(cols < CHUNK) & (col < vocab), other=0.0)
    x = tl.where(cols < CHUNK, x.to(tl.float32), float("-inf"))
    best, where = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    # NaN is the largest value, its first occurrence wins: tl.max's comparisons skip NaN
    first_nan = tl.min(tl.where(x != x, cols, BLOCK), axis=0)
    best = tl.where(first_nan < BLOCK, float("nan"), best)
    where = tl.where(first_nan < BLOCK, first_nan, where)
    tl.store(values_ptr + row * n_chunks + c, best)
    tl.store(index_ptr + row * n_chunks + c, where.to(tl.int64))


@triton.jit
def _argmax_reduce(values_ptr, index_ptr, out_ptr, n_chunks, CHUNK: tl.constexpr,
                   BLOCK: tl.constexpr, CHUNK_OFFSET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    v = tl.load(values_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
    _, best = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    first_nan = tl.min(tl.where(v != v, c, BLOCK), axis=0)
    best = tl.where(first_nan < BLOCK, first_nan, best)
    within = tl.load(index_ptr + row * n_chunks + best)
    if CHUNK_OFFSET:
        within += best.to(tl.int64) * CHUNK
    tl.store(out_ptr + row, within)


def _launch_argmax(logits: torch.Tensor, chunk: int, chunk_offset: bool) -> torch.Tensor:
    logits = logits.contiguous()
    rows, vocab = logits.shape
    n_chunks = triton.cdiv(vocab, chunk)
    values = torch.empty((rows, n_chunks), dtype=torch.float32, device=logits.device)
    index = torch.empty((rows, n_chunks), dtype=torch.int64, device=logits.device)
    _argmax_partial[(rows, n_chunks)](logits, values, index, vocab, n_chunks, CHUNK=chunk,
                                      BLOCK=triton.next_power_of_2(chunk))
    out = torch.empty((rows, 1), dtype=torch.int64, device=logits.device)
    _argmax_reduce[(rows,)](values, index, out, n_chunks, CHUNK=chunk,
                            BLOCK=triton.next_power_of_2(n_chunks), CHUNK_OFFSET=chunk_offset)
    return out


def argmax(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """The partial kernel (one program per row and chunk: max and first index), then the
    reduce kernel (one per row: the first chunk with the max, offset by chunk * c)."""
    return _launch_argmax(logits, chunk, True)


def argmax_no_chunk_offset(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Control: the reduce kernel returns the chunk-relative index."""
    return _launch_argmax(logits, chunk, False)
