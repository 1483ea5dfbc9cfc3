"""Mixture of Experts: the router, Paddle's moe_permute / moe_unpermute, the expert SwiGLU
FFN as a grouped GEMM (bf16 and FP8 blockwise), the whole layer, and the layer with expert
parallelism (uneven all_to_all dispatch and combine).

One module per kind lives in suites/_moe/; this family module gathers their specs.
"""

from __future__ import annotations

from suites._moe.common import FAMILY
from suites._moe.ffn import SPECS as FFN_SPECS
from suites._moe.layer import SPECS as LAYER_SPECS
from suites._moe.permute import SPECS as PERMUTE_SPECS
from suites._moe.router import SPECS as ROUTER_SPECS

__all__ = ["FAMILY", "SPECS"]

SPECS = [*ROUTER_SPECS, *PERMUTE_SPECS, *FFN_SPECS, *LAYER_SPECS]
