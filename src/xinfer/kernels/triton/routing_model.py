"""Triton kernels of the routing model (launched from `xinfer.routing.parametric_launch`;
twins: `advance_state_reference` and `select_experts_reference` in
`xinfer.routing.parametric_ops`, hash helpers: `xinfer.routing.noise`)."""

from __future__ import annotations

import triton
import triton.language as tl

MIX = tl.constexpr(0x45D9F3B)  # a plain annotation is not a constexpr for Triton 3.6
SECOND = tl.constexpr(0x5BD1E995)


@triton.jit
def _mix32(x):
    """uint32 → uint32 hash (noise.mix32: shifts, xors, products mod 2**32)."""
    x = ((x >> 16) ^ x) * MIX
    x = ((x >> 16) ^ x) * MIX
    return (x >> 16) ^ x


@triton.jit
def _u32(x):
    """The low 32 bits of an int64 (negative values wrap, as `x & 0xFFFFFFFF`)."""
    return (x & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _uniform(h):
    return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _normal(tok_hash, offs_e):
    """(BLOCK_E,) N(0, 1) of one token (noise.normal)."""
    h = _mix32(tok_hash ^ offs_e.to(tl.uint32))
    u1 = _uniform(h)
    u2 = _uniform(_mix32(h ^ SECOND))
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(u2 * 6.283185307179586)


@triton.jit
def _first_c(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, pos0, step_key, init_key,
             num_experts, offs, mask, phi, innovation):  # fmt: skip
    """(BLOCK_E,) c of a sequence's first token, at pos0: it continues the state row
    (position just before), repeats it (same position: a dropped step computed it) or starts
    fresh."""
    prev_c = tl.load(state_c_ptr + row * num_experts + offs, mask=mask, other=0.0)
    prev_pos = tl.load(state_pos_ptr + row)
    prev_key = tl.load(state_key_ptr + row)
    eps = _normal(_mix32(step_key ^ _u32(pos0)), offs)
    fresh = _normal(_mix32(init_key ^ _u32(pos0)), offs)
    is_same = (key >= 0) & (prev_key == key)
    c = tl.where(is_same & (prev_pos == pos0), prev_c, fresh)
    follows = is_same & (prev_pos == pos0 - 1) & (pos0 > 0)
    return tl.where(follows, phi * prev_c + innovation * eps, c)


@triton.jit
def _write_state_row(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, last_pos, c,
                     num_experts, scratch_row, offs, mask):  # fmt: skip
    """The sequence's last c back to its row (padding sequences: the scratch row)."""
    target = tl.where(key >= 0, row, scratch_row)
    tl.store(state_c_ptr + target * num_experts + offs, c, mask=mask)
    tl.store(state_pos_ptr + target, last_pos)
    tl.store(state_key_ptr + target, key)


@triton.jit
def routing_state_kernel(
    qsl_ptr, seq_lens_ptr, rows_ptr, keys_ptr,
    state_c_ptr, state_pos_ptr, state_key_ptr,
    c_out_ptr, tok_key_ptr, tok_pos_ptr,
    num_experts, scratch_row, step_base, init_base, phi, innovation,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Decode, grid (B,): each sequence's one token, its c from `_first_c` (the row's c one
    AR(1) step on, repeated, or fresh); c (B, E) f32, the token's key and position written,
    c back to the row. Prompts take the scan passes below."""
    b = tl.program_id(0)
    tok = tl.load(qsl_ptr + b).to(tl.int64)
    pos = tl.load(seq_lens_ptr + b).to(tl.int64) - 1
    key = tl.load(keys_ptr + b)
    row = tl.load(rows_ptr + b)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    step_key = _mix32(step_base.to(tl.uint32) ^ _u32(key))
    init_key = _mix32(init_base.to(tl.uint32) ^ _u32(key))
    c = _first_c(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, pos, step_key,
                 init_key, num_experts, offs, mask, phi, innovation)  # fmt: skip
    tl.store(c_out_ptr + tok * num_experts + offs, c, mask=mask)
    tl.store(tok_key_ptr + tok, key)
    tl.store(tok_pos_ptr + tok, pos)
    _write_state_row(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, pos, c,
                     num_experts, scratch_row, offs, mask)  # fmt: skip


@triton.jit
def _block_of(qsl_ptr, b, blk, BLOCK_T: tl.constexpr):
    """(first token, tokens) of sequence b and the first token of its block blk in it."""
    start = tl.load(qsl_ptr + b).to(tl.int64)
    length = tl.load(qsl_ptr + b + 1).to(tl.int64) - start
    return start, length, blk * BLOCK_T


@triton.jit
def _row_at(tile, i, BLOCK_T: tl.constexpr):
    """Row i of a (BLOCK_T, BLOCK_E) tile (a masked sum: no dynamic indexing)."""
    return tl.sum(tl.where((tl.arange(0, BLOCK_T) == i)[:, None], tile, 0.0), axis=0)


@triton.jit
def _ar1_combine(a1, y1, a2, y2):
    """Two affine maps y -> a·y + x composed (the first, then the second)."""
    return a1 * a2, a2 * y1 + y2


@triton.jit
def routing_scan_local_kernel(
    qsl_ptr, seq_lens_ptr, rows_ptr, keys_ptr,
    state_c_ptr, state_pos_ptr, state_key_ptr,
    c_out_ptr, tok_key_ptr, tok_pos_ptr, block_end_ptr,
    num_experts, num_blocks, step_base, init_base, phi, innovation,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Prefill, pass 1 of 2, grid (B, num_blocks): BLOCK_T tokens of one sequence at once.
    Every token's innovation in parallel, then the AR(1) walk over the block as a scan from
    zero (`_ar1_combine`); the block's first row is `_first_c` in the sequence's first
    block. Writes the local c, keys and positions, and the block's last local c for pass 2."""
    b = tl.program_id(0)
    blk = tl.program_id(1)
    start, length, t0 = _block_of(qsl_ptr, b, blk, BLOCK_T)
    if t0 >= length:
        return
    pos0 = tl.load(seq_lens_ptr + b).to(tl.int64) - length
    key = tl.load(keys_ptr + b)
    row = tl.load(rows_ptr + b)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    j = t0 + tl.arange(0, BLOCK_T)
    mask_t = j < length
    pos = pos0 + j
    step_key = _mix32(step_base.to(tl.uint32) ^ _u32(key))
    init_key = _mix32(init_base.to(tl.uint32) ^ _u32(key))
    eps = _normal(_mix32(step_key ^ _u32(pos))[:, None], offs[None, :])  # (BLOCK_T, BLOCK_E)
    first = _first_c(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, pos0, step_key,
                     init_key, num_experts, offs, mask, phi, innovation)  # fmt: skip
    x = tl.where((j == 0)[:, None], first[None, :], innovation * eps)
    x = tl.where(mask_t[:, None], x, 0.0)
    a = tl.full((BLOCK_T, BLOCK_E), 1.0, tl.float32) * phi
    _, y = tl.associative_scan((a, x), 0, _ar1_combine)
    rows_t = start + j
    m2 = mask_t[:, None] & mask[None, :]
    tl.store(c_out_ptr + rows_t[:, None] * num_experts + offs[None, :], y, mask=m2)
    tl.store(tok_key_ptr + rows_t, tl.zeros((BLOCK_T,), tl.int64) + key, mask=mask_t)
    tl.store(tok_pos_ptr + rows_t, pos, mask=mask_t)
    y_last = _row_at(y, tl.minimum(length - t0, BLOCK_T) - 1, BLOCK_T)
    tl.store(block_end_ptr + (b * num_blocks + blk) * BLOCK_E + offs, y_last)


@triton.jit
def routing_scan_carry_kernel(
    qsl_ptr, seq_lens_ptr, rows_ptr, keys_ptr,
    state_c_ptr, state_pos_ptr, state_key_ptr,
    c_out_ptr, block_end_ptr,
    num_experts, num_blocks, scratch_row, phi,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Prefill, pass 2 of 2, grid (B, num_blocks): the c entering block `blk` from the blocks
    before it (each a full block: carry ← φ^BLOCK_T·carry + its last local c), added to the
    block's local c as φ^(i+1)·carry at its row i; the sequence's last block writes the row."""
    b = tl.program_id(0)
    blk = tl.program_id(1)
    start, length, t0 = _block_of(qsl_ptr, b, blk, BLOCK_T)
    if t0 >= length:
        return
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    powers = tl.cumprod(tl.full((BLOCK_T,), 1.0, tl.float32) * phi, 0)  # φ^(i+1)
    full_decay = tl.sum(tl.where(tl.arange(0, BLOCK_T) == BLOCK_T - 1, powers, 0.0), 0)
    carry = tl.zeros((BLOCK_E,), tl.float32)
    for k in range(0, blk):
        end_k = tl.load(block_end_ptr + (b * num_blocks + k) * BLOCK_E + offs)
        carry = full_decay * carry + end_k
    j = t0 + tl.arange(0, BLOCK_T)
    mask_t = j < length
    m2 = mask_t[:, None] & mask[None, :]
    ptrs = c_out_ptr + (start + j)[:, None] * num_experts + offs[None, :]
    c = tl.load(ptrs, mask=m2, other=0.0) + powers[:, None] * carry[None, :]
    tl.store(ptrs, c, mask=m2)
    if t0 + BLOCK_T >= length:
        c_last = _row_at(c, length - t0 - 1, BLOCK_T)
        key = tl.load(keys_ptr + b)
        row = tl.load(rows_ptr + b)
        pos_last = tl.load(seq_lens_ptr + b).to(tl.int64) - 1
        _write_state_row(state_c_ptr, state_pos_ptr, state_key_ptr, row, key, pos_last,
                         c_last, num_experts, scratch_row, offs, mask)  # fmt: skip


@triton.jit
def routing_select_kernel(
    c_ptr, tok_key_ptr, tok_pos_ptr, logits_ptr, popularity_ptr,
    weights_ptr, ids_ptr,
    num_experts, stride_lt, gumbel_base, drift_scale,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """grid (T,): one token's top-k of popularity + drift_scale·c + Gumbel (ties: lowest
    index, as torch.topk), weights = float32 softmax of its router logits at those ids."""
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    key = tl.load(tok_key_ptr + tok)
    pos = tl.load(tok_pos_ptr + tok)
    h = _mix32(_mix32(gumbel_base.to(tl.uint32) ^ _u32(key)) ^ _u32(pos))
    u = _uniform(_mix32(h ^ offs.to(tl.uint32)))
    g = -tl.log(-tl.log(u))
    c = tl.load(c_ptr + tok * num_experts + offs, mask=mask, other=0.0)
    pop = tl.load(popularity_ptr + offs, mask=mask, other=0.0)
    score = tl.where(mask, pop + drift_scale * c + g, -float("inf"))
    x = tl.load(logits_ptr + tok * stride_lt + offs, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    num = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
    probs = num / tl.sum(num, axis=0)
    offs_k = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(score, axis=0)
        idx = tl.min(tl.where(score == best, offs, BLOCK_E), axis=0)
        w = tl.sum(tl.where(offs == idx, probs, 0.0), axis=0)
        top_w = tl.where(offs_k == j, w, top_w)
        top_i = tl.where(offs_k == j, idx, top_i)
        score = tl.where(offs == idx, -float("inf"), score)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)  # lanes >= TOP_K hold 0
    mask_k = offs_k < TOP_K
    tl.store(weights_ptr + tok * TOP_K + offs_k, top_w, mask=mask_k)
    tl.store(ids_ptr + tok * TOP_K + offs_k, top_i, mask=mask_k)
