"""What every ``harness`` subcommand shares: exit codes, consoles, one-line user errors."""

from __future__ import annotations

import sys

from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REGRESSION, EXIT_INFRA = 0, 1, 2, 3, 4

# logs (CI, pipes) get wide lines so case ids are never folded; terminals keep their width
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False,
                      width=None if sys.stderr.isatty() else 200)


class HarnessExit(Exception):
    """A user-facing error: one line and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> None:
    raise HarnessExit(message, code)


def parse_world_sizes(text: str) -> list[int]:
    """``1,4,8`` -> [1, 4, 8]; anything else is a usage error."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        _fail(f"--world-sizes {text!r} is not a comma-separated list of positive integers "
              "(e.g. 1,4,8)", EXIT_USAGE)
    return sorted(dict.fromkeys(sizes))
