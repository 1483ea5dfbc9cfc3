"""The nccl-tests layout of collective results."""

from __future__ import annotations

from harness.cli.nccl_table import format_blocks
from harness.core.results import CaseResult
from harness.core.spec import Work


def _result(n, inplace, busbw, status="pass", wrong=0, impl="torch", peak=None):
    return CaseResult(
        run_id="r", case_id=f"allreduce[n={n},inplace={inplace}]", op="allreduce",
        family="collectives", impl=impl, world_size=4,
        params={"dtype": "f32", "n": n, "op": "sum", "inplace": inplace, "mode": "exact"},
        status=status, wrong=wrong, timing={"median": 2000.0} if status == "pass" else None,
        derived={"gbps": busbw / 1.5, "busbw_gbps": busbw} if status == "pass" else {},
        peak_memory_bytes=peak, peak_memory_kind="cpu_rss_peak" if peak else "not_measured")


def _work(op, params, world_size):
    return Work(bytes=params["n"] * 4, bus_bytes=params["n"] * 6)


def _data_lines(block: str) -> list[list[str]]:
    return [ln.split() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


def test_one_line_per_size_with_in_place_beside_out_of_place():
    results = [_result(7, False, 1.0, peak=3_000_000), _result(7, True, 3.0),
               _result(1031, False, 2.0)]
    text = format_blocks(results, _work)
    assert text.startswith("# allreduce  world size 4  impl torch")
    lines = _data_lines(text)
    assert [ln[:2] for ln in lines] == [["28", "7"], ["4124", "1031"]]  # size = n * 4 bytes
    # size count type redop root | time algbw busbw #wrong peak | time ... | variant
    first = lines[0]
    assert first[2:5] == ["f32", "sum", "-"]
    assert first[5] == "2.0" and first[7] == "1.000" and first[8] == "0" and first[9] == "3.00"
    assert first[12] == "3.000" and first[14] == "n/m"
    assert lines[1][10:15] == ["-"] * 5  # no in-place result for that size
    assert first[-1] == "mode=exact"
    assert "# Avg bus bandwidth    : 2 GB/s" in text  # mean of 1, 3 and 2
    assert "# Wrong elements       : 0 OK" in text


def test_failures_count_wrong_elements_and_unfinished_cases_show_their_status():
    results = [_result(7, False, 1.0, status="fail", wrong=5), _result(7, True, 0, "timeout"),
               _result(9, False, 1.0, impl="mpi", status="crash")]
    text = format_blocks(results, _work)
    blocks = text.split("\n\n")
    assert blocks[0].startswith("# allreduce  world size 4  impl mpi")
    assert "crash" in _data_lines(blocks[0])[0]
    torch_line = _data_lines(blocks[1])[0]
    assert torch_line[8] == "5" and torch_line[13] == "timeout"
    assert "# Wrong elements       : 5 FAILED" in blocks[1]
    assert "# Avg bus bandwidth    : - (not timed)" in blocks[1]


def test_results_without_a_count_are_left_to_the_generic_table():
    r = _result(7, False, 1.0)
    r.params = {"dtype": "f32"}
    assert format_blocks([r], _work) == ""
