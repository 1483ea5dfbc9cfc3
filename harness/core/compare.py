"""Comparison of an implementation's output with the expected one.

Metrics (DESIGN.md): max_abs, max_rel, rel_l2 = ||a-e|| / ||e||, cos_diff =
1 - 2<a,e> / (|a|^2 + |e|^2) (DeepGEMM's calc_diff), mismatch count and fraction, n_nan, n_inf,
first_bad_index. They are computed on the tensors' device, in float64, a chunk at a time (no
full host copy), as partial sums so that the metrics of every rank merge into one
(``harness.core.metrics.Metrics``).

Tolerance kinds: ``exact`` (bitwise, a NaN's sign and payload too unless ``any_nan``),
``allclose`` (|a-e| <= atol + rtol*|e|, plus ``magnitude_rtol`` times a per-element magnitude
the op gives beside its reference, exact where that magnitude is 0, with an optional mismatch
budget), ``ulp`` (at most n units
in the last place of the output dtype), ``cos_diff`` and ``rel_l2`` (global bounds),
``cos_diff_per_row`` (the worst row's own calc_diff: a fault confined to one token),
``rounding`` (the precision lens: against the op's float64 value before its one rounding, how
many elements are not that value correctly rounded, or, for float32 outputs, carry no more
bits than bf16 or fp16), ``rounded_near`` (bitwise that value rounded once, or the rounding of
a value within a relative distance of it: a quantizer's float32 quotient), and ``all_of``
combinations. NaN never passes unless the expected
value has NaN in the same place; an infinity passes only against the same infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.metrics import Metrics

CHUNK_ELEMS = 1 << 22

ELEMENTWISE_KINDS = ("exact", "allclose", "ulp", "rounding", "rounded_near")
GLOBAL_KINDS = ("cos_diff", "rel_l2", "cos_diff_per_row")


@dataclass(frozen=True)
class Tolerance:
    """How close an output must be. Build with the constructors below, not directly."""

    kind: str
    rtol: float = 0.0
    atol: float = 0.0
    ulps: int = 0
    bound: float = 0.0
    max_mismatch_frac: float = 0.0
    parts: tuple[Tolerance, ...] = ()
    #: allclose: plus this times the output's per-element magnitude (``OpSpec.magnitude``:
    #: for a GEMM, sum_k |a_ik| |b_jk|, the scale of a dot product's rounding error)
    magnitude_rtol: float = 0.0
    #: exact: any NaN matches any NaN (NaNs an op computes, whose bits differ by device);
    #: otherwise a NaN must carry the expected one's sign and payload, as a copy does
    any_nan: bool = False

    def __post_init__(self) -> None:
        kinds = ELEMENTWISE_KINDS + GLOBAL_KINDS + ("all_of",)
        if self.kind not in kinds:
            raise ValueError(f"unknown tolerance kind {self.kind!r}; use one of {kinds}")
        for name in ("rtol", "atol", "ulps", "bound", "max_mismatch_frac", "magnitude_rtol"):
            value = getattr(self, name)
            # a negative bound passes nothing but exact values, which looks like a pass
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not value >= 0:
                raise ValueError(f"{self.kind}: {name}={value!r}; a tolerance's bounds are "
                                 "numbers >= 0")
        if self.max_mismatch_frac > 1:
            raise ValueError(f"{self.kind}: max_mismatch_frac={self.max_mismatch_frac!r} is a "
                             "share of the elements, at most 1")
        if self.kind == "all_of":
            elementwise = [p for p in self.parts if p.kind in ELEMENTWISE_KINDS]
            if len(elementwise) > 1:
                raise ValueError("all_of takes at most one elementwise part (exact/allclose/ulp)")

    @property
    def elementwise(self) -> Tolerance | None:
        """The part that decides per element what counts as wrong (None: only global)."""
        if self.kind in ELEMENTWISE_KINDS:
            return self
        if self.kind == "all_of":
            return next((p for p in self.parts if p.kind in ELEMENTWISE_KINDS), None)
        return None

    def describe(self) -> str:
        """Short text for tables and reports, e.g. ``allclose(rtol=0.016, atol=1e-05)``."""
        if self.kind == "exact":
            return "exact(any NaN)" if self.any_nan else "exact"
        if self.kind == "allclose":
            frac = self.max_mismatch_frac
            extra = f", max_mismatch_frac={frac:g}" if frac else ""
            if self.magnitude_rtol:
                extra = f", magnitude_rtol={self.magnitude_rtol:g}" + extra
            return f"allclose(rtol={self.rtol:g}, atol={self.atol:g}{extra})"
        if self.kind == "ulp":
            return f"ulp({self.ulps})"
        if self.kind == "rounding":
            ulps = f", ulps<={self.ulps}" if self.ulps else ""
            return f"rounding(off<={self.max_mismatch_frac:g}{ulps})"
        if self.kind == "rounded_near":
            return f"rounded_near(rel={self.rtol:g})"
        if self.kind in GLOBAL_KINDS:
            return f"{self.kind}<={self.bound:g}"
        return " & ".join(p.describe() for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored with each result."""
        d: dict[str, Any] = {"kind": self.kind, "text": self.describe()}
        if self.kind == "exact" and self.any_nan:
            d["any_nan"] = True
        elif self.kind == "allclose":
            d.update(rtol=self.rtol, atol=self.atol, max_mismatch_frac=self.max_mismatch_frac)
            if self.magnitude_rtol:
                d["magnitude_rtol"] = self.magnitude_rtol
        elif self.kind == "ulp":
            d["ulps"] = self.ulps
        elif self.kind == "rounding":
            d.update(ulps=self.ulps, max_mismatch_frac=self.max_mismatch_frac)
        elif self.kind == "rounded_near":
            d["rtol"] = self.rtol
        elif self.kind in GLOBAL_KINDS:
            d["bound"] = self.bound
        elif self.kind == "all_of":
            d["parts"] = [p.to_dict() for p in self.parts]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tolerance:
        """Inverse of ``to_dict``."""
        return cls(d["kind"], rtol=d.get("rtol", 0.0), atol=d.get("atol", 0.0),
                   ulps=d.get("ulps", 0), bound=d.get("bound", 0.0),
                   max_mismatch_frac=d.get("max_mismatch_frac", 0.0),
                   parts=tuple(cls.from_dict(p) for p in d.get("parts", ())),
                   magnitude_rtol=d.get("magnitude_rtol", 0.0), any_nan=d.get("any_nan", False))


