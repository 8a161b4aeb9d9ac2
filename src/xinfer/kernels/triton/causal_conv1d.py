"""Depthwise causal conv1d + SiLU of Gated DeltaNet over packed sequences, with each
sequence's last K-1 inputs kept in a state slot between steps. Prefill: `conv1d_prefill_kernel`
(one program per sequence, token block and channel block) then `conv1d_state_kernel` (the
new states, after every program has read the old ones). Decode: `conv1d_update_kernel`
does one token per sequence and its state shift in one program. Float32 arithmetic, one
rounding on store. A state id < 0 (padding) reads zeros and writes no state. A slot owns
`copies` rows (1, or 2 used in turn: read the cached length's parity, write the new
length's, see `linear_attn_reference`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _span(query_start_loc_ptr, seq_lens_ptr, state_ids_ptr, b, copies, K: tl.constexpr):
    """(start, new tokens, slot, state row read, state row written, inputs held in the
    read row: K-1, or 0 for a fresh sequence or padding). Masks compare against that count
    rather than AND a scalar flag, which the interpreter would turn into an integer mask."""
    start = tl.load(query_start_loc_ptr + b)
    n = tl.load(query_start_loc_ptr + b + 1) - start
    sid = tl.load(state_ids_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    read, write = sid * copies + (seq_len - n) % copies, sid * copies + seq_len % copies
    prev_rows = tl.where((sid >= 0) & (seq_len - n > 0), K - 1, 0)
    return start, n, sid, read, write, prev_rows


@triton.jit
def conv1d_prefill_kernel(
    x_ptr,  # (T, C), unit stride in C
    w_ptr,  # (C, K) contiguous
    state_ptr,  # (S·copies, K-1, C) contiguous
    out_ptr,  # (T, C) contiguous
    query_start_loc_ptr,  # (B+1,)
    seq_lens_ptr,  # (B,)
    state_ids_ptr,  # (B,)
    stride_x,
    num_channels,
    copies,  # state rows per slot
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    start, n, sid, read, write, prev_rows = _span(
        query_start_loc_ptr, seq_lens_ptr, state_ids_ptr, b, copies, K
    )
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # token index within the span
    if tl.program_id(1) * BLOCK_T >= n:
        return
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < num_channels
    row_mask = (t < n)[:, None] & c_mask[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(K):  # tap j reads the input K-1-j tokens back
        src = t - (K - 1) + j  # < 0: an input of an earlier step, kept in the state
        from_x = (src >= 0)[:, None] & row_mask
        from_state = ((src < 0) & (src >= -prev_rows))[:, None] & row_mask
        xv = tl.load(
            x_ptr + (start + src).to(tl.int64)[:, None] * stride_x + c[None, :],
            mask=from_x,
            other=0.0,
        )
        sv = tl.load(
            state_ptr + (read * (K - 1) + (K - 1) + src)[:, None] * num_channels + c[None, :],
            mask=from_state,
            other=0.0,
        )
        w = tl.load(w_ptr + c * K + j, mask=c_mask, other=0.0).to(tl.float32)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * w[None, :]
    out = acc * tl.sigmoid(acc)
    dst = out_ptr + (start + t).to(tl.int64)[:, None] * num_channels + c[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def conv1d_state_kernel(
    x_ptr,  # (T, C), unit stride in C
    state_ptr,  # (S·copies, K-1, C) contiguous
    query_start_loc_ptr,
    seq_lens_ptr,
    state_ids_ptr,
    stride_x,
    num_channels,
    copies,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,  # >= K-1, a power of two
    BLOCK_C: tl.constexpr,
):
    """After the prefill kernel: each slot's written row ← the last K-1 inputs of its
    sequence (older inputs come from the read row when the span is shorter than K-1)."""
    b = tl.program_id(0)
    start, n, sid, read, write, prev_rows = _span(
        query_start_loc_ptr, seq_lens_ptr, state_ids_ptr, b, copies, K
    )
    if (sid < 0) | (n == 0):
        return
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    mask = (r < K - 1)[:, None] & (c < num_channels)[None, :]
    src = n - (K - 1) + r  # the input that becomes state row r
    xv = tl.load(
        x_ptr + (start + src).to(tl.int64)[:, None] * stride_x + c[None, :],
        mask=mask & (src >= 0)[:, None],
        other=0.0,
    )
    rows = state_ptr + (read * (K - 1) + (K - 1) + src)[:, None] * num_channels + c[None, :]
    sv = tl.load(rows, mask=mask & ((src < 0) & (src >= -prev_rows))[:, None], other=0.0)
    new = xv.to(tl.float32) + sv.to(tl.float32)
    tl.debug_barrier()  # every thread has read the old rows before any is overwritten
    dst = state_ptr + (write * (K - 1) + r)[:, None] * num_channels + c[None, :]
    tl.store(dst, new.to(state_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv1d_update_kernel(
    x_ptr,  # (B, C), unit stride in C: one new token per sequence
    w_ptr,  # (C, K) contiguous
    state_ptr,  # (S·copies, K-1, C) contiguous
    out_ptr,  # (B, C) contiguous
    seq_lens_ptr,  # (B,)
    state_ids_ptr,  # (B,)
    stride_x,
    num_channels,
    copies,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    sid = tl.load(state_ids_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    read, write = sid * copies + (seq_len - 1) % copies, sid * copies + seq_len % copies
    prev_rows = tl.where((sid >= 0) & (seq_len > 1), K - 1, 0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < num_channels
    r = tl.arange(0, BLOCK_R)
    mask = (r < K - 1)[:, None] & c_mask[None, :]
    x = tl.load(x_ptr + b.to(tl.int64) * stride_x + c, mask=c_mask, other=0.0).to(tl.float32)
    rows = state_ptr + (read * (K - 1) + r)[:, None] * num_channels + c[None, :]
    old = tl.load(rows, mask=mask & (r < prev_rows)[:, None], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c[None, :] * K + r[:, None], mask=mask, other=0.0).to(tl.float32)
    w_last = tl.load(w_ptr + c * K + (K - 1), mask=c_mask, other=0.0).to(tl.float32)
    acc = tl.sum(old * w, axis=0) + x * w_last
    tl.store(
        out_ptr + b * num_channels + c,
        (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty),
        mask=c_mask,
    )
    if sid >= 0:  # shift: row r ← old row r+1, the last row ← x
        nxt = tl.load(rows + num_channels, mask=mask & (r + 1 < prev_rows)[:, None], other=0.0)
        new = tl.where((r == K - 2)[:, None], x[None, :], nxt.to(tl.float32))
        tl.debug_barrier()  # every thread has read the old rows before any is overwritten
        dst = state_ptr + (write * (K - 1) + r)[:, None] * num_channels + c[None, :]
        tl.store(dst, new.to(state_ptr.dtype.element_ty), mask=mask)
