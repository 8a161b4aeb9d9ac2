"""Compile cases: dense GEMV, attention, norms, RoPE, KV store, qkv prep, bf16 MoE and routing."""

from __future__ import annotations

from unittest import mock

import torch

from compile_cases.base import (
    BF16,
    DT,
    F16,
    F32,
    FP8,
    MOE_GROUPED,
    _gen,
    _randn,
    _routing,
    add,
    reduced_apart,
)

# --- dense linears: the skinny GEMM (decode batches; larger ones run cuBLAS) -------------


def _gemv(dtype, cfg, m: int, bias: bool) -> None:
    from xinfer.kernels import gemv_launch

    n, k = 256, 256 * cfg.split_k  # split_k ranges of 256 columns: cfg.split_k splits
    x, w = _randn(m, k, dtype=dtype), _randn(n, k, dtype=dtype)
    gemv_launch.linear(x, w, _randn(n, dtype=dtype) if bias else None, config=cfg)


def _gemv_cases() -> None:
    from xinfer.kernels import gemv_launch

    configs: dict = {}
    for (n, k, max_m), cfg in gemv_launch.GEMV_TABLE.items():
        if cfg is not None:
            configs.setdefault(cfg, f"n{n}-k{k}-m{max_m}")
    for cfg, name in configs.items():  # split-K: the last split reduces (REDUCE)
        add(f"gemv-bf16-{name}-m1-bias", "gemv_kernel", _gemv, BF16, cfg, 1, True)
        add(f"gemv-fp16-{name}-m16", "gemv_kernel", _gemv, F16, cfg, 16, False)
    split = next(cfg for cfg in configs if cfg.split_k > 1)
    add("gemv-bf16-split-m1-bias-reduce-apart", "gemv_kernel gemv_split_reduce_kernel",
        reduced_apart(_gemv), BF16, split, 1, True)  # fmt: skip
    cfg = gemv_launch.FP32_CONFIG
    add("gemv-fp32-m5-bias", "gemv_kernel", _gemv, F32, cfg, 5, True)


_gemv_cases()


# --- attention, norms, rope, KV store, qkv prep ------------------------------------------


def _attention(dtype, decode: bool, hq: int, hk: int, head_dim: int, window=None,
               cache_dtype=None, block_size: int = 16) -> None:  # fmt: skip
    from xinfer.kernels import attn_launch

    seq_lens = [300, 17, 1000]
    query_lens = [1, 1, 1] if decode else [300, 5, 64]  # a prompt, chunked prefills
    max_blocks = max(seq_lens) // block_size + 1
    num_blocks = len(seq_lens) * max_blocks
    k_cache = _randn(num_blocks, block_size, hk, head_dim, dtype=cache_dtype or dtype)
    v_cache = _randn(num_blocks, block_size, hk, head_dim, dtype=cache_dtype or dtype)
    tables = torch.randperm(num_blocks, generator=_gen()).view(len(seq_lens), -1).to(torch.int32)
    q = _randn(sum(query_lens), hq, head_dim, dtype=dtype)
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    # the tiles CUDA tensors get (CPU tensors get small interpreter tiles otherwise)
    with mock.patch.object(attn_launch, "SMALL_INTERPRETER_TILES", False):
        attn_launch.paged_attention(
            q, k_cache, v_cache, tables, lens, qsl, head_dim**-0.5,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), sliding_window=window,
        )  # fmt: skip


def _decode_merged_in_launch(*args, **kwargs) -> None:
    """`_attention` with decode's splits merged by their last program (FUSED_DECODE_REDUCE
    on: no `decode_reduce_kernel`)."""
    from xinfer.kernels import attn_launch

    with mock.patch.object(attn_launch, "FUSED_DECODE_REDUCE", True):
        _attention(*args, **kwargs)


