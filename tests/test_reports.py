"""The dashboard's pieces without a browser: which error number is plotted against which
bound, status-matrix cells (negative controls included), file names for hostile DB strings,
op trends, compare pairing, and a whole render of a small history built with the store."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from harness.core.results import CaseResult, RunInfo
from harness.history import store
from reports import charts, data, render

T0 = 1_700_000_000.0


def out_entry(tol: dict, **metrics) -> dict:
    return {"tolerance": tol, "metrics": metrics, "passed": True}


@pytest.mark.parametrize("tol, metrics, want", [
    ({"kind": "cos_diff", "bound": 1e-3}, {"cos_diff": 2e-5}, ("cos_diff", 2e-5, 1e-3)),
    ({"kind": "rel_l2", "bound": 0.01}, {"rel_l2": 0.002}, ("rel_l2", 0.002, 0.01)),
    ({"kind": "ulp", "ulps": 2}, {"max_ulp": 1.0}, ("max ulp", 1.0, 2.0)),
    ({"kind": "allclose", "rtol": 0.1, "atol": 0.01}, {"max_tol_ratio": 0.25, "max_abs": 9.0},
     ("worst |a-e| / (atol+rtol|e|)", 0.25, 1.0)),
    # all_of: the global bound sums up the output, so it is the one plotted
    ({"kind": "all_of", "parts": [{"kind": "allclose", "rtol": 0.1, "atol": 0.1},
                                  {"kind": "cos_diff", "bound": 1e-5}]},
     {"cos_diff": 3e-7, "max_tol_ratio": 0.5}, ("cos_diff", 3e-7, 1e-5)),
    # a value of 0 (bitwise equal) has no place on a log axis: a gap, the bound stays
    ({"kind": "cos_diff", "bound": 1e-3}, {"cos_diff": 0.0}, ("cos_diff", None, 1e-3)),
    ({"kind": "cos_diff", "bound": 1e-3}, {"cos_diff": -1e-17}, ("cos_diff", None, 1e-3)),
])
def test_error_metric_reads_the_number_the_tolerance_bounds(tol, metrics, want):
    assert charts.error_metric(out_entry(tol, **metrics)) == want


@pytest.mark.parametrize("entry", [
    out_entry({"kind": "exact"}, max_abs=0.0),  # checked bitwise: no curve
    out_entry({"kind": "allclose", "rtol": 0.1, "atol": 0.1}, max_abs=0.01),  # pre-v3 record
    {"tolerance": "exact"}, {}, None,
])
def test_error_metric_none_where_there_is_no_such_number(entry):
    assert charts.error_metric(entry) is None


def test_cells_of_implementations_and_of_negative_controls():
    impl = data.Cell(total=3, passed=2, failed=1)
    assert (impl.state, impl.text) == ("bad", "2/3")
    assert data.Cell(total=3, passed=2, skipped=1).text == "2/2 (1 skip)"
    assert data.Cell(total=1, skipped=1).state == "skip"
    caught = data.Cell(total=2, failed=2, control=True)
    assert (caught.state, caught.text) == ("ok", "2/2 caught")
    missed = data.Cell(total=2, passed=1, failed=1, control=True)  # one control passed
    assert (missed.state, missed.text) == ("bad", "1/2 caught")
    assert data.Cell().state == "empty"


def test_safe_names_keep_harmless_names_and_never_collide_or_escape():
    assert render.safe_name("allreduce") == "allreduce"
    assert render.safe_name("fp8_gemm.blockwise") == "fp8_gemm.blockwise"
    a, b = render.safe_name("../../etc/x"), render.safe_name("../../etc/y")
    assert a != b and "/" not in a + b
    for hostile in ("", ".", "..", "<script>", "a/b", "a\\b"):
        name = render.safe_name(hostile)
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name) and name not in ("", ".", ".."), hostile
    assert render.case_anchor("x[a=1]") == render.case_anchor("x[a=1]") != render.case_anchor(
        "x[a=2]")


def test_sparkline_spans_its_box():
    pts = [tuple(map(float, p.split(",")))
           for p in charts.sparkline([1.0, 2.0, 1.5], 100, 20).split()]
    assert [x for x, _ in pts] == [0.0, 50.0, 100.0]
    assert max(y for _, y in pts) == 18.0 and min(y for _, y in pts) == 2.0  # low is down
    assert charts.sparkline([]) == ""


# ----------------------------------------------------------------------------- a small history


def result(run_id: str, case: str, impl: str, median: float, *, status: str = "pass",
           op: str = "allreduce", ws: int = 1, busbw: float = 0.0) -> CaseResult:
    timing = {"median": median, "p10": median * 0.9, "p90": median * 1.2, "n": 5,
              "samples": [median * f for f in (0.9, 0.95, 1.0, 1.1, 1.2)]}
    return CaseResult(
        run_id=run_id, case_id=f"{op}[{case}]", op=op, family="collectives", impl=impl,
        world_size=ws, params={"n": 1031, "dtype": "f32"}, status=status,
        reason="" if status == "pass" else "out: 3/1031 elements not bitwise equal",
        outputs={"out": out_entry({"kind": "allclose", "rtol": 1e-3, "atol": 1e-5},
                                  max_tol_ratio=0.1, max_abs=1e-6, n_mismatch=0,
                                  numel=1031)},
        timing=timing if status == "pass" else None,
        derived={"gbps": 1.0, "busbw_gbps": busbw}, wrong=0 if status == "pass" else 3)


def make_db(path: Path, nights: list[list[CaseResult]], machine: str = "fp-a") -> None:
    conn = store.connect(path)
    for i, results in enumerate(nights):
        run_id = results[0].run_id
        store.ingest(conn, RunInfo(run_id=run_id, started_at=T0 + 3600 * i, tier="smoke",
                                   world_sizes=[1, 4], machine={"fingerprint": machine,
                                                                "name": "box"},
                                   env={"torch": "2.13.0"}, git_commit=f"c{i:039d}",
                                   status="complete"), results)
    conn.close()


def test_op_trend_is_the_geometric_mean_of_each_series_against_its_first_run(tmp_path):
    make_db(tmp_path / "h.db", [
        [result("r0", "n=1", "torch", 100.0), result("r0", "n=2", "torch", 400.0)],
        [result("r1", "n=1", "torch", 200.0), result("r1", "n=2", "torch", 200.0)],
        [result("r2", "n=1", "torch", 100.0), result("r2", "n=2", "torch", 100.0,
                                                       status="fail")],
    ])
    conn = store.connect(tmp_path / "h.db")
    history = data.load(conn, "h.db")
    conn.close()
    trend = data.op_trend(history.by_op()["allreduce"])
    assert [run.run_id for run, _ in trend] == ["r0", "r1", "r2"]
    # r1: sqrt(2 * 0.5) = 1; r2: the failing series is left out, 100/100 = 1
    assert [v for _, v in trend] == pytest.approx([1.0, 1.0, 1.0])
    assert data.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_render_of_a_small_history(tmp_path):
    nights = [[result(f"r{i}", "n=1031", "torch", 1000.0 * (1.5 if i >= 5 else 1.0), ws=4,
                      busbw=2.0),
               result(f"r{i}", "n=1031", "drop_rank", 900.0, ws=4,
                      status="fail" if i != 6 else "pass")]
              for i in range(7)]
    # another selection on the same machine between two nights: not what r6 compares with
    nights.insert(6, [result("other", "n=7", "mpi", 10.0, op="broadcast")])
    make_db(tmp_path / "h.db", nights)
    conn = store.connect(tmp_path / "h.db")
    assert data.analyze_missing(conn) == ["r0", "r1", "r2", "r3", "r4", "r5", "other", "r6"]
    history = data.load(conn, "h.db")
    site = render.render(conn, history, tmp_path / "site")
    conn.close()
    assert (site.n_runs, site.op_pages, site.run_pages, site.compare_pages) == (8, 2, 8, 7)
    assert (tmp_path / "site" / "compare" / "r5_r6.html").is_file()  # skips "other"
    # a negative control that passed is a missed control: the matrix says so in red
    sizes, matrix = data.status_matrix(history, "fp-a")
    cells = {(impl, ctrl): c[4] for _, impl, ctrl, c in matrix if 4 in c}
    assert sizes == [1, 4]
    assert cells[("drop_rank", True)].state == "bad"  # r6: drop_rank passed
    assert cells[("torch", False)].state == "ok"
    # the slowdown on r5 and r6 is a change point that r6 confirmed, drawn as a marker on r5's
    # point and listed on the index
    kinds = {(f["run_id"], f["kind"]) for f in history.findings if f["impl"] == "torch"}
    assert ("r6", "regression") in kinds
    (point,) = history.change_points
    index = (tmp_path / "site" / "index.html").read_text()
    assert f'<td class="mono">{point["id"]}</td>' in index and "untriaged" in index
    page = (tmp_path / "site" / "ops" / "allreduce.html").read_text()
    figs = [json.loads(m) for m in re.findall(
        r'<script type="application/json" id="fig-[^"]+">(.*?)</script>', page, re.S)]
    assert figs and all("NaN" not in json.dumps(f) for f in figs)
    trends = [f for f in figs if f["layout"]["xaxis"].get("type") == "date"]
    torch_fig = next(f for f in trends if any(t.get("name") == "torch w4" for t in f["data"]))
    latency = next(t for t in torch_fig["data"] if t.get("name") == "torch w4")
    assert latency["y"] == pytest.approx([1.0] * 5 + [1.5] * 2)  # µs, from the records
    markers = [t for t in torch_fig["data"] if t.get("marker", {}).get("symbol") ==
               ["triangle-up"]]
    assert len(markers) == 1 and markers[0]["y"] == pytest.approx([1.5])
    errors = [t for t in torch_fig["data"] if "max_tol_ratio" in json.dumps(t) or
              "atol+rtol" in t.get("name", "")]
    assert errors and all(v == pytest.approx(0.1) for v in errors[0]["y"])
    busbw = next(f for f in figs if f["layout"]["xaxis"].get("type") == "log")
    assert busbw["data"][0]["y"] == [2.0] and busbw["data"][0]["x"] == [4124.0]
    assert not math.isnan(site.seconds)


def test_a_step_after_a_slow_night_is_listed_with_the_range_to_bisect(tmp_path):
    # four nights at the level, one between it and the new one (a slow night, or the step
    # landing mid-night), three at the new: the step is dated at r5, as early as r4
    levels = [1000.0] * 4 + [3000.0] + [200000.0] * 3
    make_db(tmp_path / "h.db", [[result(f"r{i}", "n=1031", "torch", v)]
                                for i, v in enumerate(levels)])
    conn = store.connect(tmp_path / "h.db")
    data.analyze_missing(conn)
    history = data.load(conn, "h.db")
    render.render(conn, history, tmp_path / "site")
    conn.close()
    (point,) = history.change_points
    assert (point["run_id"], point["earliest_run_id"]) == ("r5", "r4")
    index = (tmp_path / "site" / "index.html").read_text()
    assert "or as early as" in index and "bisect that range" in index


def _entry(i: int, max_tol_ratio: float) -> data.Entry:
    info = RunInfo(run_id=f"r{i}", started_at=T0 + i, tier="smoke", world_sizes=[1],
                   machine={"fingerprint": "f", "name": "m"}, env={})
    r = result(f"r{i}", "n=1", "torch", 1000.0)
    r.outputs["out"]["metrics"]["max_tol_ratio"] = max_tol_ratio
    return data.Entry(r, data.Run(info=info, machine="f", machine_name="m", index=i))


@pytest.mark.parametrize("ratios, noted", [([0.0, 0.0], True), ([0.0, 0.3], False)])
def test_an_error_row_of_zeros_says_so_instead_of_looking_empty(ratios, noted):
    history = data.History("h.db", [], [], [], [], {}, {})
    fig = charts.case_figure(history, [_entry(i, v) for i, v in enumerate(ratios)], {})
    axes = {v["title"]["text"]: k for k, v in fig["layout"].items() if k.startswith("yaxis")}
    assert fig["layout"][axes[charts.ERROR_ROW]]["type"] == "log"
    notes = [a for a in fig["layout"].get("annotations", []) if "error 0" in a["text"]]
    assert bool(notes) == noted
    if noted:  # written inside the error row, not somewhere else on the figure
        assert notes[0]["yref"] == axes[charts.ERROR_ROW].replace("yaxis", "y") + " domain"
