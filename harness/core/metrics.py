"""The metrics of one output against its reference as mergeable partial sums (one ``Metrics``
per rank, merged across ranks into the case's), their JSON form and what follows from them:
mismatch fraction, rel_l2, cos_diff and the position of the first bad element.
``harness.core.compare`` measures them and judges them against a tolerance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metrics:
    """Comparison metrics as mergeable partial sums (one per rank, merged across ranks)."""

    numel: int = 0
    n_mismatch: int = 0
    n_nan: int = 0
    n_inf: int = 0
    #: NaN or infinite values that differ from the reference's (never within a mismatch budget)
    n_bad_special: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_sq_diff: float = 0.0
    sum_sq_expected: float = 0.0
    sum_sq_actual: float = 0.0
    sum_dot: float = 0.0
    max_ulp: float = 0.0
    #: allclose only: the worst finite element's |a-e| / (atol + rtol*|e|), the share of its
    #: allowance it uses (1 is the tolerance's edge); what the dashboard plots against 1
    max_tol_ratio: float = 0.0
    #: per-row tolerances only: the largest calc_diff of one row (the last dim: a token's
    #: output), the row's index on its rank, and that rank
    max_row_cos_diff: float = 0.0
    worst_row: int | None = None
    worst_row_rank: int | None = None
    #: flat index of the first element outside the elementwise tolerance, and its rank
    first_bad_index: int | None = None
    first_bad_rank: int | None = None
    first_bad_actual: float | None = None
    first_bad_expected: float | None = None
    shape: list[int] = field(default_factory=list)
    shape_error: str | None = None

    @property
    def mismatch_frac(self) -> float:
        return self.n_mismatch / self.numel if self.numel else 0.0

    @property
    def rel_l2(self) -> float:
        if self.sum_sq_expected == 0.0:
            return 0.0 if self.sum_sq_diff == 0.0 else math.inf
        return math.sqrt(self.sum_sq_diff / self.sum_sq_expected)

    @property
    def cos_diff(self) -> float:
        denom = self.sum_sq_actual + self.sum_sq_expected
        if denom == 0.0:
            return 0.0  # both all zero: identical (DeepGEMM's convention)
        if not math.isfinite(denom) or not math.isfinite(self.sum_dot):
            return math.inf
        return 1.0 - 2.0 * self.sum_dot / denom

    def first_bad_position(self) -> list[int] | None:
        """The first bad element as a multi-dimensional index."""
        if self.first_bad_index is None or not self.shape:
            return None if self.first_bad_index is None else [self.first_bad_index]
        idx, pos = self.first_bad_index, []
        for extent in reversed(self.shape):
            pos.append(idx % extent if extent else 0)
            idx //= max(extent, 1)
        return pos[::-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the raw partial sums plus the derived metrics."""
        return {
            "numel": self.numel,
            "n_mismatch": self.n_mismatch,
            "mismatch_frac": self.mismatch_frac,
            "n_nan": self.n_nan,
            "n_inf": self.n_inf,
            "n_bad_special": self.n_bad_special,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "max_ulp": self.max_ulp,
            "max_tol_ratio": self.max_tol_ratio,
            "rel_l2": self.rel_l2,
            "cos_diff": self.cos_diff,
            "max_row_cos_diff": self.max_row_cos_diff,
            "worst_row": self.worst_row,
            "worst_row_rank": self.worst_row_rank,
            "first_bad_index": self.first_bad_index,
            "first_bad_position": self.first_bad_position(),
            "first_bad_rank": self.first_bad_rank,
            "first_bad_actual": self.first_bad_actual,
            "first_bad_expected": self.first_bad_expected,
            "shape": self.shape,
            "shape_error": self.shape_error,
            "sum_sq_diff": self.sum_sq_diff,
            "sum_sq_expected": self.sum_sq_expected,
            "sum_sq_actual": self.sum_sq_actual,
            "sum_dot": self.sum_dot,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metrics:
        """Inverse of ``to_dict`` (derived fields are recomputed)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def merge(cls, parts: list[Metrics]) -> Metrics:
        """Combine per-rank metrics: sums add, maxima take the max, the first bad index is the
        one of the lowest rank that has one."""
        out = cls()
        for p in parts:
            out.numel += p.numel
            out.n_mismatch += p.n_mismatch
            out.n_nan += p.n_nan
            out.n_inf += p.n_inf
            out.n_bad_special += p.n_bad_special
            out.max_abs = _nanmax(out.max_abs, p.max_abs)
            out.max_rel = _nanmax(out.max_rel, p.max_rel)
            out.max_ulp = _nanmax(out.max_ulp, p.max_ulp)
            out.max_tol_ratio = _nanmax(out.max_tol_ratio, p.max_tol_ratio)
            out.sum_sq_diff += p.sum_sq_diff
            out.sum_sq_expected += p.sum_sq_expected
            out.sum_sq_actual += p.sum_sq_actual
            out.sum_dot += p.sum_dot
            out.shape_error = out.shape_error or p.shape_error
            if p.worst_row is not None and not p.max_row_cos_diff <= out.max_row_cos_diff:
                out.max_row_cos_diff = p.max_row_cos_diff
                out.worst_row, out.worst_row_rank = p.worst_row, p.worst_row_rank
            if out.first_bad_index is None and p.first_bad_index is not None:
                out.first_bad_index = p.first_bad_index
                out.first_bad_rank = p.first_bad_rank
                out.first_bad_actual = p.first_bad_actual
                out.first_bad_expected = p.first_bad_expected
                out.shape = p.shape
        if not out.shape and parts:
            out.shape = parts[0].shape
        return out


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
