"""The README's first two commands are the ones CI and users run: keep them true."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _sh_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```sh\n")[1:]
    return [b.split("```", 1)[0].strip() for b in blocks]


def test_first_command_sets_up_and_runs_the_smoke_tier_at_1_4_8():
    first = _sh_blocks()[0]
    assert first.startswith("pip install torch==2.13.0 && pip install -e .")
    assert first.endswith("harness run --tier smoke --world-sizes 1,4,8")


def test_ci_runs_the_readme_test_command_verbatim():
    second = _sh_blocks()[1]
    assert "python -m pytest" in second
    ci_entry = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "bash ci/cpu.sh" in ci_entry
    cpu_lines = (ROOT / "ci" / "cpu.sh").read_text().splitlines()
    assert cpu_lines[-1] == second  # the browser install first, the README's command last
