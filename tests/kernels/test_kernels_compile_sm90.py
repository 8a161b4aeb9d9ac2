"""Every Triton launcher of the package compiled for the H200 (sm_90) on CPU: each case
calls a launcher with small CPU tensors inside `triton_compile.compile_only()`, which
compiles the launch's exact specialization (AST → TTIR → TTGIR → LLVM IR, no ptxas, no
GPU) and runs nothing. The cases are the configurations that select different kernels or
constexpr specializations: dtypes, decode / prefill tiles, GEMV / grouped MoE paths, every
quantized format and GGUF block type, windows, fp8 KV caches, head sizes, tile tables.

Why: CI runs the kernels only in Triton's CPU interpreter, which accepts code that compiled
Triton refuses; every 4-bit and FP8 kernel once failed to compile on the H200 while CI was
green. Here they fail in CI instead, named by launcher and configuration. A kernel whose
shared memory exceeds the H200's 227 KB fails too, as its launch would.

Each case asserts the kernels it expects were compiled (it cannot pass by compiling
nothing); `test_every_kernel_is_compiled` asserts that every kernel launched anywhere in
`src/xinfer` (a jit function called with a grid, `kernel[grid](...)`) was compiled by some
case. Launchers that take a torch twin for CPU tensors (`xinfer.kernels.*`, `use_triton`)
are bypassed: the cases call the launcher modules, or pass `force_triton=True`.

Outputs are never written (nothing launches); only the arguments' dtypes, shapes, strides
and alignment matter, so the tensors are small. A configuration that cannot be fixed at once
gets `marks=(pytest.mark.xfail(strict=True, reason=<the exact error>),)` in its `add` (the
coverage test then does not count it). About 90 s on two CPU cores (~220 compiles)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch
from interpreter_child import IS_CHILD

triton = pytest.importorskip("triton")
from triton_compile import compile_only  # noqa: E402

pytestmark = pytest.mark.skipif(
    IS_CHILD, reason="compiles the kernels: needs a process without TRITON_INTERPRET=1"
)

SRC = Path(__file__).resolve().parents[2] / "src" / "xinfer"
BF16, F16, F32, FP8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
DT = {BF16: "bf16", F16: "fp16", F32: "fp32"}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[], object]
    kernels: frozenset[str]  # names that must be among the compiled kernels
    marks: tuple = ()


CASES: list[Case] = []
_RESULTS: dict[str, set[str]] = {}  # case id → compiled kernel names, in this process


def add(case_id: str, kernels: str, fn: Callable, *args, marks: tuple = (), **kwargs) -> None:
    if any(c.id == case_id for c in CASES):
        raise AssertionError(f"duplicate case id {case_id}")
    run = functools.partial(fn, *args, **kwargs)
    CASES.append(Case(case_id, run, frozenset(kernels.split()), marks))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=F32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen()).to(dtype)


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
    for cfg, name in configs.items():
        kernels = "gemv_kernel" + (" gemv_split_reduce_kernel" if cfg.split_k > 1 else "")
        add(f"gemv-bf16-{name}-m1-bias", kernels, _gemv, BF16, cfg, 1, True)
        add(f"gemv-fp16-{name}-m16", kernels, _gemv, F16, cfg, 16, False)
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


def _attention_cases() -> None:
    for decode in (True, False):
        kind = "decode" if decode else "prefill"
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


def _route_topk(dtype, num_experts: int, top_k: int, renormalize: bool) -> None:
    from xinfer.kernels import moe_launch

    moe_launch.route_topk(_randn(11, num_experts, dtype=dtype), top_k, renormalize)


def _routing(num_experts: int, top_k: int, renorm: bool):
    """Router outputs as the engine hands them to the expert kernels (ids int32)."""
    from xinfer.kernels import reference

    def make(tokens: int):
        logits = _randn(tokens, num_experts)
        return reference.route_topk(logits, top_k, renorm)

    return make


def _fused_moe(dtype, tokens: int, top_k: int, use_gemv: bool, num_experts: int = 8) -> None:
    from xinfer.kernels import moe_launch

    hidden_dim, inter = 512, 256
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    w13 = _randn(num_experts, 2 * inter, hidden_dim, dtype=dtype)
    w2 = _randn(num_experts, hidden_dim, inter, dtype=dtype)
    hidden = _randn(tokens, hidden_dim, dtype=dtype)
    moe_launch.fused_moe(hidden, ids, weights, w13, w2, use_gemv=use_gemv)


MOE_GEMV = "moe_gate_up_gemv_kernel moe_down_gemv_kernel moe_combine_kernel"
MOE_GROUPED = (
    "moe_align_kernel moe_gate_up_grouped_kernel moe_down_grouped_kernel moe_combine_kernel"
)


def _moe_cases() -> None:
    for dtype in (BF16, F16, F32):
        add(f"silu_and_mul-{DT[dtype]}", "silu_and_mul_kernel", _silu, dtype, 768)
        add(f"moe-{DT[dtype]}-gemv-t1", MOE_GEMV, _fused_moe, dtype, 1, 8, True)
        add(f"moe-{DT[dtype]}-grouped-t40", MOE_GROUPED, _fused_moe, dtype, 40, 8, False)
    # more than 1024 pairs: the large grouped tiles (bf16/fp16 only; fp32 has one config)
    add("moe-bf16-grouped-t130k8", MOE_GROUPED, _fused_moe, BF16, 130, 8, False)
    add("silu_and_mul-bf16-wide", "silu_and_mul_kernel", _silu, BF16, 5632)
    r = "route_topk_kernel"
    add("route_topk-bf16-e128-k8-renorm", r, _route_topk, BF16, 128, 8, True)
    add("route_topk-fp16-e60-k4", r, _route_topk, F16, 60, 4, False)
    add("route_topk-fp32-e512-k10-renorm", r, _route_topk, F32, 512, 10, True)


_moe_cases()


# --- quantized formats (quant_launch, quant_prefill) --------------------------------------


def _formats() -> dict:
    from xinfer.quant.awq import AwqInt4
    from xinfer.quant.compressed_tensors import PackQuantizedInt4
    from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {
        "fp8-block128": Fp8Block(128, 128),
        "fp8-per-channel": Fp8Scaled(),
        "gptq-g128-sym": GptqInt4(group_size=128, has_zero=False),
        "gptq-g128-asym": GptqInt4(group_size=128, has_zero=True),
        "gptq-per-row-sym": GptqInt4(group_size=0, has_zero=False),
        "awq-g128": AwqInt4(group_size=128, has_zero=True),
        "ct-g32-asym-bf16": PackQuantizedInt4(32, True, torch.bfloat16),
        "nvfp4": Nvfp4(),
        # scale groups that a tile can straddle: the per-element scale gathers (GROUP_T 1, 2)
        "fp8-block128x96": Fp8Block(128, 96),
        "gptq-g96-sym": GptqInt4(group_size=96, has_zero=False),
    }


@functools.cache
def _quant_weights(name: str, n: int, k: int, count: int | None = None) -> dict:
    from quant_weights import random_weights

    return random_weights(_formats()[name], n, k, seed=0, count=count)


def _quant_k(name: str) -> int:
    return 1536 if "96" in name else 1024  # whole groups of 96: 16 of them


def _quant_linear(name: str, dtype, m: int, dequant=None, bias: bool = True) -> None:
    from xinfer.kernels import quant_launch

    n, k = 256, _quant_k(name)
    fmt, tensors = _formats()[name], _quant_weights(name, n, k)
    b = _randn(n, dtype=dtype) if bias else None
    quant_launch.linear(_randn(m, k, dtype=dtype), fmt, tensors, b, n, k, dequant=dequant)


def _quant_moe(name: str, dtype, tokens: int, use_gemv: bool, dequant=None,
               factored: bool | None = None, num_experts: int = 8) -> None:  # fmt: skip
    from xinfer.kernels import quant_launch

    hidden_dim, inter, top_k = _quant_k(name) // 2, 384 if "96" in name else 256, 8
    fmt = _formats()[name]
    w13 = _quant_weights(name, 2 * inter, hidden_dim, num_experts)
    w2 = _quant_weights(name, hidden_dim, inter, num_experts)
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    tiles = None
    if factored is not None:
        tiles = dataclasses.replace(
            quant_launch.gemv_tiles(fmt.kernel_weights(w13, hidden_dim)), factored=factored
        )
    hidden = _randn(tokens, hidden_dim, dtype=dtype)
    quant_launch.fused_moe(hidden, ids, weights, fmt, w13, w2, inter, use_gemv=use_gemv,
                           tiles=tiles, dequant=dequant)  # fmt: skip


Q_LINEAR = "quant_linear_kernel"
Q_SPLIT = "quant_linear_kernel gemv_split_reduce_kernel"  # decode tiles split K
Q_DEQUANT = "dequant_kernel"
Q_GEMV = "quant_moe_gate_up_gemv_kernel quant_moe_down_gemv_kernel moe_combine_kernel"
Q_GROUPED = (
    "moe_align_kernel quant_moe_gate_up_grouped_kernel quant_moe_down_grouped_kernel "
    "moe_combine_kernel"
)
Q_PREFILL_MOE = f"dequant_kernel {MOE_GROUPED}"


def _quant_cases() -> None:
    for name in _formats():
        odd = "96" in name  # the gather variants: decode and in-register prefill tiles only
        add(f"quant-{name}-linear-bf16-m1", Q_SPLIT, _quant_linear, name, BF16, 1)
        add(f"quant-{name}-linear-fp16-m16-nobias", Q_SPLIT, _quant_linear, name, F16, 16,
            bias=False)  # fmt: skip
        add(f"quant-{name}-linear-bf16-m128-registers", Q_LINEAR, _quant_linear, name, BF16,
            128, dequant=False)  # fmt: skip
        add(f"quant-{name}-moe-bf16-gemv", Q_GEMV, _quant_moe, name, BF16, 1, True)
        add(f"quant-{name}-moe-bf16-gemv-factored", Q_GEMV, _quant_moe, name, BF16, 2, True,
            factored=True)  # fmt: skip
        add(f"quant-{name}-moe-bf16-grouped-registers", Q_GROUPED, _quant_moe, name, BF16, 40,
            False, dequant=False)  # fmt: skip
        if odd:
            continue
        add(f"quant-{name}-linear-bf16-m128-prefill", Q_DEQUANT, _quant_linear, name, BF16,
            128)  # fmt: skip
        add(f"quant-{name}-linear-fp32-m32-registers", Q_LINEAR, _quant_linear, name, F32, 32,
            dequant=False)  # fmt: skip
        add(f"quant-{name}-moe-bf16-prefill", Q_PREFILL_MOE, _quant_moe, name, BF16, 130,
            False)  # fmt: skip
        add(f"quant-{name}-moe-fp16-grouped-large", Q_GROUPED, _quant_moe, name, F16, 130,
            False, dequant=False)  # fmt: skip
        add(f"quant-{name}-moe-fp16-gemv", Q_GEMV, _quant_moe, name, F16, 3, True)
        add(f"quant-{name}-moe-fp32-grouped-registers", Q_GROUPED, _quant_moe, name, F32, 40,
            False, dequant=False)  # fmt: skip


_quant_cases()


# --- GGUF blocks (gguf_launch) ----------------------------------------------------------

GGUF_TYPES = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def _gguf_rows(name: str, rows: int, k: int, experts: int | None = None) -> torch.Tensor:
    """Block rows of the right shape (the bytes do not matter: nothing runs)."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    shape = (rows, BLOCK_TYPES[name].row_bytes(k))
    return torch.zeros((experts, *shape) if experts else shape, dtype=torch.uint8)


