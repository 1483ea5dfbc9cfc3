"""The benchmark figures (benchmarks/results/*.json) and what is rendered from them: every file
holds the keys benchmarks/_figures.py writes and a commit this repository knows,
benchmarks/RESULTS.md and the README's headline table are in step with them, and every
benchmark that measures something records its figure."""

import ast
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))

import _figures  # noqa: E402
import render  # noqa: E402
import timed  # noqa: E402

#: benchmarks/*.py that measure nothing themselves, and why
EXEMPT = {
    "_figures.py": "the writer every benchmark calls",
    "render.py": "renders the figures into RESULTS.md and the README",
    "_faultkit.py": "the processes and checks benchmarks/faults.py injects faults with",
    "_fault_inputs.py": "the file and input faults benchmarks/faults.py injects",
    "mutants.py": "the mutator benchmarks/mutation_catch.py runs",
    "v1_rule.py": "the harness's previous history rule, a baseline regression_detection.py runs",
    "gpu_validation_summary.py": "prints what a GPU validation's history DB holds; its figures "
                                 "are docs/gpu-validation.md's",
}
COMMIT = re.compile(r"^[0-9a-f]{40}(-dirty)?$")


def _figure_files() -> list[Path]:
    files = sorted(RESULTS.glob("*.json"))
    assert files, "no benchmarks/results/*.json"
    return files


def test_every_figure_file_has_the_required_keys_with_sane_values():
    for path in _figure_files():
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert _figures.check(doc) == [], path.name
        assert doc["name"] == path.stem, path.name
        assert COMMIT.match(doc["commit"]), f"{path.name}: commit {doc['commit']!r}"
        assert re.match(r"^\d{4}-\d{2}-\d{2}$", doc["date"]), path.name
        value = doc["value"]
        if isinstance(value, str):
            assert 0 < len(value.strip()) <= 60, f"{path.name}: a short value, please"
        else:
            assert math.isfinite(value), path.name
        assert len(doc["figure"]) <= 200, f"{path.name}: say what is measured in one sentence"
    headline = [p.stem for p in _figure_files() if json.loads(p.read_text())["headline"]]
    assert 8 <= len(headline) <= 14, headline


def test_every_figure_names_a_commit_of_this_repository():
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT,
                            capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    commits = {json.loads(p.read_text())["commit"].removesuffix("-dirty"): p.name
               for p in _figure_files()}
    # one git call for all: `git cat-file -e` each, as a batch
    out = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, capture_output=True,
                         text=True, input="".join(f"{c}^{{commit}}\n" for c in commits),
                         check=True).stdout.splitlines()
    unknown = [commits[c] for c, line in zip(commits, out, strict=True) if "missing" in line]
    assert not unknown, f"figures whose commit git does not know: {unknown}"


def test_results_md_and_the_readme_are_in_step_with_the_figures(capsys):
    assert render.main(["--check"]) == 0, capsys.readouterr().err


