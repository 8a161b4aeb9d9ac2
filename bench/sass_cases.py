"""The launches `bench/sass_report.py` compiles to SASS and reports: Qwen3-30B-A3B decode
shapes (hidden 2048, expert inter 768, top-8) of every decode GEMV family (bf16, quantized
formats, GGUF block types, int8-activation GGUF), the packed-expert fill, and the router's
top-k; each with the weights a loop iteration of one program reads and the weights and bytes
the whole call reads (for the issue and HBM floors)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

HIDDEN, INTER, TOP_K = 2048, 768, 8
VOCAB = 151936  # the LM head's rows


@dataclass(frozen=True)
class Case:
    """One launch and, per kernel name, the weights a loop iteration of one program reads
    and the weights and bytes the whole call reads (for the floors)."""

    launch: Callable[[], object]
    per_iter: dict[str, int]
    call_weights: dict[str, int]
    call_bytes: dict[str, int]
    # programs the call launches, where known: the report then adds the issue time of every
    # instruction executed (the code outside the loop too, once a program), which is what
    # a kernel whose loop runs once or twice (4-bit MoE GEMVs: K in one or two steps) costs
    programs: dict[str, int] = field(default_factory=dict)
    # loops of the main loop's length in the code (gate and up one after the other: 2), so
    # that their bodies are counted by their iterations and not once more
    loop_copies: dict[str, int] = field(default_factory=dict)


STORED = 8  # experts whose (zero) weights the launches get: the kernels see only strides


def _routing(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(tokens * TOP_K, dtype=torch.int32).reshape(tokens, TOP_K) % STORED
    return ids, torch.full((tokens, TOP_K), 1.0 / TOP_K)


def _gguf_moe(btype_name: str, tokens: int = 1, words: bool | None = None) -> Case:
    """`words`: the launcher's tiles with the block type's word path on or off (None: its
    default)."""
    from xinfer.kernels import gguf_launch as gl
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    bt = BLOCK_TYPES[btype_name]
    w13 = torch.zeros(STORED, 2 * INTER, bt.row_bytes(HIDDEN), dtype=torch.uint8)
    w2 = torch.zeros(STORED, HIDDEN, bt.row_bytes(INTER), dtype=torch.uint8)
    hidden = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    ids, weights = _routing(tokens)
    t = gt.gemv_tiles(torch.bfloat16, bt, words=words)
    t2 = t.down or t
    pairs = tokens * TOP_K
    return Case(
        lambda: gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, INTER, True, t),
        {"gguf_moe_gate_up_gemv_kernel": 2 * t.block_n * t.subs * 32,
         "gguf_moe_down_gemv_kernel": t2.block_n * t2.subs * 32},
        {"gguf_moe_gate_up_gemv_kernel": pairs * 2 * INTER * HIDDEN,
         "gguf_moe_down_gemv_kernel": pairs * HIDDEN * INTER},
        {"gguf_moe_gate_up_gemv_kernel": pairs * 2 * INTER * bt.row_bytes(HIDDEN),
         "gguf_moe_down_gemv_kernel": pairs * HIDDEN * bt.row_bytes(INTER)},
    )  # fmt: skip


def _gguf_q8x_moe(btype_name: str = "Q4_K", tokens: int = 1) -> Case:
    """Q4_K or Q8_0 experts on int8 activations (`gguf_q8x_launch`): a loop iteration reads
    256 weights a row."""
    from xinfer.kernels import gguf_q8x_launch as ql
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    bt = BLOCK_TYPES[btype_name]
    w13 = torch.zeros(STORED, 2 * INTER, bt.row_bytes(HIDDEN), dtype=torch.uint8)
    w2 = torch.zeros(STORED, HIDDEN, bt.row_bytes(INTER), dtype=torch.uint8)
    hidden = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    ids, weights = _routing(tokens)
    pairs = tokens * TOP_K
    gate_up, down = "q8x_moe_gate_up_kernel", "q8x_moe_down_kernel"
    return Case(
        lambda: ql.fused_moe(hidden, ids, weights, w13, bt, w2, bt, INTER),
        {gate_up: 2 * ql.GATE_UP_BLOCK_N * 256, down: ql.DOWN_BLOCK_N * 256},
        {gate_up: pairs * 2 * INTER * HIDDEN, down: pairs * HIDDEN * INTER},
        {gate_up: pairs * 2 * INTER * bt.row_bytes(HIDDEN),
         down: pairs * HIDDEN * bt.row_bytes(INTER)},
    )  # fmt: skip


def _bf16_moe(tokens: int = 1) -> Case:
    from xinfer.kernels import moe_launch as ml

    w13 = torch.zeros(STORED, 2 * INTER, HIDDEN, dtype=torch.bfloat16)
    w2 = torch.zeros(STORED, HIDDEN, INTER, dtype=torch.bfloat16)
    hidden = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    ids, weights = _routing(tokens)
    pairs = tokens * TOP_K
    return Case(
        lambda: ml.fused_moe(hidden, ids, weights, w13, w2),
        {},  # tiles vary by path: no per-iteration figure
        {"moe_gate_up_gemv_kernel": pairs * 2 * INTER * HIDDEN, "moe_down_gemv_kernel": pairs * HIDDEN * INTER},
        {"moe_gate_up_gemv_kernel": pairs * 2 * INTER * HIDDEN * 2,
         "moe_down_gemv_kernel": pairs * HIDDEN * INTER * 2},
    )  # fmt: skip


def _quant_moe(fmt_name: str, tokens: int = 1) -> Case:
    """A quantized format's MoE GEMV (8 experts' weights; the ids pick among them)."""
    from quant_weights import random_weights

    from xinfer.kernels import quant_launch

    fmt = _quant_format(fmt_name)
    experts = STORED
    w13 = random_weights(fmt, 2 * INTER, HIDDEN, seed=0, count=experts)
    w2 = random_weights(fmt, HIDDEN, INTER, seed=1, count=experts)
    hidden = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    ids, weights = _routing(tokens)
    t = quant_launch.gemv_tiles(fmt, fmt.kernel_weights(w13, HIDDEN))
    pairs = tokens * TOP_K
    per_weight = {n: v.nbytes / (experts * 2 * INTER * HIDDEN) for n, v in w13.items()}
    nbytes = sum(per_weight.values())
    return Case(
        lambda: quant_launch.fused_moe(hidden, ids, weights, fmt, w13, w2, INTER, use_gemv=True),
        # gate and up in one loop (`joined`): an iteration reads both tiles; else two loops
        # one after the other (`_row_dot` each), an iteration of either reads one tile
        {"quant_moe_gate_up_gemv_kernel": (2 if t.joined else 1) * t.block_n * t.block_k,
         "quant_moe_down_gemv_kernel": (t.down_block_n or t.block_n) * t.block_k},
        {"quant_moe_gate_up_gemv_kernel": pairs * 2 * INTER * HIDDEN,
         "quant_moe_down_gemv_kernel": pairs * HIDDEN * INTER},
        {"quant_moe_gate_up_gemv_kernel": int(pairs * 2 * INTER * HIDDEN * nbytes),
         "quant_moe_down_gemv_kernel": int(pairs * HIDDEN * INTER * nbytes)},
        {"quant_moe_gate_up_gemv_kernel": pairs * -(-INTER // t.block_n),
         "quant_moe_down_gemv_kernel": pairs * -(-HIDDEN // (t.down_block_n or t.block_n))},
        {"quant_moe_gate_up_gemv_kernel": 1 if t.joined else 2},
    )  # fmt: skip


def _quant_moe_prefill(fmt_name: str, tokens: int = 2048) -> Case:
    """A quantized format's in-register grouped expert GEMMs at prefill size (`dequant=False`,
    the format's `moe_prefill_tiles`): a loop iteration of a program reads a BLOCK_N x
    BLOCK_K weight tile (gate and up: two) for BLOCK_M rows."""
    from quant_weights import random_weights

    from xinfer.kernels import quant_launch

    fmt = _quant_format(fmt_name)
    w13 = random_weights(fmt, 2 * INTER, HIDDEN, seed=0, count=STORED)
    w2 = random_weights(fmt, HIDDEN, INTER, seed=1, count=STORED)
    hidden = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    ids, weights = _routing(tokens)
    t = quant_launch.grouped_tiles(tokens * TOP_K, torch.bfloat16, fmt)
    # every expert's tiles once per row tile of its pairs (block_m rows share a decode)
    row_tiles = tokens * TOP_K // t.block_m
    per_weight = {n: v.nbytes / (STORED * 2 * INTER * HIDDEN) for n, v in w13.items()}
    nbytes = sum(per_weight.values())
    gate_up, down = "quant_moe_gate_up_grouped_kernel", "quant_moe_down_grouped_kernel"
    return Case(
        lambda: quant_launch.fused_moe(
            hidden, ids, weights, fmt, w13, w2, INTER, use_gemv=False, dequant=False
        ),
        {gate_up: 2 * t.block_n * t.block_k, down: t.block_n * t.block_k},
        {gate_up: row_tiles * 2 * INTER * HIDDEN, down: row_tiles * HIDDEN * INTER},
        {gate_up: int(STORED * 2 * INTER * HIDDEN * nbytes),
         down: int(STORED * HIDDEN * INTER * nbytes)},
    )  # fmt: skip


QKV_N = 5120  # the decode linears' case: Qwen3-30B-A3B's qkv projection, one row


def _quant_format(fmt_name: str):
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {"fp8-block128": Fp8Block(128, 128), "gptq-g128": GptqInt4(128, False),
            "nvfp4": Nvfp4()}[fmt_name]  # fmt: skip


def _quant_linear(fmt_name: str, n: int = QKV_N, k: int = HIDDEN, m: int = 1) -> Case:
    """A quantized format's decode linear of `m` rows (the M <= 16 tile; one row alone: the
    one-row kernel)."""
    from quant_weights import random_weights

    from xinfer.kernels import quant_launch

    fmt = _quant_format(fmt_name)
    w = random_weights(fmt, n, k, seed=0)
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    t = quant_launch.linear_tiles(m, torch.bfloat16, fmt.kernel_weights(w, k), k, fmt)
    name = {1: "quant_linear_gemv_kernel", 4: "quant_linear_rows_kernel"}.get(
        t.block_m, "quant_linear_kernel"
    )
    nbytes = sum(v.nbytes for v in w.values())
    return Case(
        lambda: quant_launch.linear(x, fmt, w, None, n, k),
        {name: t.block_n * t.block_k},
        {name: n * k},
        {name: nbytes},
    )


def _gguf_linear(
    btype_name: str, n: int = QKV_N, k: int = HIDDEN, words: bool | None = None
) -> Case:
    """`words`: the launcher's tiles with the block type's word path on or off (None: its
    default); n = VOCAB: the LM head's tile."""
    from xinfer.kernels import gguf_launch as gl
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    bt = BLOCK_TYPES[btype_name]
    w = torch.zeros(n, bt.row_bytes(k), dtype=torch.uint8)
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    t = gt.linear_tiles(1, torch.bfloat16, bt, n, words=words)
    name = {1: "gguf_linear_gemv_kernel", 4: "gguf_linear_rows_kernel"}.get(
        t.block_m, "gguf_linear_kernel"
    )
    return Case(
        lambda: gl.linear(x, w, bt, None, n, k, t),
        {name: t.block_n * t.subs * 32},
        {name: n * k},
        {name: w.nbytes},
    )


