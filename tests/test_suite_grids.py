"""Static checks of the suites' grids: every case is well formed before any rank runs it."""

from __future__ import annotations

import math

import pytest

from reference_kernels import dtensor, strided_copy
from suites import dtensor as dtensor_suite
from suites import strided_copy as strided_suite


@pytest.mark.parametrize("tier", ["smoke", "nightly"])
def test_every_dtensor_case_names_one_placement_per_mesh_dim(tier):
    for p in dtensor_suite.REDISTRIBUTE.grid[tier]:
        dims = len(dtensor_suite.mesh_shape(p))
        for side in ("src", "dst"):
            placements = dtensor.parse(p[side])
            assert len(placements) == dims, p
            assert all(q.dim < len(p["shape"]) for q in placements if q.kind in ("S", "SS")), p


@pytest.mark.parametrize("tier", ["smoke", "nightly", "stress"])
def test_every_strided_view_fits_its_storage_and_stress_goes_past_2_31(tier):
    for p in strided_suite.STRIDED_COPY.grid[tier]:
        assert len(p["size"]) == len(p["stride"]) and p["offset"] >= 0, p
        assert strided_copy.source_span(p["size"], p["stride"], p["offset"]) >= 0
    if tier == "stress":
        for p in strided_suite.STRIDED_COPY.grid[tier]:
            big = max([math.prod(p["size"]), p["offset"], *p["stride"]])
            assert big > 2**31, p