def _attention_cases() -> None:
    for decode in (True, False):
        kind = "decode" if decode else "prefill"
        # decode: the splits merged in a launch of their own (FUSED_DECODE_REDUCE off)
        kernels = "decode_kernel decode_reduce_kernel" if decode else "prefill_kernel"
        for dtype in (BF16, F16, F32):
            for window in (None, 512):
                w = f"-window{window}" if window else ""
                add(f"attn-{kind}-{DT[dtype]}-hd128-g4{w}", kernels, _attention,
                    dtype, decode, 32, 8, 128, window)  # fmt: skip
        add(f"attn-{kind}-bf16-hd256-g2-window", kernels, _attention, BF16, decode, 8, 4, 256,
            1024)  # Gemma 3 local layers  # fmt: skip
        add(f"attn-{kind}-bf16-hd64-g8", kernels, _attention, BF16, decode, 16, 2, 64)
        add(f"attn-{kind}-fp16-hd80-mha", kernels, _attention, F16, decode, 8, 8, 80)
        add(f"attn-{kind}-bf16-hd128-fp8cache", kernels, _attention, BF16, decode, 32, 4, 128,
            cache_dtype=FP8)  # fmt: skip
        add(f"attn-{kind}-fp16-hd128-block32", kernels, _attention, F16, decode, 16, 4, 128,
            block_size=32)  # fmt: skip
    add("attn-decode-bf16-hd128-g4-merged", "decode_kernel", _decode_merged_in_launch, BF16,
        True, 32, 8, 128)  # fmt: skip
    add("attn-decode-bf16-hd256-g2-window-merged", "decode_kernel", _decode_merged_in_launch,
        BF16, True, 8, 4, 256, 1024)  # fmt: skip
    add("attn-decode-fp32-hd128-g4-merged", "decode_kernel", _decode_merged_in_launch, F32,
        True, 32, 8, 128)  # fmt: skip


_attention_cases()


def _rms_norm(dtype, shape, residual: bool, weight_dtype=None, heads: bool = False) -> None:
    from xinfer.kernels import attn_launch

    hidden = shape[-1]
    if heads:  # per-head norm of the q heads of a fused qkv output (strided 3-D view)
        t, h, d = shape
        x = _randn(t, (h + 8) * d, dtype=dtype)[:, : h * d].view(t, h, d)
    else:
        x = _randn(*shape, dtype=dtype)
    res = _randn(*shape, dtype=dtype) if residual else None
    attn_launch.rms_norm(x, _randn(hidden, dtype=weight_dtype or dtype), 1e-6, res)


def _norm_cases() -> None:
    k = "rms_norm_kernel"
    add("rms_norm-bf16-2048-residual", k, _rms_norm, BF16, (7, 2048), True)
    add("rms_norm-bf16-2048", k, _rms_norm, BF16, (1, 2048), False)
    add("rms_norm-fp16-4096-residual", k, _rms_norm, F16, (3, 4096), True)
    add("rms_norm-fp32-1000-residual", k, _rms_norm, F32, (5, 1000), True)
    add("rms_norm-bf16-heads128", k, _rms_norm, BF16, (5, 32, 128), False, heads=True)
    add("rms_norm-bf16-fp32weight", k, _rms_norm, BF16, (4, 2048), False, weight_dtype=F32)


_norm_cases()


