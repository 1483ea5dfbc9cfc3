"""The launcher's host file (``--hostfile``), read before a rank starts: a host that does not
resolve would otherwise end every job with the launcher's own lines (ssh's, hydra's) and be
taken for a broken cluster (exit 4), not the typo it is."""

from __future__ import annotations

import socket
from pathlib import Path


def hosts(text: str) -> list[tuple[int, str]]:
    """(line number, host) of each host a host file names, in order: MPICH's ``host[:ranks]``
    and Open MPI's ``host slots=N``, one per line, ``#`` starting a comment."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        host, _, ranks = words[0].rpartition(":")
        # no ":N", or a bare IPv6 address's colons (with ":N" it is written in brackets)
        if not host or not ranks.isdigit() or (":" in host and not host.startswith("[")):
            host = words[0]
        out.append((number, host.strip("[]")))
    return out


def problem(path: str) -> str | None:
    """What is wrong with the host file at ``path`` (None: each host it names resolves)."""
    try:
        named = hosts(Path(path).read_text(errors="replace"))
    except OSError as exc:
        return f"--hostfile {path}: {exc.strerror or exc}"
    if not named:
        return f"--hostfile {path} names no host: write one `host[:ranks]` per line"
    seen = set()
    for number, host in named:
        if host in seen:
            continue
        seen.add(host)
        try:
            socket.getaddrinfo(host, None)
        except (OSError, UnicodeError):
            return (f"--hostfile {path}: host {host!r} (line {number}) does not resolve: fix "
                    "its name, or add it to /etc/hosts")
    return None
