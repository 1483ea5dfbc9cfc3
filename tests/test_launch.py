"""The launcher's plain decisions: how ranks wait when they outnumber the CPUs, whether a job
stays on this host, srun's PMI, the ranks' check of their MPI world, and the incremental read
of the results file it polls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.results import CaseResult, append
from harness.engine.launch import (
    HEAVY_YIELD,
    LaunchConfig,
    RecordedKeys,
    build_command,
    one_node,
    srun_args,
    wait_environment,
)
from harness.engine.options import RunOptions


def cfg(tmp_path: Path, **options) -> LaunchConfig:
    return LaunchConfig(launcher=options.pop("launcher", "/venv/bin/mpiexec"), run_dir=tmp_path,
                        run_id="r", options=RunOptions.from_mapping(options))


@pytest.mark.parametrize("world,cpus,expected", [
    (1, 2, {}), (2, 2, {}), (4, 2, {HEAVY_YIELD: "1"}), (8, 2, {HEAVY_YIELD: "1"}),
    (8, 16, {}),
])
def test_ranks_wait_politely_only_where_they_outnumber_the_cpus(world, cpus, expected):
    assert wait_environment(world, cpus, single_node=True) == expected


def test_ranks_on_other_hosts_are_not_judged_by_this_hosts_cpus():
    assert wait_environment(8, 2, single_node=False) == {}


def test_a_job_stays_on_this_host_unless_told_otherwise(tmp_path):
    assert one_node(cfg(tmp_path), {})
    assert one_node(cfg(tmp_path), {"SLURM_JOB_NUM_NODES": "1"})
    assert not one_node(cfg(tmp_path), {"SLURM_JOB_NUM_NODES": "2"})
    assert not one_node(cfg(tmp_path, hostfile="hosts"), {})
    assert not one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {})
    assert one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {"SLURM_JOB_NUM_NODES": "1"})
    assert not one_node(cfg(tmp_path, launcher="/usr/bin/srun"), {"SLURM_NNODES": "2"})
    assert not one_node(cfg(tmp_path, launcher_args=["-hosts", "a,b"]), {})
    assert not one_node(cfg(tmp_path, launcher_args=["--hostfile=h"]), {})
    assert one_node(cfg(tmp_path, launcher_args=["-bind-to", "core"]), {})


def test_srun_serves_the_ranks_pmi2_unless_told_which_mpi(tmp_path):
    assert srun_args([]) == ["--mpi=pmi2"]
    assert srun_args(["--exclusive"]) == ["--mpi=pmi2", "--exclusive"]
    assert srun_args(["--mpi=pmix"]) == ["--mpi=pmix"]
    assert srun_args(["--mpi", "none"]) == ["--mpi", "none"]
    cmd = build_command(cfg(tmp_path, launcher="/usr/bin/srun"), 4, 1)
    assert cmd[:4] == ["/usr/bin/srun", "--mpi=pmi2", "-n", "4"]
    cmd = build_command(cfg(tmp_path, launcher_args=["-bind-to", "core"]), 4, 1)
    assert cmd[:5] == ["/venv/bin/mpiexec", "-bind-to", "core", "-n", "4"]  # mpiexec as given
    assert cmd[cmd.index("--harness-world-size") + 1] == "4"


def test_a_rank_whose_mpi_world_is_not_the_job_started_says_why():
    from harness.device.runtime import world_mismatch

    assert world_mismatch(4, 4) is None and world_mismatch(None, 1) is None
    why = world_mismatch(4, 1)
    assert "started 4 processes but this one sees an MPI world of 1" in why
    assert "--mpi=pmi2" in why


def _result(case: str, world: int) -> CaseResult:
    return CaseResult(run_id="r", case_id=case, op="op", family="f", impl="torch",
                      world_size=world, params={}, status="pass")


def test_recorded_keys_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "results.jsonl"
    keys = RecordedKeys(path, 4)
    assert keys.update() == set()  # no file yet
    append(path, _result("a", 4))
    append(path, _result("b", 1))  # another world size
    assert keys.update() == {"w4:a@torch"}
    first_offset = keys.offset
    with open(path, "a") as fh:  # a line still being written
        fh.write(json.dumps(_result("c", 4).to_dict())[:40])
    assert keys.update() == {"w4:a@torch"} and keys.offset == first_offset
    with open(path, "a") as fh:
        fh.write(json.dumps(_result("c", 4).to_dict())[40:] + "\n")
    append(path, _result("d", 4))
    assert keys.update() == {"w4:a@torch", "w4:c@torch", "w4:d@torch"}
    assert keys.offset == path.stat().st_size


def test_recorded_keys_skips_a_torn_line_the_next_launch_wrote_past(tmp_path):
    path = tmp_path / "results.jsonl"
    with open(path, "w") as fh:
        fh.write('{"case_id": "torn", "imp')  # the writer died mid-line
    append(path, _result("e", 8))  # glued to the torn line by the next launch
    append(path, _result("f", 8))
    assert RecordedKeys(path, 8).update() == {"w8:f@torch"}


def test_a_dead_case_is_recorded_on_the_device_its_ranks_ran_on():
    from harness.engine.launch import dead_case_device

    gpu = {"backend": "gloo", "devices": ["cuda:0", "cuda:0", "cuda:0", "cuda:0"]}
    assert dead_case_device(gpu, "cuda") == "cuda:0"  # was "cpu" on the H200
    assert dead_case_device(None, "cuda") == "cuda"  # the job died before its placement
    assert dead_case_device({"devices": []}, "auto") == "cpu"
    assert dead_case_device(None, "cpu") == "cpu"
