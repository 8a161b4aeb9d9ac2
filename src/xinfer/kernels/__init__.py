"""Kernel launchers: check shapes and dtypes, then run the Triton kernel on CUDA tensors or
the pure-torch twin from `reference.py` elsewhere (CPU, or `XINFER_DISABLE_TRITON=1`).
Every caller in the engine goes through these functions, never through Triton directly."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch

from xinfer import envs
from xinfer.kernels import reference
from xinfer.kv.turbo import TurboKVCache

if TYPE_CHECKING:
    from xinfer.quant.base import WeightFormat


@functools.cache
def has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and has_triton() and not envs.XINFER_DISABLE_TRITON()


def rows_aligned(t: torch.Tensor, nbytes: int) -> bool:
    """Whether `t`'s base and every row (each stride but the last, in bytes) start on an
    `nbytes` boundary: what a kernel's vector loads of whole rows need. From the layout
    alone, alike for every expert set and slot cache of a shape (each its own allocation),
    so a launcher's choice by it never makes an expert's bits depend on where it is held."""
    size = t.element_size()
    return t.data_ptr() % nbytes == 0 and all(st * size % nbytes == 0 for st in t.stride()[:-1])


def inline_asm() -> bool:
    """Whether Triton kernels may use inline PTX: everywhere but Triton's CPU interpreter
    (no inline assembly there; the kernels then take plain operations of the same results)."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T (+ bias): the Triton skinny GEMM for decode-sized batches
    where `gemv_launch.wants` says so (at most 16 rows, bf16/fp16, a tuned or default
    shape), F.linear otherwise."""
    if use_triton(x):
        from xinfer.kernels import gemv_launch

        if gemv_launch.wants(x, weight, bias):
            return gemv_launch.linear(x, weight, bias)
    return reference.linear(x, weight, bias)


def format_linear(
    x: torch.Tensor,
    fmt: WeightFormat,
    tensors: dict[str, torch.Tensor],
    bias: torch.Tensor | None,
    n: int,
    k: int,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) for a weight (N, K) stored in `fmt` (its tensor set): the
    format's kernels on CUDA, its twin elsewhere."""
    if x.shape[-1] != k:
        raise ValueError(f"linear: x has {x.shape[-1]} features, the {fmt.name} weight {k}")
    if use_triton(x):
        return fmt.triton_linear(x, tensors, bias, n, k)
    return fmt.reference_linear(x, tensors, bias, n, k)


def format_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    fmt: WeightFormat,
    w13: dict[str, torch.Tensor],
    w2: dict[str, torch.Tensor],
    inter: int,
    w2_fmt: WeightFormat | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """Routed experts whose w13 (2I, H) and w2 (H, I) tensor sets are stored in `fmt` (w2 in
    `w2_fmt` when given: `fmt` then runs both), with a leading dim of experts or slots that
    `topk_ids` (T, k) index. `max_ids`: at most this many distinct ids in `topk_ids` (the
    layer's experts, on a slot view of more rows), for the GPU path's sizing."""
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("fused_moe: topk_ids, topk_weights and hidden disagree on tokens")
    extra = {} if w2_fmt is None else {"w2_fmt": w2_fmt}
    if use_triton(hidden):
        if max_ids is not None:
            extra["max_ids"] = max_ids
        return fmt.triton_moe(hidden, topk_ids, topk_weights, w13, w2, inter, **extra)
    return fmt.reference_moe(hidden, topk_ids, topk_weights, w13, w2, inter, **extra)


