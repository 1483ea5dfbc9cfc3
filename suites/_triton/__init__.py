"""Built-in Triton implementations: the kernels live in this package's modules, which import
triton and are imported on an implementation's first call (``harness.triton_impl``): a
machine without triton still loads every op, and a rank chooses compiled or interpreted
kernels before they are defined."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.triton_impl import TritonImplementation


def triton_impl(ref: str, unsupported: Callable[[Mapping[str, Any]], str | None] | None = None,
                elements: Callable[[Mapping[str, Any]], int] | None = None
                ) -> TritonImplementation:
    """``module:function`` of this package as an implementation."""
    return TritonImplementation(f"{__name__}.{ref}", unsupported=unsupported,
                                elements=elements)
