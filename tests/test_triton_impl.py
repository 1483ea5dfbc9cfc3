"""Triton implementations (harness.device.triton_impl): the decisions as plain functions, and the
example of docs/cuda-and-triton.md through a real `harness run` with `--impl path.py:fn`,
beside a wrong kernel of the kind a new user writes. The built-in kernels pass and their
controls fail in the real runs of tests/test_negative_controls.py (the controls run) and
tests/test_cli_integration.py (the strided copy's stress runs)."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.spec import SpecError, load_callable
from harness.device import triton_impl

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: "
                                  "pip install -e '.[triton]'")

def test_a_cpu_rank_interprets_and_a_gpu_rank_compiles_unless_asked():
    assert triton_impl.interprets("cpu", {})
    assert triton_impl.interprets("meta", {})
    assert not triton_impl.interprets("cuda", {})
    assert triton_impl.interprets("cuda", {"TRITON_INTERPRET": "1"})  # debugging on a GPU
    assert not triton_impl.interprets("cuda", {"TRITON_INTERPRET": "0"})
    env: dict[str, str] = {}
    triton_impl.configure_rank("cuda", env)
    assert env == {}  # a GPU rank's environment gets nothing
    triton_impl.configure_rank("cpu", env)
    assert env == {"TRITON_INTERPRET": "1"}


def test_the_launcher_sets_the_interpreter_before_a_cpu_rank_imports_triton():
    guess = {"TRITON_INTERPRET": "1", "HARNESS_TRITON_INTERPRET_GUESS": "1"}
    assert triton_impl.launcher_environment("cpu", 8, {}) == guess
    assert triton_impl.launcher_environment("auto", 0, {}) == guess
    assert triton_impl.launcher_environment("auto", 8, {}) == {}
    assert triton_impl.launcher_environment("cuda", 0, {}) == {}
    assert triton_impl.launcher_environment("cpu", 0, {"TRITON_INTERPRET": "0"}) == {}
    # a rank of another host that has a GPU undoes the guess; a CPU rank keeps it
    gpu_rank, cpu_rank = dict(guess), dict(guess)
    triton_impl.configure_rank("cuda", gpu_rank)
    triton_impl.configure_rank("cpu", cpu_rank)
    assert gpu_rank == {} and cpu_rank["TRITON_INTERPRET"] == "1"
    # the user's own setting on a GPU rank (to debug a kernel there) stays
    user = {"TRITON_INTERPRET": "1"}
    triton_impl.configure_rank("cuda", user)
    assert user == {"TRITON_INTERPRET": "1"}


def test_only_triton_implementations_are_marked_interpreted():
    def plain_torch(x):
        return x

    impl = triton_impl.TritonImplementation("suites._triton.hopper:rmsnorm")
    assert triton_impl.interpreter_of(impl, "cpu", {}) == "triton"
    assert triton_impl.interpreter_of(impl, "cuda", {}) == ""
    assert triton_impl.interpreter_of(plain_torch, "cpu", {}) == ""
    # a CPU run plans them only when asked for; a GPU run always
    assert not impl.runs_on("cpu") and impl.runs_on("cuda")


def test_each_op_the_issue_names_has_a_triton_kernel_and_a_triton_control():
    from harness.core.discovery import registry

    specs = registry().specs
    for op, impl in (("hopper_tasks.rmsnorm", "triton"), ("hopper_tasks.silu_mul", "triton"),
                     ("hopper_tasks.embedding", "triton"), ("hopper_tasks.argmax", "triton"),
                     ("fp8_gemm.quantize", "triton"), ("moe.permute", "triton"),
                     ("strided_copy", "triton"), ("allreduce", "tile_triton")):
        assert getattr(specs[op].implementations[impl], "triton", False), op
        assert any(getattr(fn, "triton", False)
                   for fn in specs[op].negative_controls.values()), op


def test_without_triton_an_implementation_is_a_skip_naming_the_install(tmp_path, monkeypatch):
    module = tmp_path / "needs_triton_kernels.py"
    module.write_text("import triton.no_such_part\n\ndef fn(x):\n    return x\n")
    impl = load_callable(f"{module}:fn")
    assert isinstance(impl, triton_impl.MissingTriton)
    assert "pip install -e '.[triton]'" in impl.skip_reason({}, 1, "cpu")
    monkeypatch.setattr(triton_impl, "available", lambda: False)
    built_in = triton_impl.TritonImplementation("suites._triton.hopper:rmsnorm")
    assert "triton is not installed: pip install" in built_in.skip_reason({}, 1, "cpu")


def test_an_impl_path_that_is_wrong_says_what_to_fix(tmp_path):
    with pytest.raises(SpecError, match="no file"):
        load_callable(f"{tmp_path}/missing.py:fn")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(SpecError, match="failed to import .*boom"):
        load_callable(f"{broken}:fn")


@needs_triton
@pytest.mark.mpi
def test_the_guide_example_passes_and_a_wrong_kernel_fails_through_harness_run(tmp_path):
    example = ROOT / "examples" / "triton_rmsnorm" / "rmsnorm.py"
    # a new user's slip: eps added outside the rsqrt; a path relative to where harness runs
    (tmp_path / "wrong_rmsnorm.py").write_text(example.read_text().replace(
        "tl.math.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)",
        "tl.math.rsqrt(tl.sum(x * x, axis=0) / hidden) + eps"))
    good, wrong = f"{example}:rmsnorm", "wrong_rmsnorm.py:rmsnorm"
    out = subprocess.run([sys.executable, "-m", "harness", "run", "hopper_tasks.rmsnorm",
                          "--impl", good, "--impl", wrong, "--world-sizes", "1",
                          "--db", str(tmp_path / "h.db")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    conn = sqlite3.connect(tmp_path / "h.db")
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT case_id, impl, status, record FROM results")]
    assert {r["status"] for r in rows if r["impl"] == good} == {"pass"}
    assert all('"interpreter": "triton"' in r["record"] for r in rows)
    # every passing call was timed by the interpreter: 6 of the good one, 3 of the wrong one
    assert re.search(r"^i 9 time\(s\) of Triton kernels run by Triton.s interpreter", out.stdout,
                     re.M), out.stdout[-2000:]
    failed = sorted(r["case_id"] for r in rows if r["impl"] == wrong and r["status"] == "fail")
    # the zero rows (eps outside the rsqrt: inf), and the rows of rms 30000, whose rsqrt
    # (3e-5) the eps added outside moves by 3%
    assert failed == ["hopper_tasks.rmsnorm[b=20,hidden=512,values=wide]",
                      "hopper_tasks.rmsnorm[b=3,hidden=1280,rows=zero]",
                      "hopper_tasks.rmsnorm[b=3,hidden=256,rows=zero]"]
    assert "FAIL w1 hopper_tasks.rmsnorm[b=3,hidden=256,rows=zero]@wrong_rmsnorm.py" in out.stdout


@needs_triton
def test_triton_imported_before_the_interpreter_was_set_is_a_skip_that_says_so():
    # in a process of its own: this one set TRITON_INTERPRET=1 before importing triton
    script = (
        "import os\n"
        "os.environ.pop('TRITON_INTERPRET', None)\n"
        "import triton\n"
        "from harness.device import triton_impl\n"
        "triton_impl.configure_rank('cpu')\n"
        "print(triton_impl.mode_problem(lambda: None, 'cpu'))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "triton was imported before TRITON_INTERPRET=1 was set" in out.stdout


def test_an_interpreted_result_is_marked_and_stays_out_of_the_series():
    from harness.core.results import CaseResult
    from harness.core.timing import TimingConfig
    from harness.history.regress import in_series

    cfg = TimingConfig.for_tier("smoke").interpreted("triton")
    assert (cfg.min_repeats, cfg.max_repeats, cfg.minimal) == (1, 1, True)
    r = CaseResult(run_id="r", case_id="c", op="o", family="f", impl="triton", world_size=1,
                   params={}, status="pass", interpreter="triton",
                   timing={"median": 5e6, "samples": [5e6], "minimal": True,
                           "interpreter": "triton"})
    assert not in_series(r) and r.time_marks == "i"
    assert CaseResult.from_dict(r.to_dict()).interpreter == "triton"


def _put_many(cache_dir: str, payload: str, rounds: int) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    from triton.runtime.cache import FileCacheManager

    cache = FileCacheManager("k" * 32)
    for _ in range(rounds):
        cache.put(payload, "kernel.cubin", binary=False)


@needs_triton
def test_eight_processes_share_one_triton_cache_without_a_torn_file(tmp_path):
    """What 8 ranks compiling the same kernel do to Triton's cache (FileCacheManager.put:
    a temporary directory per process, then os.replace): a reader sees a whole file."""
    import multiprocessing

    payloads = [str(i) * 20000 for i in range(8)]
    ctx = multiprocessing.get_context("fork")  # nothing but file writes in the children
    procs = [ctx.Process(target=_put_many, args=(str(tmp_path), p, 30)) for p in payloads]
    for p in procs:
        p.start()
    path = tmp_path / ("k" * 32) / "kernel.cubin"
    seen = set()
    while any(p.is_alive() for p in procs):
        if path.exists():
            seen.add(path.read_text())
    for p in procs:
        p.join()
        assert p.exitcode == 0
    seen.add(path.read_text())
    assert seen <= set(payloads) and seen
    assert not [d for d in path.parent.iterdir() if d.name.startswith("tmp.")]


@needs_triton
def test_a_launch_function_calling_kernels_of_an_imported_module_is_known_as_triton(tmp_path):
    (tmp_path / "my_kernels.py").write_text(
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)\n")
    (tmp_path / "my_launch.py").write_text(
        "import my_kernels as k\n\ndef launch(x):\n    return x\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import os\n\ndef launch(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        launch = load_callable(f"{tmp_path / 'my_launch.py'}:launch")
        assert triton_impl.interpreter_of(launch, "cpu", {}) == "triton"
        assert triton_impl.interpreter_of(load_callable(f"{plain}:launch"), "cpu", {}) == ""
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_kernels", None)
