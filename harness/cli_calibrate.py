"""`harness calibrate`: measure the device's copy bandwidth and matmul peak."""

from __future__ import annotations

import click

from harness.cli_common import EXIT_USAGE, HarnessExit


@click.command("calibrate")
def calibrate() -> None:
    """Not built yet (issue 8, in progress)."""
    raise HarnessExit("`harness calibrate` is not built yet", EXIT_USAGE)
