"""Paged-attention prologue (Mirage's persistent kernel): per-head RMSNorm of q and k, then
NeoX RoPE."""
