"""Triton kernel of MoE routing: float32 softmax over experts, top-k, optional renormalise
(launched from `xinfer.kernels.moe_launch`; twin: `reference.route_topk`)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers

# warps of every launch that runs `topk_row` (route_topk's and the router GEMV's): one layout,
# so both reduce a row's probabilities in one order and choose with the same bits
TOPK_WARPS = 4


@triton.jit
def _ordered(bits):
    """float32 bits (int32) ↔ an int32 of the same order as the floats (its own inverse):
    non-negative floats keep their bits, negative ones flip all but the sign."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def topk_row(x, mask, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
             BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """One token's choice from its float32 logits x (BLOCK_E,), lanes off `mask` holding
    -inf: (weights (BLOCK_K,) f32, ids (BLOCK_K,) int32), lanes >= TOP_K zero. Selection
    runs on the float32 probabilities; ties go to the lowest expert index (as torch.topk).
    Shared by `route_topk_kernel` and the router GEMV's fused top-k (`router_topk`)."""
    offs = tl.arange(0, BLOCK_E)
    num = tl.exp(x - tl.max(x, axis=0))
    num = tl.where(mask, num, 0.0)
    probs = num / tl.sum(num, axis=0)
    # padding lanes rank below every real probability (>= 0); taken lanes below those. A NaN
    # probability ranks with the padding but before it (lower index), so every id chosen is
    # a real expert in [0, E) whatever the logits hold: no offload or MoE kernel can be
    # handed an id out of range.
    key = tl.where(mask & (probs == probs), probs, -1.0)
    # one reduction a pick: the key's bits made order-preserving as a signed int, above the
    # lane's reversed index, so that the int64 maximum is the largest key at its lowest lane
    packed = (_ordered(key.to(tl.int32, bitcast=True)).to(tl.int64) << 32) | (
        BLOCK_E - 1 - offs
    ).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(packed, axis=0)
        idx = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        weight = _ordered((best >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
        top_w = tl.where(offs_k == j, weight, top_w)
        top_i = tl.where(offs_k == j, idx, top_i)
        packed = tl.where(offs == idx, -(2**63), packed)  # taken: below every lane
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)  # lanes >= TOP_K hold 0
    return top_w, top_i


@triton.jit
def route_topk_kernel(
    logits_ptr, weights_ptr, ids_ptr,
    num_experts, stride_lt,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (T,): one token's row of logits (`topk_row`). Outputs (T, k) f32 and int32."""
    wait_for_producers(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    x = tl.load(logits_ptr + tok * stride_lt + offs, mask=mask, other=-float("inf"))
    top_w, top_i = topk_row(x.to(tl.float32), mask, TOP_K, RENORMALIZE, BLOCK_E, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < TOP_K
    tl.store(weights_ptr + tok * TOP_K + offs_k, top_w, mask=mask_k)
    tl.store(ids_ptr + tok * TOP_K + offs_k, top_i, mask=mask_k)
