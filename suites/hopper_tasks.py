"""Hopper tasks: reference semantics of the task types of a persistent megakernel (Mirage)
on Hopper, the tensor-parallel layers built from them, and a decoder-layer pipeline whose check
names the first stage that diverges.

One module per kind of task lives in suites/_hopper/; this family module gathers their specs.
"""

from __future__ import annotations

from suites._hopper.attention import SPECS as ATTENTION_SPECS
from suites._hopper.parallel import SPECS as PARALLEL_SPECS
from suites._hopper.readout import SPECS as READOUT_SPECS
from suites._hopper.tasks import SPECS as TASK_SPECS

FAMILY = "hopper_tasks"

SPECS = [*TASK_SPECS, *READOUT_SPECS, *ATTENTION_SPECS, *PARALLEL_SPECS]
