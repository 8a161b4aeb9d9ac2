"""The fill of packed expert tensors (`--moe-offload-compress`): `unpack_fill_kernel` reads a
missed expert's packed planes from device-mapped host memory (12 bits an element cross the
link) and writes its bf16 row into the slot, bit for bit. The layout and the reference twin
are in `xinfer.offload.packed`."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.offload import miss_block


@triton.jit
def _unpack_block(
    low_ptr, codes_ptr, escapes_ptr, starts_ptr, dst_ptr, words, capacity, blocks, base,
    expert, slot, block, BLOCK: tl.constexpr,
):  # fmt: skip
    """Block `block` (BLOCK elements, BLOCK / 8 words of each plane) of one expert's row into
    row `slot` of `dst` (int16 view of the bf16 slots). `low_ptr` is the low plane as bytes."""
    W: tl.constexpr = BLOCK // 8
    w = block * W + tl.arange(0, W)
    j = tl.arange(0, 8)
    in_row = w < words
    offs = w[:, None] * 8 + j[None, :]  # (W, 8) elements, in row order
    mask = in_row[:, None]
    # low: the (W, 8) bytes as they lie (one 8-byte load a word); codes: one word a row
    low = tl.load(low_ptr + expert * (words * 8) + offs, mask=mask, other=0).to(tl.int32)
    code_word = tl.load(codes_ptr + expert * words + w, mask=in_row, other=0)
    code = (code_word[:, None] >> (j[None, :] * 4)) & 15
    exponent = code + base
    escaped = (code == 15) & mask
    per_word = tl.sum(escaped.to(tl.int32), axis=1)
    if tl.sum(per_word, axis=0) > 0:  # rare (~1.5e-4 of trained weights): a scan for ranks
        esc = escaped.to(tl.int32)
        before_word = tl.cumsum(per_word, axis=0) - per_word
        rank = before_word[:, None] + tl.cumsum(esc, axis=1) - esc
        start = tl.load(starts_ptr + expert * blocks + block)
        where = escapes_ptr + expert * capacity + start + rank
        exponent = tl.where(escaped, tl.load(where, mask=escaped, other=0).to(tl.int32), exponent)
    bits = ((low & 0x80) << 8) | (exponent << 7) | (low & 0x7F)
    tl.store(dst_ptr + slot * (words * 8) + offs, bits.to(tl.int16), mask=mask)


@triton.jit
def unpack_fill_kernel(
    # Up to two packed tensors: their planes (low as bytes, codes int32, escapes uint8, starts
    # int32: device-mapped host memory), the slots (int16 view), words (= elements / 8) a
    # row, escape capacity, blocks a row, and the exponent base.
    low0, codes0, escapes0, starts0, dst0, words0, capacity0, blocks0, base0,
    low1, codes1, escapes1, starts1, dst1, words1, capacity1, blocks1, base1,
    miss_ids_ptr,  # (capacity,) int32
    miss_slots_ptr,  # (capacity,) int32: rows of the slot view (slots or overflow)
    miss_count_ptr,  # (1,) int32, read on the device: the grid is fixed
    NUM_TENSORS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # As the plain fill: every block of every missed expert's rows in one list, dealt out
    # round-robin over the fixed grid.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    per_expert = blocks0
    if NUM_TENSORS > 1:
        per_expert += blocks1
    total = tl.load(miss_count_ptr) * per_expert
    for b in range(pid, total, num_programs):
        expert, slot, r = miss_block(b, per_expert, miss_ids_ptr, miss_slots_ptr)
        if r < blocks0:
            _unpack_block(low0, codes0, escapes0, starts0, dst0, words0, capacity0, blocks0,
                          base0, expert, slot, r, BLOCK)  # fmt: skip
        if NUM_TENSORS > 1:
            if r >= blocks0:
                _unpack_block(low1, codes1, escapes1, starts1, dst1, words1, capacity1,
                              blocks1, base1, expert, slot, r - blocks0, BLOCK)  # fmt: skip