def exact(any_nan: bool = False) -> Tolerance:
    """Bitwise equality, a NaN's sign and payload included (data movement, integers).
    ``any_nan``: any NaN matches any NaN, for outputs whose NaNs are computed (a sum with a
    NaN in it, a quantized NaN), whose bits IEEE leaves to the device."""
    return Tolerance("exact", any_nan=any_nan)


def allclose(rtol: float, atol: float, max_mismatch_frac: float = 0.0,
             magnitude_rtol: float = 0.0) -> Tolerance:
    """|a-e| <= atol + rtol*|e| (+ magnitude_rtol * the element's magnitude, where the op
    gives one) for all but ``max_mismatch_frac`` of the elements. Where the op's magnitude
    is exactly 0 (every term of the element's sum has a zero factor: a padding token's row),
    any order of any arithmetic gives exactly the expected value, so nothing is allowed:
    an epilogue that makes 2**-125 of a zero (a scale applied by an exponent add) fails."""
    return Tolerance("allclose", rtol=rtol, atol=atol, max_mismatch_frac=max_mismatch_frac,
                     magnitude_rtol=magnitude_rtol)


def ulp(n: int) -> Tolerance:
    """At most ``n`` units in the last place of the output dtype (nccl-tests: 2 for float AVG)."""
    return Tolerance("ulp", ulps=n)


