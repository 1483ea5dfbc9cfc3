"""The harness across a real two-node SLURM cluster (tests/helpers/two_node_cluster.py: n1 and
n2, 2 CPUs each, in namespaces of their own joined by a bridge; this process is the login node).

The first test loses a node in the middle of a `harness run --launcher srun` started from the
login node and finishes the run with ``--resume``. Then one nightly batch job at ``-N2``
(``ci/slurm/nightly.sbatch``, world size 4: ranks 0-1 on n1, 2-3 on n2) is the two-node run the
other three read: where the ranks ran, that their results equal a one-node run's, that the
night was ingested and rendered, and what the multi-node decisions make of the facts its ranks
gathered. The one-node run goes in the background while the first test waits for SLURM.

A few allreduce cases, checks only: what is proven is the wiring across nodes, not the cases.
Together they take about 40 s on a 2-core machine, most of it ranks importing torch.
"""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from harness.device.placement import GpuFacts, RankFacts, contention, place
from harness.engine.launch import LaunchConfig, one_node
from harness.engine.rank_env import wait_environment
from harness.engine.srun import PMI1_CUT_ADVICE

pytestmark = pytest.mark.heavy  # a cluster brought up in namespaces: run apart, -m heavy

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"
# exact sums (any order of reduction gives the same bits), one large enough that its
# allreduce cannot hide in a packet or two, and one of random values (an order of reduction
# that changed with the topology would change its hash)
SELECTORS = ("allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]",
             "allreduce[dtype=f32,inplace=true,mode=exact,n=65539,op=sum]",
             "allreduce[dtype=f32,inplace=false,mode=random,n=4099,op=sum]")
STALL = "harness_test_impls:stall_while_flagged"
# what srun's pmi2 plugin does to some environments' MPICH wire-up, whatever the harness does
_PMI_CUT_SKIP = ("srun's pmi2 plugin cut MPICH's PMI-1 wire-up requests (value not properly "
                 "terminated: it reads one in a single 1024-byte read, and MPICH's business "
                 "card lines grow with what is in its buffer, harness.engine.srun); the "
                 "harness stopped the job at once and said so, but nothing ran on two nodes")


def _env(cluster, **extra: str) -> dict[str, str]:
    # the ranks run the harness this test runs (its Python's scripts first on PATH) and may
    # import the test implementations
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
    return {**cluster.env, "PATH": path, "PYTHONPATH": pythonpath, **extra}


def _launch_logs(where: Path, lines: int = 30) -> str:
    """The last lines of every launch log of the runs under ``where``, for a failure's
    message."""
    return "\n".join(f"{log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()
                                              [-lines:])
                     for log in sorted(where.glob("**/w*.launch-*.log")))


def _launches(run_dir: Path) -> list[Path]:
    """The launch logs of world size 4 in a run folder, in the order they were made."""
    return sorted(run_dir.glob("w4.launch-*.log"), key=lambda p: int(p.stem.split("-")[-1]))


def _results(run_dir: Path) -> set[tuple[str, str, str, str]]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    return {(d["case_id"], d["impl"], d["status"], d["output_hash"])
            for d in map(json.loads, lines)}


