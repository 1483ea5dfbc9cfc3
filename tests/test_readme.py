"""The README's first two commands are the ones CI and users run: keep them true."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))


def _sh_blocks(path: Path = README) -> list[str]:
    text = path.read_text()
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


def test_every_file_the_guides_show_from_examples_is_that_file():
    """A block headed by a path under examples/ is the whole file, so docs/own-ops.md's "Adding
    an op" and "Testing your own op" stay equal to the example suite, whose tests run them, and
    docs/cuda-and-triton.md's examples to theirs."""
    shown = []
    for path in (README, *GUIDES):
        shown += re.findall(r"^`(examples/[^`]+)`\n\n```\w+\n(.*?)^```$", path.read_text(),
                            re.S | re.M)
    assert len(shown) >= 6, [p for p, _ in shown]
    for rel, block in shown:
        assert block == (ROOT / rel).read_text(), rel
    own_ops = (ROOT / "docs" / "own-ops.md").read_text()
    for section in ("## Adding an op", "## Testing your own op"):
        assert section in own_ops
    assert sum("examples/example_ops/" in rel for rel, _ in shown) >= 5


def test_the_cuda_example_in_the_guide_is_the_one_in_examples():
    """docs/cuda-and-triton.md's CUDA C++ example is shown in full: each block equals its file,
    which tests/test_cuda_source.py compiles and tests/test_cuda_gpu.py runs."""
    guide = ROOT / "docs" / "cuda-and-triton.md"
    text = guide.read_text()
    for name, lang in (("embedding.cu", "cuda"), ("embedding.py", "python")):
        path = ROOT / "examples" / "cuda_embedding" / name
        heading = f"`examples/cuda_embedding/{name}`\n\n```{lang}\n"
        assert heading in text, heading
        block = text.split(heading, 1)[1].split("```", 1)[0]
        assert block == path.read_text()
    command = next(b for b in _sh_blocks(guide) if "embedding.cu:launch_embedding" in b)
    assert "--impl examples/cuda_embedding/embedding.cu:launch_embedding" in command

