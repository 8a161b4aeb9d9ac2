"""Launchers of the Triton MoE kernels: fused_moe (decode GEMV / prefill grouped GEMM),
route_topk and silu_and_mul. Called from `xinfer.kernels` on CUDA tensors (and by the tests
on CPU tensors under TRITON_INTERPRET=1). No host sync anywhere: safe in CUDA graphs.

Determinism: the kernel and tile config depend only on (T, k, H, I, dtype), never on the
number of ids N or on the id values, so an expert's output bits do not depend on placement
(the align's path depends on N and `max_ids`, its outputs do not: `moe_align`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from xinfer.kernels import arrivals, moe_align, pdl
from xinfer.kernels.triton import activation, routing
from xinfer.kernels.triton import fused_moe as moe_jit

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# (token, k) pairs up to which decode uses the GEMV kernels (each pair streams its expert)
MAX_GEMV_PAIRS = 64
# decode GEMVs sum each token's pairs in their down kernel's last program (one launch fewer a
# MoE layer, the same bits; `combine_tail`); False: the separate combine kernel, as before
FUSED_COMBINE = True


@dataclass(frozen=True)
class MoeConfig:
    """Tile sizes of one path; `block_m` is only used by the grouped (prefill) path."""

    block_n: int
    block_k: int
    num_warps: int
    block_m: int = 0
    num_stages: int = 3
    down_block_n: int = 0  # 0 = same as block_n


def gemv_config(num_pairs: int, hidden_dim: int, inter_dim: int, dtype: torch.dtype) -> MoeConfig:
    # rows of one expert per program; at T=1, k=8 (Qwen3-30B-A3B) that is 8 x 96 gate/up and
    # 8 x 128 down programs for 132 SMs. BLOCK_K fixes the reduction order: keep it
    # shape-only. bf16: the best of 54 configs on the H200 (bench_moe_kernel.py --sweep,
    # 2026-12-02): 2.85 TB/s at T=1 against 2.49 for the earlier (16, 256, 8, 4 warps).
    del num_pairs, hidden_dim, inter_dim
    if dtype == torch.float32:
        return MoeConfig(block_n=8, block_k=128, num_warps=4)
    return MoeConfig(block_n=8, block_k=128, num_warps=8, down_block_n=16)


def grouped_config(
    num_pairs: int, dtype: torch.dtype, device: torch.device | None = None
) -> MoeConfig:
    """Tiles of the grouped (prefill) GEMMs from the pair count and dtype; `device` only
    rules out the large tile where its shared memory (144 KiB in 3 stages) does not fit."""
    if dtype == torch.float32:  # fp32 tiles are twice the bytes: keep shared memory small
        return MoeConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2)
    if num_pairs <= 1024:  # few rows per id: memory-bound, small M, many programs
        return MoeConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    if num_pairs >= LARGE_TILE_PAIRS and _shared_memory(device) >= LARGE_TILE_SHARED:
        # the best of eleven on the H200 (bench_moe_kernel.py --sweep, 2026-12-04, Qwen3-30B
        # shape, k=8): 2k tokens 0.966 -> 0.699 ms, 8k 1.787 -> 1.553 ms against the tile
        # below; at 1k tokens it lost (1.339 against 1.227), at 4k it tied (1.136, 1.159)
        return MoeConfig(block_m=128, block_n=128, block_k=64, num_warps=8, down_block_n=128)
    return MoeConfig(block_m=64, block_n=64, block_k=64, num_warps=4, down_block_n=128)


# pairs (T x k) from which the grouped GEMMs take their 128 x 128 tile, and the shared
# memory a block must be allowed for it: 3 stages of the x, gate and up tiles (128 x 64
# bf16 each) = 144 KiB, with room for the epilogue (the H200 allows 227 KiB)
LARGE_TILE_PAIRS = 16384
LARGE_TILE_SHARED = 160 * 1024


@functools.cache
def _device_shared_memory(index: int) -> int:
    props = torch.cuda.get_device_properties(index)  # HIP has no opt-in figure: the default
    return int(getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block))


def _shared_memory(device: torch.device | None) -> int:
    """Shared memory one block may use on `device` (a CUDA device; CPU tensors run under the
    interpreter, which has no limit)."""
    if device is None or device.type != "cuda":
        return LARGE_TILE_SHARED
    return _device_shared_memory(device.index if device.index is not None else 0)


def _check_moe(hidden, topk_ids, topk_weights, w13, w2) -> None:
    if hidden.dim() != 2 or topk_ids.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError("fused_moe: expected hidden (T, H), topk_ids (T, k), w13/w2 3-D")
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("fused_moe: topk_ids, topk_weights and hidden disagree on tokens")
    if hidden.dtype not in _DTYPES or w13.dtype != hidden.dtype or w2.dtype != hidden.dtype:
        raise ValueError(
            f"fused_moe: hidden {hidden.dtype}, w13 {w13.dtype}, w2 {w2.dtype}: "
            "expected one dtype of bfloat16/float16/float32"
        )
    num_ids, two_inter, hidden_dim = w13.shape
    if w2.shape != (num_ids, hidden_dim, two_inter // 2) or hidden.shape[1] != hidden_dim:
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} mismatch")
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe: expert weights must be contiguous in their last dim")


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    config: MoeConfig | None = None,
    use_gemv: bool | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """Triton twin of `reference.fused_moe`. `config`/`use_gemv` override the choice
    (tests, benchmarks); by default both depend only on (T, k, H, I, dtype). `max_ids`: at
    most this many distinct ids in `topk_ids` (a slot view's layer has E experts however
    many rows the view has): bounds the grouped path's align (`align_pairs`), bits unchanged."""
    _check_moe(hidden, topk_ids, topk_weights, w13, w2)
    num_pairs = topk_ids.numel()
    if use_gemv is None:
        use_gemv = num_pairs <= MAX_GEMV_PAIRS
    hidden, topk_ids, topk_weights, out = moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    if use_gemv:
        config = config or gemv_config(num_pairs, w13.shape[2], w2.shape[2], hidden.dtype)
        _moe_gemv(hidden, topk_ids, topk_weights, w13, w2, out, config)
    else:
        config = config or grouped_config(num_pairs, hidden.dtype, hidden.device)
        _moe_grouped(hidden, topk_ids, topk_weights, w13, w2, out, config, max_ids)
    return out