@pytest.fixture(scope="module")
def night(two_node_cluster, tmp_path_factory):
    """ci/slurm/nightly.sbatch on both nodes, 2 tasks each, at world size 4 (world size 1 ran
    on one node in tests/test_slurm.py); the bytes that crossed n2's link meanwhile."""
    cluster, tmp = two_node_cluster, tmp_path_factory.mktemp("night2")
    history = tmp / "history"
    # the batch script's `harness` is this test's, whatever console script is installed
    shim = tmp / "bin" / "harness"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m harness "$@"\n')
    shim.chmod(0o755)
    # every variable through the environment: srun's --export=ALL,VAR=a,b splits on commas
    env = _env(cluster, HARNESS_HISTORY_DIR=str(history), HARNESS_DEVICE="cpu",
               HARNESS_TIER="smoke", WORLD_SIZES="4",
               HARNESS_RUN_ARGS=" ".join(map(shlex.quote, SELECTORS)) + " --no-bench")
    env["PATH"] = f"{shim.parent}{os.pathsep}{env['PATH']}"
    before = cluster.traffic("n2")
    out = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2",
                          "--gpus-per-node=0", "--export=ALL", f"--output={tmp}/job-%j.out",
                          "ci/slurm/nightly.sbatch"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    from slurm_cluster import wait_for_job

    fields = wait_for_job(cluster.env, job, 300)
    log = "".join(p.read_text() for p in tmp.glob("job-*.out"))
    if PMI1_CUT_ADVICE in log:  # the harness stopped the job and said why, in one line
        pytest.skip(_PMI_CUT_SKIP)
    run_dirs = [p.parent for p in (history / "runs" / job).glob("*/run.json")]
    return {"job": fields, "log": log, "history": history, "run_dirs": run_dirs,
            "crossed": cluster.traffic("n2") - before}


