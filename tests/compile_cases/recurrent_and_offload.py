"""Compile cases: linear attention, offload lookup/fill, prefetch reservation, predictors
and the routing model."""

from __future__ import annotations

import dataclasses

import torch

from compile_cases.base import BF16, DT, F16, F32, FP8, _randn, _routing, add

# --- linear attention (Qwen3-Next style layers) -------------------------------------------


def _packed(lens: list[int], prev: list[int], ids: list[int]):
    qsl = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([p + n for p, n in zip(prev, lens)], dtype=torch.int32)
    return qsl, seq_lens, torch.tensor(ids, dtype=torch.int32)


LENS, PREV, IDS, NUM_SLOTS = [70, 2, 1, 20], [0, 9, 30, 3], [3, 0, -1, 1], 6


def _conv1d(dtype, prefill: bool, copies: int = 1, channels: int = 384, k: int = 4) -> None:
    from xinfer.kernels import linear_attn_launch as launch

    weight = _randn(channels, k, dtype=dtype)
    states = _randn(NUM_SLOTS * copies, k - 1, channels, dtype=dtype)
    if prefill:
        qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
        x = _randn(int(qsl[-1]), channels + 64, dtype=dtype)[:, 32 : 32 + channels]
        launch.causal_conv1d_prefill(x, weight, states, ids, qsl, seq_lens, max(LENS), copies)
    else:
        _, seq_lens, ids = _packed([1] * 4, PREV, IDS)
        x = _randn(4, channels + 64, dtype=dtype)[:, 32 : 32 + channels]
        launch.causal_conv1d_update(x, weight, states, ids, seq_lens, copies)


def _delta_rule(dtype, prefill: bool, copies: int = 1, hk=2, hv=4, dk=128, dv=128) -> None:
    from xinfer.kernels import linear_attn_launch as launch

    lens = LENS if prefill else [1] * 4
    qsl, seq_lens, ids = _packed(lens, PREV, IDS)
    num_tokens = int(qsl[-1])
    widths = [hk * dk, hk * dk, hv * dv, hv, hv]
    proj = _randn(num_tokens, sum(widths), dtype=dtype)
    q, k, v, a, b = proj.split(widths, dim=-1)
    q, k, v = q.view(num_tokens, hk, dk), k.view(num_tokens, hk, dk), v.view(num_tokens, hv, dv)
    a_log, dt_bias = _randn(hv, dtype=dtype), _randn(hv, dtype=dtype)
    states = _randn(NUM_SLOTS * copies, hv, dk, dv)
    args = (q, k, v, a, b, a_log, dt_bias, states, ids)
    if prefill:
        launch.gated_delta_rule_prefill(*args, qsl, seq_lens, max(lens), copies)
    else:
        launch.gated_delta_rule_decode(*args, seq_lens, copies)


def _gated_norm(dtype, gate: bool, heads: int = 4, head_dim: int = 128) -> None:
    from xinfer.kernels import linear_attn_launch as launch

    x = _randn(7, heads, head_dim, dtype=dtype)
    z = _randn(7, heads * 2 * head_dim, dtype=dtype).view(7, heads, 2 * head_dim)[..., head_dim:]
    if gate:
        launch.sigmoid_gate_mul(x, z)
    else:
        launch.gated_rms_norm(x, z, _randn(head_dim, dtype=dtype), 1e-6)


def _linear_attn_cases() -> None:
    conv_prefill = "conv1d_prefill_kernel conv1d_state_kernel"
    for dtype, copies in ((BF16, 2), (F16, 1), (F32, 1)):
        d = f"{DT[dtype]}-copies{copies}"
        add(f"conv1d-prefill-{d}", conv_prefill, _conv1d, dtype, True, copies)
        add(f"conv1d-update-{d}", "conv1d_update_kernel", _conv1d, dtype, False, copies)
        add(f"delta_rule-prefill-{d}", "chunk_prepare_kernel chunk_forward_kernel",
            _delta_rule, dtype, True, copies)  # fmt: skip
        add(f"delta_rule-decode-{d}", "recurrent_step_kernel", _delta_rule, dtype, False, copies)
        add(f"gated_rms_norm-{DT[dtype]}", "gated_rms_norm_kernel", _gated_norm, dtype, False)
        add(f"sigmoid_gate_mul-{DT[dtype]}", "sigmoid_gate_mul_kernel", _gated_norm, dtype, True)
    add("delta_rule-prefill-bf16-dk64-dv80", "chunk_prepare_kernel chunk_forward_kernel",
        _delta_rule, BF16, True, dk=64, dv=80)  # fmt: skip
    add("conv1d-prefill-bf16-narrow", conv_prefill, _conv1d, BF16, True, channels=40)