def combine_tail(out: torch.Tensor, block_n: int) -> tuple[torch.Tensor, bool]:
    """(counters, COMBINE) for a down GEMV that writes `out` (T, H) in row tiles of
    `block_n` and may sum each token's pairs itself (`fused_moe.combine_when_last`, counters
    from `arrivals`). COMBINE False — the caller then runs `_combine`, same bits — when
    FUSED_COMBINE is off or `arrivals` gives no counters."""
    groups = out.shape[0] * triton.cdiv(out.shape[1], block_n)
    counters = arrivals.counters(out.device, groups) if FUSED_COMBINE else None
    if counters is None:
        return out, False  # any pointer: COMBINE=False compiles no use of it
    return counters, True


def _moe_gemv(hidden, topk_ids, topk_weights, w13, w2, out, cfg: MoeConfig) -> None:
    # re-reads an expert once per pair that hits it: fine while pairs <= MAX_GEMV_PAIRS
    num_tokens, top_k = topk_ids.shape
    hidden_dim, inter_dim = w2.shape[1], w2.shape[2]
    inter = hidden.new_empty(num_tokens * top_k, inter_dim)  # (T*k, I)
    grid = (num_tokens * top_k, triton.cdiv(inter_dim, cfg.block_n))
    moe_jit.moe_gate_up_gemv_kernel[grid](
        hidden, topk_ids, w13, inter,
        hidden_dim, inter_dim,
        hidden.stride(0), w13.stride(0), w13.stride(1), inter.stride(0),
        TOP_K=top_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        **pdl.options(hidden),
    )  # fmt: skip
    down_n = cfg.down_block_n or cfg.block_n
    y = hidden.new_empty(num_tokens * top_k, hidden_dim)  # (T*k, H) unweighted outputs
    grid = (num_tokens * top_k, triton.cdiv(hidden_dim, down_n))
    counters, fused = combine_tail(out, down_n)
    moe_jit.moe_down_gemv_kernel[grid](
        inter, topk_ids, w2, y, topk_weights, out, counters,
        hidden_dim, inter_dim,
        inter.stride(0), w2.stride(0), w2.stride(1), y.stride(0), out.stride(0),
        BLOCK_N=down_n, BLOCK_K=min(cfg.block_k, triton.next_power_of_2(inter_dim)),
        TOP_K=top_k, COMBINE=fused, num_warps=cfg.num_warps, **pdl.options(hidden),
    )  # fmt: skip
    if not fused:
        _combine(y, topk_weights, out, top_k)


