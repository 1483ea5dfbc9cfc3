"""Issue 8's acceptance, end to end with the real CLI and real MPI ranks: the committed goldens
verify, an edited golden fails the case it belongs to (naming the golden), and a planted delay
is flagged as a regression by `harness run --fail-on regression` and `harness compare`, while
two runs of the same code are not."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from harness.core.golden import GoldenStore, default_dir, file_sha256
from tests.test_cli_integration import harness, rows

pytestmark = pytest.mark.mpi

CASE = "allreduce[dtype=f32,inplace=false,mode=random,n=4099,op=sum]"


def test_committed_goldens_verify(tmp_path):
    out = harness(tmp_path, "golden", "verify")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " 0 mismatch, 0 missing, 0 corrupt" in out.stdout


def _copy_goldens(tmp_path: Path) -> GoldenStore:
    root = tmp_path / "golden"
    shutil.copytree(default_dir(), root)
    return GoldenStore(root)


def _edit(store: GoldenStore, key: str, rank: int, update_sha: bool) -> Path:
    """Change one stored value of rank ``rank``; with ``update_sha`` the manifest is updated
    too (a deliberate edit), else the file no longer matches its sha256 (corruption)."""
    entry = store.manifest["entries"][key]
    path = store.path_of(entry)
    tensors = load_file(path)
    name = f"r{rank}/out"
    value = tensors[name].clone()
    value.view(-1)[7] += 1.0
    tensors[name] = value
    save_file(tensors, str(path))
    if update_sha:
        entry["sha256"] = file_sha256(path)
        store.save_manifest()
    return path


def test_an_edited_golden_fails_its_case_naming_the_golden(tmp_path):
    store = _copy_goldens(tmp_path)
    edited = _edit(store, f"w4:{CASE}", rank=2, update_sha=True)
    corrupt_case = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=max]"
    corrupt = _edit(store, f"w1:{corrupt_case}", rank=0, update_sha=False)
    out = harness(tmp_path, "run", CASE, corrupt_case, "--world-sizes", "1,4", "--no-bench",
                  "--golden-dir", str(store.root))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    results = rows(tmp_path / "h.db", "SELECT world_size, case_id, impl, status, reason "
                                      "FROM results")
    by = {(r["world_size"], r["case_id"]): r for r in results}
    for impl_row in (r for r in results if (r["world_size"], r["case_id"]) == (4, CASE)):
        assert impl_row["status"] == "fail"
        assert f"against the golden {edited}" in impl_row["reason"]
        assert "first at rank 2 index [7]" in impl_row["reason"]
    assert by[(1, corrupt_case)]["status"] == "error"
    assert str(corrupt) in by[(1, corrupt_case)]["reason"]
    assert "sha256" in by[(1, corrupt_case)]["reason"]
    # the same cases at the world sizes whose goldens were not touched still pass
    assert by[(1, CASE)]["status"] == "pass" and by[(4, corrupt_case)]["status"] == "pass"
    assert str(edited) in out.stdout.replace("\n", "")


def _timed_run(tmp_path: Path, delay: float):
    return harness(tmp_path, "run", CASE, "--world-sizes", "1", "--impl",
                   "harness_test_impls:sleepy", "--fail-on", "regression",
                   env={"HARNESS_TEST_DELAY_S": str(delay)})


@pytest.mark.alone  # runs compared with each other
def test_a_planted_delay_is_a_regression_and_the_same_code_is_not(tmp_path):
    first = _timed_run(tmp_path, 0.0)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    same = _timed_run(tmp_path, 0.0)
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-2000:]
    compare_same = harness(tmp_path, "compare", "--fail-on", "regression")
    assert compare_same.returncode == 0, compare_same.stdout[-3000:]

    slow = _timed_run(tmp_path, 0.01)  # 20 ms -> 30 ms: 50% slower
    # one slow run could be a bad night: the next run says whether the level moved
    assert slow.returncode == 0, slow.stdout[-3000:] + slow.stderr[-2000:]
    slow2 = _timed_run(tmp_path, 0.01)
    assert slow2.returncode == 3, slow2.stdout[-3000:] + slow2.stderr[-2000:]
    assert "REGRESSION" in slow2.stdout and "from run" in slow2.stdout
    ids = [re.search(r"run\s+([0-9a-f]{32})\s+stored", r.stdout).group(1) for r in (same, slow2)]
    compare_slow = harness(tmp_path, "compare", *ids, "--fail-on", "regression", "--json")
    assert compare_slow.returncode == 3, compare_slow.stdout[-3000:]
    findings = json.loads(compare_slow.stdout)
    flagged = [f for f in findings["findings"] if f["kind"] == "regression"]
    assert [f["case_id"] for f in flagged] == [CASE]
    assert flagged[0]["ratio"] > 1.3
