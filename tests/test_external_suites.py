"""Op suites from outside this repository: the example package in examples/example_ops, found
through --suite, its project file, or its installed entry point; name clashes and broken
suites; the project file's defaults; goldens kept in the suite's own repository; the public
import surface; the new-op scaffold; and tolerance sizing."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli.common import HarnessExit
from harness.cli.main import cli
from harness.core import project as project_mod
from harness.core.discovery import registry, use_suites
from harness.core.spec import SpecError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "example_ops"
SUITE = EXAMPLE / "example_ops"
BUILTIN_MANIFEST = ROOT / "suites" / "golden" / "manifest.json"
CONTROLS = ("rope_before_norm", "k_normed_with_q_weight", "no_shard_offset", "last_on_ties")


@pytest.fixture(autouse=True)
def _builtin_registry_after():
    """In-process CLI calls load suites into the shared registry: put it back after each."""
    yield
    use_suites([])


def harness(cwd: Path, *args: str, env: dict | None = None, timeout: float = 600):
    full_env = {k: v for k, v in os.environ.items() if k != "HARNESS_DB"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def invoke(monkeypatch: pytest.MonkeyPatch, cwd: Path, *args: str):
    """The CLI in this process (no MPI launch), run from ``cwd``."""
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("HARNESS_DB", raising=False)
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def refused(monkeypatch: pytest.MonkeyPatch, cwd: Path, *args: str) -> tuple[int, str]:
    """(exit code, message) of a CLI call from ``cwd`` that stops with a user error, as
    ``harness.cli.main`` would print it (one line)."""
    with pytest.raises(HarnessExit) as info:
        invoke(monkeypatch, cwd, *args)
    return info.value.code, str(info.value)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- the example, for real
@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> dict:
    """One real run of the example at world sizes 1 and 4 from outside its repository, with
    the torch implementations and every control, then its dashboard."""
    tmp = tmp_path_factory.mktemp("example")
    manifest_before = _sha(BUILTIN_MANIFEST)
    args = [a for impl in ("torch", *CONTROLS) for a in ("--impl", impl)]
    out = harness(tmp, "run", "--suite", str(SUITE), "--world-sizes", "1,4", "--no-bench",
                  "--db", str(tmp / "h.db"), *args)
    report = CliRunner().invoke(cli, ["report", "--suite", str(SUITE), "--db",
                                      str(tmp / "h.db"), "--out", str(tmp / "site")])
    with sqlite3.connect(tmp / "h.db") as conn:
        conn.row_factory = sqlite3.Row
        results = [dict(r) for r in conn.execute(
            "SELECT run_id, world_size, op, case_id, impl, status FROM results")]
    run_dir = next((tmp / "runs").iterdir())
    golden = {(r["world_size"], r["case_id"], r["impl"]): (r.get("golden") or {}).get("status")
              for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    return {"out": out, "report": report, "results": results, "golden": golden,
            "site": tmp / "site", "manifest_unchanged": _sha(BUILTIN_MANIFEST) == manifest_before}


@pytest.mark.mpi
def test_example_ops_pass_with_their_goldens_and_their_controls_fail(example_run):
    out = example_run["out"]
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # the controls fail
    by: dict[tuple[str, str, int], list[dict]] = {}
    for r in example_run["results"]:
        by.setdefault((r["op"], r["impl"], r["world_size"]), []).append(r)
    assert set(by) == {("example.qk_norm_rope", i, 1)
                       for i in ("torch", "rope_before_norm", "k_normed_with_q_weight")} | {
        ("example.tp_argmax", i, w) for i in ("torch", "no_shard_offset", "last_on_ties")
        for w in (1, 4)}
    for (_op, impl, w), got in by.items():
        statuses = {r["case_id"]: r["status"] for r in got}
        if impl == "torch":  # correct, and equal to the goldens stored in the example's repo
            assert set(statuses.values()) == {"pass"}, got
            assert {example_run["golden"][(w, c, impl)] for c in statuses} == {"pass"}
        elif impl == "no_shard_offset":  # the offset is 0 at one rank: a multi-rank bug
            assert set(statuses.values()) == ({"pass"} if w == 1 else {"fail"}), got
        elif impl == "last_on_ties":
            assert statuses == {c: "fail" if "values=ties" in c else "pass"
                                for c in statuses}, got
        else:
            assert set(statuses.values()) == {"fail"}, got
    assert example_run["manifest_unchanged"]  # suites/golden is not where they live


@pytest.mark.mpi
def test_the_dashboard_groups_the_example_ops_under_their_suite(example_run):
    assert example_run["report"].exit_code == 0, example_run["report"].output[-2000:]
    index = (example_run["site"] / "index.html").read_text()
    assert '<tr class="suite"><th colspan="6">suite example_ops</th></tr>' in index
    assert index.count('data-suite="example_ops"') == 2


# ---------------------------------------------------------------- finding suites
def test_the_project_file_gives_suites_world_sizes_and_flags_win(monkeypatch):
    out = invoke(monkeypatch, EXAMPLE, "list", "--json")
    assert out.exit_code == 0, out.output
    items = json.loads(out.output)
    assert {i["op"] for i in items} == {"example.qk_norm_rope", "example.tp_argmax"}
    assert {i["world_size"] for i in items} == {1, 4}  # world_sizes = [1, 4]
    assert {i["suite"] for i in items} == {"example_ops"}
    assert all(i["origin"].startswith(f"example_ops (listed in {EXAMPLE / 'pyproject.toml'}")
               for i in items)
    out = invoke(monkeypatch, EXAMPLE, "list", "--json", "--world-sizes", "4")
    assert {i["world_size"] for i in json.loads(out.output)} == {4}
    # a selector still reaches a built-in op from inside the project
    out = invoke(monkeypatch, EXAMPLE, "list", "--json", "hopper_tasks.rmsnorm")
    assert {i["op"] for i in json.loads(out.output)} == {"hopper_tasks.rmsnorm"}
    # a selection with nothing at the sizes asked for is refused as `run` refuses it
    code, message = refused(monkeypatch, EXAMPLE, "list", "--json", "strided_copy",
                            "--world-sizes", "4")
    assert code == 2 and "no case in tier 'smoke' at world sizes 4" in message
    assert "strided_copy runs at world size 1 only" in message


def test_list_names_the_suite_and_its_golden_directory(monkeypatch, tmp_path):
    out = invoke(monkeypatch, tmp_path, "list", "--suite", str(SUITE))
    assert out.exit_code == 0, out.output
    assert f"suite example_ops: --suite {SUITE}; goldens in {EXAMPLE / 'golden'}" in out.output
    assert "kernel-harness" not in out.output  # only the named suite's ops without selectors


@pytest.mark.parametrize("text, message", [
    ("[tool.harness]\nsuite = ['x']\n", "unknown key 'suite'; known keys: suites, golden_dir"),
    ("[tool.harness]\nworld_sizes = [0]\n", "world_sizes must be a list of positive integers"),
    ("[tool.harness]\ntier = 'weekly'\n", "tier 'weekly' is not one of smoke, nightly, stress"),
    ("[tool.harness\n", "cannot be read"),
])
def test_a_bad_project_file_is_exit_2_naming_the_key(monkeypatch, tmp_path, text, message):
    (tmp_path / "pyproject.toml").write_text(text)
    code, said = refused(monkeypatch, tmp_path, "list")
    assert code == 2 and message in said and str(tmp_path / "pyproject.toml") in said, said


def test_a_user_error_from_a_suite_is_one_line_on_stderr(tmp_path):
    (tmp_path / "harness.toml").write_text("suites = ['nowhere/ops.py']\n")
    out = harness(tmp_path, "list")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: listed in {tmp_path / 'harness.toml'}: {tmp_path / 'nowhere' / 'ops.py'}: no "
        "such file or directory; pass a .py file, a directory of suite modules, or an "
        "importable module name"]


def test_a_pyproject_without_the_table_is_passed_over_for_the_one_above(tmp_path):
    (tmp_path / "harness.toml").write_text('suites = ["ops/"]\ndb = "h.db"\n')
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    found = project_mod.find(inner)
    assert found is not None and found.path == tmp_path / "harness.toml"
    assert found.suites == [str(tmp_path / "ops")] and found.db == tmp_path / "h.db"


def _suite_file(path: Path, op: str, family: str = "mine") -> Path:
    path.write_text(
        "import torch\nfrom harness.api import OpSpec, case_tensor\n"
        f"SPECS = [OpSpec(name={op!r}, family={family!r}, reference=lambda x: x.clone(),\n"
        f"    make_inputs=lambda p, r, w: {{'x': case_tensor({op!r}, p, 'x', (4,))}},\n"
        "    grid={'smoke': [{'n': 4}]}, implementations={'torch': lambda x: x.clone()})]\n")
    return path


def test_an_op_name_taken_by_a_built_in_op_is_exit_2(monkeypatch, tmp_path):
    _suite_file(tmp_path / "clash.py", "allreduce")
    code, said = refused(monkeypatch, tmp_path, "list", "--suite", "clash.py")
    assert code == 2, said
    assert "op 'allreduce' is defined twice: family mine of suite clash (--suite" in said
    assert "kernel-harness (built-in)" in said and "rename one" in said


def test_two_suites_defining_one_op_clash(monkeypatch, tmp_path):
    _suite_file(tmp_path / "one.py", "mine.copy")
    (tmp_path / "b").mkdir()
    _suite_file(tmp_path / "b" / "two.py", "mine.copy")
    code, said = refused(monkeypatch, tmp_path, "list", "--suite", "one.py", "--suite",
                         "b/two.py")
    assert code == 2 and "op 'mine.copy' is defined twice" in said, said


@pytest.mark.parametrize("body, message", [
    ("import no_such_module\n", "broken.py failed to import: ModuleNotFoundError"),
    ("SPECS = 3\n", "gives int, not a list of OpSpec"),
    ("SPECS = ['x']\n", "SPECS holds str, not OpSpec"),
    ("X = 1\n", "defines no SPECS"),
])
def test_a_broken_suite_names_itself(monkeypatch, tmp_path, body, message):
    (tmp_path / "broken.py").write_text(body)
    code, said = refused(monkeypatch, tmp_path, "list", "--suite", "broken.py")
    assert code == 2 and message in said, said


def test_an_installed_suite_is_found_through_its_entry_point(monkeypatch, tmp_path):
    """pip installs the example (its own pyproject); the harness finds it by the entry point
    harness.suites, with no flag and no project file."""
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", str(target),
                          str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    for leftover in ("build", "harness_example_ops.egg-info"):  # setuptools' by-products
        shutil.rmtree(EXAMPLE / leftover, ignore_errors=True)
    monkeypatch.syspath_prepend(str(target))  # importlib.metadata reads sys.path's dist-info
    out = invoke(monkeypatch, tmp_path, "list", "--json", "example.*")
    assert out.exit_code == 0, out.output
    origins = {i["origin"] for i in json.loads(out.output)}
    assert origins == {"example_ops (entry point example_ops in harness-example-ops)"}
    # a broken plugin beside it names itself
    dist = target / "broken_ops-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ops\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[harness.suites]\nbroken = no_such_pkg.ops\n")
    with pytest.raises(SpecError) as info:  # the registry is built once per process
        registry(reload=True)
    assert "entry point broken in broken-ops (no_such_pkg.ops, group harness.suites) failed " \
           "to load: ModuleNotFoundError" in str(info.value)
    monkeypatch.undo()
    for name in [n for n, m in sys.modules.items()  # the installed copy's modules
                 if str(getattr(m, "__file__", "") or "").startswith(str(target))]:
        del sys.modules[name]
    registry(reload=True)


def test_an_editable_install_listed_in_its_project_file_is_one_suite(monkeypatch, tmp_path):
    """pip install -e . of the example plus its own [tool.harness] table: the entry point
    (here under another name) and the project file find the same modules, which must make
    one suite, not a clash of every op with itself."""
    dist = tmp_path / "harness_example_ops-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-example-ops\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text("[harness.suites]\nexample_alias = example_ops\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE))  # what the editable install's .pth does
    out = invoke(monkeypatch, EXAMPLE, "list", "--json")
    assert out.exit_code == 0, out.output
    items = json.loads(out.output)
    assert {i["suite"] for i in items} == {"example_alias"}
    assert {i["op"] for i in items} == {"example.qk_norm_rope", "example.tp_argmax"}
    assert registry().golden_dir_of("example.tp_argmax") == EXAMPLE / "golden"
    monkeypatch.undo()
    registry(reload=True)


# ---------------------------------------------------------------- goldens
def test_golden_generate_writes_only_the_selected_suites_goldens(monkeypatch, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("golden", "__pycache__"))
    (repo / "example_ops").rename(repo / "copied_ops")  # its own package name: no clash
    text = (repo / "pyproject.toml").read_text().replace('"example_ops/"', '"copied_ops/"')
    (repo / "pyproject.toml").write_text(text)
    for spec in (repo / "copied_ops").rglob("reference.py"):
        spec.write_text(spec.read_text().replace('OP = "example.', 'OP = "copy.'))
    before = _sha(BUILTIN_MANIFEST)
    out = invoke(monkeypatch, repo, "golden", "generate")
    assert out.exit_code == 0, out.output
    assert "7 new" in out.output and str(repo / "golden" / "manifest.json") in out.output
    entries = json.loads((repo / "golden" / "manifest.json").read_text())["entries"]
    assert {e["op"] for e in entries.values()} == {"copy.qk_norm_rope", "copy.tp_argmax"}
    assert _sha(BUILTIN_MANIFEST) == before
    out = invoke(monkeypatch, repo, "golden", "verify")
    assert out.exit_code == 0 and "7 ok" in out.output, out.output


def test_the_example_goldens_verify(monkeypatch):
    out = invoke(monkeypatch, EXAMPLE, "golden", "verify")
    assert out.exit_code == 0 and "7 ok" in out.output, out.output


# ---------------------------------------------------------------- the public surface
def _harness_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "harness" or n.startswith("harness.")}


def test_external_suites_import_the_harness_only_through_harness_api(tmp_path):
    from harness.cli import scaffold

    files = {p: p.read_text() for p in EXAMPLE.rglob("*.py")}
    for rel, text in scaffold.op_files("ops", "softmax", "ops.softmax").items():
        files[tmp_path / rel] = text
    for rel, text in scaffold.op_files("ops", "tp", "ops.tp", distributed=True).items():
        files[tmp_path / rel] = text
    for distributed in (False, True):
        files[tmp_path / f"test_{distributed}.py"] = scaffold.test_file(
            "ops", "tp", "ops.tp", distributed)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(text)
        assert _harness_imports(path) <= {"harness.api"}, path


def test_the_built_in_suites_import_the_harness_only_through_harness_api():
    """The built-in suites are written as a user's would be: what they need is on the public
    surface, or it is not there for anyone."""
    root = Path(__file__).resolve().parent.parent / "suites"
    paths = sorted(root.rglob("*.py"))
    assert len(paths) > 20
    for path in paths:
        assert _harness_imports(path) <= {"harness.api"}, (path, _harness_imports(path))


def test_harness_api_names_what_it_exports():
    import harness.api as api

    assert sorted(api.__all__) == sorted(set(api.__all__))
    for name in api.__all__:
        assert getattr(api, name) is not None, name
        assert name in api.__doc__, f"harness.api's docstring does not describe {name}"


# ---------------------------------------------------------------- new-op and tolerance
@pytest.mark.mpi
def test_new_op_scaffolds_an_op_that_runs_and_whose_control_fails(monkeypatch, tmp_path):
    repo = tmp_path / "myrepo"
    repo.mkdir()
    out = invoke(monkeypatch, repo, "new-op", "fused_softmax")
    assert out.exit_code == 0, out.output
    assert (repo / "harness.toml").is_file() and (repo / "ops" / "fused_softmax" / "spec.py")
    code, said = refused(monkeypatch, repo, "new-op", "fused_softmax")
    assert code == 2 and "exists already" in said
    run = harness(repo, "run", "--impl", "torch", "--impl", "no_max_shift", "--no-bench",
                  "--no-golden")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    with sqlite3.connect(repo / "harness-results" / "history.db") as conn:
        got = dict(((impl, case), status) for impl, case, status in conn.execute(
            "SELECT impl, case_id, status FROM results"))
    assert got == {("torch", "ops.fused_softmax[cols=1000,rows=4,scale=1.0]"): "pass",
                   ("torch", "ops.fused_softmax[cols=257,rows=3,scale=100.0]"): "pass",
                   ("no_max_shift", "ops.fused_softmax[cols=1000,rows=4,scale=1.0]"): "pass",
                   ("no_max_shift", "ops.fused_softmax[cols=257,rows=3,scale=100.0]"): "fail"}
    # the scaffold's own tests, called here as pytest would
    assert _run_scaffolded_tests(monkeypatch, repo, "fused_softmax", tmp_path) == 2
    assert (repo / "conftest.py").is_file()
    assert (repo / ".gitignore").read_text().splitlines()[1:] == ["harness-results/",
                                                                    ".benchmarks/"]


def _run_scaffolded_tests(monkeypatch, repo: Path, name: str, tmp_path: Path) -> int:
    """Call the test functions new-op wrote for op ``name`` as pytest would (its suite
    importable, as the conftest.py it wrote makes it; a ``tmp_path`` argument given a fresh
    directory); how many there were."""
    import inspect

    monkeypatch.syspath_prepend(str(repo))
    spec = importlib.util.spec_from_file_location(
        f"scaffolded_test_{name}", repo / "tests" / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        tests = [f for test, f in vars(module).items() if test.startswith("test_")]
        for i, test in enumerate(tests):
            if "tmp_path" in inspect.signature(test).parameters:
                (tmp_path / str(i)).mkdir()
                test(tmp_path=tmp_path / str(i))
            else:
                test()
    finally:  # "ops" is the scaffold's default package name: leave no module behind
        for mod in [m for m in sys.modules if m == "ops" or m.startswith("ops.")]:
            del sys.modules[mod]
    return len(tests)


@pytest.mark.mpi
@pytest.mark.heavy  # two launches of a scaffolded repository: 10 s of the everyday budget
def test_new_op_distributed_passes_at_one_and_four_ranks_and_its_control_fails_at_four(
        monkeypatch, tmp_path):
    """The --distributed scaffold for real: `harness run` from the repository it wrote runs
    the project file's world sizes (1 and 4) through mpiexec; the implementation passes
    everywhere, the control (its sum never all-reduced) passes at 1 and fails at 4; then the
    tests it wrote, which launch 4 ranks themselves."""
    repo = tmp_path / "myrepo"
    repo.mkdir()
    out = invoke(monkeypatch, repo, "new-op", "vocab_softmax", "--distributed")
    assert out.exit_code == 0, out.output
    assert project_mod.find(repo).world_sizes == [1, 4]
    assert "wrote .gitignore: harness-results/, .benchmarks/" in out.output
    assert "--world-sizes 1,4 --impl no_sum_reduce" in out.output
    run = harness(repo, "run", "--impl", "torch", "--impl", "no_sum_reduce", "--no-bench",
                  "--no-golden")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    with sqlite3.connect(repo / "harness-results" / "history.db") as conn:
        got = {(impl, w, case): status for impl, w, case, status in conn.execute(
            "SELECT impl, world_size, case_id, status FROM results")}
    cases = ("ops.vocab_softmax[cols=1024,rows=4,scale=1.0]",
             "ops.vocab_softmax[cols=260,rows=3,scale=100.0]")
    assert got == {(impl, w, case): "fail" if (impl, w) == ("no_sum_reduce", 4) else "pass"
                   for impl in ("torch", "no_sum_reduce") for w in (1, 4) for case in cases}
    (tmp_path / "scaffolded").mkdir()
    assert _run_scaffolded_tests(monkeypatch, repo, "vocab_softmax",
                                 tmp_path / "scaffolded") == 4


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_new_op_distributed_refuses_a_taken_name_and_writes_nothing(monkeypatch, tmp_path):
    out = invoke(monkeypatch, tmp_path, "new-op", "fused_softmax")
    assert out.exit_code == 0, out.output
    # the project file runs world size 1 only (the first op's): a distributed op says so
    out = invoke(monkeypatch, tmp_path, "new-op", "other_softmax", "--distributed")
    assert out.exit_code == 0, out.output
    assert "add 4 to its world_sizes" in out.output
    (tmp_path / ".gitignore").unlink()  # not written again either
    before = _tree(tmp_path)
    code, said = refused(monkeypatch, tmp_path, "new-op", "fused_softmax", "--distributed")
    assert code == 2 and "exists already" in said and "nothing was written" in said
    assert _tree(tmp_path) == before


def test_new_op_writes_a_gitignore_or_adds_only_the_lines_it_lacks(monkeypatch, tmp_path):
    from harness.cli import scaffold

    text, added = scaffold.gitignore(None)
    assert added == ["harness-results/", ".benchmarks/"]
    assert [line for line in text.splitlines() if not line.startswith("#")] == added
    # a file with its own rule for harness-results (another spelling, no final newline)
    (tmp_path / ".gitignore").write_text("__pycache__/\n/harness-results")
    out = invoke(monkeypatch, tmp_path, "new-op", "fused_softmax")
    assert out.exit_code == 0, out.output
    assert "added to .gitignore: .benchmarks/ (" in out.output
    expected = "__pycache__/\n/harness-results\n.benchmarks/\n"
    assert (tmp_path / ".gitignore").read_text() == expected
    # a second op: nothing left to add, and nothing said
    out = invoke(monkeypatch, tmp_path, "new-op", "other_softmax", "--distributed")
    assert out.exit_code == 0, out.output
    assert ".gitignore" not in out.output
    assert (tmp_path / ".gitignore").read_text() == expected
    # a DB the project file keeps inside the repository is the team's to commit or not
    (tmp_path / "harness.toml").write_text('suites = ["ops/"]\ndb = "history/h.db"\n')
    out = invoke(monkeypatch, tmp_path, "new-op", "third_softmax")
    assert out.exit_code == 0, out.output
    assert "the history DB is history/h.db" in out.output and "history/runs/" in out.output


@pytest.mark.parametrize("name", ["fused-softmax", "class", "import"])
def test_new_op_refuses_a_name_that_is_not_an_identifier(monkeypatch, tmp_path, name):
    # a keyword made ops/class/, and every later command of the repository a SyntaxError
    code, said = refused(monkeypatch, tmp_path, "new-op", name)
    assert code == 2 and "must be a Python identifier" in said and not any(tmp_path.iterdir())


def test_tolerance_reports_the_room_between_implementations_and_controls(monkeypatch):
    out = invoke(monkeypatch, EXAMPLE, "tolerance", "example.qk_norm_rope", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    worst = {(w["impl"], w["output"]): w["use"] for w in data["worst"]}
    assert worst[("torch", "q")] < 1 and worst[("torch", "k")] < 1
    # each control's furthest reach, over its outputs: far past the edge
    reach = {w["impl"]: w["use"] for w in data["worst"] if w["control"]}
    assert set(reach) == {"rope_before_norm", "k_normed_with_q_weight"}
    assert min(reach.values()) > 10
    assert data["controls_caught"] == {"rope_before_norm": True,
                                       "k_normed_with_q_weight": True}


def test_tolerance_fails_a_correct_looking_variant_that_crosses_the_edge(monkeypatch,
                                                                           tmp_path):
    """A variant given as module:callable is measured too: one 5% off on q crosses the
    tolerance, and the command says so with exit 1."""
    (tmp_path / "variants.py").write_text(
        "import torch\n"
        "from example_ops.qk_norm_rope.reference import qk_norm_rope\n"
        "def perturbed(**kw):\n"
        "    out = qk_norm_rope(**kw)\n"
        "    return {'q': (out['q'].float() * 1.05).to(out['q'].dtype), 'k': out['k']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = invoke(monkeypatch, EXAMPLE, "tolerance", "example.qk_norm_rope", "--impl",
                 "variants:perturbed", "--json")
    assert out.exit_code == 1, out.output
    data = json.loads(out.output)
    assert data["failing_implementations"] == ["variants:perturbed"]
    q = next(w for w in data["worst"] if w["output"] == "q")
    assert q["use"] > 1


@pytest.mark.mpi
def test_tolerance_at_four_ranks_measures_a_distributed_op_where_its_bugs_show(monkeypatch):
    # one case (the ties one catches both controls): the launch, not the cases, is under test
    out = invoke(monkeypatch, EXAMPLE, "tolerance", "example.tp_argmax", "--world-sizes", "4",
                 "--case", "*values=ties*", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["rows"] and all(r["case_id"].startswith("w4:") for r in data["rows"])
    assert data["controls_caught"] and all(data["controls_caught"].values())
    assert all(w["use"] < 1 for w in data["worst"] if not w["control"])


def test_registry_is_back_to_the_built_in_suites():
    assert {registry().suite_of[s.name] for s in registry().select([], "smoke")} == {
        "kernel-harness"}
