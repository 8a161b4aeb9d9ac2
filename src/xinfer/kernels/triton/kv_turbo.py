"""TurboQuant KV cache (kv/turbo.py) in Triton: the store (one program per token and KV
head: scale, indices and packed codes of the rotated k and v rows, float64 like the twin, so
both give the same bits) and the row loader the attention kernels call for `TURBO_BITS` > 0
(codes → indices → centroid table → times the row's scale). Codes as `kv/turbo.pack` lays
them out: 4 bits two a byte (low nibble first), 3 bits as low bit pairs four a byte then
high bits eight a byte."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _quantize_row(
    y_ptr, codes_ptr, scale_ptr, centroids_ptr, boundaries_ptr,
    HEAD_DIM: tl.constexpr, BITS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One rotated row y (HEAD_DIM,) → its BITS * HEAD_DIM / 8 bytes of codes and its scale."""
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    y = tl.load(y_ptr + d, mask=d_mask, other=0.0).to(tl.float64)
    # float64 sqrt and division are IEEE round-to-nearest on the GPU (only float32's are
    # approximate there), so these match torch's
    sigma = tl.sqrt(tl.sum(y * y, axis=0) / HEAD_DIM)
    t = y / tl.where(sigma > 0, sigma, 1.0)
    idx = tl.zeros([BLOCK_D], tl.int32)
    for j in tl.static_range((1 << BITS) - 1):  # the index = the boundaries below t
        idx += (t > tl.load(boundaries_ptr + j)).to(tl.int32)
    idx = tl.where(d_mask, idx, 0)
    c = tl.where(d_mask, tl.load(centroids_ptr + idx).to(tl.float64), 0.0)
    scale = tl.sum(y * c, axis=0) / tl.sum(c * c, axis=0)
    scale = tl.minimum(tl.maximum(scale, -65504.0), 65504.0)
    tl.store(scale_ptr, scale.to(tl.float32).to(tl.float16))
    if BITS == 4:  # two a byte, coordinate 2j in byte j's low nibble
        pairs = tl.reshape(idx, [BLOCK_D // 2, 2])
        byte = tl.sum(pairs << (4 * tl.arange(0, 2))[None, :], axis=1)
        j = tl.arange(0, BLOCK_D // 2)
        tl.store(codes_ptr + j, byte.to(tl.uint8), mask=j < HEAD_DIM // 2)
    else:  # 3 bits: the low bit pairs four a byte, then the high bits eight a byte
        quads = tl.reshape(idx & 3, [BLOCK_D // 4, 4])
        low = tl.sum(quads << (2 * tl.arange(0, 4))[None, :], axis=1)
        j = tl.arange(0, BLOCK_D // 4)
        tl.store(codes_ptr + j, low.to(tl.uint8), mask=j < HEAD_DIM // 4)
        octets = tl.reshape((idx >> 2) & 1, [BLOCK_D // 8, 8])
        high = tl.sum(octets << tl.arange(0, 8)[None, :], axis=1)
        j = tl.arange(0, BLOCK_D // 8)
        tl.store(codes_ptr + HEAD_DIM // 4 + j, high.to(tl.uint8), mask=j < HEAD_DIM // 8)


@triton.jit
def turbo_store_kernel(
    k_ptr,  # (T, Hk, D) rotated k, model dtype
    v_ptr,
    k_codes_ptr,  # (num_blocks, block_size, Hk, BITS * D / 8) uint8, contiguous
    k_scales_ptr,  # (num_blocks, block_size, Hk) float16, contiguous
    v_codes_ptr,
    v_scales_ptr,
    centroids_ptr,  # (2^BITS,) float32
    boundaries_ptr,  # (2^BITS - 1,) float64
    slot_mapping_ptr,  # (T,) flat slot = block_id * block_size + offset; < 0: padding
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    HEAD_DIM: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """grid (T, Hk): token t's k and v of one KV head into the cache at its slot."""
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot >= 0:
        row = slot * tl.num_programs(1) + h  # (slot, head) row of the contiguous caches
        width = BITS * (HEAD_DIM // 8)
        _quantize_row(
            k_ptr + t * stride_kt + h * stride_kh, k_codes_ptr + row * width,
            k_scales_ptr + row, centroids_ptr, boundaries_ptr, HEAD_DIM, BITS, BLOCK_D,
        )  # fmt: skip
        _quantize_row(
            v_ptr + t * stride_vt + h * stride_vh, v_codes_ptr + row * width,
            v_scales_ptr + row, centroids_ptr, boundaries_ptr, HEAD_DIM, BITS, BLOCK_D,
        )  # fmt: skip


@triton.jit
def _fields(codes, WIDTH: tl.constexpr, COUNT: tl.constexpr):
    """(R, B) bytes → (R, B, COUNT) int32: field i of byte j (bits WIDTH * i and up) at
    [.., j, i]. Shifts along a new last axis, not `tl.join`s (see `turbo_kv_rows`)."""
    shifts = WIDTH * tl.arange(0, COUNT)[None, None, :]
    return (codes.to(tl.int32)[:, :, None] >> shifts) & ((1 << WIDTH) - 1)


@triton.jit
def turbo_kv_rows(
    codes_ptr, scales_ptr, centroids_ptr, blk, n, n_mask, d, d_mask,
    block_size: tl.constexpr, stride_b, stride_s,
    HEAD_DIM: tl.constexpr, BITS: tl.constexpr, SHUFFLE: tl.constexpr = False,
):  # fmt: skip
    """(BLOCK_N, BLOCK_D) float32 dequantized rotated rows of key positions `n` in cache
    blocks `blk`: `codes_ptr`/`scales_ptr` at the KV head's first row, codes strides
    (stride_b, stride_s) (contiguous caches: a row's scale sits at its codes offset / width).
    A row's bytes are contiguous, so they load as vectors: 4-bit codes as a (BLOCK_N,
    BLOCK_D / 2) tile, 3-bit codes as a tile of low bit pairs and one of high bits; each
    byte's fields are spread along a new last axis by shifts (`_fields`), which a reshape
    folds into the coordinate. Columns past HEAD_DIM get index 0 (their q and output
    columns are masked by the caller).
    SHUFFLE: the centroid table in registers, looked up with `tl.gather`, instead of a load
    of the cached table a coordinate.

    No `tl.join` here: the rows feed `tl.dot`, and Triton 3.6 (the GPU machine's) takes a
    join in a dot operand's producers for an unpacked 4-bit type, so its MMAv2 dots (the
    decode kernel's) get kWidth 8 instead of 4, which gives wrong sums where the dot's K is
    under 32 (head_dim 16: q . k; a 16-key tile: p . v). Fixed upstream after 3.6 (MMAv2
    kWidth bounded by K; 3.9, the CI's, gives 4 either way); with these shifts 3.6 gives 4
    too. `tests/kernels/test_kv_turbo_compile.py` checks both."""
    row = blk * stride_b + (n % block_size) * stride_s  # (BLOCK_N,) codes offsets
    rows: tl.constexpr = n.shape[0]
    cols: tl.constexpr = d.shape[0]
    if BITS == 4:  # two a byte, coordinate 2j + h in nibble h of byte j
        half = tl.arange(0, cols // 2)
        half_mask = n_mask[:, None] & (half < HEAD_DIM // 2)[None, :]
        pairs = tl.load(codes_ptr + row[:, None] + half[None, :], mask=half_mask, other=0)
        idx = tl.reshape(_fields(pairs, 4, 2), (rows, cols))
    else:  # 3 bits: low bit pairs (coordinate 4j + i), then high bits (8j + i)
        quad = tl.arange(0, cols // 4)
        q_mask = n_mask[:, None] & (quad < HEAD_DIM // 4)[None, :]
        c = tl.load(codes_ptr + row[:, None] + quad[None, :], mask=q_mask, other=0)
        # quad j's high bits: nibble j % 2 of high byte j // 2 (each byte read twice), so
        # that both tiles are (rows, quads): one shape and layout, one reshape
        high = (HEAD_DIM // 4 + quad // 2)[None, :]
        h = tl.load(codes_ptr + row[:, None] + high, mask=q_mask, other=0).to(tl.int32)
        h = (h << 2) >> (4 * (quad % 2))[None, :]  # bit i + 2: coordinate 4j + i's high bit
        i = tl.arange(0, 4)[None, None, :]
        idx = tl.reshape(_fields(c, 2, 4) | ((h[:, :, None] >> i) & 4), (rows, cols))
    scale_ptrs = scales_ptr + row // (BITS * (HEAD_DIM // 8))
    scale = tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32)
    if SHUFFLE:  # the table in registers, looked up with `tl.gather` (warp shuffles)
        table = tl.load(centroids_ptr + tl.arange(0, 1 << BITS))
        table = tl.broadcast_to(table[None, :], (n.shape[0], 1 << BITS))
        values = tl.gather(table, idx, axis=1)
    else:  # a load of the (cached) table a coordinate
        values = tl.load(centroids_ptr + idx)
    return values * scale[:, None]
