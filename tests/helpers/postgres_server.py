"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, started in a
temporary directory on a free port and stopped at the end of the session.

``initdb -A trust`` makes a cluster whose superuser ``harness`` logs in without a password
from this host only (``listen_addresses=127.0.0.1``); fsync is off (a test cluster, thrown
away). PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres``
user that Debian's package creates, and its commands run through ``runuser``.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from services import free_port

USER = "harness"


class Unavailable(Exception):
    """No server can be started here: the message says why and how to get one."""


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise Unavailable(f"PostgreSQL's {name} is not installed (Debian: apt-get install "
                          "postgresql; .ci/run installs it)")
    return found


class Server:
    """One running cluster; ``database()`` makes a fresh, empty database and returns its URL."""

    def __init__(self) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise Unavailable("psycopg is not installed: pip install "
                              "'kernel-harness[postgres]'") from exc
        initdb, self.pg_ctl = _binary("initdb"), _binary("pg_ctl")
        self.root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise Unavailable("running as root and runuser is missing: PostgreSQL will "
                                  "not run as root")
            try:
                shutil.chown(self.root, "postgres", "postgres")
            except (LookupError, PermissionError) as exc:
                raise Unavailable(f"running as root and no postgres user ({exc})") from exc
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data = self.root / "data"
        self.port = free_port()
        self._run([initdb, "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                   "--no-sync"])
        self.options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                        "-c max_connections=100")
        self.start()
        self.url = f"postgresql://{USER}@127.0.0.1:{self.port}"
        self._count = 0
        atexit.register(self.stop)  # also when the session ends without its teardown

    def start(self) -> None:
        self._run([self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                   "-t", "60", "-o", self.options, "start"])

    def halt(self) -> None:
        """Stop the server as an administrator's restart does (``-m fast``: every session is
        ended, its open transaction rolled back), keeping its data for ``start``."""
        self._run([self.pg_ctl, "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop"])

    def _run(self, cmd: list[str]) -> None:
        out = subprocess.run(self.prefix + cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise Unavailable(f"{Path(cmd[0]).name} failed: {out.stderr.strip()[-2000:]} {tail}")

    def database(self) -> str:
        import psycopg

        self._count += 1
        name = f"h{self._count}"
        with psycopg.connect(f"{self.url}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"{self.url}/{name}"

    def stop(self) -> None:
        if not self.root.exists():
            return
        subprocess.run(self.prefix + [self.pg_ctl, "-D", str(self.data), "-m", "immediate",
                                      "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
