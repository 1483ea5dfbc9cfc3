"""Hopper tasks that read results out: argmax (the sampling step, over vocab chunks) and
identity (a copy that captures an intermediate of a pipeline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness.api import OpSpec, Work, exact, hash32, plant_specials, seed_from
from reference_kernels import hopper_tasks as ref
from suites._triton import triton_impl

from .common import tensor
from .tasks import BATCHES, FAMILY, HIDDENS


# ---------------------------------------------------------------- argmax
def argmax_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Logits in [-1, 1) with one planted maximum per row (so the answer is unique), placed
    by a hash so that most rows have it past the first chunk; or, with ``values=ties``, the
    rows of ``argmax_ties`` (``nan``: of ``argmax_nan``). ``values=neginf``, for a vocab of whole
    chunks: row 0 all -inf (answer 0: a scan that starts at index -1 or at a finite floor and
    takes a logit only when it is larger keeps -1) and every other row -inf but its last
    logit."""
    b, vocab, chunk = params["b"], params["vocab"], params["chunk"]
    logits = tensor("argmax", params, "logits", (b, vocab))
    if params.get("values") == "ties":
        return {"logits": argmax_ties(logits, chunk), "chunk": chunk}
    if params.get("values") == "nan":
        return {"logits": argmax_nan(logits, chunk), "chunk": chunk}
    if params.get("values") == "neginf":
        logits[:] = float("-inf")
        logits[1:, -1] = -3.0
        return {"logits": logits, "chunk": chunk}
    if params.get("values") == "range":
        return {"logits": argmax_range(logits, chunk), "chunk": chunk}
    if params.get("values") == "negative":
        # every logit below zero: where the vocab does not fill its chunk, a padded zero wins
        # (the answer is the vocab size), which a single pass over the real logits misses
        return {"logits": -(logits.abs() + 0.5), "chunk": chunk}
    where = hash32(torch.arange(b), seed_from("argmax.max", b, vocab)) % vocab
    logits[torch.arange(b), where] = 4.0
    return {"logits": logits, "chunk": chunk}


