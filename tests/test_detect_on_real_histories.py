"""The scoring of benchmarks/detect_on_real_histories.py: sheriffs' verdicts as truth, the
points left out, the scores of one series worked by hand, and its harness detector against
`harness detect --json` on the same CSV."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import detect_on_real_histories as real  # noqa: E402

from harness.cli.main import main  # noqa: E402


def test_verdicts_map_to_changes_invalid_alerts_and_unsettled_ones():
    s = real.from_alerts([1.0] * 50, [
        {"index": 10, "status": "Acknowledged"}, {"index": 20, "status": "invalid"},
        {"index": 30, "status": "untriaged"}, {"index": 40, "status": "downstream"},
        {"index": 45, "status": "FN"},  # a sheriff's own alert, where Perfherder made none
        {"index": 40, "status": "invalid"}])  # an accepted alert on the point wins
    assert s.annotations == {"sheriffs": [10, 40, 45]}
    assert (s.invalid, s.unsure) == ([20], [30])
    with pytest.raises(ValueError, match="unknown alert status 'maybe'"):
        real.from_alerts([1.0], [{"index": 0, "status": "maybe"}])


def test_a_report_near_an_unsettled_alert_is_left_out_unless_near_a_change():
    s = real.Series(np.zeros(100), {"sheriffs": [10, 40]}, unsure=[30])
    # 29 and 33 are within 5 of the unsettled 30 and of no change; 35 is within 5 of both
    assert real.kept(s, [12, 29, 33, 35, 60]) == [12, 35, 60]


def test_one_series_scored_by_hand():
    s = real.Series(np.zeros(100), {"sheriffs": [10, 40]}, invalid=[20])
    r = real.score_series(s, [12, 21, 60])
    # F1 with 0 added to both: truth {0, 10, 40}, guess {0, 12, 21, 60}; 0 and 10 (by 12)
    # matched: precision 2/4, recall 2/3, F1 = 2 * 1/2 * 2/3 / (1/2 + 2/3) = 4/7
    assert r["f1"] == pytest.approx(4 / 7)
    # covering: [0,10) best by [0,12): 10/12; [10,40) by [21,60): 19/50; [40,100) by
    # [60,100): 40/60; weighted by 10, 30, 60 of 100
    assert r["cover"] == pytest.approx((10 * 10 / 12 + 30 * 19 / 50 + 60 * 40 / 60) / 100)
    assert (r["points"], r["invalid_hits"]) == (3, 1)  # 21 is within 5 of the invalid 20


def test_a_summary_is_the_mean_over_series():
    rows = {"a": {"f1": 1.0, "cover": 0.5, "points": 2, "invalid_hits": 0},
            "b": {"f1": 0.5, "cover": 0.25, "points": 1, "invalid_hits": 3}}
    assert real.summarise(rows) == {"series": 2, "f1": 0.75, "cover": 0.375, "points": 3,
                                    "invalid_hits": 3}
    assert real.summarise({}) == {"series": 0}


def test_the_split_is_fixed_by_name():
    # pinned: a split that moved would mix what was tuned on with what is held out
    names = ["bank", "brent_spot", "businv", "homeruns", "nile", "rail_lines", "well_log"]
    assert [n for n in names if real.held_out(n)] == ["brent_spot", "homeruns",
                                                       "rail_lines", "well_log"]


def test_the_harness_detector_is_harness_detect_on_a_csv(tmp_path, capsys):
    rng = np.random.default_rng(3)
    values = np.concatenate([100 + rng.normal(0, 1, 40), 110 + rng.normal(0, 1, 40),
                             95 + rng.normal(0, 1, 40)])
    path = tmp_path / "h.csv"
    path.write_text("series,order,value\n"
                    + "".join(f"s,{i},{float(v)!r}\n" for i, v in enumerate(values)))
    with pytest.raises(SystemExit):
        main(["detect", str(path), "--json"])
    cli = [d["index"] for d in json.loads(capsys.readouterr().out)]
    assert cli == real.harness_detect(values)
    assert [abs(i - at) <= 1 for i, at in zip(cli, (40, 80), strict=True)] == [True, True]