def _gguf_linear(name: str, dtype, m: int, bias: bool = True) -> None:
    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    n, k = 96, 1024
    b = _randn(n, dtype=dtype) if bias else None
    w = _gguf_rows(name, n, k)
    gguf_launch.linear(_randn(m, k, dtype=dtype), w, BLOCK_TYPES[name], b, n, k)


def _gguf_moe(t13: str, t2: str, dtype, tokens: int, use_gemv: bool) -> None:
    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    num_experts, top_k, hidden_dim, inter = 8, 8, 512, 256
    w13 = _gguf_rows(t13, 2 * inter, hidden_dim, num_experts)
    w2 = _gguf_rows(t2, hidden_dim, inter, num_experts)
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    gguf_launch.fused_moe(_randn(tokens, hidden_dim, dtype=dtype), ids, weights,
                          w13, BLOCK_TYPES[t13], w2, BLOCK_TYPES[t2], inter, use_gemv)  # fmt: skip


G_GEMV = "gguf_moe_gate_up_gemv_kernel gguf_moe_down_gemv_kernel moe_combine_kernel"
G_GROUPED = (
    "moe_align_kernel gguf_moe_gate_up_grouped_kernel gguf_moe_down_grouped_kernel "
    "moe_combine_kernel"
)


def _gguf_cases() -> None:
    g = "gguf_linear_kernel"
    for name in GGUF_TYPES:
        add(f"gguf-{name}-linear-bf16-m1", g, _gguf_linear, name, BF16, 1)
        add(f"gguf-{name}-linear-bf16-m128", g, _gguf_linear, name, BF16, 128)
        add(f"gguf-{name}-moe-bf16-gemv", G_GEMV, _gguf_moe, name, name, BF16, 1, True)
        add(f"gguf-{name}-moe-bf16-grouped", G_GROUPED, _gguf_moe, name, name, BF16, 40, False)
    add("gguf-Q4_K-linear-fp16-m16-nobias", g, _gguf_linear, "Q4_K", F16, 16, bias=False)
    add("gguf-Q6_K-linear-fp32-m64", g, _gguf_linear, "Q6_K", F32, 64)
    add("gguf-Q4_K+Q6_K-moe-fp16-gemv", G_GEMV, _gguf_moe, "Q4_K", "Q6_K", F16, 2, True)
    add("gguf-Q4_K+Q6_K-moe-bf16-grouped-large", G_GROUPED, _gguf_moe, "Q4_K", "Q6_K", BF16,
        130, False)  # fmt: skip
    add("gguf-Q8_0-moe-fp32-grouped", G_GROUPED, _gguf_moe, "Q8_0", "Q8_0", F32, 40, False)


