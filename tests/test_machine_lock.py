"""The suite runs in parallel (tests/helpers/machine_lock.py): a test marked ``alone`` runs
with no other test beside it, in a real pytest-xdist run of two workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).parent / "helpers"

# one module per worker (--dist loadfile): the one alone, the other's tests say when they ran
ALONE = '''
import json, os, time, pytest

@pytest.mark.alone
def test_alone():
    start = time.time()
    open(os.environ["SPANS"] + ".started", "w").close()
    time.sleep(1.0)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps(["alone", start, time.time()]) + "\\n")
'''
BESIDE = '''
import json, os, time, pytest

@pytest.mark.parametrize("i", range(16))
def test_beside(i):
    start = time.time()
    if i == 0 and os.environ.get("WAIT_FOR_ALONE"):  # a worker slow to start cannot hide it
        deadline = time.time() + 60
        while not os.path.exists(os.environ["SPANS"] + ".started") and time.time() < deadline:
            time.sleep(0.01)
    time.sleep(0.2)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps(["beside", start, time.time()]) + "\\n")
'''


def _spans(tmp_path: Path, *plugins: str, **env_vars: str) -> list[tuple[str, float, float]]:
    (tmp_path / "test_a.py").write_text(ALONE)
    (tmp_path / "test_b.py").write_text(BESIDE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = alone\n")
    spans = tmp_path / "spans.jsonl"
    env = {**os.environ, "SPANS": str(spans), "PYTHONPATH": str(HELPERS), **env_vars}
    env.pop("KERNEL_HARNESS_TEST_LOCK", None)  # this run's own lock, not the outer suite's
    args = [a for p in plugins for a in ("-p", p)]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", "pytest.ini", "--rootdir", str(tmp_path), *args, "-n", "2",
                          "--dist", "loadfile", "test_a.py", "test_b.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [tuple(json.loads(line)) for line in spans.read_text().splitlines()]


def _overlaps(spans: list[tuple[str, float, float]]) -> int:
    (alone,) = [s for s in spans if s[0] == "alone"]
    return sum(1 for s in spans if s[0] == "beside" and s[1] < alone[2] and alone[1] < s[2])


def test_a_test_marked_alone_runs_with_no_other_beside_it(tmp_path):
    spans = _spans(tmp_path, "machine_lock")
    assert len(spans) == 17 and _overlaps(spans) == 0, spans


def test_without_the_lock_the_two_workers_overlap(tmp_path):
    """The control: the same run without the plugin, which the check above must catch (the
    other worker's first test waits for the alone one to begin, however late its worker)."""
    assert _overlaps(_spans(tmp_path, WAIT_FOR_ALONE="1")) > 0


def test_the_modules_begun_first_are_modules_of_the_suite() -> None:
    """A renamed or removed module left in LONGEST would silently lose its place."""
    from machine_lock import LONGEST

    here = Path(__file__).parent
    assert len(set(LONGEST)) == len(LONGEST)
    assert [m for m in LONGEST if not (here / m).is_file()] == []