def moe_merge_key(weights, num_pairs: int, hidden: torch.Tensor) -> object | None:
    """What fixes each row's bits in a routed-expert call of `num_pairs` pairs on expert
    weights `weights` (an ExpertWeights; None: plain): calls with equal keys give a row the
    same bits whatever the other rows (None: no such promise, never join calls). With w2 in
    a format of its own, both formats must give the same key."""
    if weights is None:
        return None
    key = weights.fmt.moe_merge_key(num_pairs, hidden)
    if weights.w2_fmt in (None, weights.fmt) or key is None:
        return key
    return key if weights.w2_fmt.moe_merge_key(num_pairs, hidden) == key else None


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(f"rms_norm: x has {x.shape[-1]} features, weight {weight.shape[0]}")
    if use_triton(x):
        from xinfer.kernels import attn_launch

        return attn_launch.rms_norm(x, weight, eps, residual)
    return reference.rms_norm(x, weight, eps, residual)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(q):
        from xinfer.kernels import attn_launch

        return attn_launch.apply_rope(q, k, positions, cos_sin_cache)
    return reference.apply_rope(q, k, positions, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from xinfer.kernels import moe_launch

        return moe_launch.silu_and_mul(x)
    return reference.silu_and_mul(x)


def sigmoid_gated_add(
    base: torch.Tensor,
    gate: torch.Tensor,
    x: torch.Tensor,
    gate_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """base (T, H) + sigmoid(gate (T, 1)) * x (T, H); with `gate_weight` (1, K), `gate` is
    the input (T, K) of the gate linear (no bias), computed in the same launch on CUDA."""
    if use_triton(base):
        from xinfer.kernels import moe_launch

        return moe_launch.sigmoid_gated_add(base, gate, x, gate_weight)
    if gate_weight is not None:
        gate = reference.linear(gate, gate_weight)
    return reference.sigmoid_gated_add(base, gate, x)


def route_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(router_logits):
        from xinfer.kernels import moe_launch

        return moe_launch.route_topk(router_logits, top_k, renormalize)
    return reference.route_topk(router_logits, top_k, renormalize)


def router_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`route_topk` of the router logits x @ weight^T in one launch with the router GEMV
    (`router_launch`, while its ENABLED switch is on, for at most its MAX_ROWS rows), or None
    where that does not apply (CPU, wider batches, ...): the caller then runs the router
    linear and `route_topk`."""
    if use_triton(x):
        from xinfer.kernels import router_launch

        if router_launch.ENABLED and x.shape[0] <= router_launch.MAX_ROWS:
            return router_launch.router_topk(x, weight, top_k, renormalize)
    return None


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    if w13.shape[0] != w2.shape[0] or w13.shape[1] != 2 * w2.shape[2]:
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} mismatch")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("fused_moe: topk_ids, topk_weights and hidden disagree on tokens")
    if use_triton(hidden):
        from xinfer.kernels import moe_launch

        return moe_launch.fused_moe(hidden, topk_ids, topk_weights, w13, w2)
    return reference.fused_moe(hidden, topk_ids, topk_weights, w13, w2)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor | TurboKVCache,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v (T, Hk, D) into the caches at `slot_mapping`; a `TurboKVCache` (with v_cache
    None) takes both, quantized (`kernels/kv_turbo.py`)."""
    if isinstance(k_cache, TurboKVCache):
        from xinfer.kernels import kv_turbo

        return kv_turbo.store_kv(k, v, _sole(k_cache, v_cache), slot_mapping)
    if use_triton(k):
        from xinfer.kernels import attn_launch

        return attn_launch.store_kv(k, v, k_cache, v_cache, slot_mapping)
    reference.store_kv(k, v, k_cache, v_cache, slot_mapping)


def _sole(cache: TurboKVCache, v_cache: torch.Tensor | None) -> TurboKVCache:
    """A turbo cache holds K and V: its callers pass None for v_cache."""
    if v_cache is not None:
        raise ValueError("a TurboKVCache holds both K and V: pass v_cache=None")
    return cache


def qkv_prep(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor | TurboKVCache,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """Per-head q/k RMSNorm (with weights), RoPE and the KV-cache store in one launch on the
    GPU: `rms_norm`, `apply_rope`, `store_kv` fused. Returns the roped q (T, Hq, D). A
    `TurboKVCache` (v_cache None) runs `kernels/kv_turbo.py`'s version."""
    if isinstance(k_cache, TurboKVCache):
        from xinfer.kernels import kv_turbo

        turbo = _sole(k_cache, v_cache)
        return kv_turbo.qkv_prep(
            q, k, v, positions, cos_sin_cache, turbo, slot_mapping, q_norm_weight,
            k_norm_weight, eps,
        )  # fmt: skip
    num_tokens, _, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f"qkv_prep: q {tuple(q.shape)}, k {tuple(k.shape)}, v disagree")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"qkv_prep: caches {tuple(k_cache.shape)} do not hold k's heads")
    if positions.shape != (num_tokens,) or slot_mapping.shape != (num_tokens,):
        raise ValueError("qkv_prep: positions and slot_mapping must be (T,)")
    rot = cos_sin_cache.shape[-1]  # < head_dim: partial rotary
    if rot > head_dim or rot % 2 or (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError(
            "qkv_prep: cos_sin_cache must be (max_pos, R <= D, even); norm weights both or none"
        )
    args = (q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)
    if use_triton(q):
        from xinfer.kernels import qkv_prep_launch

        return qkv_prep_launch.qkv_prep(*args, q_norm_weight, k_norm_weight, eps)
    return reference.qkv_prep(*args, q_norm_weight, k_norm_weight, eps)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor | TurboKVCache,
    v_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`max_query_len`/`max_seq_len` are host-side bounds that let the GPU path pick its
    decode or prefill kernel and grid without reading device memory. `sliding_window` W:
    a query at position p sees keys in (p - W, p] only (Gemma 3's local layers). A
    `TurboKVCache` (v_cache None) runs `kernels/kv_turbo.py`'s version."""
    if sliding_window is not None and max_seq_len is not None and max_seq_len <= sliding_window:
        sliding_window = None  # every key is inside the window
    if isinstance(k_cache, TurboKVCache):
        from xinfer.kernels import kv_turbo

        return kv_turbo.paged_attention(
            q, _sole(k_cache, v_cache), block_tables, seq_lens, query_start_loc, scale,
            max_query_len=max_query_len, max_seq_len=max_seq_len, sliding_window=sliding_window,
        )  # fmt: skip
    if use_triton(q):
        from xinfer.kernels import attn_flash, attn_launch

        if attn_flash.wanted(q, k_cache, block_tables, max_query_len, max_seq_len, sliding_window):
            return attn_flash.prefill_one_sequence(
                q, k_cache, v_cache, block_tables[0], max_seq_len, scale
            )
        return attn_launch.paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
            max_query_len=max_query_len, max_seq_len=max_seq_len, sliding_window=sliding_window,
        )  # fmt: skip
    return reference.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window
    )
