"""An implementation of hopper_tasks.rmsnorm that leaves each row's last element unwritten in
an output it allocates itself (loaded with --impl unwritten:tail): right only where the
allocator hands back a block that held the right answer."""

from __future__ import annotations

import torch

from reference_kernels import hopper_tasks as ref


def tail(x, weight):
    full = ref.rmsnorm(x, weight)
    right = full.clone()
    del full  # freed: the next allocation of its size gets its block, right values and all
    out = torch.empty_like(right)
    out[..., :-1] = right[..., :-1]
    return out
