"""`harness golden generate|verify|show`: the stored golden results."""

from __future__ import annotations

import click


@click.group()
def golden() -> None:
    """Stored golden results (suites/golden): generate, verify, show."""
