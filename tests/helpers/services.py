"""What tests that need a service of this machine (a PostgreSQL server, a SLURM cluster)
share: the rule (skipped with the reason where it cannot start, failed under CI, CI=true,
where .ci/run installs what it needs) and a free port for it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def start_or_skip(start: Callable[[], T], unavailable: type[Exception], what: str) -> T:
    """``start()``, or the test skipped (failed under CI) with why ``what`` cannot start."""
    try:
        return start()
    except unavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the {what} tests must run in CI: {exc}")
        pytest.skip(str(exc))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a test's server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
