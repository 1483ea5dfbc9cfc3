"""Import a Python file by path: ``--impl path/file.py:fn`` and the launch description beside a
``.cu`` source (``harness.device.cuda_impl``)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


@functools.cache
def import_file(path: Path) -> Any:
    """``path`` imported as a module of its own, once per process: its name is made from the
    path, so two files of the same name do not collide, and it is in ``sys.modules`` while and
    after it runs, so what looks a module up by name (dataclasses, pickle) finds it. Raises
    ImportError where the file is not importable as Python, else what running it raised."""
    name = f"harness_file_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not importable as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
