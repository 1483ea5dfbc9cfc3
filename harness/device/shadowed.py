"""A package the harness needs that a file or folder of the user's shadows: a ``torch.py`` in
the folder a command runs from, or a ``torch/`` on ``PYTHONPATH``, is imported in its place,
and what fails next (``cannot import name 'device' from 'torch'``) never says why."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

#: import name: the distribution that installs it
NEEDED = {"torch": "torch", "numpy": "numpy", "mpi4py": "mpi4py", "click": "click"}


def shadowed(needed: dict[str, str] = NEEDED) -> str:
    """One line naming the first needed package imported (or importable) from somewhere other
    than where its distribution installed it, and the remedy; "" where none is."""
    for module, dist in needed.items():
        try:
            loaded = sys.modules.get(module)
            spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(module)
            installed = Path(importlib.metadata.distribution(dist).locate_file(module))
        except (ImportError, ValueError, AttributeError):
            continue  # not installed (another check says so), or not findable at all
        origin = getattr(spec, "origin", None)
        if not origin or origin in ("built-in", "frozen"):
            continue
        found = Path(origin).resolve()
        home = installed.resolve()
        if found == home or home in found.parents or not home.exists():
            continue  # not there: an editable install, whose files live elsewhere
        return (f"`{module}` is imported from {found}, not from the installed {dist} "
                f"({home}): a file or folder named {module} in the current folder or on "
                "PYTHONPATH shadows it; rename it or fix PYTHONPATH")
    return ""