def rounding(off: float, ulps: int = 0) -> Tolerance:
    """The precision lens, for an output the op's semantics round once: compared with the
    float64 value before that rounding (``OpSpec.exact``), at most a fraction ``off`` of the
    elements may differ from that value correctly rounded to the output's dtype (a kernel that
    only sums in another float32 order moves few; one that rounds twice, a bf16 GEMM result
    rounded before the residual add, moves a quarter). A float32 output may hold at most
    ``off`` elements that fit in bf16 or fp16 where the correctly rounded value does not (an
    output computed through a 16-bit type). ``ulps``, when nonzero, also bounds every 16-bit
    element's distance from the float64 value; leave it 0 for reductions: where a long dot
    product nearly cancels, a correct float32 sum lands many ulps of the small result away
    (benchmarks/precision_lens.py: 20 at K = 4096)."""
    return Tolerance("rounding", ulps=ulps, max_mismatch_frac=off)


def rounded_near(rel: float) -> Tolerance:
    """Against the float64 value before the output's one rounding (``OpSpec.exact``): each
    element bitwise the value rounded to the output's dtype (to nearest, ties to even), or,
    where a value within ``rel`` of it rounds otherwise, that rounding. For a quantizer, whose
    float32 arithmetic may compute x / s or x * (fmax / amax) (DeepGEMM's), each off the
    float64 quotient by an ulp or two: near a rounding boundary the two give neighbouring
    codes; everywhere else both must be the one code (the sign of a zero included)."""
    return Tolerance("rounded_near", rtol=rel)


def correctly_rounded(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``e`` rounded once to ``dtype``, to nearest, ties to even. torch's own cast to
    bf16 or fp16 goes through float32 and rounds twice (1 + 2**-8 + 2**-30 becomes 1.0, not
    1 + 2**-7); this corrects the one step that can cost."""
    r = e.to(dtype)
    if dtype.itemsize >= 4 or not dtype.is_floating_point:
        return r  # float64 -> float32 rounds once
    r64 = r.to(torch.float64)
    d = e - r64  # exact: the two are within a factor of two
    q64 = r64 + torch.sign(d) * _ulp_size(e, dtype)
    q = q64.to(dtype)  # on the grid: exact
    dq, dr = (e - q64).abs(), d.abs()
    odd = (_int_view(r) & 1).bool()
    take = torch.isfinite(e) & torch.isfinite(q64) & ((dq < dr) | ((dq == dr) & odd))
    return torch.where(take, q, r)


def _narrow(t: torch.Tensor) -> torch.Tensor:
    """Where a float32 value fits in bf16 or fp16 (finite, nonzero)."""
    f = t.to(torch.float32)
    fits = ((f.to(torch.bfloat16).to(torch.float32) == f)
            | (f.to(torch.float16).to(torch.float32) == f))
    return fits & torch.isfinite(f) & (f != 0)


def cos_diff(bound: float) -> Tolerance:
    """DeepGEMM's calc_diff <= bound (a global metric for long reductions)."""
    return Tolerance("cos_diff", bound=bound)


def cos_diff_per_row(bound: float) -> Tolerance:
    """Every row's own calc_diff <= bound, a row being the last dim (a token's output). A
    fault confined to a few rows (a token that lost one expert's share) moves a global
    calc_diff by their share of the tensor only, and stays inside an elementwise mismatch
    budget; a row's own calc_diff moves by the whole fault."""
    return Tolerance("cos_diff_per_row", bound=bound)


def rel_l2(bound: float) -> Tolerance:
    """||a-e|| / ||e|| <= bound."""
    return Tolerance("rel_l2", bound=bound)


def all_of(*parts: Tolerance) -> Tolerance:
    """Every part must hold."""
    return Tolerance("all_of", parts=tuple(parts))


#: SEMANTICS.md's default allclose tolerances per dtype (torch.testing, TransformerEngine).
DEFAULT_RTOL_ATOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float8_e4m3fn: (0.125, 0.0675),
    torch.float8_e5m2: (0.25, 0.125),
}


def default_for(dtype: torch.dtype) -> Tolerance:
    """The default tolerance of an output dtype: allclose for floats, exact otherwise."""
    if dtype in DEFAULT_RTOL_ATOL:
        return allclose(*DEFAULT_RTOL_ATOL[dtype])
    return exact()


