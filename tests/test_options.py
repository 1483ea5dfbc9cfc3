"""The run's settings record: defined once, the CLI's options are its fields, it survives
run.json, a resume keeps what decides the run's cases, and the ranks' command line carries
only the run directory and the world size."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli.main import run as run_command
from harness.engine.launch import LaunchConfig, build_command
from harness.engine.options import SANITIZE_DEADLINE_FACTOR, RunDir, RunOptions


def test_every_run_option_is_one_field_and_every_field_one_option():
    # --suite loads the suites as it is parsed (or the project file names them): the record
    # keeps what was loaded
    params = {p.name for p in run_command.params} - {"resume_id", "suites"}
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    assert fields - params == {"suite_sources", "suite_golden_dir"}
    assert params - fields == set()


def test_the_record_survives_its_json():
    options = RunOptions(selectors=("allreduce",), world_sizes=(1, 4), impls=("torch",),
                         bench=True, timeout=12.5, launcher_args=("-bind-to", "core"),
                         suite_sources=("/x/ops",))
    assert RunOptions.from_mapping(options.to_json()) == options
    # run.json of runs recorded before the record: world sizes as the flag's text
    assert RunOptions.from_mapping({"world_sizes": "1,4", "extra": 1}).world_sizes == (1, 4)


def test_a_resume_keeps_what_decides_the_cases_and_takes_the_rest_where_given_anew():
    started = RunOptions(selectors=("allreduce",), tier="nightly", timeout=5.0, grace=1.0,
                         launcher="srun", launcher_args=("--mpi=pmi2",))
    now = RunOptions(tier="smoke", timeout=60.0, launcher="mpiexec")
    # the command gave --timeout only (and no kept option can be given anew)
    resumed = started.resumed_with(now, given=("timeout", "tier"))
    assert (resumed.selectors, resumed.tier) == (("allreduce",), "nightly")
    assert resumed.timeout == 60.0
    # what it did not give is the run's own: a run started with srun finishes with srun
    assert (resumed.launcher, resumed.launcher_args, resumed.grace) == (
        "srun", ("--mpi=pmi2",), 1.0)
    assert {"selectors", "tier", "world_sizes", "impls", "device", "bench", "sanitize",
            "golden_dir", "use_golden", "suite_sources"} <= set(RunOptions.kept_names())
    assert "timeout" not in RunOptions.kept_names()


def test_settings_by_hand_parse_by_the_fields_type():
    o = RunOptions()
    for text in ("tier=nightly", "impls=torch, tile", "bench=false", "timeout=7",
                 "world_sizes=1,4", "golden_dir=none"):
        o = o.with_text(text)
    assert (o.tier, o.impls, o.bench, o.timeout, o.world_sizes, o.golden_dir) == \
        ("nightly", ("torch", "tile"), False, 7.0, (1, 4), None)
    for bad in ("colour=red", "tier", "bench=maybe"):
        with pytest.raises(ValueError, match="--harness-set"):
            o.with_text(bad)


def test_sanitize_and_no_bench_turn_timing_off_and_bench_makes_it_full():
    assert RunOptions().timed and not RunOptions().full_timing
    assert RunOptions(bench=True).full_timing
    assert not RunOptions(bench=False).timed
    assert not RunOptions(bench=True, sanitize=True).timed


def test_a_cases_deadline_is_the_timeout_given_else_its_ops_longer_under_sanitize():
    """memcheck slows every kernel: an op's own deadline would time out cases that only ran
    slowly; a --timeout given is the user's and holds as given."""
    assert RunOptions().deadline_of(120.0) == 120.0
    assert RunOptions(sanitize=True).deadline_of(120.0) == 120.0 * SANITIZE_DEADLINE_FACTOR
    assert SANITIZE_DEADLINE_FACTOR > 1
    assert RunOptions(timeout=7.0).deadline_of(120.0) == 7.0
    assert RunOptions(timeout=7.0, sanitize=True).deadline_of(120.0) == 7.0


def test_the_ranks_get_the_run_directory_and_their_world_size_only(tmp_path):
    cfg = LaunchConfig(launcher="/venv/bin/mpiexec", run_dir=tmp_path, run_id="r",
                       options=RunOptions(tier="nightly", impls=("torch",), timeout=3.0,
                                          bench=True, golden_dir="/g"))
    cmd = build_command(cfg, 4, 2)
    assert [a for a in cmd if a.startswith("--harness")] == ["--harness-run-dir",
                                                             "--harness-world-size"]
    assert cmd[cmd.index("--harness-run-dir") + 1] == str(tmp_path)
    assert cmd[cmd.index("--junitxml") + 1] == str(RunDir(tmp_path).junit(4, 2))
