"""Launchers of the linear-attention kernels (Gated DeltaNet and the gated outputs of
Qwen3-Next / Qwen3.5): check shapes, then run the Triton kernel on CUDA tensors or the
pure-torch twin from `linear_attn_reference.py` elsewhere (as `xinfer.kernels` does).
Packed-sequence arguments and the state `copies` (rows per slot, 1 or 2) are described in
`linear_attn_reference`."""

from __future__ import annotations

import torch

from xinfer.kernels import linear_attn_reference as reference
from xinfer.kernels import use_triton


def _check_unit_stride(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: inputs need a unit stride in their last dim")


def _check_conv(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor) -> None:
    if x.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if conv_states.shape[1:] != (weight.shape[1] - 1, x.shape[1]) or weight.shape[1] < 2:
        raise ValueError(
            f"causal_conv1d: conv_states {tuple(conv_states.shape)} is not (S, K-1, C)"
        )
    if not (weight.is_contiguous() and conv_states.is_contiguous()):
        raise ValueError("causal_conv1d: weight and conv_states must be contiguous")
    _check_unit_stride("causal_conv1d", x)


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
    """x (T, C) → SiLU(causal conv) (T, C); conv_states (S·copies, K-1, C) updated per
    sequence. `max_query_len` is the host-side bound of new tokens per sequence (the grid)."""
    _check_conv(x, weight, conv_states)
    args = (x, weight, conv_states, state_ids, query_start_loc, seq_lens)
    if use_triton(x):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.causal_conv1d_prefill(*args, max_query_len, copies)
    return reference.causal_conv1d_prefill(*args, copies)


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    """One new token per sequence: x (B, C) → (B, C), fixed shapes (CUDA-graph safe)."""
    _check_conv(x, weight, conv_states)
    if state_ids.shape != (x.shape[0],) or seq_lens.shape != (x.shape[0],):
        raise ValueError("causal_conv1d_update: one state id and length per row of x")
    args = (x, weight, conv_states, state_ids, seq_lens, copies)
    if use_triton(x):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.causal_conv1d_update(*args)
    return reference.causal_conv1d_update(*args)


def _check_delta_rule(q, k, v, a, b, ssm_states) -> None:
    num_tokens, num_k_heads, head_k_dim = k.shape
    num_v_heads, head_v_dim = v.shape[1:]
    if q.shape != k.shape or v.shape[0] != num_tokens or num_v_heads % num_k_heads:
        raise ValueError(f"gated_delta_rule: q {tuple(q.shape)}, k, v {tuple(v.shape)} disagree")
    if a.shape != (num_tokens, num_v_heads) or b.shape != a.shape or a.stride(0) != b.stride(0):
        raise ValueError("gated_delta_rule: a and b must be (T, Hv) with one row stride")
    if ssm_states.shape[1:] != (num_v_heads, head_k_dim, head_v_dim):
        raise ValueError(
            f"gated_delta_rule: ssm_states {tuple(ssm_states.shape)} is not (S, Hv, Dk, Dv)"
        )
    if ssm_states.dtype != torch.float32 or not ssm_states.is_contiguous():
        raise ValueError("gated_delta_rule: ssm_states must be contiguous float32")
    _check_unit_stride("gated_delta_rule", q, k, v, a, b)
    if q.stride(1) != head_k_dim or k.stride(1) != head_k_dim or v.stride(1) != head_v_dim:
        raise ValueError("gated_delta_rule: heads of q, k and v must be packed within a row")


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
    """Chunked gated delta rule over packed sequences → (T, Hv, Dv) in v's dtype."""
    _check_delta_rule(q, k, v, a, b, ssm_states)
    args = (q, k, v, a, b, a_log, dt_bias, ssm_states, state_ids, query_start_loc, seq_lens)
    if use_triton(q):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.gated_delta_rule_prefill(*args, max_query_len, copies)
    return reference.gated_delta_rule_prefill(*args, copies)


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
    """One recurrent step per sequence (row b of q/k/v/a/b) → (B, Hv, Dv); fixed shapes."""
    _check_delta_rule(q, k, v, a, b, ssm_states)
    if state_ids.shape != (q.shape[0],) or seq_lens.shape != (q.shape[0],):
        raise ValueError("gated_delta_rule_decode: one state id and length per row")
    args = (q, k, v, a, b, a_log, dt_bias, ssm_states, state_ids, seq_lens, copies)
    if use_triton(q):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.gated_delta_rule_decode(*args)
    return reference.gated_delta_rule_decode(*args)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x, gate (T, H, D) → RMSNorm(x)·weight·SiLU(gate) as (T, H*D)."""
    if x.shape != gate.shape or x.dim() != 3 or weight.shape != (x.shape[2],):
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)}, gate {tuple(gate.shape)}")
    _check_unit_stride("gated_rms_norm", x, gate)
    if use_triton(x):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.gated_rms_norm(x, gate, weight.contiguous(), eps)
    return reference.gated_rms_norm(x, gate, weight, eps)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x, gate (T, H, D) → x·sigmoid(gate) as (T, H*D) (gated attention output)."""
    if x.shape != gate.shape or x.dim() != 3 or x.dtype != gate.dtype:
        raise ValueError(f"sigmoid_gate_mul: x {tuple(x.shape)}, gate {tuple(gate.shape)}")
    _check_unit_stride("sigmoid_gate_mul", x, gate)
    if use_triton(x):
        from xinfer.kernels import linear_attn_launch

        return linear_attn_launch.sigmoid_gate_mul(x, gate)
    return reference.sigmoid_gate_mul(x, gate)
