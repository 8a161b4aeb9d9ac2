"""Triton launchers for the linear-attention kernels (causal conv1d, gated delta rule,
gated RMSNorm, sigmoid output gate): strides, output allocation, grids and tile sizes.
`xinfer.kernels.linear_attn` calls these on CUDA; they also run on CPU tensors under
`TRITON_INTERPRET=1` (the interpreter tests)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels.triton import causal_conv1d as conv
from xinfer.kernels.triton import gated_delta_rule as gdr
from xinfer.kernels.triton import gated_norm

CHUNK = 64  # the twin's chunk length: same chunk boundaries, same arithmetic order
CONV_BLOCK_T, CONV_BLOCK_C = 32, 128


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    copies: int = 1,
) -> torch.Tensor:
    num_tokens, channels = x.shape
    k = weight.shape[1]
    out = torch.empty((num_tokens, channels), dtype=x.dtype, device=x.device)
    num_seqs = state_ids.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_c = min(CONV_BLOCK_C, _pow2(channels))
    args = (query_start_loc, seq_lens, state_ids, x.stride(0), channels, copies)
    grid = (num_seqs, triton.cdiv(max_query_len, CONV_BLOCK_T), triton.cdiv(channels, block_c))
    conv.conv1d_prefill_kernel[grid](
        x, weight, conv_states, out, *args, K=k, BLOCK_T=CONV_BLOCK_T, BLOCK_C=block_c
    )
    conv.conv1d_state_kernel[(num_seqs, triton.cdiv(channels, block_c))](
        x, conv_states, *args, K=k, BLOCK_R=_pow2(k - 1, 1), BLOCK_C=block_c
    )
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    num_seqs, channels = x.shape
    k = weight.shape[1]
    out = torch.empty((num_seqs, channels), dtype=x.dtype, device=x.device)
    if num_seqs == 0:
        return out
    block_c = min(CONV_BLOCK_C, _pow2(channels))
    conv.conv1d_update_kernel[(num_seqs, triton.cdiv(channels, block_c))](
        x, weight, conv_states, out, seq_lens, state_ids, x.stride(0), channels, copies,
        K=k, BLOCK_R=_pow2(k - 1, 1), BLOCK_C=block_c,
    )  # fmt: skip
    return out


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    copies: int = 1,
) -> torch.Tensor:
    num_tokens, num_k_heads, head_k_dim = k.shape
    num_v_heads, head_v_dim = v.shape[1:]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    num_seqs = state_ids.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    f32 = dict(dtype=torch.float32, device=v.device)
    w = torch.empty((num_tokens, num_v_heads, head_k_dim), **f32)
    u = torch.empty((num_tokens, num_v_heads, head_v_dim), **f32)
    gc = torch.empty((num_tokens, num_v_heads), **f32)
    group = num_v_heads // num_k_heads
    bk, bv = _pow2(head_k_dim), _pow2(head_v_dim)
    precision = _dot_precision(v.dtype)
    gdr.chunk_prepare_kernel[(num_seqs, triton.cdiv(max_query_len, CHUNK), num_v_heads)](
        k, v, a, b, a_log, dt_bias, w, u, gc, query_start_loc,
        k.stride(0), v.stride(0), a.stride(0), num_v_heads, group, head_k_dim, head_v_dim,
        BT=CHUNK, BK=bk, BV=bv, DOT_PRECISION=precision, num_warps=8,
    )  # fmt: skip
    # one program per (sequence, value head, value block) walks all chunks: narrow value
    # blocks keep SMs busy for one sequence, and a fixed width keeps results batch-invariant
    block_v = min(bv, 32)
    gdr.chunk_forward_kernel[(num_seqs, num_v_heads, triton.cdiv(head_v_dim, block_v))](
        q, k, w, u, gc, out, ssm_states, query_start_loc, seq_lens, state_ids,
        q.stride(0), k.stride(0), num_v_heads, group, head_k_dim, head_v_dim,
        head_k_dim**-0.5, copies, BT=CHUNK, BK=bk, BV=block_v, DOT_PRECISION=precision,
        # one stage: the chunk loop's q, k, w (64 x 128 fp32 each) and u tiles pipelined in
        # three stages took 313-330 KB of shared memory on the H200 (limit 227 KB)
        num_warps=8, num_stages=1,
    )  # fmt: skip
    return out


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    num_seqs, num_k_heads, head_k_dim = k.shape
    num_v_heads, head_v_dim = v.shape[1:]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if num_seqs == 0:
        return out
    bk = _pow2(head_k_dim)
    block_v = min(_pow2(head_v_dim), 32)
    gdr.recurrent_step_kernel[(num_seqs, num_v_heads, triton.cdiv(head_v_dim, block_v))](
        q, k, v, a, b, a_log, dt_bias, out, ssm_states, seq_lens, state_ids,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), num_v_heads,
        num_v_heads // num_k_heads, head_k_dim, head_v_dim, head_k_dim**-0.5, copies,
        BK=bk, BV=block_v, num_warps=4,
    )  # fmt: skip
    return out


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    gated_norm.gated_rms_norm_kernel[(num_tokens, num_heads)](
        x, gate, weight, out, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        num_heads, head_dim, eps, BLOCK_D=_pow2(head_dim, 1),
    )  # fmt: skip
    return out


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty((num_tokens, num_heads * head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    gated_norm.sigmoid_gate_mul_kernel[(num_tokens, num_heads)](
        x, gate, out, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        num_heads, head_dim, BLOCK_D=_pow2(head_dim, 1),
    )  # fmt: skip
    return out