def _gguf_q8x_linear(btype_name: str = "Q4_K", n: int = QKV_N, k: int = HIDDEN) -> Case:
    """The Q4_K or Q8_0 decode linear on int8 activations, one row: a loop iteration reads
    256 weights a row of the tile."""
    from xinfer.kernels import gguf_q8x_launch as ql
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    bt = BLOCK_TYPES[btype_name]
    w = torch.zeros(n, bt.row_bytes(k), dtype=torch.uint8)
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    name = "q8x_linear_kernel"
    return Case(
        lambda: ql.linear(x, w, bt, None, n),
        {name: ql.LINEAR_BLOCK_N * 256}, {name: n * k}, {name: n * bt.row_bytes(k)},
    )  # fmt: skip


def _unpack(misses: int = 2) -> Case:
    """The packed-expert fill (`--moe-offload-compress`) of a Qwen3-30B-A3B expert's w13 and
    w2: a loop iteration unpacks PACK_BLOCK elements; the call moves `misses` experts. Its
    bytes are host bytes (a PCIe floor, not HBM's: read the issue floor only)."""
    from xinfer.offload.packed import PACK_BLOCK, pack_experts, unpack_fill

    shapes = [(2 * INTER, HIDDEN), (HIDDEN, INTER)]
    packed = [pack_experts(torch.randn(misses, *s).mul(0.02).to(torch.bfloat16)) for s in shapes]
    dst = [torch.zeros(misses, *s, dtype=torch.bfloat16) for s in shapes]
    ids = torch.arange(misses, dtype=torch.int32)
    count = torch.tensor([misses], dtype=torch.int32)
    name = "unpack_fill_kernel"
    elements = misses * sum(math.prod(s) for s in shapes)
    return Case(
        lambda: unpack_fill(packed, dst, ids, ids, count, 264, mapped=False),
        {name: PACK_BLOCK}, {name: elements}, {name: sum(p.nbytes for p in packed)},
    )  # fmt: skip


