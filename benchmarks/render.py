"""Render the figures in benchmarks/results/*.json: benchmarks/RESULTS.md (every figure) and
the README's headline table (those with ``"headline": true``, between the markers
``<!-- figures:begin -->`` and ``<!-- figures:end -->``).

    python benchmarks/render.py            # write both
    python benchmarks/render.py --check    # exit 1, naming the file, when either is stale

Run it after a benchmark has recorded its figure (benchmarks/_figures.py); tests/test_figures.py
runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _figures import RESULTS as RESULTS_DIR  # noqa: E402
from _figures import ROOT, check  # noqa: E402

RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
#: the README's rows first in this order, the other headline figures after them by name
ORDER = ("smoke_tier", "harness_overhead", "test_suite", "ci_run", "faults", "golden_verify",
         "demo", "report_render", "mutation_catch", "precision_lens", "strided_copy_speed",
         "tcpd_changepoints", "regression_detection")


class FigureError(ValueError):
    """A figure file that cannot be rendered; the message names it."""


def load(results_dir: Path) -> list[dict]:
    """Every figure in ``results_dir``, checked, in the README's order then by name."""
    figures = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise FigureError(f"{path}: not readable JSON ({e})") from e
        problems = check(doc)
        if not problems and doc["name"] != path.stem:
            problems.append(f"'name' is {doc['name']!r}, the file {path.stem!r}")
        if problems:
            raise FigureError(f"{path}: {'; '.join(problems)}")
        figures.append(doc)
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(figures, key=lambda f: (rank.get(f["name"], len(ORDER)), f["name"]))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _number(v: float | int) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def value_text(fig: dict) -> str:
    """The value with its unit: "81.6 s", "662 s (11 min 2 s)", "0.820 / 0.727 F1 / cover";
    " (exit 1)" after a timed command that failed."""
    v = fig["value"]
    text = v if isinstance(v, str) else _number(v)
    text = f"{text} {fig['unit']}".strip()
    if fig["unit"] == "s" and not isinstance(v, str) and v >= 120:
        minutes, seconds = divmod(round(v), 60)
        text += f" ({minutes} min {seconds} s)"
    code = fig["details"].get("exit_code")
    if isinstance(code, int) and code != 0:
        text += f" (exit {code})"
    return text


def _short(commit: str) -> str:
    head, dirty, _ = commit.partition("-dirty")
    return head[:7] + ("-dirty" if dirty else "")


def results_md(figures: list[dict]) -> str:
    lines = ["# Benchmark results", "",
             "Generated from `benchmarks/results/*.json` by `python benchmarks/render.py`: do "
             "not edit by hand; rerun the benchmark (its command below), then the renderer.",
             "",
             "The latest measurement of each figure, with the commit and date it was taken at. "
             "Each name links to its file, whose `details` hold the breakdown; what each "
             "benchmark measures and how: [docs/benchmarks.md](../docs/benchmarks.md).",
             "",
             "| name | figure | value | machine | commit | date | command |",
             "|---|---|---|---|---|---|---|"]
    for f in figures:
        lines.append(f"| [{f['name']}](results/{f['name']}.json) | {_cell(f['figure'])} | "
                     f"{_cell(value_text(f))} | {_cell(_machine(f))} | "
                     f"`{_short(f['commit'])}` | {f['date']} | `{_cell(f['command'])}` |")
    for f in figures:  # a figure whose details hold a table gets it below, under its name
        table = f["details"].get("table")
        if isinstance(table, dict) and table.get("columns"):
            lines += ["", f"## {f['name']}", "", _cell(f["figure"]), "",
                      "| " + " | ".join(map(_cell, table["columns"])) + " |",
                      "|" + "---|" * len(table["columns"])]
            lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    return "\n".join(lines) + "\n"


def _machine(figure: dict) -> str:
    """The machine, with its yardstick where the figure has one (``timed.py``)."""
    speed = figure["details"].get("yardstick_s")
    return figure["machine"] + (f" (yardstick {speed:.2f} s)" if speed else "")


def readme_table(figures: list[dict]) -> str:
    lines = ["| figure | value | machine, date | command |", "|---|---|---|---|"]
    for f in figures:
        if f["headline"]:
            lines.append(f"| {_cell(f['figure'])} | **{_cell(value_text(f))}** | "
                         f"{_cell(f['machine'])}, {f['date']} | `{_cell(f['command'])}` |")
    return "\n".join(lines)


def with_table(readme: str, table: str, where: str = "README.md") -> str:
    """``readme`` with what lies between the markers replaced by ``table``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or \
            readme.index(BEGIN) > readme.index(END):
        raise FigureError(f"{where}: needs one {BEGIN} line and one {END} line after it")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def rendered(results_dir: Path | None = None, readme: Path | None = None,
             results_md_path: Path | None = None) -> dict[Path, str]:
    """{path: the text it should hold} for RESULTS.md and the README (by default the
    repository's, from benchmarks/results)."""
    figures = load(results_dir or RESULTS_DIR)
    readme = readme or README
    return {results_md_path or RESULTS_MD: results_md(figures),
            readme: with_table(readme.read_text(encoding="utf-8"), readme_table(figures),
                               str(readme))}


def stale(results_dir: Path | None = None, readme: Path | None = None,
          results_md_path: Path | None = None) -> list[Path]:
    """The rendered files whose text on disk is not what the figures give."""
    return [path for path, text in rendered(results_dir, readme, results_md_path).items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when RESULTS.md or the README is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            behind = stale()
            if behind:
                names = ", ".join(_shown(p) for p in behind)
                print(f"{names} not in step with benchmarks/results/*.json: run python "
                      "benchmarks/render.py", file=sys.stderr)
                return 1
            return 0
        for path, text in rendered().items():
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {_shown(path)}")
    except FigureError as e:
        print(f"render: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
