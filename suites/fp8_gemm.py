"""FP8: quantization (per tensor, per token, per block; UE8M0), GEMMs (per-tensor, blockwise,
grouped contiguous and masked) and the fused transpose-split-quant.

One module per kind lives in suites/_fp8/; this family module gathers their specs.
"""

from __future__ import annotations

from suites._fp8.gemm import SPECS as GEMM_SPECS
from suites._fp8.quant import SPECS as QUANT_SPECS

FAMILY = "fp8_gemm"

SPECS = [*QUANT_SPECS, *GEMM_SPECS]
