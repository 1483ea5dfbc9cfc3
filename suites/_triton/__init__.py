"""Built-in Triton implementations: the kernels live in this package's modules, which import
triton and are imported on an implementation's first call (``harness.device.triton_impl``): a
machine without triton still loads every op, and a rank chooses compiled or interpreted
kernels before they are defined."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness.api import TritonImplementation

#: the integer type of each element size
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of its element size: a kernel that moves data moves bits
    (fp8, bool, NaN payloads and -0.0 included)."""
    return t.view(_RAW[t.element_size()])


def triton_impl(ref: str, unsupported: Callable[[Mapping[str, Any]], str | None] | None = None,
                elements: Callable[[Mapping[str, Any]], int] | None = None
                ) -> TritonImplementation:
    """``module:function`` of this package as an implementation."""
    return TritonImplementation(f"{__name__}.{ref}", unsupported=unsupported,
                                elements=elements)
