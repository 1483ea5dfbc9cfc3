"""The op as kernel-harness sees it: grids, tolerance, work, implementations, controls."""

from __future__ import annotations

from harness.api import OpSpec, Work, allclose

from . import controls
from .reference import OP, make_inputs, qk_norm_rope
from .torch_impl import qk_norm_rope_torch

SPECS = [OpSpec(
    name=OP, family="attention_prologue", reference=qk_norm_rope,
    description="Per-head RMSNorm of q and k, then NeoX RoPE (Mirage's paged-attention "
                "prologue).",
    make_inputs=make_inputs, outputs=("q", "k"),
    # both sides compute in float32 and round once to bf16: one bf16 ulp (2**-8 relative)
    # apart at most; `harness tolerance example.qk_norm_rope` shows the margins
    tolerance=allclose(rtol=2**-7, atol=2**-7),
    work=lambda p, w: Work(bytes=2.0 * p["tokens"] * (2 * p["hq"] + 3 * p["hkv"]) * p["d"]),
    grid={"smoke": [{"tokens": 5, "hq": 8, "hkv": 2, "d": 64},
                    {"tokens": 1, "hq": 4, "hkv": 4, "d": 128},
                    {"tokens": 3, "hq": 4, "hkv": 1, "d": 128, "rows": "zero"}],
          "nightly": [{"tokens": t, "hq": hq, "hkv": hkv, "d": 128}
                      for t in (1, 16, 128) for hq, hkv in ((32, 8), (64, 8))]},
    implementations={"torch": qk_norm_rope_torch},
    negative_controls={"rope_before_norm": controls.rope_before_norm,
                       "k_normed_with_q_weight": controls.k_normed_with_q_weight},
)]