def _rope(dtype, hq: int, hk: int, head_dim: int, num_tokens: int = 37) -> None:
    from xinfer.kernels import attn_launch

    qkv = _randn(num_tokens, (hq + 2 * hk) * head_dim, dtype=dtype)
    q = qkv[:, : hq * head_dim].view(num_tokens, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(num_tokens, hk, head_dim)
    pos = torch.randint(0, 4096, (num_tokens,), generator=_gen())
    attn_launch.apply_rope(q, k, pos, _randn(4096, head_dim))


def _store_kv(dtype, cache_dtype=None, hk: int = 4, head_dim: int = 128) -> None:
    from xinfer.kernels import attn_launch

    k, v = _randn(37, hk, head_dim, dtype=dtype), _randn(37, hk, head_dim, dtype=dtype)
    k_cache = _randn(20, 16, hk, head_dim, dtype=cache_dtype or dtype)
    v_cache = _randn(20, 16, hk, head_dim, dtype=cache_dtype or dtype)
    slots = torch.randperm(320, generator=_gen())[:37]
    attn_launch.store_kv(k, v, k_cache, v_cache, slots)


def _qkv_prep(dtype, hq: int, hk: int, head_dim: int, norm: bool = True, cache_dtype=None,
              rot: int | None = None, num_tokens: int = 37) -> None:  # fmt: skip
    from xinfer.kernels import qkv_prep_launch

    width = (hq + 2 * hk) * head_dim
    qkv = _randn(num_tokens, width, dtype=dtype)
    q, k, v = qkv.split([hq * head_dim, hk * head_dim, hk * head_dim], dim=-1)
    q, k, v = (t.reshape(num_tokens, -1, head_dim) for t in (q, k, v))
    cos_sin = _randn(4096, rot or head_dim)
    positions = torch.randint(0, 4096, (num_tokens,), generator=_gen())
    slots = torch.randperm(20 * 16, generator=_gen())[:num_tokens]
    k_cache = _randn(20, 16, hk, head_dim, dtype=cache_dtype or dtype)
    v_cache = _randn(20, 16, hk, head_dim, dtype=cache_dtype or dtype)
    weights = [_randn(head_dim, dtype=dtype), _randn(head_dim, dtype=dtype)] if norm else []
    qkv_prep_launch.qkv_prep(q, k, v, positions, cos_sin, k_cache, v_cache, slots, *weights,
                             eps=1e-6)  # fmt: skip


def _rope_kv_cases() -> None:
    for dtype in (BF16, F16, F32):
        add(f"rope-{DT[dtype]}-hd128", "rope_kernel", _rope, dtype, 32, 4, 128)
        add(f"store_kv-{DT[dtype]}", "store_kv_kernel", _store_kv, dtype)
        add(f"qkv_prep-{DT[dtype]}-norm", "qkv_prep_kernel", _qkv_prep, dtype, 32, 4, 128)
    add("rope-bf16-hd64", "rope_kernel", _rope, BF16, 16, 2, 64)
    add("rope-fp16-hd80", "rope_kernel", _rope, F16, 8, 8, 80)
    add("store_kv-bf16-fp8cache", "store_kv_kernel", _store_kv, BF16, FP8)
    add("store_kv-bf16-hd256", "store_kv_kernel", _store_kv, BF16, hk=8, head_dim=256)
    q = "qkv_prep_kernel"
    add("qkv_prep-bf16-no-norm", q, _qkv_prep, BF16, 32, 8, 128, norm=False)
    add("qkv_prep-bf16-fp8cache", q, _qkv_prep, BF16, 32, 4, 128, cache_dtype=FP8)
    add("qkv_prep-bf16-partial-rotary", q, _qkv_prep, BF16, 16, 2, 128, norm=False, rot=64)
    add("qkv_prep-bf16-hd256-decode", q, _qkv_prep, BF16, 8, 4, 256, num_tokens=1)


_rope_kv_cases()


# --- MoE (bf16 experts), routing, activation ---------------------------------------------


def _silu(dtype, inter: int) -> None:
    from xinfer.kernels import moe_launch

    moe_launch.silu_and_mul(_randn(9, 2 * inter, dtype=dtype))


def _gated_add(dtype, hidden: int) -> None:
    from xinfer.kernels import moe_launch

    base, x = _randn(9, hidden, dtype=dtype), _randn(9, hidden, dtype=dtype)
    moe_launch.sigmoid_gated_add(base, _randn(9, 1, dtype=dtype), x)


def _gated_add_with_gate(dtype, hidden: int) -> None:
    """The shared expert's gate computed inside the add (GATE_DOT)."""
    from xinfer.kernels import moe_launch

    base, x = _randn(9, hidden, dtype=dtype), _randn(9, hidden, dtype=dtype)
    moe_launch.sigmoid_gated_add(base, _randn(9, hidden, dtype=dtype), x,
                                 gate_weight=_randn(1, hidden, dtype=dtype))  # fmt: skip


def _route_topk(dtype, num_experts: int, top_k: int, renormalize: bool) -> None:
    from xinfer.kernels import moe_launch

    moe_launch.route_topk(_randn(11, num_experts, dtype=dtype), top_k, renormalize)


def _router_topk(dtype, num_experts: int, k: int, top_k: int, rows: int) -> None:
    from xinfer.kernels import router_launch

    w = _randn(num_experts, k, dtype=dtype)
    assert router_launch.router_topk(_randn(rows, k, dtype=dtype), w, top_k, True) is not None


def _fused_moe(dtype, tokens: int, top_k: int, use_gemv: bool, num_experts: int = 8) -> None:
    from xinfer.kernels import moe_launch

    hidden_dim, inter = 512, 256
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    w13 = _randn(num_experts, 2 * inter, hidden_dim, dtype=dtype)
    w2 = _randn(num_experts, hidden_dim, inter, dtype=dtype)
    hidden = _randn(tokens, hidden_dim, dtype=dtype)
    moe_launch.fused_moe(hidden, ids, weights, w13, w2, use_gemv=use_gemv)


MOE_GEMV = "moe_gate_up_gemv_kernel moe_down_gemv_kernel"  # the combine is fused


def _fused_moe_combined_apart(*args) -> None:
    """The GEMV path with the separate combine launch (`moe_launch.FUSED_COMBINE` off)."""
    from xinfer.kernels import moe_launch

    saved, moe_launch.FUSED_COMBINE = moe_launch.FUSED_COMBINE, False
    try:
        _fused_moe(*args)
    finally:
        moe_launch.FUSED_COMBINE = saved


def _align_numbered(num_ids: int, num_pairs: int, block_m: int, max_ids: int) -> None:
    """The align kernel numbering the used ids first (an offload slot view, `max_ids` E)."""
    from xinfer.kernels import moe_align

    ids = torch.randint(-1, num_ids, (num_pairs,), generator=_gen(), dtype=torch.int32)
    assert moe_align._numbered_bound(num_ids, num_pairs, max_ids)
    moe_align.align_pairs(ids, num_ids, block_m, method="kernel", max_ids=max_ids)


def _align_count(num_ids: int, num_pairs: int, block_m: int, max_ids=None, method="count"):
    """The counting-sort align (`method` None: the default picks it at these sizes)."""
    from xinfer.kernels import moe_align

    ids = torch.randint(-1, num_ids, (num_pairs,), generator=_gen(), dtype=torch.int32)
    moe_align.align_pairs(ids, num_ids, block_m, method=method, max_ids=max_ids)


ALIGN_COUNT = "moe_count_kernel moe_count_starts_kernel moe_count_place_kernel"


def _moe_cases() -> None:
    for dtype in (BF16, F16, F32):
        add(f"silu_and_mul-{DT[dtype]}", "silu_and_mul_kernel", _silu, dtype, 768)
        add(f"moe-{DT[dtype]}-gemv-t1", MOE_GEMV, _fused_moe, dtype, 1, 8, True)
        add(f"moe-{DT[dtype]}-grouped-t40", MOE_GROUPED, _fused_moe, dtype, 40, 8, False)
    add("moe-bf16-gemv-t1-combine-apart", f"{MOE_GEMV} moe_combine_kernel",
        _fused_moe_combined_apart, BF16, 1, 8, True)  # fmt: skip
    # more than 1024 pairs: the large grouped tiles (bf16/fp16 only; fp32 has one config)
    add("moe-bf16-grouped-t130k8", MOE_GROUPED, _fused_moe, BF16, 130, 8, False)
    for pairs, block_m in ((72, 16), (4088, 64)):  # decode batches 9 and 511 at k=8
        add(f"moe-align-numbered-p{pairs}", "moe_align_kernel", _align_numbered, 3338, pairs,
            block_m, 128)  # fmt: skip
    # the counting sort: blocks x ids scanned in the starts kernel (64 x 128), or by the
    # prefix kernel (79 x 3,338: a joined prompt call over an offload view); numbered to E
    add("moe-align-count-p16384-e128", ALIGN_COUNT, _align_count, 128, 16384, 64,
        method=None)  # fmt: skip
    add("moe-align-count-p20000-e3338", f"{ALIGN_COUNT} moe_count_prefix_kernel",
        _align_count, 3338, 20000, 16)  # fmt: skip
    add("moe-align-count-numbered-p4095", ALIGN_COUNT, _align_count, 3338, 4095, 128, 128)
    add("silu_and_mul-bf16-wide", "silu_and_mul_kernel", _silu, BF16, 5632)
    for dtype in (BF16, F32):
        add(f"sigmoid_gated_add-{DT[dtype]}", "sigmoid_gated_add_kernel", _gated_add, dtype, 2048)
        add(f"sigmoid_gated_add-{DT[dtype]}-gate-dot", "sigmoid_gated_add_kernel",
            _gated_add_with_gate, dtype, 2048)  # fmt: skip
    r = "route_topk_kernel"
    add("route_topk-bf16-e128-k8-renorm", r, _route_topk, BF16, 128, 8, True)
    add("route_topk-fp16-e60-k4", r, _route_topk, F16, 60, 4, False)
    add("route_topk-fp32-e512-k10-renorm", r, _route_topk, F32, 512, 10, True)
    r = "router_topk_kernel"
    add("router_topk-bf16-e128-k2048-m1", r, _router_topk, BF16, 128, 2048, 8, 1)  # split K
    add("router_topk-bf16-e60-k2048-m16", r, _router_topk, BF16, 60, 2048, 4, 16)
    add("router_topk-fp32-e8-k512-m3", r, _router_topk, F32, 8, 512, 2, 3)  # unsplit


_moe_cases()
