"""Time a command's wall clock and record it as the figure NAME (benchmarks/results/NAME.json).

    python benchmarks/timed.py NAME [--figure "what is timed"] [--machine M] [--headline]
                               -- CMD [ARGS...]

The command runs as given, its output passed through; this exits with its exit code. The
figure's value is the wall time in seconds; its details, the exit code, the machine's
``yardstick`` (seconds of a fixed workload, the best of three runs before the command and
three after; RESULTS.md shows it beside the machine) and, where the last line of the output
is a pytest summary, the counts it gives (passed, skipped, ...). Where NAME was recorded
before, ``--figure`` and the headline flag default to what it says, so that a rerun is
``python benchmarks/timed.py NAME -- CMD``. E.g.:

    python benchmarks/timed.py test_suite -- python -m pytest -q --durations=45
    python benchmarks/timed.py ci_run -- .ci/run
    python benchmarks/timed.py golden_verify -- harness golden verify
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _figures import machine, record, results_dir, yardstick  # noqa: E402

#: pytest's last line: "2089 passed, 50 skipped in 627.12s (0:10:27)", "== 3 failed, ... =="
PYTEST_SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s\b")


def pytest_counts(last_line: str) -> dict[str, int]:
    """{"passed": 2089, "skipped": 50, ...} from pytest's summary line; {} from another."""
    m = PYTEST_SUMMARY.match(last_line.strip())
    if not m:
        return {}
    counts = {}
    for part in m.group(1).split(","):
        n, word = part.split()
        counts[{"error": "errors", "warning": "warnings"}.get(word, word)] = int(n)
    return counts


def run(cmd: list[str]) -> tuple[int, float, str]:
    """(exit code, wall seconds, last non-empty line of stdout), stdout passed through."""
    start = time.perf_counter()
    last = ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, errors="replace",
                          bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.strip():
                last = line
    return proc.returncode, time.perf_counter() - start, last


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    own, cmd = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s NAME [--figure F] [--machine M] "
                                           "[--headline] -- CMD [ARGS...]")
    parser.add_argument("name", help="the figure's name: benchmarks/results/NAME.json")
    parser.add_argument("--figure", help="what is timed, one short sentence")
    parser.add_argument("--machine", help="what it runs on (default: benchmarks/_figures.py's "
                        "guess)")
    parser.add_argument("--headline", action=argparse.BooleanOptionalAction, default=None,
                        help="show it in the README's table (default: as before, else no)")
    args = parser.parse_args(own)
    if not cmd:
        parser.error("give the command to time after --")
    before_path = results_dir() / f"{args.name}.json"
    before = json.loads(before_path.read_text()) if before_path.is_file() else {}
    figure = args.figure or before.get("figure")
    if not figure:
        parser.error(f"{args.name} has no figure yet: give --figure \"what is timed\"")
    before_speed = yardstick()
    try:
        code, seconds, last = run(cmd)
    except OSError as e:  # no such command: nothing was timed
        print(f"timed.py: {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    # the best of both sides: a neighbour busy for part of a long run slows one of them
    # (before a command that installs torch, there is only the side after)
    speeds = [s for s in (before_speed, yardstick()) if s is not None]
    details = {"exit_code": code, **({"yardstick_s": min(speeds)} if speeds else {}),
               **pytest_counts(last)}
    record(args.name, figure=figure, value=round(seconds, 1), unit="s",
           command=shlex.join(["python", "benchmarks/timed.py", args.name, "--", *cmd]),
           machine=args.machine or machine(), details=details,
           headline=(args.headline if args.headline is not None
                     else bool(before.get("headline", False))))
    return code


if __name__ == "__main__":
    sys.exit(main())