def _copy_results(tmp_path: Path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    return copy


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def test_an_altered_value_makes_the_check_fail_and_names_the_stale_file(tmp_path, monkeypatch,
                                                                        capsys):
    """The negative control: the check reads the figures, it does not pass by itself."""
    copy = _copy_results(tmp_path)
    assert render.stale(copy) == []
    headline = next(p for p in sorted(copy.glob("*.json")) if json.loads(p.read_text())["headline"])
    _edit(headline, value="12345 / 6789")
    assert set(render.stale(copy)) == {render.RESULTS_MD, render.README}
    monkeypatch.setattr(render, "RESULTS_DIR", copy)
    assert render.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "benchmarks/RESULTS.md" in err and "README.md" in err

    copy = _copy_results(tmp_path / "other")
    other = next(p for p in sorted(copy.glob("*.json"))
                 if not json.loads(p.read_text())["headline"])
    _edit(other, value=0.5)
    assert render.stale(copy) == [render.RESULTS_MD]  # not shown in the README


def test_a_figure_missing_a_key_is_named(tmp_path):
    copy = _copy_results(tmp_path)
    doc = json.loads((copy / "smoke_tier.json").read_text())
    del doc["commit"]
    (copy / "smoke_tier.json").write_text(json.dumps(doc))
    with pytest.raises(render.FigureError, match=r"smoke_tier\.json: no 'commit'"):
        render.load(copy)


def test_the_readme_shows_the_headline_figures_in_short_rows():
    text = (ROOT / "README.md").read_text()
    table = text.split(render.BEGIN, 1)[1].split(render.END, 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ")][1:]
    headline = [p for p in _figure_files() if json.loads(p.read_text())["headline"]]
    assert len(rows) == len(headline)
    long = [r[:60] for r in rows if len(r) > 250]
    assert not long, f"README rows over 250 characters (shorten the figure or unit): {long}"


def test_every_benchmark_records_its_figure():
    """Each benchmarks/*.py that measures something imports record from _figures and calls
    it (under whatever name it imports it as)."""
    silent = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name in EXEMPT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module == "_figures"
                 for alias in node.names if alias.name == "record"}
        calls = {node.func.id for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        if not names & calls:
            silent.append(path.name)
    assert not silent, f"benchmarks that record no figure (call _figures.record): {silent}"
    gone = [name for name in EXEMPT if not (BENCHMARKS / name).is_file()]
    assert not gone, f"EXEMPT names files that are gone: {gone}"


def test_record_writes_a_figure_the_renderer_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("FIGURES_RESULTS", str(tmp_path))
    monkeypatch.setenv("FIGURES_MACHINE", "test box")
    path = _figures.record("t", figure="a test figure", value=1.5, unit="s",
                           command="python benchmarks/t.py", machine=_figures.machine(),
                           details={"n": 1}, headline=True)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "t.json" and _figures.check(doc) == []
    assert doc["machine"] == "test box" and doc["headline"] is True
    head = _figures.commit()
    assert doc["commit"] == head and (head == "unknown" or COMMIT.match(head))
    [fig] = render.load(tmp_path)
    assert "| **1.5 s** | test box, " in render.readme_table([fig])
    with pytest.raises(ValueError, match="'value' is bool"):
        _figures.record("t", figure="x", value=True, unit="s", command="c", machine="m")


@pytest.mark.parametrize("line, counts", [
    ("2089 passed, 50 skipped in 627.12s (0:10:27)\n", {"passed": 2089, "skipped": 50}),
    ("==== 1 failed, 3 passed, 1 error in 2.00s ====", {"failed": 1, "passed": 3, "errors": 1}),
    ("ok: 3 passed", {}),
])
def test_timed_reads_pytest_s_summary_line(line, counts):
    assert timed.pytest_counts(line) == counts


def test_timed_records_the_machine_s_yardstick_beside_the_wall_time(tmp_path, monkeypatch):
    """RESULTS.md shows beside the machine the seconds of a fixed workload (the best of runs before
    and after the command), so that wall times from a faster and a slower machine are told
    apart from faster and slower code."""
    monkeypatch.setenv("FIGURES_RESULTS", str(tmp_path))
    monkeypatch.setenv("FIGURES_MACHINE", "test box")
    code = timed.main(["t", "--figure", "a timed test", "--", sys.executable, "-c",
                       "print('1 passed in 0.01s')"])
    doc = json.loads((tmp_path / "t.json").read_text())
    speed = doc["details"]["yardstick_s"]
    assert code == 0 and doc["details"]["passed"] == 1 and 0 < speed < 60, doc
    [fig] = render.load(tmp_path)
    assert f"| test box (yardstick {speed:.2f} s) |" in render.results_md([fig])


def test_timed_without_torch_records_no_yardstick(tmp_path, monkeypatch):
    """Before a command that installs torch (``.ci/run`` on a fresh machine) there is no
    workload to time: the figure is recorded without it."""
    monkeypatch.setenv("FIGURES_RESULTS", str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)  # ``import torch`` raises ImportError
    assert _figures.yardstick() is None
    assert timed.main(["t", "--figure", "a timed test", "--", sys.executable, "-c", ""]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert "yardstick_s" not in doc["details"] and _figures.check(doc) == []
    [fig] = render.load(tmp_path)
    assert "yardstick" not in render.results_md([fig])