def moe_inputs(
    hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What every routed-expert launcher (bf16, quantized, GGUF) starts from: hidden (T, H)
    contiguous, ids int32 and weights float32 contiguous, and the (T, H) output to fill."""
    hidden = hidden.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    return hidden, ids, topk_weights.to(torch.float32).contiguous(), torch.empty_like(hidden)


def _moe_grouped(hidden, topk_ids, topk_weights, w13, w2, out, cfg: MoeConfig, max_ids) -> None:
    y = hidden.new_empty(topk_ids.numel(), hidden.shape[1])  # (T*k, H) unweighted outputs
    grouped_outputs(hidden, topk_ids, w13, w2, y, cfg, max_ids=max_ids)
    _combine(y, topk_weights, out, topk_ids.shape[1])


def grouped_outputs(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    y: torch.Tensor,
    cfg: MoeConfig,
    inter: torch.Tensor | None = None,
    max_ids: int | None = None,
) -> None:
    """The grouped GEMMs: y[pair] (T*k, H) = the unweighted output of expert topk_ids[pair]
    (int32, contiguous) for every pair; rows of pairs with a negative id are left as they
    are. `inter` (T*k, I): the gate/up scratch, reused across calls when given. `max_ids`:
    at most this many distinct ids in `topk_ids` (`align_pairs`)."""
    num_tokens, top_k = topk_ids.shape
    num_pairs = num_tokens * top_k
    num_ids, hidden_dim, inter_dim = w2.shape
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"  # fp32 must not use tf32
    sorted_pairs, block_ids, num_rows = moe_align.align_pairs(
        topk_ids, num_ids, cfg.block_m, max_ids=max_ids
    )
    num_blocks = block_ids.numel()
    if inter is None:
        inter = hidden.new_empty(num_pairs, inter_dim)  # (T*k, I), pair order
    grid = (num_blocks * triton.cdiv(inter_dim, cfg.block_n),)
    moe_jit.moe_gate_up_grouped_kernel[grid](
        hidden, sorted_pairs, block_ids, num_rows, w13, inter,
        num_pairs, hidden_dim, inter_dim,
        hidden.stride(0), w13.stride(0), w13.stride(1), inter.stride(0),
        TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    down_n = cfg.down_block_n or cfg.block_n
    grid = (num_blocks * triton.cdiv(hidden_dim, down_n),)
    moe_jit.moe_down_grouped_kernel[grid](
        inter, sorted_pairs, block_ids, num_rows, w2, y,
        num_pairs, hidden_dim, inter_dim,
        inter.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=down_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _combine(y: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, top_k: int) -> None:
    """out[t] = sum over k, in k order and float32, of topk_weights[t, k] * y[t*k + k]."""
    num_tokens, hidden_dim = out.shape
    block = min(1024, triton.next_power_of_2(hidden_dim))
    moe_jit.moe_combine_kernel[(num_tokens, triton.cdiv(hidden_dim, block))](
        y, topk_weights, out, hidden_dim, y.stride(0), out.stride(0),
        TOP_K=top_k, BLOCK_N=block, num_warps=4,
    )  # fmt: skip


def route_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `reference.route_topk`: (weights f32 (T, k), ids int32 (T, k))."""
    if router_logits.dim() != 2 or router_logits.dtype not in _DTYPES:
        raise ValueError("route_topk: expected router_logits (T, E) in bf16/fp16/fp32")
    num_tokens, num_experts = router_logits.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"route_topk: top_k={top_k} must be in [1, {num_experts}]")
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    dev = logits.device
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=dev)
    if num_tokens == 0:
        return weights, ids
    block_e = triton.next_power_of_2(num_experts)
    routing.route_topk_kernel[(num_tokens,)](
        logits, weights, ids, num_experts, logits.stride(0),
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(top_k), num_warps=routing.TOPK_WARPS,
        **pdl.options(logits),
    )  # fmt: skip
    return weights, ids


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton twin of `reference.silu_and_mul`: x (..., 2I) → (..., I)."""
    if x.dtype not in _DTYPES or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: expected (..., 2I) bf16/fp16/fp32, got {x.dtype}")
    inter_dim = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = x.new_empty(x2.shape[0], inter_dim)
    if out.numel() == 0:
        return out.view(*x.shape[:-1], inter_dim)
    block = min(1024, triton.next_power_of_2(inter_dim))
    grid = (x2.shape[0], triton.cdiv(inter_dim, block))
    activation.silu_and_mul_kernel[grid](
        x2, out, inter_dim, x2.stride(0), out.stride(0), BLOCK=block, num_warps=4
    )
    return out.view(*x.shape[:-1], inter_dim)


def sigmoid_gated_add(
    base: torch.Tensor,
    gate: torch.Tensor,
    x: torch.Tensor,
    gate_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton twin of `reference.sigmoid_gated_add`: base (T, H) + sigmoid(gate (T, 1)) * x
    (T, H), one launch instead of three. With `gate_weight` (1, K), `gate` is the gate
    linear's input (T, K) and the kernel computes the gate itself (one launch fewer)."""
    if base.dtype not in _DTYPES or not (base.dtype == gate.dtype == x.dtype):
        raise ValueError(f"sigmoid_gated_add: dtypes {base.dtype}, {gate.dtype}, {x.dtype}")
    gate_k = 1 if gate_weight is None else gate_weight.shape[-1]
    if gate_weight is not None and (
        gate_weight.shape != (1, gate_k) or gate_weight.dtype != gate.dtype
    ):
        raise ValueError(
            f"sigmoid_gated_add: gate weight {tuple(gate_weight.shape)} {gate_weight.dtype}, "
            f"expected (1, K) {gate.dtype}"
        )
    if base.dim() != 2 or base.shape != x.shape or gate.shape != (base.shape[0], gate_k):
        raise ValueError(f"sigmoid_gated_add: shapes {base.shape}, {gate.shape}, {x.shape}")
    if base.stride(-1) != 1 or x.stride(-1) != 1 or gate.stride(-1) != 1:
        base, x, gate = base.contiguous(), x.contiguous(), gate.contiguous()
    out = torch.empty_like(base)
    if out.numel() == 0:
        return out
    n_cols = base.shape[1]
    block = min(1024, triton.next_power_of_2(n_cols))
    gate_w = gate if gate_weight is None else gate_weight.contiguous()
    activation.sigmoid_gated_add_kernel[(base.shape[0], triton.cdiv(n_cols, block))](
        base, gate, gate_w, x, out, n_cols, gate_k,
        base.stride(0), gate.stride(0), x.stride(0), out.stride(0), BLOCK=block,
        GATE_DOT=gate_weight is not None, BLOCK_K=min(1024, triton.next_power_of_2(gate_k)),
        num_warps=4,
        enable_fp_fusion=False,  # the reference's separate product and sum, fp32 included
    )  # fmt: skip
    return out
