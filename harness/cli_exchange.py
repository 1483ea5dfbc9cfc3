"""`harness ingest` and `harness export`: runs in and out of the history DB."""

from __future__ import annotations

import click

from harness.cli_common import EXIT_USAGE, HarnessExit


@click.command("ingest")
def ingest() -> None:
    """Not built yet (issue 8, in progress)."""
    raise HarnessExit("`harness ingest` is not built yet", EXIT_USAGE)


@click.command("export")
def export() -> None:
    """Not built yet (issue 8, in progress)."""
    raise HarnessExit("`harness export` is not built yet", EXIT_USAGE)
