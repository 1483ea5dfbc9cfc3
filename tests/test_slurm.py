"""The SLURM pipeline on a real single-node cluster (tests/helpers/slurm_cluster.py): the
nightly batch script through sbatch, its `harness run --launcher srun` at the world sizes the
allocation holds (1 and 4 of 4 tasks), and srun without a PMI the mpich wheel speaks, which
must stop."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# one case per implementation at each world size: enough to prove the ranks wired up
SELECTOR = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]"
pytestmark = pytest.mark.heavy  # a SLURM cluster brought up for the module: run apart, -m heavy


@pytest.fixture(scope="module")
def cluster():
    import slurm_cluster
    from services import start_or_skip

    c = start_or_skip(slurm_cluster.Cluster, slurm_cluster.Unavailable, "SLURM")
    yield c
    c.stop()


def _env(cluster, **extra: str) -> dict[str, str]:
    # the job runs the harness this test runs: its Python's scripts first on PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**cluster.env, "PATH": path, **extra}


def test_the_nightly_batch_script_runs_srun_at_the_allocations_sizes_and_reports(cluster,
                                                                                 tmp_path):
    history = tmp_path / "history"
    env = _env(cluster, HARNESS_HISTORY_DIR=str(history), HARNESS_DEVICE="cpu",
               HARNESS_TIER="smoke", HARNESS_RUN_ARGS=f"{SELECTOR} --no-bench")
    # --gpus-per-node=0: this cluster has no GPUs (the script asks for 8 per node); 4 tasks,
    # not the script's 8: the world sizes it runs are those the allocation holds, 1, 3 and 4
    # (8 ranks on 2 cores would cost this test a third of its time)
    out = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=0", "--ntasks-per-node=4",
                          "--export=ALL", f"--output={tmp_path}/job-%j.out",
                          "ci/slurm/nightly.sbatch"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from slurm_cluster import wait_for_job

    fields = wait_for_job(cluster.env, out.stdout.strip().split(";")[0])
    state, code = fields["JobState"], fields.get("ExitCode", "")
    log = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    assert "harness report exited 0" in log
    with sqlite3.connect(history / "history.db") as conn:
        rows = conn.execute("SELECT world_size, impl, status FROM results").fetchall()
        runs = conn.execute("SELECT status, argv FROM runs").fetchall()
    assert [status for status, _ in runs] == ["complete"]
    argv = json.loads(runs[0][1])
    assert argv[argv.index("--launcher") + 1] == "srun"  # srun inside the allocation
    assert {w for w, _, _ in rows} == {1, 2, 3, 4} and {s for *_, s in rows} == {"pass"}
    per_size = {w: sum(1 for x, _, _ in rows if x == w) for w in (1, 2, 3, 4)}
    assert per_size[1] == per_size[2] == per_size[3] == per_size[4] > 0  # once each, one job
    assert (history / "site" / "index.html").is_file()


def test_srun_without_a_pmi_the_ranks_speak_stops_instead_of_running_them_alone(cluster,
                                                                                  tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "run", SELECTOR, "--world-sizes",
                          "2", "--no-bench", "--launcher", "srun", "--launcher-args=--mpi=none",
                          "--db", str(tmp_path / "h.db")],
                         cwd=tmp_path, env=_env(cluster), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "started 2 processes but this one sees an MPI world of 1" in out.stderr
    with sqlite3.connect(tmp_path / "h.db") as conn:  # nothing recorded at a wrong size
        assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 0
