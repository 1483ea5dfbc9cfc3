"""`harness compare`: performance and correctness changes between two runs."""

from __future__ import annotations

import click

from harness.cli_common import EXIT_USAGE, HarnessExit


@click.command("compare")
def compare() -> None:
    """Not built yet (issue 8, in progress)."""
    raise HarnessExit("`harness compare` is not built yet", EXIT_USAGE)