_linear_attn_cases()


# --- offload: slot lookup, fill, prefetch reservation and predictors ----------------------


def _expert_set(kind: str, num_experts: int) -> dict[str, torch.Tensor]:
    """Host expert tensors as the engine offloads them: bf16 weights, FP8 weights with
    float32 block scales, or mixed odd-sized tensors (int32, int16 and byte words)."""
    if kind == "bf16":
        return {"w13": _randn(num_experts, 64, 32, dtype=BF16),
                "w2": _randn(num_experts, 32, 32, dtype=BF16)}  # fmt: skip
    if kind == "fp8":
        return {"w13": _randn(num_experts, 64, 32, dtype=FP8),
                "w13_scale": _randn(num_experts, 1, 1),
                "w2": _randn(num_experts, 32, 32, dtype=FP8),
                "w2_scale": _randn(num_experts, 1, 1)}  # fmt: skip
    return {  # nine tensors: two fill launches (eight tensors a launch)
        "w13": _randn(num_experts, 6, 5),
        "w2": _randn(num_experts, 5, 3, dtype=BF16),
        "scale": torch.zeros(num_experts, 7, dtype=torch.uint8),
        "w13_scale": _randn(num_experts, 3, dtype=F16),
        "w2_scale": torch.zeros(num_experts, 2, 9, dtype=torch.int32),
        "w13_zeros": torch.zeros(num_experts, 4, 3, dtype=torch.uint8),
        "w2_zeros": torch.zeros(num_experts, 11, dtype=torch.uint8),
        "w13_scale_2": _randn(num_experts, 1),
        "w2_scale_2": _randn(num_experts, 2),
    }


def _slot_cache(kind: str, num_experts: int, num_slots: int, policy: str = "lru"):
    from xinfer.offload.slot_cache import SlotCache

    host = _expert_set(kind, num_experts)
    return SlotCache(host, num_slots, torch.device("cpu"), policy=policy), host


def _lookup_fill(kind: str, num_experts: int, num_slots: int, tokens: int, top_k: int,
                 policy: str = "lru") -> None:  # fmt: skip
    from xinfer.offload import kernels as offload_kernels

    cache, host = _slot_cache(kind, num_experts, num_slots, policy)
    _, ids = _routing(num_experts, top_k, True)(tokens)
    offload_kernels.lookup(cache, ids, force_triton=True)
    offload_kernels.fill(cache, host, force_triton=True)


def _reserve(
    num_experts: int, num_slots: int, tokens: int, top_k: int, policy: str = "lru"
) -> None:
    from xinfer.offload import kernels as offload_kernels
    from xinfer.offload.prefetch_table import PrefetchTable, reserve

    cache, host = _slot_cache("bf16", num_experts, num_slots, policy)
    table = PrefetchTable(cache)
    _, ids = _routing(num_experts, top_k, True)(tokens)
    reserve(table, ids, force_triton=True)
    offload_kernels.fill(table.fill_target(), host, force_triton=True)  # the prefetch fill


def _unpack(shapes: list[tuple[int, ...]], misses: int) -> None:
    """The packed-expert fill (`--moe-offload-compress`), one or two tensors a launch."""
    from xinfer.offload.packed import pack_experts, unpack_fill

    packed = [pack_experts(_randn(8, *s, dtype=BF16) * 0.02) for s in shapes]
    dst = [torch.zeros(12, *s, dtype=BF16) for s in shapes]
    ids = torch.arange(misses, dtype=torch.int32)
    unpack_fill(packed, dst, ids, ids + 2, torch.tensor([misses], dtype=torch.int32), 8,
                mapped=False)  # fmt: skip


def _select(dtype, num_experts: int, top_k: int, keys: bool) -> None:
    from xinfer.offload.predictor import select

    k = torch.arange(9, dtype=torch.int64) if keys else None
    select(_randn(9, num_experts, dtype=dtype), top_k, 0.5, k, force_triton=True)