class OneNodeRun:
    """The same cases at world size 4 on this machine alone (mpiexec, no SLURM), started in
    the background when first asked for: the node-loss test starts it while SLURM takes
    seconds to notice the loss, with the CPUs idle."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.proc = tmp, None

    def start(self) -> None:
        if self.proc is not None:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
        with open(self.tmp / "out.txt", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness", "run", *SELECTORS, "--world-sizes", "4",
                 "--no-bench", "--db", str(self.tmp / "h.db")],
                cwd=self.tmp, env=env, stdout=log, stderr=subprocess.STDOUT)

    def run_dir(self) -> Path:
        self.start()
        assert self.proc.wait(timeout=300) == 0, (self.tmp / "out.txt").read_text()[-4000:]
        (run_dir,) = [p.parent for p in (self.tmp / "runs").glob("*/run.json")]
        return run_dir

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def one_node_run(tmp_path_factory):
    run = OneNodeRun(tmp_path_factory.mktemp("one-node"))
    yield run
    run.stop()


def test_a_node_lost_mid_run_ends_it_in_one_line_and_resume_finishes_it(two_node_cluster,
                                                                         one_node_run, tmp_path):
    cluster = two_node_cluster
    flag = tmp_path / "stall"
    flag.touch()
    env = _env(cluster, HARNESS_TEST_STALL=str(flag))
    db = str(tmp_path / "h.db")
    # torch's result is recorded, then every rank waits in the stall implementation while
    # n2 goes; mpi would come after it
    # a job stuck in its start-up is stopped after 60 s and tried again inside the wait
    # below (a CI run once sat there for minutes); one whose PMI-1 wire-up requests srun's
    # pmi2 plugin cut at 1024 bytes ("value not properly terminated") is stopped at once
    run = [sys.executable, "-m", "harness", "run", SELECTORS[0], "--world-sizes", "4",
           "--no-bench", "--launcher", "srun", "--impl", "torch", "--impl", STALL, "--impl",
           "mpi", "--db", db, "--stall-timeout", "60"]
    proc = subprocess.Popen(run, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        progress = None
        deadline = time.monotonic() + 240  # two start-ups of 60 s and their cases
        while time.monotonic() < deadline and proc.poll() is None:
            progress = next((tmp_path / "runs").glob("*/w4.progress.json"), None) \
                if (tmp_path / "runs").is_dir() else None
            if progress is not None and STALL in progress.read_text():
                break
            time.sleep(0.1)
        else:
            # said with what the run, its ranks and the nodes wrote, once the run is stopped
            # (communicate() on a run still going would wait for it)
            proc.kill()
            out, err = proc.communicate(timeout=60)
            if PMI1_CUT_ADVICE in err:
                # the harness did its part (stopped the job as slurmstepd cut the requests,
                # said so in one line); MPI never wired up, so no node can be lost mid-case
                pytest.skip(_PMI_CUT_SKIP)
            pytest.fail(f"the stalling case did not begin within 240 s; harness run: "
                        f"{out[-1500:]}{err[-1500:]}\n{_launch_logs(tmp_path)}\n"
                        + "\n".join(cluster._logs(name) for name in ("ctl", "n1", "n2")))
        cluster.kill_node("n2")
        one_node_run.start()  # the next test's, while slurmctld notices (CPUs idle)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if "n2" not in cluster.running():
            cluster.start_node("n2")
    run_dir = progress.parent
    lost_launch = _launches(run_dir)[-1]
    if lost_launch.name != "w4.launch-1.log":
        warnings.warn("the node-loss run's first srun job was stopped, stuck before its "
                      f"first case:\n{_launch_logs(tmp_path)}", stacklevel=1)
    assert proc.returncode == 4, out[-2000:] + err[-2000:]
    # one line (folded only by the console's width) names the node, the case it was in and
    # how to finish
    lines = err.split("infrastructure error: ")[1:]
    assert len(lines) == 1, err
    said = " ".join(lines[0].split())
    assert said.startswith(f"world size 4: SLURM lost node n2 during {SELECTORS[0]}@{STALL}")
    assert "1 of 3 case(s) at this size were recorded" in said
    assert f"`harness run --resume {run_dir.name}`" in said
    # the result written before the loss is kept and stored; the case in progress is not
    # recorded as the case's failure
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM runs").fetchall() == [("infra_error",)]
        assert conn.execute("SELECT impl, status FROM results").fetchall() == [("torch",
                                                                                 "pass")]
    assert "srun: error: Node failure on n2" in lost_launch.read_text()
    # on the healthy cluster, --resume runs the other two there (with the run's own launcher,
    # srun, not given again) and completes the run
    flag.unlink()
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", run_dir.name,
                          "--db", db],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM runs").fetchall() == [("complete",)]
        assert sorted(conn.execute("SELECT impl, status FROM results").fetchall()) == [
            (STALL, "pass"), ("mpi", "pass"), ("torch", "pass")]
    # the lost launch's log is kept beside the one that finished the run, on both nodes
    *_, lost, resumed = _launches(run_dir)
    assert lost == lost_launch and "Node failure on n2" in lost.read_text()
    assert " --mpi=pmi2 -n 4 " in resumed.read_text().splitlines()[0]
    placement = json.loads((run_dir / "w4.placement.json").read_text())
    assert placement["nodes"] == ["n1", "n1", "n2", "n2"]


def test_a_run_over_two_nodes_puts_two_ranks_on_each_and_matches_a_one_node_run(
        night, one_node_run):
    (run_dir,) = night["run_dirs"]
    launch = (run_dir / "w4.launch-1.log").read_text().split()  # "$ /usr/bin/srun ..."
    assert Path(launch[1]).name == "srun" and launch[2:5] == ["--mpi=pmi2", "-n", "4"], launch
    placements = sorted(run_dir.glob("w*.placement.json"))
    assert [p.name for p in placements] == ["w4.placement.json"]
    for path in placements:
        placement = json.loads(path.read_text())
        # what the ranks gathered: their node (MPI's processor name), their rank in the
        # node-local communicator and its size
        assert placement["nodes"] == ["n1", "n1", "n2", "n2"], placement
        assert placement["local_ranks"] == [0, 1, 0, 1]
        assert placement["local_sizes"] == [2, 2, 2, 2]
        assert placement["backend"] == "gloo" and placement["devices"] == ["cpu"] * 4
    one_node = one_node_run.run_dir()
    single = json.loads((one_node / "w4.placement.json").read_text())
    assert len(set(single["nodes"])) == 1 and single["local_sizes"] == [4] * 4
    # the same cases, statuses and output bits as on one node
    two = _results(run_dir)
    assert {status for _, _, status, _ in two} == {"pass"}
    assert {case for case, *_ in two} == set(SELECTORS)
    assert two == _results(one_node)
    # and the allreduce of 65539 float32 values did cross the bridge, both ways, not through
    # shared memory
    assert night["crossed"] > 2 * 65539 * 4, night["crossed"]


def test_the_nightly_batch_script_runs_on_two_nodes_ingests_and_renders(night):
    job = night["job"]
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), night["log"][-4000:]
    assert job["NodeList"] == "n[1-2]" and job["NumNodes"] == "2"
    assert "harness report exited 0" in night["log"]
    history = night["history"]
    with sqlite3.connect(history / "history.db") as conn:
        rows = conn.execute("SELECT world_size, status FROM results").fetchall()
        runs = conn.execute("SELECT status, argv FROM runs").fetchall()
    assert [status for status, _ in runs] == ["complete"]
    argv = json.loads(runs[0][1])
    assert argv[argv.index("--launcher") + 1] == "srun"
    assert len(rows) == len(_results(night["run_dirs"][0])) and set(rows) == {(4, "pass")}
    assert (history / "site" / "index.html").is_file()


def _gathered(night) -> list[RankFacts]:
    """The facts the two-node ranks reported of themselves, as placement reads them."""
    (run_dir,) = night["run_dirs"]
    p = json.loads((run_dir / "w4.placement.json").read_text())
    return [RankFacts(node, local_rank, cpus=tuple(cpus), local_size=size)
            for node, local_rank, size, cpus in zip(p["nodes"], p["local_ranks"],
                                                   p["local_sizes"], p["cpus"], strict=True)]


def _with_gpus(facts: list[RankFacts], per_node: int, bound: bool = False) -> list[RankFacts]:
    """The same ranks on nodes with ``per_node`` GPUs each (UUIDs unique across nodes): every
    rank sees its node's GPUs, or, ``bound`` (srun --gpus-per-task=1), the one it was given."""
    out = []
    for f in facts:
        gpus = tuple(GpuFacts(f"GPU-{f.node}-{i}", "H100") for i in range(per_node))
        if bound:
            gpus = (GpuFacts(f"GPU-{f.node}-{f.local_rank}", "H100"),)
        out.append(RankFacts(f.node, f.local_rank, gpus, "2.13.0+cu130", "13.0",
                             cpus=f.cpus, local_size=f.local_size))
    return out


