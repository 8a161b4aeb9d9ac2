"""Gated DeltaNet, the linear-attention token mixer of Qwen3-Next and Qwen3.5: input
projections [q k v | z] and [b | a], a depthwise causal conv over q k v, the gated delta rule
(chunked over a prompt, one recurrent step per decode token) and a gated RMSNorm before
the output projection. Its per-request state (the conv's last inputs and the (Hv, Dk, Dv)
delta-rule matrix) lives in slots bound by the model runner (`bind_state`); the forward
context says which slot each sequence owns."""

from __future__ import annotations

import torch
from torch import nn

from xinfer.kernels import linear_attn
from xinfer.layers.linear import Linear, MergedLinear
from xinfer.runner.forward_context import get_forward_context


class _ConvWeight(nn.Module):
    """Holds `conv1d.weight` (C, 1, K) under the checkpoint's name."""

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))


class _GatedNormWeight(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class GatedDeltaNet(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel_size: int,
        eps: float,
        split_projections: bool,
    ) -> None:
        """`split_projections`: the checkpoint stores `in_proj_qkv`, `in_proj_z`, `in_proj_b`
        and `in_proj_a` apart (Qwen3.5; merged here into `in_proj_qkvz` and `in_proj_ba`,
        parts named after them); otherwise as `in_proj_qkvz` and `in_proj_ba` whose rows the
        model file has put in [q k v | z] and [b | a] order while loading (Qwen3-Next)."""
        super().__init__()
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size, self.eps = conv_kernel_size, eps
        if split_projections:
            qkvz = {"in_proj_qkv": self.conv_dim, "in_proj_z": self.value_dim}
            self.in_proj_qkvz: Linear = MergedLinear(hidden_size, qkvz)
            ba = {"in_proj_b": num_v_heads, "in_proj_a": num_v_heads}
            self.in_proj_ba: Linear = MergedLinear(hidden_size, ba)
        else:
            self.in_proj_qkvz = Linear(hidden_size, self.conv_dim + self.value_dim)
            self.in_proj_ba = Linear(hidden_size, 2 * num_v_heads)
        self.conv1d = _ConvWeight(self.conv_dim, conv_kernel_size)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        # float32 whatever the model dtype (the published checkpoints store it so): the
        # decay exp(A_log) compounds over every token of a sequence
        self.A_log = nn.Parameter(torch.zeros(num_v_heads, dtype=torch.float32))
        self.norm = _GatedNormWeight(head_v_dim)
        self.out_proj = Linear(self.value_dim, hidden_size)
        self.conv_states: torch.Tensor | None = None  # (S·copies, K-1, conv_dim), model dtype
        self.ssm_states: torch.Tensor | None = None  # (S·copies, Hv, Dk, Dv) float32
        self.state_copies = 1

    def state_shapes(self, num_rows: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of the conv and delta-rule state tensors with `num_rows` rows."""
        conv = (num_rows, self.conv_kernel_size - 1, self.conv_dim)
        return conv, (num_rows, self.num_v_heads, self.head_k_dim, self.head_v_dim)

    def bind_state(self, conv_states: torch.Tensor, ssm_states: torch.Tensor, copies: int) -> None:
        """`copies` rows per request slot: 2 lets a queued decode step be dropped (see
        `linear_attn_reference`)."""
        self.conv_states, self.ssm_states, self.state_copies = conv_states, ssm_states, copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, H) → (T, H); the sequences' states advance past this step's tokens."""
        if self.conv_states is None or self.ssm_states is None:
            raise RuntimeError("linear-attention state is not bound; the model runner binds it")
        ctx = get_forward_context()
        if ctx.state_ids is None:
            raise RuntimeError("the forward context has no state slots for linear attention")
        num_tokens = x.shape[0]
        mixed, z = self.in_proj_qkvz(x).split([self.conv_dim, self.value_dim], dim=-1)
        b, a = self.in_proj_ba(x).split([self.num_v_heads, self.num_v_heads], dim=-1)
        conv_w = self.conv1d.weight.view(self.conv_dim, self.conv_kernel_size)
        ids, lens, copies = ctx.state_ids, ctx.seq_lens, self.state_copies
        conv = (conv_w, self.conv_states, ids)
        if ctx.is_decode:  # one token per sequence: fixed shapes, CUDA-graph safe
            mixed = linear_attn.causal_conv1d_update(mixed, *conv, lens, copies)
        else:
            qsl, max_len = ctx.query_start_loc, ctx.max_query_len
            mixed = linear_attn.causal_conv1d_prefill(mixed, *conv, qsl, lens, max_len, copies)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.view(num_tokens, self.num_k_heads, self.head_k_dim)
        k = k.view(num_tokens, self.num_k_heads, self.head_k_dim)
        v = v.view(num_tokens, self.num_v_heads, self.head_v_dim)
        rule = (q, k, v, a, b, self.A_log, self.dt_bias, self.ssm_states, ids)
        if ctx.is_decode:
            core = linear_attn.gated_delta_rule_decode(*rule, lens, copies)
        else:
            core = linear_attn.gated_delta_rule_prefill(
                *rule, ctx.query_start_loc, lens, ctx.max_query_len, copies
            )
        z = z.view(num_tokens, self.num_v_heads, self.head_v_dim)
        return self.out_proj(linear_attn.gated_rms_norm(core, z, self.norm.weight, self.eps))
