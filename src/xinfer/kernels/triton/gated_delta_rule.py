"""The gated delta rule of Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention) over
packed sequences with per-request state slots (S, Hv, Dk, Dv) float32.

Prefill is chunked (chunks of BT tokens from each span's start), in two launches:
`chunk_prepare_kernel` (every chunk in parallel) computes the in-chunk cumulative decay and
the WY factors w = T (beta·exp(gc)·k), u = T (beta·v) with T = (I + A)^-1,
A_ij = beta_i (k_i·k_j) exp(gc_i − gc_j) for i > j (forward substitution in registers);
`chunk_forward_kernel` walks each (sequence, value head, value block) through its chunks:
v_new = u − w S, out = exp(gc) q S + (q kᵀ ∘ decay) v_new, S ← exp(gc_last) S +
(exp(gc_last − gc) k)ᵀ v_new. Decode is `recurrent_step_kernel`: one token per sequence.
q and k are L2-normalised (eps 1e-6) in the kernels, q scaled by Dk^-1/2; the decay
g = −exp(A_log)·softplus(a + dt_bias) and beta = sigmoid(b) are computed in them too.
A slot owns `copies` state rows (see `linear_attn_reference`): read the cached length's
parity, write the new length's."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gate_beta(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, h, rows, mask, stride_ab):
    """g (log-decay, ≤ 0) and beta for `rows`; masked rows get g = 0, beta = 0."""
    a = tl.load(a_ptr + rows * stride_ab + h, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_ab + h, mask=mask, other=0.0).to(tl.float32)
    x = a + tl.load(dt_bias_ptr + h).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32)) * softplus
    return tl.where(mask, g, 0.0), tl.where(mask, tl.sigmoid(b), 0.0)


@triton.jit
def _load_l2norm(ptr, rows, mask, stride_t, head_off, d, d_mask):
    """(rows, D) float32 rows of one head, each scaled to unit L2 norm (eps 1e-6)."""
    x = tl.load(
        ptr + rows[:, None] * stride_t + head_off + d[None, :],
        mask=mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def chunk_prepare_kernel(
    k_ptr,  # (T, Hk, Dk), unit stride in Dk
    v_ptr,  # (T, Hv, Dv), unit stride in Dv
    a_ptr,  # (T, Hv), unit stride in Hv
    b_ptr,  # (T, Hv), same row stride as a
    a_log_ptr,  # (Hv,)
    dt_bias_ptr,  # (Hv,)
    w_ptr,  # (T, Hv, Dk) float32 out
    u_ptr,  # (T, Hv, Dv) float32 out
    gc_ptr,  # (T, Hv) float32 out: cumulative g since the chunk start
    query_start_loc_ptr,
    stride_kt,
    stride_vt,
    stride_ab,
    num_v_heads,
    group,  # value heads per key head
    head_k_dim,
    head_v_dim,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq, chunk, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(query_start_loc_ptr + seq)
    n = tl.load(query_start_loc_ptr + seq + 1) - start
    if chunk * BT >= n:
        return
    i = tl.arange(0, BT)
    mask = chunk * BT + i < n
    rows = (start + chunk * BT + i).to(tl.int64)
    dk, dv = tl.arange(0, BK), tl.arange(0, BV)
    k = _load_l2norm(k_ptr, rows, mask, stride_kt, (h // group) * head_k_dim, dk, dk < head_k_dim)
    g, beta = _gate_beta(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, h, rows, mask, stride_ab)
    gc = tl.cumsum(g, axis=0)
    lower = i[:, None] > i[None, :]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], float("-inf")))
    kk = tl.dot(k * beta[:, None], tl.trans(k), input_precision=DOT_PRECISION)
    a_mat = tl.where(lower, kk * decay, 0.0)  # strictly lower (BT, BT)
    # T = (I + A)^-1 by forward substitution: row r = e_r − Σ_{j<r} A_rj T_j
    t_inv = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    for r in range(1, BT):
        a_r = tl.sum(tl.where(i[:, None] == r, a_mat, 0.0), axis=0)  # (BT,) over j
        row = tl.where(i == r, 1.0, 0.0) - tl.sum(a_r[:, None] * t_inv, axis=0)
        t_inv = tl.where(i[:, None] == r, row[None, :], t_inv)
    w = tl.dot(t_inv, k * (beta * tl.exp(gc))[:, None], input_precision=DOT_PRECISION)
    v = tl.load(
        v_ptr + rows[:, None] * stride_vt + h * head_v_dim + dv[None, :],
        mask=mask[:, None] & (dv < head_v_dim)[None, :],
        other=0.0,
    ).to(tl.float32)
    u = tl.dot(t_inv, v * beta[:, None], input_precision=DOT_PRECISION)
    out_rows = rows[:, None] * num_v_heads + h
    tl.store(
        w_ptr + out_rows * head_k_dim + dk[None, :],
        w,
        mask=mask[:, None] & (dk < head_k_dim)[None, :],
    )
    tl.store(
        u_ptr + out_rows * head_v_dim + dv[None, :],
        u,
        mask=mask[:, None] & (dv < head_v_dim)[None, :],
    )
    tl.store(gc_ptr + rows * num_v_heads + h, gc, mask=mask)


@triton.jit
def chunk_forward_kernel(
    q_ptr,  # (T, Hk, Dk), unit stride in Dk
    k_ptr,  # (T, Hk, Dk)
    w_ptr,  # (T, Hv, Dk) float32 from the prepare kernel
    u_ptr,  # (T, Hv, Dv) float32
    gc_ptr,  # (T, Hv) float32
    out_ptr,  # (T, Hv, Dv) contiguous
    state_ptr,  # (S·copies, Hv, Dk, Dv) float32 contiguous
    query_start_loc_ptr,
    seq_lens_ptr,
    state_ids_ptr,
    stride_qt,
    stride_kt,
    num_v_heads,
    group,
    head_k_dim,
    head_v_dim,
    scale,  # Dk^-1/2
    copies,  # state rows per slot
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(query_start_loc_ptr + seq)
    n = tl.load(query_start_loc_ptr + seq + 1) - start
    sid = tl.load(state_ids_ptr + seq).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    read, write = sid * copies + (seq_len - n) % copies, sid * copies + seq_len % copies
    # state rows to read: all for a continuing sequence, none for a fresh one or padding
    # (a count, not a scalar flag ANDed into the mask, which the interpreter mistypes)
    prev_rows = tl.where((sid >= 0) & (seq_len - n > 0), head_k_dim, 0)
    i, dk = tl.arange(0, BT), tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    dk_mask, dv_mask = dk < head_k_dim, dv < head_v_dim
    s_mask = dk_mask[:, None] & dv_mask[None, :]
    s_read = state_ptr + ((read * num_v_heads + h) * head_k_dim + dk[:, None]) * head_v_dim
    state = tl.load(s_read + dv[None, :], mask=s_mask & (dk < prev_rows)[:, None], other=0.0)
    k_off = (h // group) * head_k_dim
    for c0 in range(0, n, BT):
        mask = c0 + i < n
        rows = (start + c0 + i).to(tl.int64)
        q = _load_l2norm(q_ptr, rows, mask, stride_qt, k_off, dk, dk_mask) * scale
        k = _load_l2norm(k_ptr, rows, mask, stride_kt, k_off, dk, dk_mask)
        gc = tl.load(gc_ptr + rows * num_v_heads + h, mask=mask, other=0.0)
        gc_last = tl.sum(tl.where(c0 + i == tl.minimum(n, c0 + BT) - 1, gc, 0.0), axis=0)
        hv_rows = rows[:, None] * num_v_heads + h
        w = tl.load(
            w_ptr + hv_rows * head_k_dim + dk[None, :],
            mask=mask[:, None] & dk_mask[None, :],
            other=0.0,
        )
        u = tl.load(
            u_ptr + hv_rows * head_v_dim + dv[None, :],
            mask=mask[:, None] & dv_mask[None, :],
            other=0.0,
        )
        v_new = u - tl.dot(w, state, input_precision=DOT_PRECISION)  # (BT, BV)
        causal = (i[:, None] >= i[None, :]) & mask[:, None]  # rows past the span: none
        decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
        attn = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * decay
        out = tl.dot(q * tl.exp(gc)[:, None], state, input_precision=DOT_PRECISION)
        out += tl.dot(attn, v_new, input_precision=DOT_PRECISION)
        dst = out_ptr + hv_rows * head_v_dim + dv[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask[:, None] & dv_mask[None, :])
        k_tail = k * tl.exp(tl.where(mask, gc_last - gc, float("-inf")))[:, None]
        state = state * tl.exp(gc_last) + tl.dot(
            tl.trans(k_tail), v_new, input_precision=DOT_PRECISION
        )
    if sid >= 0:
        s_write = state_ptr + ((write * num_v_heads + h) * head_k_dim + dk[:, None]) * head_v_dim
        tl.store(s_write + dv[None, :], state, mask=s_mask)


@triton.jit
def recurrent_step_kernel(
    q_ptr,  # (B, Hk, Dk), unit stride in Dk: one token per sequence
    k_ptr,
    v_ptr,  # (B, Hv, Dv), unit stride in Dv
    a_ptr,  # (B, Hv)
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    out_ptr,  # (B, Hv, Dv) contiguous
    state_ptr,  # (S·copies, Hv, Dk, Dv) float32 contiguous
    seq_lens_ptr,
    state_ids_ptr,
    stride_qt,
    stride_kt,
    stride_vt,
    stride_ab,
    num_v_heads,
    group,
    head_k_dim,
    head_v_dim,
    scale,
    copies,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    row, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    sid = tl.load(state_ids_ptr + row).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    read, write = sid * copies + (seq_len - 1) % copies, sid * copies + seq_len % copies
    prev_rows = tl.where((sid >= 0) & (seq_len > 1), head_k_dim, 0)
    dk = tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    dk_mask, dv_mask = dk < head_k_dim, dv < head_v_dim
    r64 = row.to(tl.int64)
    k_off = (h // group) * head_k_dim
    q = tl.load(q_ptr + r64 * stride_qt + k_off + dk, mask=dk_mask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + r64 * stride_kt + k_off + dk, mask=dk_mask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    v = tl.load(v_ptr + r64 * stride_vt + h * head_v_dim + dv, mask=dv_mask, other=0.0).to(
        tl.float32
    )
    g, beta = _gate_beta(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, h, r64, True, stride_ab)
    s_mask = dk_mask[:, None] & dv_mask[None, :]
    s_off = (h * head_k_dim + dk[:, None]) * head_v_dim + dv[None, :]  # within a state row
    row_size = num_v_heads * head_k_dim * head_v_dim
    s_read = state_ptr + read * row_size + s_off
    state = tl.load(s_read, mask=s_mask & (dk < prev_rows)[:, None], other=0.0) * tl.exp(g)
    kv = tl.sum(state * k[:, None], axis=0)  # (BV,)
    delta = (v - kv) * beta
    state = state + k[:, None] * delta[None, :]
    out = tl.sum(state * q[:, None], axis=0)
    tl.store(
        out_ptr + (r64 * num_v_heads + h) * head_v_dim + dv,
        out.to(out_ptr.dtype.element_ty),
        mask=dv_mask,
    )
    if sid >= 0:
        tl.store(state_ptr + write * row_size + s_off, state, mask=s_mask)
