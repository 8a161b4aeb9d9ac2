"""Pure-torch twins of every kernel: the CPU path, and the ground truth that each Triton
kernel is tested against. Semantics here are the contract; keep them simple and exact."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T (+ bias) in x's dtype: exactly F.linear."""
    return F.linear(x, weight, bias)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with `residual`, first `x = x + residual` and also return x.

    Matches HF: normalise in float32, cast to the input dtype, then multiply by the weight."""
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    out = weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)
    return out if residual is None else (out, residual)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (rotate-half) RoPE. q (T, Hq, D), k (T, Hk, D), positions (T,),
    cos_sin_cache (max_pos, R) float32 holding cos in [:, :R/2] and sin in [:, R/2:]. R < D is
    partial rotary: the first R dims of each head rotate, the rest pass through."""
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    cs = cos_sin_cache[positions.long()]  # (T, R)
    cos = torch.cat([cs[:, :half], cs[:, :half]], -1).unsqueeze(1).to(q.dtype)
    sin = torch.cat([cs[:, half:], cs[:, half:]], -1).unsqueeze(1).to(q.dtype)

    def rope(x: torch.Tensor) -> torch.Tensor:
        xr = x[..., :rot]
        x1, x2 = xr[..., :half], xr[..., half:]
        out = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
        return out if rot == x.shape[-1] else torch.cat([out, x[..., rot:]], dim=-1)

    return rope(q), rope(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x (T, 2I) = [gate | up] → silu(gate) * up, (T, I)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def sigmoid_gated_add(base: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """base (T, H) + sigmoid(gate (T, 1)) * x (T, H): a MoE block's routed output plus its
    gated shared expert (Qwen2-MoE, Qwen3.5 / Qwen3-Next), in the dtype, op by op."""
    return base + torch.sigmoid(gate) * x


def route_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in float32, top-k, optional renormalisation.
    Returns (topk_weights float32 (T, k), topk_ids int32 (T, k))."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def expert_outputs(
    hidden: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """Per (token, k) expert output, unweighted: (T, k, H) in the hidden dtype.

    Rows are grouped by id with a stable sort, so an expert sees the same rows in the same
    order whatever id (expert or slot) it is addressed by: the bits do not depend on placement."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    order = torch.sort(flat_ids, stable=True).indices
    sorted_ids = flat_ids[order]
    out = hidden.new_empty(num_tokens * top_k, hidden.shape[-1])
    uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    start = 0
    for e, n in zip(uniq.tolist(), counts.tolist()):
        pairs = order[start : start + n]
        start += n
        x = hidden[pairs // top_k]  # (n, H)
        h = silu_and_mul(x @ w13[e].t())  # (n, I)
        out[pairs] = h @ w2[e].t()
    return out.view(num_tokens, top_k, -1)


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """Routed-expert MLP. hidden (T, H); topk_ids (T, k) index the first dim of w13 (N, 2I, H)
    and w2 (N, H, I) for any N (experts or slots); weights float32 (T, k).
    The weighted combine sums over k in k order, in float32, then casts: (T, H)."""
    y = expert_outputs(hidden, topk_ids, w13, w2)
    return (y.float() * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(hidden.dtype)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v (T, Hk, D) into the paged caches (num_blocks, block_size, Hk, D) at the flat
    slots `slot_mapping` (T,) = block_id * block_size + offset; slots < 0 are skipped (padding).
    An fp8 cache (e4m3, no scale) stores values saturated to its range."""
    nb, bs = k_cache.shape[:2]
    if k_cache.element_size() == 1:  # fp8 cache: saturate rather than overflow to NaN
        fmax = torch.finfo(k_cache.dtype).max
        k, v = k.float().clamp(-fmax, fmax), v.float().clamp(-fmax, fmax)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.view(nb * bs, *k_cache.shape[2:])[slots] = k[valid].to(k_cache.dtype)
    v_cache.view(nb * bs, *v_cache.shape[2:])[slots] = v[valid].to(v_cache.dtype)


def qkv_prep(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """What runs between the qkv projection and attention: per-head RMSNorm of q (T, Hq, D)
    and k (T, Hk, D) when the weights (D,) are given, RoPE, then k and v (T, Hk, D) into the
    caches. Returns the roped q; exactly `rms_norm`, `apply_rope` and `store_kv` in turn."""
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    q, k = apply_rope(q, k, positions, cos_sin_cache)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries against the paged cache (GQA).

    q (T, Hq, D) holds each sequence's new tokens back to back (`query_start_loc` (B+1,));
    sequence i attends to its first `seq_lens[i]` cached tokens (its new tokens are the last
    ones); with `sliding_window` W a query at position p sees keys in (p - W, p].
    Returns (T, Hq, D) in q's dtype; float32 softmax."""
    out = torch.empty_like(q)
    num_heads, num_kv = q.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        qs, qe = qsl[i], qsl[i + 1]
        if qe == qs:
            continue
        nblk = (seq_len + bs - 1) // bs
        blocks = block_tables[i, :nblk].long()
        k = k_cache[blocks].reshape(-1, num_kv, q.shape[-1])[:seq_len].float()
        v = v_cache[blocks].reshape(-1, num_kv, q.shape[-1])[:seq_len].float()
        k = k.repeat_interleave(num_heads // num_kv, dim=1)
        v = v.repeat_interleave(num_heads // num_kv, dim=1)
        qi = q[qs:qe].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        q_pos = torch.arange(seq_len - (qe - qs), seq_len, device=q.device).unsqueeze(1)
        k_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)
        mask = k_pos > q_pos  # (q, k) future keys
        if sliding_window is not None:
            mask |= k_pos <= q_pos - sliding_window
        scores.masked_fill_(mask.unsqueeze(0), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