def argmax_range(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose maximum a comparison in a narrower type loses: row 0 holds 66048 in its
    first chunk and the maximum 70144 in its last (both +inf in float16), row 1 negative
    logits and two positive ones below float16's normal range, the larger last (2**-24 and
    its next bf16 value, one float16 subnormal), so a float16 load ties them and keeps the
    first."""
    b, vocab = logits.shape
    if b < 2 or vocab <= chunk:
        raise ValueError(f"the range rows need b >= 2 and more than one chunk: b={b}, "
                         f"vocab={vocab}, chunk={chunk}")
    x = logits.clone()
    x[0, 1], x[0, vocab - 2] = 66048.0, 70144.0
    x[1] = -x[1].abs() - 2.0**-8
    x[1, 2], x[1, vocab - 1] = 2.0**-24, 2.0**-24 * (1 + 2.0**-7)
    return x


def argmax_ties(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose answer rests on argmax's defined edges (first index on ties; the vocab padded
    with zero columns up to a multiple of the chunk, so a padded 0 beats negative logits):

    0. the maximum twice, in the first and the third chunk: the first chunk's wins;
    1. the maximum twice inside one chunk: the first of the two;
    2. every logit negative: the first padded column (index ``vocab``) wins with its 0;
    3. the maximum is 0.0, at a real column, tying the padded zeros: the real column wins;
    4. the maximum once in every chunk: the first chunk's;
    5. every logit negative but one -0.0, which ties the padded +0.0 and comes first.

    A tie broken towards the later index fails every row (the padded zeros of rows 2, 3 and 5
    tie each other too); a reduce that ignores the padding fails row 2; one that orders -0.0
    below +0.0 (comparing bits) fails row 5."""
    b, vocab = logits.shape
    if b < 6 or vocab % chunk == 0 or vocab < 3 * chunk:
        raise ValueError(f"the ties rows need b >= 6 and a padded vocab of 3+ chunks: "
                         f"b={b}, vocab={vocab}, chunk={chunk}")
    x = logits.clone()
    x[0, [chunk // 3, 2 * chunk + 1]] = 4.0
    x[1, [chunk + 6, chunk + chunk // 2]] = 4.0
    x[2] = -x[2].abs() - 1.0
    x[3] = -x[3].abs() - 1.0
    x[3, chunk + 3] = 0.0
    x[4, [c * chunk + (7 * c) % chunk for c in range(-(-vocab // chunk)) if c * chunk < vocab
          and c * chunk + (7 * c) % chunk < vocab]] = 4.0
    x[5] = -x[5].abs() - 1.0
    x[5, chunk // 2] = -0.0
    return x


def argmax_nan(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows whose answer rests on argmax's NaN and infinity semantics (NaN counts as the
    largest value, as torch.argmax and numpy.argmax have it; the first NaN wins):

    0. a NaN in the last chunk and a finite maximum in the first: the NaN wins;
    1. NaN twice, in the second and the third chunk: the second chunk's;
    2. +inf in the first chunk and a NaN after it: the NaN;
    3. +inf twice: the first;
    4. every logit -inf: the first padded column (index ``vocab``) wins with its 0;
    5. NaN twice inside the first chunk: the first of the two.

    A kernel that compares with ``>`` alone never takes a NaN (rows 0, 1, 2, 5); one that
    takes the last NaN fails rows 1 and 5; one that pads with -inf fails row 4."""
    b, vocab = logits.shape
    if b < 6 or vocab % chunk == 0 or vocab < 3 * chunk:
        raise ValueError(f"the NaN rows need b >= 6 and a padded vocab of 3+ chunks: "
                         f"b={b}, vocab={vocab}, chunk={chunk}")
    nan, inf = float("nan"), float("inf")
    x = logits.clone()
    x[0, 1], x[0, vocab - 2] = 4.0, nan
    x[1, [chunk + 5, 2 * chunk + 1]] = nan
    x[2, chunk // 2], x[2, 2 * chunk] = inf, nan
    x[3, [chunk + 1, 2 * chunk + 3]] = inf
    x[4] = -inf
    x[5, [chunk // 4, chunk // 2]] = nan
    return x


def argmax_torch(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    b, v = logits.shape
    padded = F.pad(logits, (0, (-v) % chunk))
    values, index = padded.view(b, -1, chunk).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return best * chunk + index.gather(1, best)


def argmax_last_on_ties(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: ties go to the later index, in the chunk and across chunks (a partial kernel that
    keeps a candidate on ``>=`` instead of ``>``, a greedy decode that then diverges)."""
    b, v = logits.shape
    padded = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk)
    index = chunk - 1 - padded.flip(-1).float().argmax(dim=-1)
    values = padded.amax(dim=-1).float()
    best = values.shape[1] - 1 - values.flip(-1).argmax(dim=-1, keepdim=True)
    return best * chunk + index.gather(1, best)


def argmax_no_chunk_offset(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: the reduce step returns the chunk-relative index without chunk * CHUNK."""
    b, v = logits.shape
    values, index = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk).max(dim=-1)
    return index.gather(1, values.argmax(dim=-1, keepdim=True))


def argmax_nan_skipped(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: NaN never wins (a kernel that keeps a candidate on ``x > best`` alone, which is
    false for NaN): the largest number is returned instead."""
    return argmax_torch(logits.nan_to_num(nan=float("-inf"), posinf=float("inf")), chunk)


def argmax_index_in_8_bits(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bug: the partial step keeps the index within its chunk in 8 bits (a uint8 workspace):
    right for chunks up to 256, wrapped past them."""
    b, v = logits.shape
    values, index = F.pad(logits, (0, (-v) % chunk)).view(b, -1, chunk).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return best * chunk + index.to(torch.uint8).long().gather(1, best)


ARGMAX = OpSpec(
    name="hopper_tasks.argmax", family=FAMILY, reference=ref.argmax,
    description="Greedy sampling: per-chunk partial max, then the reduce over chunks.",
    make_inputs=argmax_inputs, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * p["b"] * p["vocab"]),
    grid={"smoke": [{"b": 5, "vocab": 1000, "chunk": 96}, {"b": 3, "vocab": 64, "chunk": 16},
                    # 38 chunks: past a warp of 32 partial results, a second reduce stage
                    {"b": 6, "vocab": 600, "chunk": 16, "values": "ties"},
                    {"b": 6, "vocab": 1000, "chunk": 96, "values": "ties"},
                    {"b": 6, "vocab": 200, "chunk": 64, "values": "nan"},
                    {"b": 6, "vocab": 1000, "chunk": 96, "values": "nan"},
                    {"b": 2, "vocab": 64, "chunk": 16, "values": "neginf"},
                    {"b": 2, "vocab": 200, "chunk": 64, "values": "range"},
                    # a chunk past 256: an index within it kept in 8 bits wraps
                    {"b": 4, "vocab": 1500, "chunk": 512},
                    {"b": 2, "vocab": 50, "chunk": 64, "values": "negative"}],
          "nightly": [{"b": b, "vocab": v, "chunk": 4096} for b in BATCHES
                      for v in (128256, 151936, 152064)]
          + [{"b": 6, "vocab": 151936, "chunk": 4096, "values": v} for v in ("ties", "nan")]
          + [{"b": 2, "vocab": 131072, "chunk": 4096, "values": "neginf"},
             {"b": 2, "vocab": 151936, "chunk": 4096, "values": "range"},
             {"b": 2, "vocab": 3000, "chunk": 4096, "values": "negative"}]},
    implementations={"torch": argmax_torch, "triton": triton_impl("hopper:argmax")},
    negative_controls={"no_chunk_offset": argmax_no_chunk_offset,
                       "index_in_8_bits": argmax_index_in_8_bits,
                       "last_on_ties": argmax_last_on_ties,
                       "nan_skipped": argmax_nan_skipped,
                       "triton_no_chunk_offset": triton_impl("hopper:argmax_no_chunk_offset")},
    any_alignment=True,
)


# ---------------------------------------------------------------- identity
def identity_inputs(params: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    x = tensor("identity", params, "x", (params["b"], params["hidden"]))
    if params.get("values") == "special":
        plant_specials(x)  # -0.0, subnormals, +-inf, NaN: a copy through arithmetic loses them
    return {"x": x}


def identity_torch(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def identity_last_tile_dropped(x: torch.Tensor) -> torch.Tensor:
    """Bug: the tile loop stops one 64-column tile early (range(0, H - 64, 64))."""
    out = torch.zeros_like(x)
    for start in range(0, x.shape[1] - 64, 64):
        out[:, start : start + 64] = x[:, start : start + 64]
    return out


IDENTITY = OpSpec(
    name="hopper_tasks.identity", family=FAMILY, reference=ref.identity,
    description="A copy: captures an intermediate of a pipeline.",
    make_inputs=identity_inputs, tolerance=exact(),
    work=lambda p, w: Work(bytes=2.0 * 2 * p["b"] * p["hidden"]),
    grid={"smoke": [{"b": 4, "hidden": 256}, {"b": 3, "hidden": 193, "values": "special"},
                    {"b": 2, "hidden": 1000, "values": "special"}],
          "nightly": [{"b": b, "hidden": h} for b in BATCHES for h in HIDDENS]
          + [{"b": 16, "hidden": 5000, "values": "special"}]},
    implementations={"torch": identity_torch},
    negative_controls={"last_tile_dropped": identity_last_tile_dropped},
    any_alignment=True,
)

SPECS = [ARGMAX, IDENTITY]
