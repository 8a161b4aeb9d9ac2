"""How the quantized-format kernels cut a weight tile by its scale groups (shared by the
in-register kernels of `quant_launch` and the dequantization of `quant_prefill`)."""

from __future__ import annotations

from xinfer.quant.base import KernelWeights


def packed(kw: KernelWeights) -> bool:
    """4-bit codes two per byte (int4, NVFP4): the GEMV reads whole bytes."""
    return kw.fmt_code in (2, 3)


def group_t(kw: KernelWeights, block_k: int, k: int) -> int:
    """Columns of a BLOCK_K tile that share one scale (the loaders read scales once per such
    group): the format's columns per scale, or BLOCK_K when a scale spans the tile (or the
    row). Where a tile could straddle two scale groups (a group size that is not a power of
    two below K), single columns (FP8) or byte pairs (4-bit) — the per-element gather."""
    per_scale = 16 if kw.fmt_code == 3 else kw.scale_bk
    if per_scale >= k or per_scale % block_k == 0:
        return block_k
    if block_k % per_scale == 0 and per_scale & (per_scale - 1) == 0:
        return per_scale
    return 2 if packed(kw) else 1