def test_the_multi_node_decisions_from_what_the_two_node_ranks_gathered(night):
    facts = _gathered(night)
    # two hosts, each with its own node-local communicator of two ranks
    assert sorted({f.node for f in facts}) == ["n1", "n2"]
    assert all(f.local_size == sum(g.node == f.node for g in facts) for f in facts)
    # what the ranks decided without GPUs
    assert {place("auto", facts, r).backend for r in range(4)} == {"gloo"}
    # with 2 GPUs per node by enumeration: each node's ranks take cuda:0 and cuda:1, four
    # distinct GPUs, nccl on every rank
    two = _with_gpus(facts, 2)
    placements = [place("auto", two, r) for r in range(4)]
    assert [p.device for p in placements] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert {p.backend for p in placements} == {"nccl"} and not placements[0].warning
    assert len({p.gpu_uuid for p in placements}) == 4
    assert contention(two, placements) == ""
    # bound one GPU per rank: every rank on its device 0, still nccl
    bound = [place("auto", _with_gpus(facts, 2, bound=True), r) for r in range(4)]
    assert {p.device for p in bound} == {"cuda:0"} and {p.backend for p in bound} == {"nccl"}
    # one GPU per node: each node's two ranks share it, so gloo, said per node
    one = _with_gpus(facts, 1)
    shared = [place("auto", one, r) for r in range(4)]
    assert {p.backend for p in shared} == {"gloo"}
    assert "ranks 0-1 on GPU GPU-n1-0; ranks 2-3 on GPU GPU-n2-0" in shared[0].warning
    assert contention(one, shared) == "ranks 0-1 share GPU GPU-n1-0; ranks 2-3 share GPU GPU-n2-0"
    # the launcher's view of the same job: srun in a two-node allocation is not one node, so
    # ranks outnumbering this machine's CPUs are not told to wait politely
    cfg = LaunchConfig(launcher="/usr/bin/srun", run_dir=Path("."), run_id="x")
    allocation = {"SLURM_JOB_NUM_NODES": "2"}
    assert not one_node(cfg, allocation)
    assert wait_environment(4, 2, one_node(cfg, allocation)) == {}
