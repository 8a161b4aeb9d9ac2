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
def routing_state_kernel(
    qsl_ptr, seq_lens_ptr, rows_ptr, keys_ptr,
    state_c_ptr, state_pos_ptr, state_key_ptr,
    c_out_ptr, tok_key_ptr, tok_pos_ptr,
    num_experts, scratch_row, step_base, init_base, phi, innovation,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """grid (B,): one sequence's tokens in order. c of the first token continues the state
    row (position just before), repeats it (same position: a dropped step computed it) or
    starts fresh; each next token takes one AR(1) step. c (T, E) f32 and each token's key
    and position are written; the last c goes back to the row (real sequences only)."""
    b = tl.program_id(0)
    start = tl.load(qsl_ptr + b).to(tl.int64)
    end = tl.load(qsl_ptr + b + 1).to(tl.int64)
    pos0 = tl.load(seq_lens_ptr + b).to(tl.int64) - (end - start)
    key = tl.load(keys_ptr + b)
    row = tl.load(rows_ptr + b)
    is_valid = key >= 0
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    prev_c = tl.load(state_c_ptr + row * num_experts + offs, mask=mask, other=0.0)
    prev_pos = tl.load(state_pos_ptr + row)
    prev_key = tl.load(state_key_ptr + row)
    step_key = _mix32(step_base.to(tl.uint32) ^ _u32(key))
    init_key = _mix32(init_base.to(tl.uint32) ^ _u32(key))
    eps = _normal(_mix32(step_key ^ _u32(pos0)), offs)
    fresh = _normal(_mix32(init_key ^ _u32(pos0)), offs)
    is_same = is_valid & (prev_key == key)
    c = tl.where(is_same & (prev_pos == pos0), prev_c, fresh)
    follows = is_same & (prev_pos == pos0 - 1) & (pos0 > 0)
    c = tl.where(follows, phi * prev_c + innovation * eps, c)
    tl.store(c_out_ptr + start * num_experts + offs, c, mask=mask)
    tl.store(tok_key_ptr + start, key)
    tl.store(tok_pos_ptr + start, pos0)
    for j in range(1, end - start):
        pos = pos0 + j
        eps = _normal(_mix32(step_key ^ _u32(pos)), offs)
        c = phi * c + innovation * eps
        tl.store(c_out_ptr + (start + j) * num_experts + offs, c, mask=mask)
        tl.store(tok_key_ptr + start + j, key)
        tl.store(tok_pos_ptr + start + j, pos)
    target = tl.where(is_valid, row, scratch_row)
    tl.store(state_c_ptr + target * num_experts + offs, c, mask=mask)
    tl.store(state_pos_ptr + target, pos0 + (end - start) - 1)
    tl.store(state_key_ptr + target, key)


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