_gguf_cases()


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
    return {  # five tensors: two fill launches (four tensors a launch)
        "w13": _randn(num_experts, 6, 5),
        "w2": _randn(num_experts, 5, 3, dtype=BF16),
        "scale": torch.zeros(num_experts, 7, dtype=torch.uint8),
        "w13_scale": _randn(num_experts, 3, dtype=F16),
        "w2_scale": torch.zeros(num_experts, 2, 9, dtype=torch.int32),
    }


def _slot_cache(kind: str, num_experts: int, num_slots: int):
    from xinfer.offload.slot_cache import SlotCache

    host = _expert_set(kind, num_experts)
    return SlotCache(host, num_slots, torch.device("cpu")), host


def _lookup_fill(kind: str, num_experts: int, num_slots: int, tokens: int, top_k: int) -> None:
    from xinfer.offload import kernels as offload_kernels

    cache, host = _slot_cache(kind, num_experts, num_slots)
    _, ids = _routing(num_experts, top_k, True)(tokens)
    offload_kernels.lookup(cache, ids, force_triton=True)
    offload_kernels.fill(cache, host, force_triton=True)


def _reserve(num_experts: int, num_slots: int, tokens: int, top_k: int) -> None:
    from xinfer.offload import kernels as offload_kernels
    from xinfer.offload.prefetch_table import PrefetchTable, reserve

    cache, host = _slot_cache("bf16", num_experts, num_slots)
    table = PrefetchTable(cache)
    _, ids = _routing(num_experts, top_k, True)(tokens)
    reserve(table, ids, force_triton=True)
    offload_kernels.fill(table.fill_target(), host, force_triton=True)  # the prefetch fill


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
    add("prefetch-reserve-e128-s32-decode", "reserve_kernel fill_kernel", _reserve, 128, 32,
        1, 8)  # fmt: skip
    add("prefetch-reserve-e60-s24-batch", "reserve_kernel fill_kernel", _reserve, 60, 24, 16, 4)
    add("predictor-select-fp32-e128-k8-keys", "select_kernel", _select, F32, 128, 8, True)
    add("predictor-select-bf16-e60-k4", "select_kernel", _select, BF16, 60, 4, False)
    add("predictor-select-fp32-e512-k8", "select_kernel", _select, F32, 512, 8, False)
    rm = "routing_state_kernel routing_select_kernel"
    for big in (False, True):
        b = "i64" if big else "i32"
        add(f"routing-model-e128-k8-decode-{b}bases", f"{rm} predict_model_kernel",
            _routing_model, 128, 8, big, True)  # fmt: skip
    add("routing-model-e60-k4-prefill", rm, _routing_model, 60, 4, False, False)


