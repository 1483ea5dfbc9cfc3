"""The kernel under development that ``harness demo`` follows night after night.

It is torch's strided copy, plus what the demo plants on later nights through the
environment, so the dashboard has a real slowdown and a real wrong answer to show:
``HARNESS_DEMO_DELAY_S`` adds a sleep after the copy (a regression the history analysis must
flag), ``HARNESS_DEMO_SPIN_S`` keeps the CPU busy that long after the copy (a night a busy
machine slowed a little),
``HARNESS_DEMO_BUG=1`` corrupts the last element of outputs past 1500 elements (a tail bug
past a size threshold: a failure with its first bad index, while smaller cases pass).
Loaded ad hoc: ``--impl suites._demo:copy_under_development``.
"""

from __future__ import annotations

import os
import time

import torch

from suites.strided_copy import copy_torch

#: outputs with more elements than this get the planted tail bug
BUG_FROM = 1500


def copy_under_development(storage, size, stride, offset, out):
    """Correct unless the demo's environment plants a delay or a bug."""
    copy_torch(storage, size, stride, offset, out)
    spin = float(os.environ.get("HARNESS_DEMO_SPIN_S", "0") or 0)
    until = time.perf_counter() + spin
    while time.perf_counter() < until:
        pass
    delay = float(os.environ.get("HARNESS_DEMO_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)
    if os.environ.get("HARNESS_DEMO_BUG") == "1" and out.numel() > BUG_FROM:
        raw = out.view(-1).view(torch.uint8)  # bytes: fp8 and bool have no `+` kernel
        raw[-1] = raw[-1] + 1
    return out
