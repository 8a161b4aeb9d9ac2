"""Launcher of a linear stored as GGUF segments of different block types
(`quant/gguf_segments.py`: a Q4_K_M file's q|k in Q4_K above its v in Q6_K). Decode calls
(at most `gguf_tiles.DECODE_M` rows) of two segments whose word tiles are one tile run as
ONE launch (`triton/gguf_segments.py`): two launches, one a segment, cost ~6.5 + ~4.5 µs at
batch 1 against ~9.9 µs for the bf16 linear they replace, so only one launch gains. Where
that launch may not run (more segments, a boundary inside a row tile, a word path switched
off or not allowed by a segment's rows, 17-127 rows) each segment runs through
`gguf_launch.linear` on its rows and the outputs are joined; prefill-sized calls dequantize
every segment into the rows of one dense weight and run one `kernels.linear`.

Determinism: the path depends only on the M bucket, dtype, the segments' types, rows and
strides (as `gguf_launch`'s), so a decode row's bits do not depend on the batch; on the one
launch a row's arithmetic is the single-type word kernel's for its segment (the same
`words_four_rows`, K split by the whole weight's row tiles)."""

from __future__ import annotations

import torch

from xinfer import kernels
from xinfer.kernels import gguf_launch, gguf_tiles, pdl, quant_launch, quant_prefill
from xinfer.kernels.triton import gguf_segments as jit
from xinfer.quant.gguf_blocks import BlockType


def segment_tiles(
    m: int,
    dtype: torch.dtype,
    ws: list[torch.Tensor],
    btypes: list[BlockType],
    rows: list[int],
    k: int,
) -> gguf_tiles.GGUFTiles | None:
    """The one launch's tile for a call of `m` rows, or None where it may not run: two
    segments, at most DECODE_M rows, both segments on their word path (switch on, rows
    allowing it) with one and the same four-row tile, and the boundary on a row tile."""
    if len(ws) != 2 or m > gguf_tiles.DECODE_M:
        return None
    n = sum(rows)
    tiles = [gguf_tiles.linear_tiles(m, dtype, bt, n) for bt in btypes]
    t = tiles[0]
    if not t.words or t.block_m != 4 or tiles[1] != t or rows[0] % t.block_n:
        return None
    if not all(gguf_tiles.words_allowed(w, bt, k) for w, bt in zip(ws, btypes)):
        return None
    return t


def linear(
    x: torch.Tensor,
    ws: list[torch.Tensor],
    btypes: list[BlockType],
    rows: list[int],
    bias: torch.Tensor | None,
    k: int,
    dequant: bool | None = None,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) in x's dtype; W (N = sum(rows), K) stored as the segments
    `ws[i]` (rows[i], row bytes) in `btypes[i]`, top to bottom. `dequant`: whether to
    dequantize W and run `kernels.linear` (default: from PREFILL_MIN_ROWS rows)."""
    if not (len(ws) == len(btypes) == len(rows) >= 1):
        raise ValueError(f"gguf segments: {len(ws)} tensors, {len(btypes)} types, {len(rows)} rows")
    for i, (w, bt, r) in enumerate(zip(ws, btypes, rows)):
        gguf_launch.check_raw(w, bt, r, k, f"gguf segments linear segment {i}")
    n = sum(rows)
    if x.shape[-1] != k:
        raise ValueError(f"gguf segments linear: x {tuple(x.shape)} for K={k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m >= quant_launch.PREFILL_MIN_ROWS if dequant is None else dequant:
        return _dequantized(x2, ws, btypes, rows, bias, k).view(*x.shape[:-1], n)
    t = segment_tiles(m, x.dtype, ws, btypes, rows, k)
    if t is None:
        return per_segment(x2, ws, btypes, rows, bias, k).view(*x.shape[:-1], n)
    out = x.new_empty(m, n)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    x2 = gguf_launch.word_aligned(x2)
    sk, grid = gguf_launch.split_grid(x2, out, t, bias)
    consts = gguf_tiles.words_consts(t)
    jit.gguf_linear_segments_kernel[grid](
        x2, ws[0], ws[1], sk.bias(bias, x2), sk.part, out, sk.counters,
        m, n, rows[0], k, sk.k_per_split,
        x2.stride(0), ws[0].stride(0), ws[1].stride(0), *sk.part_strides, out.stride(0),
        BTYPE_A=btypes[0].type_id, BTYPE_B=btypes[1].type_id, HAS_BIAS=sk.fuse_bias,
        BLOCK_N=t.block_n, SUBS=t.subs, REDUCE=sk.reduce, num_warps=t.num_warps,
        ASM=consts["ASM"], ROWS_T=consts["ROWS_T"], **pdl.options(x2),
    )  # fmt: skip
    sk.finish(bias, out)
    return out.view(*x.shape[:-1], n)


def _bias_rows(bias: torch.Tensor | None, rows: list[int]) -> list[torch.Tensor | None]:
    if bias is None:
        return [None] * len(rows)
    return list(torch.split(bias, rows))


def per_segment(x2, ws, btypes, rows, bias, k: int) -> torch.Tensor:
    """Each segment through `gguf_launch.linear` (its own path and tiles), outputs joined."""
    outs = [
        gguf_launch.linear(x2, w, bt, b, r, k)
        for w, bt, r, b in zip(ws, btypes, rows, _bias_rows(bias, rows))
    ]
    return torch.cat(outs, dim=-1)


def _dequantized(x2, ws, btypes, rows, bias, k: int) -> torch.Tensor:
    """x2 @ W^T (+ bias) with every segment dequantized (the twin's bits) into the rows of one
    dense weight in x2's dtype, then one `kernels.linear`; a weight past
    quant_prefill.CHUNK_BYTES dense goes segment by segment (`gguf_launch.linear`'s own
    chunked route)."""
    n = sum(rows)
    if n * k * x2.element_size() > quant_prefill.CHUNK_BYTES:
        outs = [
            gguf_launch.linear(x2, w, bt, b, r, k, dequant=True)
            for w, bt, r, b in zip(ws, btypes, rows, _bias_rows(bias, rows))
        ]
        return torch.cat(outs, dim=-1)
    dense = x2.new_empty(1, n, k)
    start = 0
    for w, bt, r in zip(ws, btypes, rows):
        gguf_launch.dequantize(w.unsqueeze(0), bt, k, dense[:, start : start + r])
        start += r
    return kernels.linear(x2, dense[0], bias)