_offload_cases()


# --- the tests -----------------------------------------------------------------------------


def _compile_case(case: Case) -> set[str]:
    with compile_only() as log:
        case.run()
    _RESULTS[case.id] = log.names
    return log.names


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_launch_compiles_for_sm90(case: Case) -> None:
    names = _compile_case(case)
    missing = case.kernels - names
    assert not missing, f"{case.id}: {sorted(missing)} not compiled (compiled: {sorted(names)})"


def _jit_kernels_of_package() -> dict[str, str]:
    """name → module of every @triton.jit function in xinfer.kernels.triton."""
    import xinfer.kernels.triton as kernel_pkg

    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(kernel_pkg.__path__):
        module = importlib.import_module(f"{kernel_pkg.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.JITFunction) and obj.fn.__module__ == module.__name__:
                assert name not in found, f"jit function {name} in {found[name]} and {info.name}"
                found[name] = module.__name__
    return found


def _launched_names() -> set[str]:
    """Names X of every `X[grid](...)` / `mod.X[grid](...)` call in src/xinfer."""
    names = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                target = node.func.value
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return names


def test_every_kernel_is_compiled() -> None:
    """Every jit kernel the package launches (helpers are compiled inside them) was compiled
    by a case above: cases not run yet in this process (a -k selection, another order) run
    here, except the expected failures."""
    jit = _jit_kernels_of_package()
    kernels = _launched_names() & set(jit)
    assert len(kernels) >= 40, f"found only {sorted(kernels)}: is the launch scan broken?"
    for case in CASES:
        if case.id not in _RESULTS and not case.marks:
            _compile_case(case)
    compiled = set().union(*_RESULTS.values())
    missing = sorted(f"{jit[name]}.{name}" for name in kernels - compiled)
    assert not missing, f"kernels no case compiled: {missing}"


_PLAIN_GLOBAL = 3  # compiled Triton refuses a jit function's read of a plain module global


@triton.jit
def _reads_plain_global(out_ptr):
    triton.language.store(out_ptr, _PLAIN_GLOBAL)


def test_compile_only_fails_like_the_gpu_and_leaves_triton_as_it_was() -> None:
    """A compile error surfaces at the launch with the kernel's name; the driver, the
    patched methods and the device caches are as before, after an error too."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    from triton_compile import DEVICE_KEY, CompileCheckError

    from xinfer.kernels.triton import activation

    def state():
        return driver._active, JITFunction.run, JITFunction._do_compile

    before = state()
    with pytest.raises(CompileCheckError, match="(?s)_reads_plain_global.*Cannot access global"):
        with compile_only():
            _reads_plain_global[(1,)](torch.empty(1))
    assert state() == before
    with pytest.raises(ZeroDivisionError), compile_only() as log:
        _silu(BF16, 768)
        assert log.names == {"silu_and_mul_kernel"}
        1 / 0  # noqa: B018
    assert state() == before
    for fn in (activation.silu_and_mul_kernel, _reads_plain_global):
        assert DEVICE_KEY not in fn.device_caches
