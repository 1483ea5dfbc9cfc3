"""Launch of tile_reduce.cu: Mirage's tile allreduce, an allgather into a (W, n) buffer and a
local float32 reduction on the GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from harness.api import cuda_launch

BLOCK = 256
KERNELS = {torch.float32: "tile_reduce_f32", torch.bfloat16: "tile_reduce_bf16",
           torch.float16: "tile_reduce_f16", torch.int32: "tile_reduce_i32"}
DTYPES = {"f32", "bf16", "f16", "i32"}
OPS = {"sum": 0, "avg": 1, "prod": 2, "min": 3, "max": 4}


def unsupported(params: Mapping[str, Any]) -> str | None:
    if params.get("dtype") not in DTYPES:
        return f"tile_reduce.cu reduces {', '.join(sorted(DTYPES))} only"
    return None


@cuda_launch(unsupported=unsupported)
def launch_allreduce_tile(kernels: Any, world: Any, x, out, op) -> Any:
    """The allgather through torch.distributed, then one kernel reduces the W rows."""
    from suites._collectives.common import gather_rows  # (that package imports this one)

    rows = gather_rows(world, x).reshape(world.size, -1)
    n = rows.shape[1]
    if not out.is_contiguous():
        raise ValueError("tile_reduce.cu writes a contiguous out")
    blocks = min(-(-n // BLOCK), kernels.sm_count * 16)
    kernels[KERNELS[x.dtype]](grid=blocks, block=BLOCK,
                              args=(rows, out, np.int64(n), np.int32(world.size),
                                    np.int32(OPS[op])))
    return out