def _routing_model(num_experts: int, top_k: int, big_bases: bool, decode: bool) -> None:
    """The routing model's state/select kernels and the prefetch predictor on its state.
    Hash bases are uint32: below 2**31 Triton passes them as i32, above as i64."""
    from xinfer.routing import parametric_launch
    from xinfer.routing.config import PRESETS
    from xinfer.routing.parametric import popularity_draw
    from xinfer.routing.parametric_ops import RoutingState, SequenceBatch, layer_constants
    from xinfer.routing.predict import predict_model

    params = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(3, 4, params.layer_scale(4), params.sigma, params.tau, params.phi,
                            popularity_draw(3, 4, num_experts))  # fmt: skip
    base = 0xC0FFEE11 if big_bases else 0x1234567
    const = dataclasses.replace(const, step_base=base, init_base=base ^ 1, gumbel_base=base ^ 2)
    state = RoutingState.empty(6, num_experts, torch.device("cpu"))
    lens = [1, 1, 1, 1] if decode else [5, 1, 3, 9]
    qsl = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    batch = SequenceBatch(
        qsl,
        torch.tensor([7 + n for n in lens], dtype=torch.int32),
        torch.tensor([0, 1, 2, 6], dtype=torch.int64),
        torch.tensor([10, 11, -1, 13], dtype=torch.int64),
        decode,
    )
    num_tokens = sum(lens)
    c, tok_key, tok_pos = parametric_launch.advance_state(state, batch, const, num_tokens)
    logits = _randn(num_tokens, num_experts, dtype=BF16)
    parametric_launch.select_experts(c, tok_key, tok_pos, logits, const, top_k, decode)
    if decode:
        predict_model(state, batch, const, base ^ 3, 0.7, top_k, 0.5, force_triton=True)


def _offload_cases() -> None:
    lf = "lookup_kernel fill_kernel"
    add("offload-bf16-e128-s32-decode", lf, _lookup_fill, "bf16", 128, 32, 1, 8)
    add("offload-fp8-e128-s32-prefill", lf, _lookup_fill, "fp8", 128, 32, 512, 8)
    add("offload-mixed-e60-s20", lf, _lookup_fill, "mixed", 60, 20, 3, 4)
    add("offload-lfu-bf16-e128-s13-decode", lf, _lookup_fill, "bf16", 128, 13, 1, 8, "lfu")
    add("offload-lfu-bf16-e512-s64-batch", lf, _lookup_fill, "bf16", 512, 64, 16, 8, "lfu")
    add("prefetch-reserve-e128-s32-decode", "reserve_kernel fill_kernel", _reserve, 128, 32,
        1, 8)  # fmt: skip
    add("prefetch-reserve-e60-s24-batch", "reserve_kernel fill_kernel", _reserve, 60, 24, 16, 4)
    add("prefetch-reserve-lfu-e128-s13-decode", "reserve_kernel fill_kernel", _reserve, 128, 13,
        1, 8, "lfu")  # fmt: skip
    add("offload-unpack-w13-w2", "unpack_fill_kernel", _unpack, [(2 * 96, 256), (256, 96)], 3)
    add("offload-unpack-one", "unpack_fill_kernel", _unpack, [(64, 80)], 1)
    add("predictor-select-fp32-e128-k8-keys", "select_kernel", _select, F32, 128, 8, True)
    add("predictor-select-bf16-e60-k4", "select_kernel", _select, BF16, 60, 4, False)
    add("predictor-select-fp32-e512-k8", "select_kernel", _select, F32, 512, 8, False)
    rm = "routing_state_kernel routing_select_kernel"
    for big in (False, True):
        b = "i64" if big else "i32"
        add(f"routing-model-e128-k8-decode-{b}bases", f"{rm} predict_model_kernel",
            _routing_model, 128, 8, big, True)  # fmt: skip
    scan = "routing_scan_local_kernel routing_scan_carry_kernel routing_select_kernel"
    add("routing-model-e60-k4-prefill", scan, _routing_model, 60, 4, False, False)
    add("routing-model-e256-k8-prefill-i64bases", scan, _routing_model, 256, 8, True, False)


_offload_cases()
