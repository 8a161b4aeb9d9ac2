"""Launchers of the routing-model kernels (`kernels/triton/routing_model.py`): shapes and
dtypes checked, grids from shapes only (no host read, so both capture in CUDA graphs)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels.triton import routing_model as jit
from xinfer.routing.parametric_ops import LayerConstants, RoutingState, SequenceBatch


def advance_state(
    state: RoutingState,
    batch: SequenceBatch,
    const: LayerConstants,
    num_tokens: int,
    block_t: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode: one program per sequence. Prefill: the two scan passes, BLOCK_T tokens a
    program (`block_t`, a power of two, by default 8192 floats a tile), so a long prompt's
    walk is not one program stepping token by token (32k tokens × 48 layers)."""
    num_experts = state.c.shape[1]
    dev = state.c.device
    c = torch.empty(num_tokens, num_experts, dtype=torch.float32, device=dev)
    tok_key = torch.empty(num_tokens, dtype=torch.int64, device=dev)
    tok_pos = torch.empty(num_tokens, dtype=torch.int64, device=dev)
    num_seqs = batch.seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return c, tok_key, tok_pos
    block_e = triton.next_power_of_2(num_experts)
    seq = (batch.query_start_loc, batch.seq_lens, batch.rows, batch.keys)
    rows = (state.c, state.pos, state.key)
    if batch.is_decode:
        jit.routing_state_kernel[(num_seqs,)](
            *seq, *rows, c, tok_key, tok_pos,
            num_experts, state.scratch_row, const.step_base, const.init_base,
            const.phi, const.innovation,
            BLOCK_E=block_e, num_warps=4 if num_experts >= 512 else 2,
        )  # fmt: skip
        return c, tok_key, tok_pos
    block_t = block_t or max(1, 8192 // block_e)
    num_blocks = triton.cdiv(num_tokens, block_t)
    ends = torch.empty(num_seqs * num_blocks, block_e, dtype=torch.float32, device=dev)
    grid = (num_seqs, num_blocks)
    jit.routing_scan_local_kernel[grid](
        *seq, *rows, c, tok_key, tok_pos, ends,
        num_experts, num_blocks, const.step_base, const.init_base, const.phi, const.innovation,
        BLOCK_T=block_t, BLOCK_E=block_e, num_warps=4,
    )  # fmt: skip
    jit.routing_scan_carry_kernel[grid](
        *seq, *rows, c, ends, num_experts, num_blocks, state.scratch_row, const.phi,
        BLOCK_T=block_t, BLOCK_E=block_e, num_warps=4,
    )  # fmt: skip
    return c, tok_key, tok_pos


def select_experts(
    c: torch.Tensor,
    token_keys: torch.Tensor,
    token_positions: torch.Tensor,
    router_logits: torch.Tensor,
    const: LayerConstants,
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_experts = c.shape
    if router_logits.shape != c.shape:
        raise ValueError(f"router logits {tuple(router_logits.shape)} vs c {tuple(c.shape)}")
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, {num_experts}]")
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=c.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=c.device)
    if num_tokens == 0:
        return weights, ids
    block_e = triton.next_power_of_2(num_experts)
    jit.routing_select_kernel[(num_tokens,)](
        c, token_keys, token_positions, logits, const.popularity, weights, ids,
        num_experts, logits.stride(0), const.gumbel_base, const.drift_scale,
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(top_k), num_warps=4 if block_e >= 512 else 2,
    )  # fmt: skip
    return weights, ids