def _routing_case(fused: bool, experts: int = 128, k: int = HIDDEN) -> Case:
    """The router's top-k (`route_topk`) or the router GEMV with its top-k in one launch
    (`router_topk`), one token: no loop to count, the totals and registers are the report."""
    from xinfer.kernels import moe_launch, router_launch

    x = torch.zeros(1, k, dtype=torch.bfloat16)
    w = torch.zeros(experts, k, dtype=torch.bfloat16)
    logits = torch.zeros(1, experts, dtype=torch.bfloat16)
    if fused:
        return Case(lambda: router_launch.router_topk(x, w, TOP_K, True), {}, {}, {})
    return Case(lambda: moe_launch.route_topk(logits, TOP_K, True), {}, {}, {})


def _decode_attention(cache: str, ctx: int = 8192, batch: int = 1) -> Case:
    """Decode attention on the Qwen3-30B-A3B attention shape (32 q / 4 KV heads, head_dim
    128, block 16) at `ctx` keys: a dense bf16 cache or a turbo3/turbo4 one. A loop
    iteration reads BLOCK_N keys' K and V rows (the "weights": 2 x BLOCK_N x 128)."""
    from unittest import mock

    from xinfer.kernels import attn_launch as al
    from xinfer.kv import turbo
    from xinfer.kv.format import TurboQuant

    hq, hk, d, block = 32, 4, 128, 16
    blocks = batch * math.ceil(ctx / block)
    q = torch.zeros(batch, hq, d, dtype=torch.bfloat16)
    tables = torch.arange(blocks, dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    if cache == "bf16":
        k = torch.zeros(blocks, block, hk, d, dtype=torch.bfloat16)
        kv, extra = (k, k), {}
    else:
        tc = turbo.allocate(TurboQuant(int(cache[-1])), blocks, block, hk, d, torch.bfloat16,
                            torch.device("cpu"))  # fmt: skip
        kv, extra = (tc.k_codes, tc.v_codes), {"turbo": tc}

    def launch():
        with mock.patch.object(al, "SMALL_INTERPRETER_TILES", False):
            al.paged_attention(q, *kv, tables, lens, qsl, d**-0.5, max_query_len=1,
                               max_seq_len=ctx, **extra)  # fmt: skip

    with mock.patch.object(al, "SMALL_INTERPRETER_TILES", False):
        block_n = al.decode_config(q, d, ctx)["BLOCK_N"]
    keys = batch * ctx * hk
    row_bytes = 2 * d if cache == "bf16" else int(cache[-1]) * d // 8 + 2
    return Case(launch, {"decode_kernel": 2 * block_n * d}, {"decode_kernel": 2 * keys * d},
                {"decode_kernel": 2 * keys * row_bytes})  # fmt: skip


CASES: dict[str, Callable[[], Case]] = {
    "attn-decode-bf16": lambda: _decode_attention("bf16"),
    "attn-decode-turbo4": lambda: _decode_attention("turbo4"),
    "attn-decode-turbo3": lambda: _decode_attention("turbo3"),
    "route_topk": lambda: _routing_case(False),
    "route_topk-e256": lambda: _routing_case(False, experts=256),
    "router_topk": lambda: _routing_case(True),
    "linear-fp8": lambda: _quant_linear("fp8-block128"),
    "linear-gptq": lambda: _quant_linear("gptq-g128"),
    "linear-nvfp4": lambda: _quant_linear("nvfp4"),
    "linear-fp8-m8": lambda: _quant_linear("fp8-block128", m=8),
    "linear-gptq-m8": lambda: _quant_linear("gptq-g128", m=8),
    "linear-nvfp4-m8": lambda: _quant_linear("nvfp4", m=8),
    "linear-gguf-q4_k": lambda: _gguf_linear("Q4_K"),
    "linear-gguf-q8_0": lambda: _gguf_linear("Q8_0"),
    "linear-gguf-q6_k-words": lambda: _gguf_linear("Q6_K", words=True),
    "linear-gguf-q6_k-bytes": lambda: _gguf_linear("Q6_K", words=False),
    "head-gguf-q6_k-words": lambda: _gguf_linear("Q6_K", n=VOCAB, words=True),
    "head-gguf-q6_k-bytes": lambda: _gguf_linear("Q6_K", n=VOCAB, words=False),
    "head-gguf-q4_k-words": lambda: _gguf_linear("Q4_K", n=VOCAB, words=True),
    "linear-gguf-q8_0-words": lambda: _gguf_linear("Q8_0", words=True),
    "linear-gguf-q8_0-bytes": lambda: _gguf_linear("Q8_0", words=False),
    "head-gguf-q8_0-words": lambda: _gguf_linear("Q8_0", n=VOCAB, words=True),
    "head-gguf-q8_0-bytes": lambda: _gguf_linear("Q8_0", n=VOCAB, words=False),
    "linear-gguf-q4_k-q8x": _gguf_q8x_linear,
    "linear-gguf-q8_0-q8x": lambda: _gguf_q8x_linear("Q8_0"),
    "linear-gguf-q6_k-q8x": lambda: _gguf_q8x_linear("Q6_K"),
    "fp8": lambda: _quant_moe("fp8-block128"),
    "gptq": lambda: _quant_moe("gptq-g128"),
    "nvfp4": lambda: _quant_moe("nvfp4"),
    "gguf-q4_k": lambda: _gguf_moe("Q4_K"),
    "gguf-q4_k-q8x": _gguf_q8x_moe,
    "gguf-q8_0-q8x": lambda: _gguf_q8x_moe("Q8_0"),
    "gguf-q6_k-q8x": lambda: _gguf_q8x_moe("Q6_K"),
    "gguf-q8_0": lambda: _gguf_moe("Q8_0"),
    "gguf-q6_k": lambda: _gguf_moe("Q6_K"),
    "gguf-q6_k-words": lambda: _gguf_moe("Q6_K", words=True),
    "gguf-q6_k-bytes": lambda: _gguf_moe("Q6_K", words=False),
    "gguf-q8_0-words": lambda: _gguf_moe("Q8_0", words=True),
    "gguf-q8_0-bytes": lambda: _gguf_moe("Q8_0", words=False),
    "gguf-q5_0": lambda: _gguf_moe("Q5_0"),
    "gguf-q4_0": lambda: _gguf_moe("Q4_0"),
    "bf16": _bf16_moe,
    "fp8-prefill": lambda: _quant_moe_prefill("fp8-block128"),
    "gptq-prefill": lambda: _quant_moe_prefill("gptq-g128"),
    "nvfp4-prefill": lambda: _quant_moe_prefill("nvfp4"),
    "unpack": _unpack,
}
