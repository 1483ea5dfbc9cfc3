"""The README's first two commands are the ones CI and users run: keep them true. The README
stays a short guide, its depth in the guides under docs/, and every link among them resolves."""

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
    # the browser install first, then the README's command, then the heavy tests it leaves out
    assert cpu_lines[-2] == second and cpu_lines[-1] == "python -m pytest -q -m heavy"


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


def test_the_readme_is_a_ten_minute_read():
    text = README.read_text()
    assert len(text) <= 25_000, f"README.md is {len(text)} characters: move depth to docs/"


def test_the_headline_figures_stay_in_the_readme():
    """The table is the README's, not a guide's: benchmarks/render.py writes it from the
    figures marked headline (tests/test_figures.py checks it is in step with them)."""
    text = README.read_text()
    table = text.split("## Headline figures\n", 1)[1].split("\n## ", 1)[0]
    table = table.split("<!-- figures:begin -->\n", 1)[1].split("<!-- figures:end -->", 1)[0]
    rows = [line for line in table.split("\n") if line.startswith("| ")]
    assert rows[0].startswith("| figure | value |")
    assert any(r.startswith("| Smoke tier at world sizes 1, 4 and 8") for r in rows)
    assert len(rows) >= 10


def test_every_guide_is_linked_from_the_readme():
    assert GUIDES, "no docs/*.md"
    linked = {target.split("#", 1)[0] for target in _links(README)}
    missing = [g.name for g in GUIDES if f"docs/{g.name}" not in linked]
    assert not missing, f"docs/ guides the README's Guides list does not link: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _outside_code(text: str) -> str:
    text = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _outside_code(path.read_text()))


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _outside_code(path.read_text()),
                                         re.M)}


def test_every_relative_link_in_the_readme_and_the_guides_resolves():
    """A moved section leaves no link behind: each relative link names a file that exists and,
    into a Markdown file, a heading it has."""
    broken = []
    for path in (README, *GUIDES):
        for target in _links(path):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
