"""Candidate ways to move missed experts host → GPU inside a CUDA graph, for
`bench_offload_fill.py --variants`: each copies the rows `miss_ids[m]` of a mapped, pinned
host tensor (E, row_words) int32 into rows `miss_slots[m]` of a device tensor, reading the
miss count from device memory (so every one is graph-safe), with the production fill's
round-robin deal of blocks over a fixed grid. They differ in how the loads are issued:

- `words`: the production scheme (one BLOCK of 4-byte words a step);
- `vec4`: (BLOCK/4, 4) tiles with 16-byte alignment hints, so each thread issues 128-bit
  loads (fewer, wider requests in flight);
- `cg` / `stream`: the same with the `.cg` cache modifier / `evict_first` policy (the bytes
  are read once: skip L1, do not keep them in L2);
- `pipelined`: each program loops over its blocks with `tl.range(num_stages=4)`, so Triton
  keeps several blocks' loads in flight (cp.async where it can);
- `tma`: Hopper tensor-memory-accelerator loads through a device-side tensor descriptor over
  the mapped host rows (may be refused by the driver for host memory: reported, not fatal).

The winner can replace `kernels/triton/offload.py:fill_kernel` (same arguments per tensor)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _deal(miss_count_ptr, row_words, BLOCK: tl.constexpr):
    blocks = tl.cdiv(row_words, BLOCK)
    return tl.load(miss_count_ptr) * blocks, blocks


@triton.jit
def fill_words(src, dst, row_words, miss_ids, miss_slots, miss_count, BLOCK: tl.constexpr):
    total, per = _deal(miss_count, row_words, BLOCK)
    for b in range(tl.program_id(0), total, tl.num_programs(0)):
        m = b // per
        e = tl.load(miss_ids + m).to(tl.int64)
        s = tl.load(miss_slots + m).to(tl.int64)
        offs = (b - m * per) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < row_words
        v = tl.load(src + e * row_words + offs, mask=mask)
        tl.store(dst + s * row_words + offs, v, mask=mask)


@triton.jit
def fill_vec4(
    src, dst, row_words, miss_ids, miss_slots, miss_count,
    BLOCK: tl.constexpr, CACHE: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    # Rows are a multiple of 4 words and 16-byte aligned (checked by the launcher).
    total, per = _deal(miss_count, row_words, BLOCK)
    r = tl.arange(0, BLOCK // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]  # (BLOCK/4, 4)
    for b in range(tl.program_id(0), total, tl.num_programs(0)):
        m = b // per
        e = tl.load(miss_ids + m).to(tl.int64)
        s = tl.load(miss_slots + m).to(tl.int64)
        start = (b - m * per) * BLOCK
        src_row = tl.multiple_of(src + e * row_words + start, 16)  # bytes
        dst_row = tl.multiple_of(dst + s * row_words + start, 16)
        mask = start + r < row_words
        v = tl.load(src_row + r, mask=mask, cache_modifier=CACHE, eviction_policy=EVICT)
        tl.store(dst_row + r, v, mask=mask)


@triton.jit
def fill_pipelined(
    src, dst, row_words, miss_ids, miss_slots, miss_count,
    BLOCK: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    total, per = _deal(miss_count, row_words, BLOCK)
    offs0 = tl.arange(0, BLOCK)
    for b in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages=STAGES):
        m = b // per
        e = tl.load(miss_ids + m).to(tl.int64)
        s = tl.load(miss_slots + m).to(tl.int64)
        offs = (b - m * per) * BLOCK + offs0
        mask = offs < row_words
        v = tl.load(src + e * row_words + offs, mask=mask)
        tl.store(dst + s * row_words + offs, v, mask=mask)


@triton.jit
def fill_tma(
    src, dst, num_rows, row_words, miss_ids, miss_slots, miss_count,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # The host rows seen as a (E * row_words / BLOCK_C, BLOCK_C) matrix; an expert's row is
    # row_words / BLOCK_C consecutive matrix rows (row_words % BLOCK_C == 0: launcher).
    cols = row_words // BLOCK_C
    desc = tl.make_tensor_descriptor(
        src, shape=[num_rows * cols, BLOCK_C], strides=[BLOCK_C, 1],
        block_shape=[BLOCK_R, BLOCK_C],
    )  # fmt: skip
    per = tl.cdiv(cols, BLOCK_R)
    total = tl.load(miss_count) * per
    r = tl.arange(0, BLOCK_R)[:, None]
    c = tl.arange(0, BLOCK_C)[None, :]
    for b in range(tl.program_id(0), total, tl.num_programs(0)):
        m = b // per
        e = tl.load(miss_ids + m)
        s = tl.load(miss_slots + m).to(tl.int64)
        first = (b - m * per) * BLOCK_R
        v = desc.load([e * cols + first, 0])
        mask = first + r < cols
        tl.store(dst + s * row_words + (first + r) * BLOCK_C + c, v, mask=mask)
