"""The results a world size's jobs have recorded, read from the run's results file as it
grows (the launcher polls it while a job runs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.core import results as results_mod


class LauncherError(RuntimeError):
    """The launch itself failed, not its cases: the MPI launcher missing or failing, the
    results file rewritten under it (exit code 4)."""


class RecordedKeys:
    """The result keys of one world size in a results file, read incrementally: each
    ``update`` parses only the complete lines appended since the last (the launcher polls
    five times a second while the file grows to megabytes of timing samples)."""

    def __init__(self, path: Path, world_size: int) -> None:
        self.path, self.prefix = path, f"w{world_size}:"
        self.offset = 0
        self.keys: set[str] = set()
        #: (key, status) of each result read, in file order, until ``drain`` takes them
        self.fresh: list[tuple[str, str]] = []

    def update(self) -> set[str]:
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return set(self.keys)
        if size < self.offset:  # later results would be written where this never reads
            raise LauncherError(f"{self.path} shrank from {self.offset} to {size} bytes while "
                                "the run went on: something besides its ranks rewrote it (an "
                                "implementation writing ../results.jsonl?); rerun the run")
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        self.offset += end
        for line in data[:end].splitlines():
            try:
                d = json.loads(line)
                key = results_mod.result_key(d["case_id"], d["impl"], int(d["world_size"]))
            except (ValueError, KeyError, TypeError):
                continue  # a torn line: ingest reports it; the poll only counts results
            if key.startswith(self.prefix):
                self.keys.add(key)
                self.fresh.append((key, str(d.get("status"))))
        return set(self.keys)

    def drain(self) -> list[tuple[str, str]]:
        """The (key, status) pairs read since the last drain, in the order they were written."""
        fresh, self.fresh = self.fresh, []
        return fresh
