"""The TCPD scores of benchmarks/tcpd_changepoints.py against the examples that TCPDBench's
analysis/scripts/metrics.py gives in its docstrings (worked by its authors, not by this code)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import tcpd_changepoints as tcpd  # noqa: E402


@pytest.mark.parametrize(("truth", "predicted", "expected"), [
    ({1, 10, 20, 23}, {3, 8, 20}, {1, 10, 20}),
    ({1, 10, 20, 23}, {1, 3, 8, 20}, {1, 10, 20}),
    ({1, 10, 20, 23}, {1, 3, 5, 8, 20}, {1, 10, 20}),
    (set(), {1, 2, 3}, set()),
    ({1, 2, 3}, set(), set()),
])
def test_true_positives_match_one_to_one(truth, predicted, expected):
    assert tcpd.matched(truth, predicted) == expected


@pytest.mark.parametrize(("annotations", "predicted", "expected"), [
    ({1: [10, 20], 2: [11, 20], 3: [10], 4: [0, 5]}, [10, 20], 1.0),
    ({1: [], 2: [10], 3: [50]}, [10], 0.9090909090909091),
    ({1: [], 2: [10], 3: [50]}, [], 0.8),
])
def test_f1_against_several_annotators(annotations, predicted, expected):
    assert tcpd.f1(annotations, predicted) == pytest.approx(expected, rel=1e-12)


def test_the_margin_is_five_indices():
    assert tcpd.f1({1: [50]}, [55]) == 1.0
    assert tcpd.f1({1: [50]}, [56]) < 1.0


@pytest.mark.parametrize(("points", "n", "expected"), [
    ([], 5, [{0, 1, 2, 3, 4}]),
    ([3, 5], 8, [{0, 1, 2}, {3, 4}, {5, 6, 7}]),
    ([1, 2, 7], 8, [{0}, {1}, {2, 3, 4, 5, 6}, {7}]),
    ([0, 4], 6, [{0, 1, 2, 3}, {4, 5}]),
])
def test_partition_from_change_points(points, n, expected):
    assert [set(r) for r in tcpd.partition(points, n)] == expected


@pytest.mark.parametrize(("predicted", "truth", "expected"), [
    ([{1, 2, 3}, {4, 5}, {6}], [{1, 2, 3}, {4, 5, 6}], 0.8333333333333334),
    ([{1, 2, 3, 4}, {5, 6}], [{1, 2, 3, 4, 5, 6}], 0.6666666666666666),
    ([{1, 2}, {3, 4}, {5, 6}], [{1, 2, 3}, {4, 5, 6}], 0.6666666666666666),
    ([{1, 2, 3, 4, 5, 6}], [{1}, {2}, {3}, {4, 5, 6}], 0.3333333333333333),
])
def test_cover_of_one_segmentation(predicted, truth, expected):
    def ranges(sets):
        return [range(min(s), max(s) + 1) for s in sets]

    assert tcpd.cover(ranges(truth), ranges(predicted)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("annotations", "predicted", "expected"), [
    ({1: [10, 20], 2: [10], 3: [0, 5]}, [10, 20], 0.7962962962962963),
    ({1: [], 2: [10], 3: [40]}, [10], 0.7954144620811286),
    ({1: [], 2: [10], 3: [40]}, [], 0.8189300411522634),
])
def test_covering_averaged_over_annotators(annotations, predicted, expected):
    assert tcpd.covering(annotations, predicted, 45) == pytest.approx(expected, rel=1e-12)


def test_perfherder_finds_a_clear_step_once_and_keeps_its_floor():
    step = [100.0 + (i % 3) * 0.1 for i in range(30)] + [110.0 + (i % 3) * 0.1 for i in range(30)]
    assert tcpd.perfherder(step) == [30]
    tiny = [100.0 + (i % 3) * 0.01 for i in range(30)] + [101.0 + (i % 3) * 0.01
                                                            for i in range(30)]
    assert tcpd.perfherder(tiny) == []  # |t| is huge, but 1% is under the 2% floor