def _ulp_size(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at the magnitude of each expected value (float64)."""
    info = torch.finfo(dtype)
    mag = e.abs().clamp_min(info.tiny)
    _, exp = torch.frexp(mag)  # mag = m * 2**exp with m in [0.5, 1): exact, unlike log2
    exponent = (exp - 1).to(torch.float64)
    # nmant + 1 significant bits; below the normal range the spacing is constant
    spacing = torch.exp2(exponent - (info.bits - _exponent_bits(dtype) - 1))
    return spacing.clamp_min(info.tiny * info.eps)


def _exponent_bits(dtype: torch.dtype) -> int:
    return {
        torch.float64: 11,
        torch.float32: 8,
        torch.float16: 5,
        torch.bfloat16: 8,
        torch.float8_e4m3fn: 4,
        torch.float8_e5m2: 5,
    }[dtype]


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The bits of a tensor as integers (for bitwise equality)."""
    if not t.dtype.is_floating_point:
        return t
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


def measure(
    actual: torch.Tensor,
    expected: torch.Tensor,
    tolerance: Tolerance,
    *,
    rank: int = 0,
    chunk_elems: int = CHUNK_ELEMS,
    memo: dict[Any, tuple[int, int, float]] | None = None,
    dtype: torch.dtype | None = None,
    magnitude: torch.Tensor | None = None,
) -> Metrics:
    """Metrics of ``actual`` against ``expected`` on ``actual``'s device, chunk by chunk.

    ``expected`` may have a wider dtype (a float64 reference) than ``actual``; for ``exact`` it
    is cast to ``actual``'s dtype first, so "bitwise" means "the reference, rounded once".
    ``memo``: a dict kept by the caller for as long as ``expected`` stays unchanged (the
    runner keeps one per case and output): what a chunk bitwise equal to the reference adds
    depends on the reference alone, so later measures against it reuse it. ``dtype``: the
    dtype the output must have (a kernel that returns bf16 scales where the op gives float32
    fails, even when every value survives the cast). ``magnitude``: each element's magnitude
    (``expected``'s shape) for an allclose tolerance's ``magnitude_rtol``.
    """
    m = Metrics()
    if not isinstance(actual, torch.Tensor):
        m.shape_error = f"output is a {type(actual).__name__}, not a tensor"
        return m
    m.shape = list(actual.shape)
    if tuple(actual.shape) != tuple(expected.shape):
        m.shape_error = f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        m.numel = max(expected.numel(), 1)
        m.n_mismatch = m.numel
        return m
    if dtype is not None and actual.dtype != dtype:
        m.shape_error = f"dtype {_dtype_name(actual.dtype)} != expected {_dtype_name(dtype)}"
        m.numel = m.n_mismatch = max(actual.numel(), 1)
        return m
    elem = tolerance.elementwise
    a_flat = actual.reshape(-1)
    e_flat = expected.to(actual.device).reshape(-1)
    if elem is not None and elem.kind == "exact" and e_flat.dtype != a_flat.dtype:
        e_flat = e_flat.to(a_flat.dtype)
    g_flat = None
    if magnitude is not None and elem is not None and elem.magnitude_rtol:
        g_flat = magnitude.to(actual.device).reshape(-1)
    n = a_flat.numel()
    m.numel = n
    row = _row_length(actual) if _has_kind(tolerance, "cos_diff_per_row") else 0
    if row:
        chunk_elems = row * max(1, chunk_elems // row)  # whole rows: each row in one chunk
    for start in range(0, n, chunk_elems):
        a_raw, e_raw = a_flat[start : start + chunk_elems], e_flat[start : start + chunk_elems]
        if a_raw.dtype == e_raw.dtype and torch.equal(_int_view(a_raw), _int_view(e_raw)):
            key = (start, a_raw.numel(), e_raw.dtype, str(e_raw.device))
            sums = memo.get(key) if memo is not None else None
            if sums is None:
                sums = _identical_sums(e_raw)
                if memo is not None:
                    memo[key] = sums
            n_nan, n_inf, sq = sums
            m.n_nan += n_nan
            m.n_inf += n_inf
            m.sum_sq_expected += sq  # sum_sq_diff gains nothing
            m.sum_sq_actual += sq
            m.sum_dot += sq
            continue
        g_raw = None if g_flat is None else g_flat[start : start + chunk_elems]
        # (a chunk bitwise equal to the reference, skipped above, has rows of calc_diff 0)
        _measure_chunk(m, a_raw, e_raw, elem, actual.dtype, start, rank, g_raw, row)
    return m


def _has_kind(tolerance: Tolerance, kind: str) -> bool:
    return tolerance.kind == kind or any(_has_kind(p, kind) for p in tolerance.parts)


def _row_length(t: torch.Tensor) -> int:
    return max(t.shape[-1], 1) if t.dim() else 1


def _row_cos_diff(m: Metrics, af: torch.Tensor, ef: torch.Tensor, row: int,
                  first_row: int, rank: int) -> None:
    """The chunk's rows' own calc_diff (whole rows), over their finite elements (``af``,
    ``ef``: float64, non-finite ones zeroed; a NaN or a wrong infinity fails apart); the
    worst one kept."""
    a, e = af.view(-1, row), ef.view(-1, row)
    denom = (a * a).sum(1) + (e * e).sum(1)
    dot = (a * e).sum(1)
    cd = torch.where(denom > 0, 1 - 2 * dot / torch.where(denom > 0, denom, 1.0), 0.0)
    if not cd.numel():
        return
    worst = int(cd.argmax())
    if m.worst_row is None or float(cd[worst]) > m.max_row_cos_diff:
        m.max_row_cos_diff = float(cd[worst])
        m.worst_row, m.worst_row_rank = first_row + worst, rank


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _measure_chunk(
    m: Metrics,
    a_raw: torch.Tensor,
    e_raw: torch.Tensor,
    elem: Tolerance | None,
    out_dtype: torch.dtype,
    offset: int,
    rank: int,
    g_raw: torch.Tensor | None = None,
    row: int = 0,
) -> None:
    a = a_raw.to(torch.float64)
    e = e_raw.to(torch.float64)
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    a_inf = torch.isinf(a)
    m.n_nan += int(a_nan.sum())
    m.n_inf += int(a_inf.sum())
    # NaN matches only NaN; an infinity only the same infinity
    same_special = (a_nan & e_nan) | (torch.isinf(e) & (a == e))
    special = a_nan | e_nan | a_inf | torch.isinf(e)
    bad_special = special & ~same_special
    m.n_bad_special += int(bad_special.sum())
    finite = ~special
    diff = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    diff = torch.where(bad_special, torch.full_like(a, math.inf), diff)
    # against an expected 0 any difference is infinitely relative (not |a| / tiny = 1e308)
    rel = torch.where(e == 0, torch.where(diff > 0, math.inf, 0.0), diff / e.abs())
    rel = torch.where(finite, rel, diff)  # non-finite positions: 0 if they match, else inf
    rel = torch.where(finite & (diff == 0), torch.zeros_like(rel), rel)
    if diff.numel():
        m.max_abs = max(m.max_abs, float(diff.max()))
        m.max_rel = max(m.max_rel, float(rel.max()))
    af, ef = _add_sums(m, a, e, finite, bad_special)
    if row:  # a per-row tolerance: rows of ``row`` elements, whole in the chunk
        _row_cos_diff(m, af, ef, row, offset // row, rank)
    if elem is None:
        bad = bad_special
    elif elem.kind == "exact":
        bad = _int_view(a_raw) != _int_view(e_raw)
        if elem.any_nan:
            bad = bad & ~(a_nan & e_nan)
    else:
        bad = bad_special | (finite & _out_of_bounds(m, elem, a_raw, e_raw, e, diff, finite,
                                                     bad_special, out_dtype, g_raw))
    _count_bad(m, bad, a, e, offset, rank)


def _add_sums(m: Metrics, a: torch.Tensor, e: torch.Tensor, finite: torch.Tensor,
              bad_special: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's sums of squares and products (rel_l2, cos_diff), over its finite values;
    the values with the non-finite ones zeroed (for per-row sums)."""
    af = torch.where(finite, a, torch.zeros_like(a))
    ef = torch.where(finite, e, torch.zeros_like(e))
    if bool(bad_special.any()):
        m.sum_sq_diff = math.inf
    m.sum_sq_diff += float(((af - ef) ** 2).sum())
    m.sum_sq_expected += float((ef * ef).sum())
    m.sum_sq_actual += float((af * af).sum())
    m.sum_dot += float((af * ef).sum())
    return af, ef


def _out_of_bounds(m: Metrics, elem: Tolerance, a_raw: torch.Tensor, e_raw: torch.Tensor,
                   e: torch.Tensor, diff: torch.Tensor, finite: torch.Tensor,
                   bad_special: torch.Tensor, out_dtype: torch.dtype,
                   g_raw: torch.Tensor | None) -> torch.Tensor:
    """The finite elements outside an allclose, rounding or ulp tolerance (the caller keeps the
    finite ones), with the tolerance's own metric (max_tol_ratio, max_ulp) recorded."""
    if elem.kind == "allclose":
        allowed = elem.atol + elem.rtol * e.abs()
        if g_raw is not None:
            g = g_raw.to(torch.float64).abs()
            allowed = torch.where(g > 0, allowed + elem.magnitude_rtol * g, 0.0)
        if diff.numel():
            share = torch.where(finite & (diff > 0), diff / allowed, torch.zeros_like(diff))
            m.max_tol_ratio = max(m.max_tol_ratio, float(share.max()))
        return diff > allowed
    if elem.kind == "rounded_near":
        e64, bits = e_raw.to(torch.float64), _int_view(a_raw)
        below = correctly_rounded(e64 * (1 - elem.rtol), out_dtype)
        above = correctly_rounded(e64 * (1 + elem.rtol), out_dtype)
        return (bits != _int_view(below)) & (bits != _int_view(above))
    if elem.kind == "rounding":
        if out_dtype.itemsize <= 2:
            # "none beyond": for 16-bit outputs only, where a float32 sum's error is far below
            # the output's ulp (a float32 output's ulps grow with K and cancellation)
            ulps = torch.where(finite, diff / _ulp_size(e, out_dtype), torch.zeros_like(diff))
            if ulps.numel():
                m.max_ulp = max(m.max_ulp, float(ulps.max()))
            once = correctly_rounded(e_raw.to(torch.float64), out_dtype)
            return _int_view(a_raw) != _int_view(once)
        once = e_raw.to(torch.float64).to(out_dtype)
        return _narrow(a_raw) & ~_narrow(once)
    # ulp
    if out_dtype.is_floating_point:
        ulps = diff / _ulp_size(e, out_dtype)
    else:
        ulps = diff
    ulps = torch.where(finite, ulps, torch.where(bad_special, math.inf, 0.0))
    if ulps.numel():
        m.max_ulp = max(m.max_ulp, float(ulps.max()))
    return ulps > elem.ulps


def _count_bad(m: Metrics, bad: torch.Tensor, a: torch.Tensor, e: torch.Tensor, offset: int,
               rank: int) -> None:
    """Count the chunk's bad elements, and keep the first one seen."""
    n_bad = int(bad.sum())
    if n_bad:
        m.n_mismatch += n_bad
        if m.first_bad_index is None:
            i = int(torch.nonzero(bad)[0, 0])
            m.first_bad_index = offset + i
            m.first_bad_rank = rank
            m.first_bad_actual = float(a[i])
            m.first_bad_expected = float(e[i])


def _identical_sums(e_raw: torch.Tensor) -> tuple[int, int, float]:
    """(NaN count, inf count, sum of squares of the finite values): all that a chunk bitwise
    equal to the reference adds to the metrics, in a few passes instead of the two dozen of
    ``_measure_chunk`` (a 2**31-element copy is compared in seconds, not minutes)."""
    if e_raw.element_size() == 1 and e_raw.numel() > 256:
        # a byte has 256 values: a histogram of the bytes gives the same sums in one pass
        # (exactly for the integer types; fp8 squares round as the element-wise sum's do)
        codes = torch.arange(256, dtype=torch.uint8, device=e_raw.device)
        values = codes.view(e_raw.dtype).to(torch.float64)
        counts = torch.bincount(e_raw.reshape(-1).view(torch.uint8), minlength=256)
        counts = counts.to(torch.float64)
        special = torch.isnan(values) | torch.isinf(values)
        finite = torch.where(special, torch.zeros_like(values), values)
        return (int(counts[torch.isnan(values)].sum()),  # bool: no NaN, no inf
                int(counts[torch.isinf(values)].sum()),
                float((counts * finite * finite).sum()))
    e = e_raw.to(torch.float64)
    n_nan = n_inf = 0
    if e_raw.dtype.is_floating_point:
        nan, inf = torch.isnan(e), torch.isinf(e)
        n_nan, n_inf = int(nan.sum()), int(inf.sum())
        e = torch.where(nan | inf, torch.zeros_like(e), e)
    return n_nan, n_inf, float((e * e).sum())


def verdict(m: Metrics, tolerance: Tolerance) -> tuple[bool, str]:
    """Whether merged metrics meet the tolerance, and if not, one line saying why."""
    if m.shape_error:
        return False, m.shape_error
    parts = tolerance.parts if tolerance.kind == "all_of" else (tolerance,)
    for t in parts:
        ok, why = _verdict_one(m, t)
        if not ok:
            return False, why
    if m.n_bad_special:  # a mismatch budget never covers NaN or a wrong infinity
        return False, (f"{m.n_bad_special} NaN/inf values where the reference has a different "
                       "value (n_nan/n_inf)")
    if tolerance.elementwise is None and m.n_mismatch:
        return False, f"{m.n_mismatch} non-finite values where the reference is finite"
    return True, ""


def _verdict_one(m: Metrics, t: Tolerance) -> tuple[bool, str]:
    where = ""
    if m.first_bad_index is not None:
        where = (
            f"; first at rank {m.first_bad_rank} index {m.first_bad_position()}: "
            f"{m.first_bad_actual!r} vs {m.first_bad_expected!r}"
        )
        if math.isnan(m.first_bad_actual) and math.isnan(m.first_bad_expected):
            where += " (a NaN of other bits: a copy keeps a NaN's sign and payload)"
    if t.kind == "rounding":
        if m.n_mismatch > t.max_mismatch_frac * m.numel:
            ulp = f"; max {m.max_ulp:.3g} ulp" if m.max_ulp else ""
            return False, (f"{m.n_mismatch}/{m.numel} elements not the float64 value rounded "
                           f"once (precision lens: at most {t.max_mismatch_frac:g}{ulp})"
                           f"{where}")
        if t.ulps and m.max_ulp > t.ulps:
            return False, (f"an element {m.max_ulp:.3g} ulp from the float64 value (precision "
                           f"lens: at most {t.ulps}){where}")
        return True, ""
    if t.kind in ELEMENTWISE_KINDS:
        allowed = t.max_mismatch_frac * m.numel if t.kind == "allclose" else 0
        if m.n_mismatch > allowed:
            exact_at_0 = " (exact where the magnitude is 0)" if t.magnitude_rtol else ""
            what = {"exact": "not bitwise equal",
                    "allclose": f"outside {t.describe()}{exact_at_0}",
                    "ulp": f"more than {t.ulps} ulp off",
                    "rounded_near": ("not the float64 value (or one within "
                                     f"{t.rtol:g} of it) rounded once")}[t.kind]
            return False, (f"{m.n_mismatch}/{m.numel} elements {what} "
                           f"(max_abs={m.max_abs:.3g}, max_rel={m.max_rel:.3g}){where}")
        return True, ""
    if t.kind == "cos_diff_per_row":
        if not m.max_row_cos_diff <= t.bound:
            return False, (f"row {m.worst_row} (rank {m.worst_row_rank}) has calc_diff "
                           f"{m.max_row_cos_diff:.3g} > {t.bound:g} (cos_diff_per_row; the "
                           f"whole output's: {m.cos_diff:.3g}): a fault confined to that row")
        return True, ""
    value = m.cos_diff if t.kind == "cos_diff" else m.rel_l2
    if not value <= t.bound:  # also catches NaN
        return False, f"{t.kind}={value:.3g} > {t.bound:g}{where}"
    return True, ""


@dataclass
class Check:
    """A metric set plus its verdict."""

    passed: bool
    metrics: Metrics
    reason: str


def check(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance) -> Check:
    """Measure and judge one output on one process."""
    m = measure(actual, expected, tolerance)
    ok, why = verdict(m, tolerance)
    return Check(ok, m, why)
