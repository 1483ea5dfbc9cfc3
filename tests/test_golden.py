"""The golden store (harness/core/golden.py) and `harness golden generate|verify|show`.

Expectations are derived independently of the code under test: chunk sums with numpy on values
chosen so that float64 sums are exact, perturbations built to a known fraction of a tolerance
(on value grids where ``golden + perturbation`` is exact in float32), files hashed with hashlib.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.core import compare, golden
from harness.core.golden import CHUNK, Fingerprint, GoldenError, GoldenStore
from harness.core.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "suites" / "golden"

#: a 2-d output of 4 chunks, the last one ragged (4369 elements)
SHAPE = (7, 28711)
NUMEL = SHAPE[0] * SHAPE[1]
N_CHUNKS = 4
assert NUMEL == 3 * CHUNK + 4369


# -------------------------------------------------------------------------------- helpers
def raw(t: torch.Tensor) -> bytes:
    """The bytes of a tensor (bitwise comparison, NaN payloads and -0.0 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def grid_values(numel: int = NUMEL, seed: int = 0, step: float = 2.0**-10,
                span: int = 4096) -> np.ndarray:
    """Float32-exact values k*step, |k| <= span: float64 sums of up to 2**16 of them, of their
    absolute values and of their squares are exact."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-span, span + 1, size=numel) * step).astype(np.float32)


def grid_golden(seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(grid_values(seed=seed)).reshape(SHAPE)


def pow2_golden(seed: int = 1) -> torch.Tensor:
    """Positive powers of two: an ulp above each is exactly eps*|g|, the ulp bound's edge."""
    rng = np.random.default_rng(seed)
    vals = (2.0 ** rng.integers(-4, 2, size=NUMEL)).astype(np.float32)
    return torch.from_numpy(vals).reshape(SHAPE)


def np_chunk_sums(values: np.ndarray) -> tuple[list[float], list[float], list[float]]:
    """Float64 (sum, abs sum, sum of squares) per CHUNK, computed with numpy."""
    v = values.astype(np.float64).reshape(-1)
    parts = [v[i:i + CHUNK] for i in range(0, max(v.size, 1), CHUNK)]
    return ([float(np.sum(p)) for p in parts], [float(np.sum(np.abs(p))) for p in parts],
            [float(np.sum(p * p)) for p in parts])


def chunk_range(c: int) -> np.ndarray:
    return np.arange(c * CHUNK, min(NUMEL, (c + 1) * CHUNK))


def unsampled(c: int, fp: Fingerprint) -> np.ndarray:
    """The elements of chunk ``c`` that are not sampled positions of ``fp``."""
    idx = chunk_range(c)
    keep = ~np.isin(idx, fp.positions.numpy())
    assert keep.sum() < idx.size  # the chunk does hold sampled positions we leave alone
    return idx[keep]


def _quantize(x: np.ndarray | float, down: bool) -> np.ndarray:
    """Onto the 2**-20 grid (rounded towards the side that keeps the claim true), so that a
    golden on the 2**-10 grid with |g| <= 4 plus it is exact in float32."""
    q = np.asarray(x, dtype=np.float64) * 2.0**20
    return (np.floor(q) if down else np.ceil(q)) / 2.0**20


def _apply(g: torch.Tensor, idx: np.ndarray, delta: np.ndarray | float) -> torch.Tensor:
    flat = g.reshape(-1).numpy().astype(np.float64)
    flat[idx] += delta
    out = flat.astype(np.float32)
    assert np.array_equal(out.astype(np.float64), flat)  # no rounding: the move is exact
    return torch.from_numpy(out).reshape(g.shape)


# ---------------------------------------------------------------- independent tolerance
def np_within(tol: compare.Tolerance, a: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``a`` meets ``tol`` against ``g``, computed with numpy (finite values only)."""
    av = a.reshape(-1).numpy().astype(np.float64)
    gv = g.reshape(-1).numpy().astype(np.float64)
    d = av - gv
    if tol.kind == "all_of":
        return all(np_within(p, a, g) for p in tol.parts)
    if tol.kind == "exact":
        return raw(a) == raw(g)
    if tol.kind == "allclose":
        return bool(np.all(np.abs(d) <= tol.atol + tol.rtol * np.abs(gv)))
    if tol.kind == "ulp":  # same-sign float32 values: ulps apart = difference of their bits
        ai = a.reshape(-1).numpy().view(np.int32).astype(np.int64)
        gi = g.reshape(-1).numpy().view(np.int32).astype(np.int64)
        assert np.all((av >= 0) == (gv >= 0))
        return bool(np.all(np.abs(ai - gi) <= tol.ulps))
    if tol.kind == "rel_l2":
        return math.sqrt(np.sum(d * d)) <= tol.bound * math.sqrt(np.sum(gv * gv))
    assert tol.kind == "cos_diff"
    return float(np.sum(d * d) / (np.sum(av * av) + np.sum(gv * gv))) <= tol.bound


# ------------------------------------------------------------------- edge perturbations
def move_allclose(rtol: float, atol: float) -> Callable[..., torch.Tensor]:
    def move(g: torch.Tensor, idx: np.ndarray, scale: float) -> torch.Tensor:
        gv = g.reshape(-1).numpy().astype(np.float64)[idx]
        return _apply(g, idx, _quantize(scale * (atol + rtol * np.abs(gv)), down=scale < 1))
    return move


def move_ulps(k: int) -> Callable[..., torch.Tensor]:
    def move(g: torch.Tensor, idx: np.ndarray, scale: float) -> torch.Tensor:
        flat = g.reshape(-1).clone()
        sel = torch.from_numpy(idx)
        vals = flat[sel]
        for _ in range(round(k * scale)):
            vals = torch.nextafter(vals, torch.full_like(vals, math.inf))
        flat[sel] = vals
        return flat.reshape(g.shape)
    return move


def move_rel_l2(r: float) -> Callable[..., torch.Tensor]:
    """A constant shift on ``idx`` with ||a-g|| = scale * r * ||g||: concentrated in one chunk,
    the worst case for that chunk's sum (Cauchy-Schwarz is tight for a constant vector)."""
    def move(g: torch.Tensor, idx: np.ndarray, scale: float) -> torch.Tensor:
        big_g = float(np.sum(g.numpy().astype(np.float64) ** 2))
        delta = scale * r * math.sqrt(big_g / idx.size)
        return _apply(g, idx, float(_quantize(delta, down=scale < 1)))
    return move


def move_cos_diff(c: float) -> Callable[..., torch.Tensor]:
    """A constant shift d on the m elements ``idx`` with cos_diff = c' = scale*c:
    m d^2 = c' (2G + 2 d S + m d^2), S the golden's sum over idx, G its sum of squares."""
    def move(g: torch.Tensor, idx: np.ndarray, scale: float) -> torch.Tensor:
        gv = g.reshape(-1).numpy().astype(np.float64)
        big_g, s, m, cc = float(np.sum(gv * gv)), float(np.sum(gv[idx])), idx.size, scale * c
        delta = (2 * cc * s + math.sqrt(4 * cc * cc * s * s + 8 * m * (1 - cc) * cc * big_g)) / (
            2 * m * (1 - cc))
        return _apply(g, idx, float(_quantize(delta, down=scale < 1)))
    return move


def move_exact(g: torch.Tensor, idx: np.ndarray, scale: float) -> torch.Tensor:
    """Within exact: nothing moves; beyond it: the smallest move of the grid."""
    return g.clone() if scale < 1 else _apply(g, idx, 2.0**-20)


@dataclass
class Edge:
    name: str
    tol: compare.Tolerance
    move: Callable[..., torch.Tensor]
    make_golden: Callable[[], torch.Tensor] = grid_golden
    #: True: every element is moved to the edge; False (global bounds): one chunk, concentrated
    everywhere: bool = True


EDGES = [
    Edge("exact", compare.exact(), move_exact),
    Edge("allclose", compare.allclose(2.0**-7, 2.0**-10), move_allclose(2.0**-7, 2.0**-10)),
    Edge("ulp", compare.ulp(4), move_ulps(4), pow2_golden),
    Edge("rel_l2", compare.rel_l2(1e-3), move_rel_l2(1e-3), everywhere=False),
    Edge("cos_diff", compare.cos_diff(1e-6), move_cos_diff(1e-6), everywhere=False),
    Edge("allclose&rel_l2", compare.all_of(compare.allclose(2.0**-7, 2.0**-10),
                                           compare.rel_l2(0.05)),
         move_allclose(2.0**-7, 2.0**-10)),
    Edge("cos_diff&allclose", compare.all_of(compare.cos_diff(1e-6),
                                             compare.allclose(0.05, 0.05)),
         move_cos_diff(1e-6), everywhere=False),
]


# ================================================================ 1. encode / decode
WHOLE_CASES = {
    "f32": torch.tensor([1.5, -0.0, 0.0, math.inf, -math.inf, math.nan, 1e-45, -3.25e38]),
    "bf16": torch.tensor([1.0, -2.5, 3.0e38, 1e-30, math.nan], dtype=torch.bfloat16),
    "f16": torch.tensor([[1.0, -65504.0], [6e-8, math.inf]], dtype=torch.float16),
    "e4m3": torch.tensor([0.5, -448.0, 2.0**-9, -0.0], dtype=torch.float8_e4m3fn),
    "i64": torch.tensor([2**63 - 1, -(2**63), 0, 12345], dtype=torch.int64),
    "bool": torch.tensor([[True, False, True]]),
    "u8": torch.arange(256, dtype=torch.uint8),
    "scalar": torch.tensor(3.5),
    "empty": torch.empty(0, 5),
}


def test_small_outputs_round_trip_whole_and_bitwise(tmp_path: Path) -> None:
    outputs = {0: dict(WHOLE_CASES),
               1: {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # strided
                   "gone": None}}
    tensors, meta = golden.encode(outputs, "w2:op[n=1]")
    save_file(tensors, str(tmp_path / "g.safetensors"))
    loaded = load_file(str(tmp_path / "g.safetensors"))  # through the file format too
    assert set(meta) == {f"r0/{n}" for n in WHOLE_CASES} | {"r1/x"}  # None is not stored
    for rank, outs in outputs.items():
        back = golden.decode(loaded, meta, rank, "g.safetensors")
        assert set(back) == {n for n, t in outs.items() if t is not None}
        for name, t in outs.items():
            if t is None:
                continue
            got = back[name]
            assert isinstance(got, torch.Tensor), name
            assert got.dtype == t.dtype and got.shape == t.shape, name
            assert raw(got) == raw(t), name
            info = meta[f"r{rank}/{name}"]
            assert info["kind"] == "whole"
            assert info["shape"] == list(t.shape)
            assert getattr(torch, info["dtype"]) == t.dtype


def test_whole_up_to_the_byte_limit_then_fingerprint() -> None:
    n = golden.WHOLE_MAX_BYTES // 4
    outs = {0: {"at": torch.zeros(n), "over": torch.zeros(n + 1)}}
    _, meta = golden.encode(outs, "k")
    assert meta["r0/at"]["kind"] == "whole"
    assert meta["r0/over"]["kind"] == "fingerprint"


def _fingerprinted(dtype: torch.dtype, numel: int) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.from_numpy(np.random.default_rng(3).integers(0, 2, numel).astype(bool))
    if not dtype.is_floating_point:
        return torch.from_numpy(grid_values(numel, seed=4, step=1.0, span=1000)).to(dtype)
    return torch.from_numpy(grid_values(numel, seed=5)).to(dtype)  # rounded: still exact sums


@pytest.mark.parametrize("dtype,numel", [
    (torch.float32, NUMEL),
    (torch.bfloat16, 2 * CHUNK + 1),
    (torch.float8_e4m3fn, CHUNK + 12345),
    (torch.int32, 2 * CHUNK),  # no ragged chunk: exactly two
    (torch.bool, 5 * CHUNK + 7),
])
def test_large_outputs_are_fingerprinted(dtype: torch.dtype, numel: int) -> None:
    t = _fingerprinted(dtype, numel)
    tensors, meta = golden.encode({0: {"out": t}}, "w1:op[n=9]")
    fp = golden.decode(tensors, meta, 0, "mem")["out"]
    assert isinstance(fp, Fingerprint)
    assert fp.shape == (numel,) and fp.dtype == dtype
    pos = fp.positions.numpy()
    assert fp.positions.dtype == torch.int64
    assert np.array_equal(pos, np.unique(pos))  # sorted, distinct
    assert pos[0] == 0 and pos[-1] == numel - 1  # the first and last element always
    assert golden.SAMPLES <= pos.size <= golden.SAMPLES + 2
    assert meta["r0/out"] == {"shape": [numel], "dtype": str(dtype).removeprefix("torch."),
                              "kind": "fingerprint", "chunk": CHUNK, "samples": pos.size}
    assert raw(fp.values) == raw(t[fp.positions])
    n_chunks = math.ceil(numel / CHUNK)
    sums, abs_sums, sq_sums = np_chunk_sums(t.to(torch.float64).numpy())
    assert fp.sums.dtype == torch.float64 and fp.sums.numel() == n_chunks == len(sums)
    assert fp.sums.tolist() == sums
    assert fp.abs_sums.tolist() == abs_sums
    assert fp.sq_sums.tolist() == sq_sums
    # the actual output itself passes its fingerprint, exactly
    check = golden.check_output(t, fp, compare.exact())
    assert check.kind == "fingerprint" and check.sums_error == ""
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")


def test_sample_positions_are_fixed_by_the_key() -> None:
    a = golden.sample_positions(NUMEL, "w1:op[n=1]/r0/out")
    assert torch.equal(a, golden.sample_positions(NUMEL, "w1:op[n=1]/r0/out"))
    assert not torch.equal(a, golden.sample_positions(NUMEL, "w1:op[n=1]/r1/out"))


def test_chunk_sums_across_conversion_blocks() -> None:
    """More chunks than are converted to float64 at once, the last one ragged."""
    n = 65 * CHUNK + 3
    vals = np.random.default_rng(6).integers(-128, 128, size=n).astype(np.int8)
    got = golden.chunk_sums(torch.from_numpy(vals))
    want = np_chunk_sums(vals)
    assert len(want[0]) == 66
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w


# ================================================ 2. soundness of the fingerprint check
@pytest.mark.parametrize("chunk", [1, N_CHUNKS - 1], ids=["chunk1", "ragged_last"])
@pytest.mark.parametrize("edge", EDGES, ids=[e.name for e in EDGES])
def test_fingerprint_passes_an_output_at_the_edge_of_its_tolerance(edge: Edge, chunk: int
                                                                   ) -> None:
    g = edge.make_golden()
    fp = golden.fingerprint(g, "edge")
    idx = np.arange(NUMEL) if edge.everywhere else chunk_range(chunk)
    a = edge.move(g, idx, 0.99)
    assert np_within(edge.tol, a, g)  # the construction really is inside the tolerance
    check = golden.check_output(a, fp, edge.tol)
    assert check.sums_error == ""
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    # a fingerprint of the moved output against the golden's: the same verdict
    again = golden.check_fingerprint(golden.fingerprint(a, "edge"), fp, edge.tol)
    assert again.sums_error == ""
    assert compare.verdict(again.metrics, again.tolerance)[0]


@pytest.mark.parametrize("chunk", [1, N_CHUNKS - 1], ids=["chunk1", "ragged_last"])
@pytest.mark.parametrize("edge", EDGES, ids=[e.name for e in EDGES])
def test_chunk_sums_catch_what_the_samples_miss(edge: Edge, chunk: int) -> None:
    g = edge.make_golden()
    fp = golden.fingerprint(g, "edge")
    a = edge.move(g, unsampled(chunk, fp), 1.5)  # every element of the chunk, but no sample
    assert not np_within(edge.tol, a, g)  # really outside the tolerance
    assert raw(a.reshape(-1)[fp.positions]) == raw(fp.values)  # invisible to the samples
    check = golden.check_output(a, fp, edge.tol)
    assert check.metrics.n_mismatch == 0
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    assert check.sums_error.startswith(f"1/{N_CHUNKS} chunk sums outside")
    assert f"first chunk {chunk} (elements {chunk * CHUNK}..)" in check.sums_error
    again = golden.check_fingerprint(golden.fingerprint(a, "edge"), fp, edge.tol)
    assert f"first chunk {chunk} " in again.sums_error


def test_mismatch_budget_leaves_the_sums_unbounded() -> None:
    g = grid_golden()
    fp = golden.fingerprint(g, "budget")
    a = _apply(g, unsampled(2, fp)[:50], 3.0)  # 50 elements far off, within a 1% budget
    check = golden.check_output(a, fp, compare.allclose(1e-3, 1e-3, max_mismatch_frac=0.01))
    assert check.sums_error == ""


def test_strided_actual_is_read_in_logical_order() -> None:
    g = grid_golden()
    fp = golden.fingerprint(g, "strided")
    a = g.t().contiguous().t()
    assert not a.is_contiguous()
    check = golden.check_output(a, fp, compare.exact())
    assert check.sums_error == "" and check.metrics.n_mismatch == 0


def test_shape_change_against_a_fingerprint_fails() -> None:
    g = grid_golden()
    fp = golden.fingerprint(g, "shape")
    for a in (g.reshape(-1), g.t()):
        check = golden.check_output(a, fp, compare.exact())
        ok, why = compare.verdict(check.metrics, check.tolerance)
        assert not ok and "golden" in why and check.metrics.n_mismatch == NUMEL


@pytest.mark.parametrize("tol", [compare.allclose(2.0**-8, 0.0), compare.cos_diff(1e-5)],
                         ids=["allclose", "cos_diff"])
def test_wider_golden_than_the_output(tol: compare.Tolerance) -> None:
    """A float32 golden of a bf16 output (a second, unquantized reference): the output rounded
    once passes, the same output moved by 4 bf16 ulps on one unsampled chunk does not."""
    g = torch.from_numpy(np.random.default_rng(8).normal(size=NUMEL).astype(np.float32))
    fp = golden.fingerprint(g.reshape(SHAPE), "wide")
    a = g.to(torch.bfloat16)
    check = golden.check_output(a.reshape(SHAPE), fp, tol)
    assert check.sums_error == ""
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    idx = torch.from_numpy(unsampled(1, fp))
    b = a.clone()  # every element up, by 4 bf16 ulps of the golden: the sums' worst case
    b[idx] = (g[idx] + 2.0**-6 * g[idx].abs()).to(torch.bfloat16)
    assert "first chunk 1 " in golden.check_output(b.reshape(SHAPE), fp, tol).sums_error


@pytest.mark.parametrize("tol", [compare.exact(), compare.ulp(1)], ids=["exact", "ulp"])
def test_wider_golden_exact_and_ulp_agree_with_the_whole_check(tol: compare.Tolerance) -> None:
    g = torch.from_numpy(np.random.default_rng(8).normal(size=NUMEL).astype(np.float32))
    a = g.to(torch.bfloat16)  # the golden rounded once: exact and 1 ulp by compare's rules
    assert compare.check(a, g, tol).passed
    check = golden.check_output(a, golden.fingerprint(g, "wide"), tol)
    assert compare.verdict(check.metrics, check.tolerance)[0]
    assert check.sums_error == ""


# ============================================== 3. single elements, NaN and infinities
ALLCLOSE = compare.allclose(1e-3, 1e-3)


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_flipped_sampled_element_fails_at_its_flat_position(which: str) -> None:
    g = grid_golden()
    fp = golden.fingerprint(g, "flip")
    p = {"first": 0, "middle": int(fp.positions[fp.positions.numel() // 2]),
         "last": NUMEL - 1}[which]
    assert p in fp.positions.tolist()
    a = _apply(g, np.array([p]), 10.0)
    check = golden.check_output(a, fp, ALLCLOSE)
    ok, why = compare.verdict(check.metrics, check.tolerance)
    assert not ok
    assert check.metrics.n_mismatch == 1
    assert check.metrics.first_bad_index == p
    assert check.metrics.first_bad_position() == [p // SHAPE[1], p % SHAPE[1]]
    assert f"index {[p // SHAPE[1], p % SHAPE[1]]}" in why


def test_nan_where_the_golden_is_finite_fails() -> None:
    g = grid_golden()
    fp = golden.fingerprint(g, "nan")
    p = int(fp.positions[7])
    a = g.clone()
    a.view(-1)[p] = math.nan
    check = golden.check_output(a, fp, ALLCLOSE)
    ok, why = compare.verdict(check.metrics, check.tolerance)
    assert not ok and check.metrics.first_bad_index == p and check.metrics.n_nan == 1
    # at a position the samples do not see: the chunk sum
    q = int(unsampled(2, fp)[100])
    b = g.clone()
    b.view(-1)[q] = math.nan
    for tol in (ALLCLOSE, compare.exact(), compare.cos_diff(1e-2)):
        check = golden.check_output(b, fp, tol)
        assert compare.verdict(check.metrics, check.tolerance)[0]
        # NaN is counted per chunk, apart from the finite sums: exactly its chunk is named,
        # under a global tolerance too
        assert check.sums_error.startswith(f"1/{N_CHUNKS} chunk sums")
        assert "first chunk 2 " in check.sums_error and "NaN/+inf/-inf counts" in check.sums_error


def _nan_golden() -> tuple[torch.Tensor, Fingerprint, int]:
    """A golden with NaN at a sampled position and at an unsampled one of chunk 1."""
    g = grid_golden()
    fp0 = golden.fingerprint(g, "nan-golden")
    p, q = int(fp0.positions[3]), int(unsampled(1, fp0)[5])
    g.view(-1)[p] = math.nan
    g.view(-1)[q] = math.nan
    fp = golden.fingerprint(g, "nan-golden")
    assert math.isnan(float(fp.values[3])) and int(fp.specials[:, 0].sum()) == 2
    assert int(fp.specials[1, 0]) >= 1 and math.isfinite(float(fp.sums[1]))
    return g, fp, q


@pytest.mark.parametrize("tol", [ALLCLOSE, compare.ulp(1), compare.exact()],
                         ids=["allclose", "ulp", "exact"])
def test_nan_golden_matched_by_nan_passes(tol: compare.Tolerance) -> None:
    g, fp, q = _nan_golden()
    check = golden.check_output(g.clone(), fp, tol)
    assert check.sums_error == ""
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    # a finite value where the golden has NaN, in the unsampled element: the sums see it
    a = g.clone()
    a.view(-1)[q] = 1.0
    assert "first chunk 1 " in golden.check_output(a, fp, tol).sums_error


def test_golden_infinity_needs_the_same_infinity() -> None:
    g = grid_golden()
    q = int(unsampled(1, golden.fingerprint(g, "inf"))[9])
    g.view(-1)[q] = math.inf
    fp = golden.fingerprint(g, "inf")
    assert golden.check_output(g.clone(), fp, ALLCLOSE).sums_error == ""
    for wrong in (math.nan, -math.inf, 4.0):
        a = g.clone()
        a.view(-1)[q] = wrong
        check = golden.check_output(a, fp, ALLCLOSE)
        assert compare.verdict(check.metrics, check.tolerance)[0]  # not a sample
        assert "first chunk 1 " in check.sums_error, wrong


@pytest.mark.parametrize("tol", [compare.rel_l2(1e-3), compare.cos_diff(1e-5),
                                 compare.all_of(compare.allclose(1e-3, 1e-3),
                                                compare.cos_diff(1e-5))],
                         ids=["rel_l2", "cos_diff", "allclose&cos_diff"])
def test_nan_golden_matched_by_nan_passes_global_tolerances(tol: compare.Tolerance) -> None:
    g, fp, _ = _nan_golden()
    assert compare.check(g.clone(), g, tol).passed  # what the live comparison says
    check = golden.check_output(g.clone(), fp, tol)
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    assert check.sums_error == ""


def test_finite_elements_beside_a_golden_infinity_are_still_checked() -> None:
    g = grid_golden()
    fp0 = golden.fingerprint(g, "inf")
    idx = unsampled(1, fp0)
    g.view(-1)[int(idx[0])] = -math.inf  # e.g. a masked score
    fp = golden.fingerprint(g, "inf")
    a = _apply(g.nan_to_num(neginf=0.0), idx[1:], 100.0)  # far outside, no sample touched
    a.view(-1)[int(idx[0])] = -math.inf
    check = golden.check_output(a, fp, ALLCLOSE)
    assert compare.verdict(check.metrics, check.tolerance)[0]  # the samples see nothing
    assert "first chunk 1 " in check.sums_error


def test_global_tolerance_over_ranks_is_not_failed_by_one_ranks_sums() -> None:
    tol = compare.rel_l2(1e-3)
    g0 = grid_golden(seed=10) / 64  # rank 0: small values, rank 1: large ones
    g1 = grid_golden(seed=11)
    total = float((g0.double() ** 2).sum() + (g1.double() ** 2).sum())
    a0 = _apply(g0, np.arange(NUMEL), float(_quantize(0.5e-3 * math.sqrt(total / NUMEL),
                                                      down=True)))
    merged = Metrics.merge([compare.measure(a0, g0, tol), compare.measure(g1, g1, tol)])
    assert merged.rel_l2 <= 0.5e-3 and compare.verdict(merged, tol)[0]  # the live check passes
    for a, g in ((a0, g0), (g1, g1)):
        fp = golden.fingerprint(g, "ranks")
        fp.total_sq = total  # what decode() sets from every rank's entries in the file
        assert golden.check_output(a, fp, tol).sums_error == ""


def test_same_bits() -> None:
    t = torch.tensor([0.0, 1.0, math.nan])
    neg = torch.tensor([-0.0, 1.0, math.nan])
    assert golden.same_bits(t, t.clone())
    assert not golden.same_bits(t, neg)
    assert not golden.same_bits(t, t.to(torch.float64))
    g = grid_golden()
    fp = golden.fingerprint(g, "k")
    assert golden.same_bits(fp, golden.fingerprint(g.clone(), "k"))
    assert not golden.same_bits(fp, golden.fingerprint(g, "other key"))
    assert not golden.same_bits(fp, g)


# ============================================================================ 4. store
KEY_CASE, KEY_W = "op[n=1]", 2


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    outs = {r: {"out": torch.full((3,), float(r)), "big": grid_golden(seed=r)} for r in (0, 1)}
    key = golden.entry_key(KEY_CASE, KEY_W)
    tensors, meta = golden.encode(outs, key)
    store = GoldenStore(tmp_path)
    store.write(key, "fam/op/n=1.safetensors", tensors, {"outputs": meta, "world_size": KEY_W})
    store.save_manifest()
    return tmp_path


def _manifest(root: Path) -> dict:
    return json.loads((root / golden.MANIFEST).read_text())


def _resave(root: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Rewrite the entry's file with ``change`` applied and record its new sha256: an edit, not
    corruption."""
    data = _manifest(root)
    entry = data["entries"][golden.entry_key(KEY_CASE, KEY_W)]
    path = root / entry["file"]
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / golden.MANIFEST).write_text(json.dumps(data))
    return path


def test_store_writes_manifest_and_loads_each_rank(store_dir: Path) -> None:
    entry = _manifest(store_dir)["entries"]["w2:op[n=1]"]
    path = store_dir / "fam/op/n=1.safetensors"
    assert entry["file"] == "fam/op/n=1.safetensors"
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    store = GoldenStore(store_dir)
    for rank in (0, 1):
        got_path, stored = store.load(KEY_CASE, KEY_W, rank)
        assert got_path == path
        assert raw(stored["out"]) == raw(torch.full((3,), float(rank)))
        assert isinstance(stored["big"], Fingerprint)
        assert stored["big"].sums.tolist() == np_chunk_sums(grid_values(seed=rank))[0]
    assert store.entry(KEY_CASE, 4) is None
    assert store.entry("op[n=2]", KEY_W) is None
    with pytest.raises(GoldenError, match=str(store_dir / golden.MANIFEST)):
        store.load("op[n=2]", KEY_W, 0)


def test_store_without_manifest_is_empty(tmp_path: Path) -> None:
    assert GoldenStore(tmp_path / "nothing").manifest["entries"] == {}


def test_missing_file_names_the_path(store_dir: Path) -> None:
    path = store_dir / "fam/op/n=1.safetensors"
    path.unlink()
    with pytest.raises(GoldenError, match="missing") as exc:
        GoldenStore(store_dir).load(KEY_CASE, KEY_W, 0)
    assert str(path) in str(exc.value)


def test_sha256_mismatch_names_the_path(store_dir: Path) -> None:
    path = store_dir / "fam/op/n=1.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(GoldenError, match="sha256") as exc:
        GoldenStore(store_dir).load(KEY_CASE, KEY_W, 1)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("text", [
    "{not json", '{"schema": 1}', '{"schema": 1, "entries": []}', '{"schema": 99, "entries": {}}',
    # entries edited by hand: a KeyError or TypeError in every rank before
    '{"schema": 1, "entries": {"w1:x": "oops"}}',
    '{"schema": 1, "entries": {"w1:x": {"file": "x.safetensors", "outputs": {}}}}'])
def test_unreadable_manifest_names_the_path(store_dir: Path, text: str) -> None:
    (store_dir / golden.MANIFEST).write_text(text)
    store = GoldenStore(store_dir)
    with pytest.raises(GoldenError) as exc:
        store.entry(KEY_CASE, KEY_W)
    assert str(store_dir / golden.MANIFEST) in str(exc.value)


def test_manifest_naming_a_tensor_the_file_lacks(store_dir: Path) -> None:
    path = _resave(store_dir, lambda t: t.pop("r1/big/sums"))
    store = GoldenStore(store_dir)
    store.load(KEY_CASE, KEY_W, 0)  # rank 0's outputs are all there
    with pytest.raises(GoldenError, match="r1/big/sums") as exc:
        store.load(KEY_CASE, KEY_W, 1)
    assert str(path) in str(exc.value)


def test_not_a_safetensors_file_names_the_path(store_dir: Path) -> None:
    data = _manifest(store_dir)
    path = store_dir / "fam/op/n=1.safetensors"
    path.write_bytes(b"\xff" * 64)
    data["entries"]["w2:op[n=1]"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (store_dir / golden.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(GoldenError, match="safetensors") as exc:
        GoldenStore(store_dir).load(KEY_CASE, KEY_W, 0)
    assert str(path) in str(exc.value)


# ============================================================================== 5. CLI
CASE_A = "allgather[dtype=bf16,inplace=false,mode=exact,n=7,tensors=1]"  # whole
CASE_B = "allgather[dtype=i32,inplace=false,mode=exact,n=65539,tensors=1]"  # fingerprint
CASE_C = "allgather[dtype=f16,inplace=true,mode=exact,n=1,tensors=1]"  # never generated


def harness(golden_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != golden.ENV_VAR}
    return subprocess.run(
        [sys.executable, "-m", "harness", "golden", *args, "--golden-dir", str(golden_dir)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def sha_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("golden") / "g"
    proc = harness(root, "generate", CASE_A, CASE_B, "--world-sizes", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 new, 0 unchanged, 0 changed, 0 refused" in proc.stdout
    return root


@pytest.fixture
def gdir(generated: Path, tmp_path: Path) -> Path:
    """A private copy of the generated goldens."""
    return Path(shutil.copytree(generated, tmp_path / "g"))


def test_generate_writes_files_and_manifest(generated: Path) -> None:
    entries = _manifest(generated)["entries"]
    assert set(entries) == {f"w1:{CASE_A}", f"w1:{CASE_B}"}
    files = {p.relative_to(generated).as_posix() for p in generated.rglob("*.safetensors")}
    assert files == {e["file"] for e in entries.values()}
    for key, e in entries.items():
        assert e["file"].startswith("collectives/allgather/")
        assert e["sha256"] == sha_of(generated / e["file"]), key
        assert (e["op"], e["family"], e["world_size"], e["tier"]) == (
            "allgather", "collectives", 1, "smoke")
        assert e["case_id"] == key.removeprefix("w1:")
        assert e["torch"] == torch.__version__ and e["date"]
    a, b = entries[f"w1:{CASE_A}"]["outputs"], entries[f"w1:{CASE_B}"]["outputs"]
    assert a == {"r0/out": {"kind": "whole", "dtype": "bfloat16", "shape": [7]}}
    assert b["r0/out"]["kind"] == "fingerprint" and b["r0/out"]["shape"] == [65539]
    stored = load_file(str(generated / entries[f"w1:{CASE_B}"]["file"]))
    assert stored["r0/out/sums"].numel() == math.ceil(65539 / CHUNK)


def test_second_generate_is_unchanged(gdir: Path) -> None:
    before = {p: p.read_bytes() for p in gdir.rglob("*.safetensors")}
    proc = harness(gdir, "generate", CASE_A, CASE_B, "--world-sizes", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 new, 2 unchanged, 0 changed, 0 refused" in proc.stdout
    assert {p: p.read_bytes() for p in gdir.rglob("*.safetensors")} == before


def test_edited_golden_mismatches_and_needs_accept(gdir: Path) -> None:
    key = f"w1:{CASE_A}"
    data = _manifest(gdir)
    entry = data["entries"][key]
    path = gdir / entry["file"]
    original = load_file(str(path))["r0/out"]
    tensors = load_file(str(path))
    tensors["r0/out"][3] = float(tensors["r0/out"][3]) * 2 + 1  # one value, exactly representable
    assert raw(tensors["r0/out"]) != raw(original)
    save_file(tensors, str(path), metadata={"entry": key})
    entry["sha256"] = edited_sha = sha_of(path)
    (gdir / golden.MANIFEST).write_text(json.dumps(data))

    # CASE_C has no golden at all: MISSING (one call for both, a subprocess costs seconds)
    proc = harness(gdir, "verify", CASE_A, CASE_B, CASE_C, "--world-sizes", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"MISMATCH {key}" in proc.stdout
    assert "r0/out: 1/7 elements not bitwise equal" in proc.stdout
    assert f"MISSING w1:{CASE_C}" in proc.stdout
    assert "1 ok, 0 drift, 1 mismatch, 1 missing, 0 corrupt of 3 goldens" in proc.stdout

    proc = harness(gdir, "generate", CASE_A, "--world-sizes", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"DIFFERS {key}" in proc.stdout
    assert sha_of(path) == edited_sha == _manifest(gdir)["entries"][key]["sha256"]  # kept

    proc = harness(gdir, "generate", CASE_A, "--world-sizes", "1", "--accept")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"CHANGED {key}" in proc.stdout
    assert raw(load_file(str(path))["r0/out"]) == raw(original)
    assert _manifest(gdir)["entries"][key]["sha256"] == sha_of(path) != edited_sha

    proc = harness(gdir, "verify", CASE_A, CASE_B, "--world-sizes", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ok, 0 drift, 0 mismatch, 0 missing, 0 corrupt" in proc.stdout


def test_verify_fails_on_a_case_without_golden_alone(generated: Path) -> None:
    proc = harness(generated, "verify", CASE_C, "--world-sizes", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"MISSING w1:{CASE_C}" in proc.stdout
    assert "0 ok, 0 drift, 0 mismatch, 1 missing, 0 corrupt of 1 goldens" in proc.stdout


def test_show_json_lists_the_entries(generated: Path) -> None:
    proc = harness(generated, "show", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _manifest(generated)["entries"]
    # a selector that matches no stored golden (a typo) is one line and exit 2, not an
    # empty listing
    proc = harness(generated, "show", "--json", "nosuch*")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "no stored golden matches 'nosuch*'" in proc.stderr, proc.stderr


def test_broken_manifest_is_a_one_line_usage_error(gdir: Path) -> None:
    (gdir / golden.MANIFEST).write_text("{broken")
    proc = harness(gdir, "verify", CASE_A, "--world-sizes", "1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(gdir / golden.MANIFEST) in lines[0]


# ================================================================ 6. committed goldens
@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((COMMITTED / golden.MANIFEST).read_text())["entries"]


def test_committed_goldens_are_small() -> None:
    total = sum(p.stat().st_size for p in COMMITTED.rglob("*") if p.is_file())
    assert total < 20 * 2**20, f"suites/golden holds {total / 2**20:.1f} MiB"


def test_committed_files_match_the_manifest(committed: dict) -> None:
    for key, e in committed.items():
        path = COMMITTED / e["file"]
        assert path.is_file(), f"{key}: {path} is missing"
        assert sha_of(path) == e["sha256"], f"{key}: {path} does not match its sha256"
        assert key == golden.entry_key(e["case_id"], e["world_size"])
    named = {e["file"] for e in committed.values()}
    stray = {p.relative_to(COMMITTED).as_posix() for p in COMMITTED.rglob("*.safetensors")}
    assert stray <= named, f"files no manifest entry names: {sorted(stray - named)[:5]}"


def test_every_smoke_case_has_a_golden(committed: dict) -> None:
    from harness.core.discovery import registry

    cases = {golden.entry_key(c.id, w) for spec in registry().specs.values()
             for w in (1, 4, 8) for c in spec.cases("smoke", w)}
    missing = sorted(cases - set(committed))
    assert not missing, (f"{len(missing)} smoke cases have no golden (run `harness golden "
                         f"generate`), e.g. {missing[:5]}")
    orphans = sorted(k for k, e in committed.items()
                     if e.get("tier", "smoke") == "smoke" and k not in cases)
    assert not orphans, f"goldens of cases that no longer exist: {orphans[:5]}"


@pytest.mark.parametrize("world_size", [1, 4])
def test_committed_allgather_goldens_are_what_the_reference_makes(committed: dict,
                                                                 world_size: int) -> None:
    from harness.core.discovery import registry
    from harness.engine.case_setup import expected_outputs

    spec = registry().specs["allgather"]
    store = GoldenStore(COMMITTED)
    for case in spec.cases("smoke", world_size):
        for rank in range(world_size):
            _, stored = store.load(case.id, world_size, rank)
            expected = expected_outputs(case, rank)
            assert set(stored) == set(expected)
            for name, want in expected.items():
                got = stored[name]
                if isinstance(got, torch.Tensor):
                    assert raw(got) == raw(want), (case.id, rank, name)
                    continue
                flat = want.reshape(-1)
                assert raw(got.values) == raw(flat[got.positions]), (case.id, rank, name)
                assert got.sums.tolist() == pytest.approx(
                    np_chunk_sums(flat.to(torch.float64).numpy())[0], rel=1e-12, abs=1e-9)


def test_a_run_with_cases_lacking_a_golden_says_so(capsys):
    from harness.cli.show import print_results
    from harness.core.results import CaseResult

    def result(golden: dict | None, case: str, w: int = 1) -> CaseResult:
        return CaseResult("r", case, "toy", "toy", "torch", w, {}, "pass", golden=golden)

    print_results([result({"status": "absent"}, "toy[a]"),
                   result({"status": "absent"}, "toy[a]", 4),
                   result({"status": "pass"}, "toy[b]"), result(None, "toy[c]")])
    out = capsys.readouterr().out
    assert "note: 2 case(s) have no stored golden" in out and "w1 toy[a]" in out
    assert "harness golden generate" in out
    print_results([result({"status": "pass"}, "toy[b]"), result(None, "toy[c]")])
    assert "no stored golden" not in capsys.readouterr().out


def test_a_magnitude_widens_the_fingerprint_check_elementwise_and_in_the_sums() -> None:
    """An allclose magnitude_rtol allows each element magnitude_rtol times its magnitude more,
    at the samples and in the chunk sums; without the magnitude the same output fails."""
    g = grid_golden()
    fp = golden.fingerprint(g, "magnitude")
    magnitude = torch.full_like(g, 1000.0, dtype=torch.float32)
    tol = compare.allclose(rtol=0.0, atol=1e-6, magnitude_rtol=1e-3)
    a = g.to(torch.float64) + 0.9  # 0.9 < 1e-6 + 1e-3 * 1000 everywhere
    check = golden.check_output(a.to(g.dtype), fp, tol, magnitude=magnitude)
    assert check.sums_error == ""
    assert compare.verdict(check.metrics, check.tolerance) == (True, "")
    plain = golden.check_output(a.to(g.dtype), fp, tol)
    assert not compare.verdict(plain.metrics, plain.tolerance)[0]
    assert plain.sums_error.startswith(f"{N_CHUNKS}/{N_CHUNKS} chunk sums outside")
    beyond = golden.check_output((g.to(torch.float64) + 1.1).to(g.dtype), fp, tol,
                                 magnitude=magnitude)
    assert not compare.verdict(beyond.metrics, beyond.tolerance)[0]
    assert tol.describe() == "allclose(rtol=0, atol=1e-06, magnitude_rtol=0.001)"
    assert compare.Tolerance.from_dict(tol.to_dict()) == tol


def test_a_magnitude_widens_a_fingerprint_against_a_fingerprint_too() -> None:
    """``golden verify`` and ``generate`` compare a re-derived fingerprint with the stored one:
    the same magnitude_rtol holds there as against an implementation's output."""
    g = grid_golden()
    magnitude = torch.full_like(g, 1000.0, dtype=torch.float32)
    tol = compare.allclose(rtol=0.0, atol=1e-6, magnitude_rtol=1e-3)
    old = golden.fingerprint(g, "magnitude")
    near = golden.fingerprint((g.to(torch.float64) + 0.9).to(g.dtype), "magnitude")
    far = golden.fingerprint((g.to(torch.float64) + 1.1).to(g.dtype), "magnitude")
    check = golden.check_fingerprint(near, old, tol, magnitude)
    assert check.sums_error == "" and compare.verdict(check.metrics, check.tolerance)[0]
    plain = golden.check_fingerprint(near, old, tol)
    assert not compare.verdict(plain.metrics, plain.tolerance)[0] and plain.sums_error
    beyond = golden.check_fingerprint(far, old, tol, magnitude)
    assert not compare.verdict(beyond.metrics, beyond.tolerance)[0]


def test_a_golden_made_on_another_cpu_verifies_within_the_ops_magnitude_tolerance(
        tmp_path: Path) -> None:
    """An FP8 GEMM's float32 reference sums in the order the CPU's BLAS kernel picks (AVX2,
    AVX-512, AMX differ): its tolerance allows a share of each element's magnitude. A golden
    off by half that is drift, not a mismatch (``golden verify`` once compared without the
    magnitudes, and every committed f32 FP8 golden failed on a CPU with AMX); off by twice
    that, a mismatch."""
    from harness.cli.golden import derive, differences
    from harness.core.discovery import registry
    from harness.engine.case_setup import tolerances

    case = registry().plan("smoke", 1, [
        "fp8_gemm.per_tensor[dist=wide,fmt=e4m3,k=256,m=32,n=64,out=f32]"], [])[0].case
    new = derive(case, "smoke")
    out, magnitude = new.outputs[0]["out"], new.magnitudes[0]["out"]
    tol = tolerances(case, new.outputs[0])["out"]
    assert tol.magnitude_rtol > 0 and out.dtype == torch.float32

    def stored_off_by(share: float) -> str:
        store = GoldenStore(tmp_path / f"g{share}")
        other = (out.double() + share * tol.magnitude_rtol * magnitude.double()).float()
        store.write(new.key, new.rel, {**new.tensors, "r0/out": other}, new.entry)
        store.save_manifest()
        return differences(store, case, new).verdict

    assert stored_off_by(0.5) == "drift"
    assert stored_off_by(2.0) == "mismatch"
    # without the magnitudes half the allowance is far past rtol alone: the check matters
    off = (out.double() + 0.5 * tol.magnitude_rtol * magnitude.double()).float()
    plain = golden.check_output(out, off, tol)
    assert not compare.verdict(plain.metrics, plain.tolerance)[0]


_SUITE = '''
import torch
from harness.api import OpSpec, case_tensor


def seeded(params, rank, world_size):
    return {"x": case_tensor("mine.scaled", params, "x", (params["n"],), torch.float32)}


def unseeded(params, rank, world_size):
    return {"x": torch.rand(params["n"])}


def raising(params, rank, world_size):
    if params["n"] == 9:
        raise ValueError("nine does not split")
    return seeded(params, rank, world_size)


def spec(name, make_inputs):
    return OpSpec(name=name, family="mine", reference=lambda x: x * 3, make_inputs=make_inputs,
                  grid={"smoke": [{"n": 8}, {"n": 9}]},
                  implementations={"torch": lambda x: x + x + x})


SPECS = [spec("mine.scaled", seeded), spec("mine.unseeded", unseeded),
         spec("mine.raising", raising)]
'''


def test_generate_refuses_inputs_that_change_from_one_derivation_to_the_next(tmp_path):
    """An unseeded make_inputs would store goldens every later run fails against, blaming the
    implementation; one line names the case and the cause, and nothing of it is stored."""
    suite = tmp_path / "mine.py"
    suite.write_text(_SUITE)
    gdir = tmp_path / "goldens"
    proc = harness(gdir, "generate", "--suite", str(suite), "mine.unseeded",
                   "--world-sizes", "1")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "mine.unseeded[n=8] at world size 1: two derivations of its golden differ" in \
        proc.stderr and "not deterministic" in proc.stderr
    assert not list(gdir.rglob("*.safetensors"))
    proc = harness(gdir, "generate", "--suite", str(suite), "mine.scaled", "--world-sizes", "1")
    assert proc.returncode == 0 and "2 new" in proc.stdout, proc.stderr[-2000:]
    # a case whose make_inputs raises: one line naming it, exit 2
    proc = harness(gdir, "generate", "--suite", str(suite), "mine.raising", "--world-sizes", "1")
    assert proc.returncode == 2 and "mine.raising[n=9] at world size 1: its reference or " \
        "make_inputs raised ValueError: nine does not split" in proc.stderr, proc.stderr[-2000:]


def test_goldens_a_grid_change_left_behind_are_named_and_pruned(tmp_path):
    """A case dropped from an op's grid leaves its golden: `verify` of the op (a case of it
    selected, too) names it, `--prune` deletes its entry and file and nothing else."""
    suite = tmp_path / "mine.py"
    suite.write_text(_SUITE)
    gdir = tmp_path / "goldens"
    proc = harness(gdir, "generate", "--suite", str(suite), "mine.scaled", "--world-sizes", "1")
    assert proc.returncode == 0 and "2 new" in proc.stdout, proc.stderr[-2000:]
    suite.write_text(_SUITE.replace('[{"n": 8}, {"n": 9}]', '[{"n": 8}, {"n": 10}]'))
    files = {p.name for p in gdir.rglob("*.safetensors")}
    proc = harness(gdir, "verify", "--suite", str(suite), "mine.scaled[n=8]",
                   "--world-sizes", "1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "orphan w1:mine.scaled[n=9]: no such case any more" in proc.stdout
    assert "1 ok" in proc.stdout and "1 orphan" in proc.stdout
    assert {p.name for p in gdir.rglob("*.safetensors")} == files  # only named
    proc = harness(gdir, "verify", "--suite", str(suite), "mine.scaled", "--world-sizes", "1",
                   "--prune")
    assert proc.returncode == 1 and "MISSING w1:mine.scaled[n=10]" in proc.stdout  # the new one
    assert "orphan w1:mine.scaled[n=9]: no such case any more; deleted" in proc.stdout
    left = json.loads((gdir / golden.MANIFEST).read_text())["entries"]
    assert list(left) == ["w1:mine.scaled[n=8]"]
    assert {p.name for p in gdir.rglob("*.safetensors")} == {Path(left[
        "w1:mine.scaled[n=8]"]["file"]).name}
    proc = harness(gdir, "verify", "--suite", str(suite), "mine.scaled[n=8]",
                   "--world-sizes", "1")
    assert proc.returncode == 0 and "orphan" not in proc.stdout, proc.stdout[-2000:]


def test_goldens_of_an_op_no_loaded_suite_has_are_named_and_kept_in_a_shared_dir(tmp_path):
    """An op renamed: with nothing selected its goldens are orphans; in a shared --golden-dir
    (which may hold a suite not loaded now) --prune keeps them and says so."""
    suite = tmp_path / "mine.py"
    suite.write_text(_SUITE)
    gdir = tmp_path / "goldens"
    proc = harness(gdir, "generate", "--suite", str(suite), "mine.scaled", "--world-sizes", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    suite.write_text(_SUITE.replace('spec("mine.scaled"', 'spec("mine.rescaled"'))
    proc = harness(gdir, "verify", "--suite", str(suite), "--world-sizes", "1", "--prune")
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("orphan")]
    assert said == [f"orphan w1:mine.scaled[n={n}]: no loaded suite has op 'mine.scaled'; "
                    "kept: a shared --golden-dir; pass the --suite that has it, or delete it"
                    for n in (8, 9)], proc.stdout[-3000:]
    assert len(json.loads((gdir / golden.MANIFEST).read_text())["entries"]) == 2
