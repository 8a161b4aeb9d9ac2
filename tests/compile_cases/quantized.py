"""Compile cases: the quantized formats (quant_launch, quant_prefill) and the GGUF block types."""

from __future__ import annotations

import dataclasses
import functools
from unittest import mock

import torch

from compile_cases.base import BF16, F16, F32, MOE_GROUPED, _randn, _routing, add, reduced_apart

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
        # act-order: x gathered into the weight's perm order first, w13 per expert
        "gptq-g128-asym-actorder": GptqInt4(group_size=128, has_zero=True, act_order=True),
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


def _quant_linear(
    name: str, dtype, m: int, dequant=None, bias: bool = True, dot: bool = False,
    ragged: bool = False, rows: int = 0, pruned: bool = False,
) -> None:  # fmt: skip
    """`pruned`: a call of one row on the four-row kernel with rows 1-3 compiled out
    (`quant_launch.ONE_ROW_PRUNED`)."""
    from xinfer.kernels import quant_launch

    n, k = 256, _quant_k(name)
    if ragged:  # tiles past K (and N where the format allows: GPTQ packs rows by 8)
        n, k = (104, 1152) if name.startswith("gptq") else (100, 1040)
    fmt, tensors = _formats()[name], _quant_weights(name, n, k)
    b = _randn(n, dtype=dtype) if bias else None
    tiles = quant_launch.QuantTiles(block_m=16, block_n=32, block_k=128) if dot else None
    if rows:
        tiles = quant_launch.QuantTiles(block_m=rows, block_n=8, block_k=512, num_warps=8)
    saved, quant_launch.ONE_ROW_PRUNED = quant_launch.ONE_ROW_PRUNED, pruned
    try:
        quant_launch.linear(
            _randn(m, k, dtype=dtype), fmt, tensors, b, n, k, dequant=dequant, tiles=tiles
        )
    finally:
        quant_launch.ONE_ROW_PRUNED = saved


def _quant_moe(name: str, dtype, tokens: int, use_gemv: bool, dequant=None,
               factored: bool | None = None, num_experts: int = 8,
               joined: bool = False) -> None:  # fmt: skip
    from xinfer.kernels import quant_launch

    hidden_dim, inter, top_k = _quant_k(name) // 2, 384 if "96" in name else 256, 8
    fmt = _formats()[name]
    w13 = _quant_weights(name, 2 * inter, hidden_dim, num_experts)
    # (act-order: the format folds w2's perm into w13's rows and drops it before the kernels)
    w2 = {
        n: t for n, t in _quant_weights(name, hidden_dim, inter, num_experts).items() if n != "perm"
    }
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    tiles = None
    if factored is not None or joined:
        tiles = dataclasses.replace(
            quant_launch.gemv_tiles(fmt, fmt.kernel_weights(w13, hidden_dim)),
            factored=factored,
            joined=joined,
        )
    hidden = _randn(tokens, hidden_dim, dtype=dtype)
    quant_launch.fused_moe(hidden, ids, weights, fmt, w13, w2, inter, use_gemv=use_gemv,
                           tiles=tiles, dequant=dequant)  # fmt: skip


Q_LINEAR = "quant_linear_kernel"
Q_SPLIT = "quant_linear_rows_kernel"  # decode tiles split K; the last split reduces
Q_SPLIT_ONE = "quant_linear_gemv_kernel"  # one row a program (the byte-read formats)
Q_DEQUANT = "dequant_kernel"
Q_GEMV = "quant_moe_gate_up_gemv_kernel quant_moe_down_gemv_kernel"  # combine fused
Q_GROUPED = (
    "moe_align_kernel quant_moe_gate_up_grouped_kernel quant_moe_down_grouped_kernel "
    "moe_combine_kernel"
)
Q_PREFILL_MOE = f"dequant_kernel {MOE_GROUPED}"


def _quant_cases() -> None:
    for name in _formats():
        odd = "96" in name  # the gather variants: decode and in-register prefill tiles only
        split = Q_SPLIT_ONE if odd and "gptq" in name else Q_SPLIT  # 4-bit bytes: one row
        # one row alone: the one-row kernel where the format's `decode_one_row_alone` says
        # its bits equal the four-row kernel's (FP8), else the four-row kernel
        alone = Q_SPLIT_ONE if _formats()[name].decode_one_row_alone else split
        add(f"quant-{name}-linear-bf16-m1", alone, _quant_linear, name, BF16, 1)
        if alone == Q_SPLIT:  # one row on the four-row kernel, rows 1-3 compiled out
            add(f"quant-{name}-linear-bf16-m1-pruned", Q_SPLIT, _quant_linear, name, BF16, 1,
                pruned=True)  # fmt: skip
        add(f"quant-{name}-linear-fp16-m16-nobias", split, _quant_linear, name, F16, 16,
            bias=False)  # fmt: skip
        if name in ("fp8-block128", "nvfp4"):  # the 16-row dot tile at decode (selectable)
            add(f"quant-{name}-linear-bf16-m4-dot", Q_LINEAR, _quant_linear, name, BF16, 4,
                dot=True)  # fmt: skip
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
        # the dequantized route (NVFP4's default from PREFILL_MIN_PAIRS; FP8 and INT4 take
        # it only when asked: `dequant_experts_in_prefill`)
        add(f"quant-{name}-moe-bf16-prefill", Q_PREFILL_MOE, _quant_moe, name, BF16, 130,
            False, dequant=True)  # fmt: skip
        add(f"quant-{name}-moe-fp16-grouped-large", Q_GROUPED, _quant_moe, name, F16, 130,
            False, dequant=False)  # fmt: skip
        add(f"quant-{name}-moe-fp16-gemv", Q_GEMV, _quant_moe, name, F16, 3, True)
        add(f"quant-{name}-moe-fp32-grouped-registers", Q_GROUPED, _quant_moe, name, F32, 40,
            False, dequant=False)  # fmt: skip

    for name in ("fp8-block128", "nvfp4", "gptq-g128-sym", "gptq-g128-asym-actorder"):  # EVEN false
        add(f"quant-{name}-linear-bf16-m2-ragged", Q_SPLIT, _quant_linear, name, BF16, 2,
            ragged=True)  # fmt: skip
        add(f"quant-{name}-linear-bf16-m2-one-row", Q_SPLIT_ONE, _quant_linear, name, BF16, 2,
            rows=1)  # fmt: skip
    # act-order linears and prefill expert GEMMs gather x into the codes' order first
    act = "gptq-g128-asym-actorder"
    add(f"quant-{act}-linear-bf16-m4-permuted", "permute_columns_kernel", _quant_linear, act,
        BF16, 4)  # fmt: skip
    add(f"quant-{act}-moe-bf16-grouped-permuted", "permute_pair_rows_kernel", _quant_moe, act,
        BF16, 40, False, dequant=False)  # fmt: skip
    for name in ("fp8-block128", "nvfp4", "gptq-g128-asym"):  # gate and up in one loop
        add(f"quant-{name}-moe-bf16-gemv-joined", Q_GEMV, _quant_moe, name, BF16, 2, True,
            joined=True)  # fmt: skip
        add(f"quant-{name}-moe-bf16-gemv-joined-unfactored", Q_GEMV, _quant_moe, name, BF16, 1,
            True, factored=False, joined=True)  # fmt: skip


_quant_cases()


# --- GGUF blocks (gguf_launch) ----------------------------------------------------------

GGUF_TYPES = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def _gguf_rows(name: str, rows: int, k: int, experts: int | None = None) -> torch.Tensor:
    """Block rows of the right shape (the bytes do not matter: nothing runs)."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    shape = (rows, BLOCK_TYPES[name].row_bytes(k))
    return torch.zeros((experts, *shape) if experts else shape, dtype=torch.uint8)


def _gguf_linear(
    name: str, dtype, m: int, bias: bool = True, dequant=None, n: int = 96, dot: bool = False,
    rows: int = 0, words: bool | None = None,
) -> None:  # fmt: skip
    """`words`: the launcher's tiles with the Q4_K / Q6_K / Q8_0 word path on or off (None:
    its default)."""
    from xinfer.kernels import gguf_launch, gguf_tiles
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    k = 1024
    b = _randn(n, dtype=dtype) if bias else None
    w = _gguf_rows(name, n, k)
    tiles = gguf_tiles.GGUFTiles(16, 16, 8, num_warps=4) if dot else None
    if rows:
        tiles = gguf_tiles.GGUFTiles(rows, 8, 8, num_warps=4)
    if words is not None:
        tiles = gguf_tiles.linear_tiles(m, dtype, BLOCK_TYPES[name], n, words=words)
    gguf_launch.linear(
        _randn(m, k, dtype=dtype), w, BLOCK_TYPES[name], b, n, k, tiles, dequant=dequant
    )


def _gguf_moe(t13: str, t2: str, dtype, tokens: int, use_gemv: bool, dequant=None) -> None:
    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    num_experts, top_k, hidden_dim, inter = 8, 8, 512, 256
    w13 = _gguf_rows(t13, 2 * inter, hidden_dim, num_experts)
    w2 = _gguf_rows(t2, hidden_dim, inter, num_experts)
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    gguf_launch.fused_moe(_randn(tokens, hidden_dim, dtype=dtype), ids, weights,
                          w13, BLOCK_TYPES[t13], w2, BLOCK_TYPES[t2], inter, use_gemv,
                          dequant=dequant)  # fmt: skip


def _words_on(switch: str):
    """A wrapper running its `fn` with the word path `switch` of `gguf_tiles` on (Q6K_WORDS,
    Q80_WORDS), so that the word builds are compiled here whatever the defaults."""

    def wrap(fn):
        def run(*args, **kwargs) -> None:
            from xinfer.kernels import gguf_tiles

            with mock.patch.object(gguf_tiles, switch, True):
                fn(*args, **kwargs)

        return run

    return wrap


_q6k_words_on, _q80_words_on = _words_on("Q6K_WORDS"), _words_on("Q80_WORDS")


def _gguf_segments_linear(types: str, dtype, m: int, bias: bool = True, dequant=None) -> None:
    """A linear of two segments (`gguf_segments_launch`), 64 | 32 rows of K = 1024 (four
    super-blocks: K split in two at one row tile of six), `types` e.g. "Q4_K|Q6_K"."""
    from xinfer.kernels import gguf_segments_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    k, names, rows = 1024, types.split("|"), [64, 32]
    ws = [_gguf_rows(name, r, k) for name, r in zip(names, rows)]
    b = _randn(sum(rows), dtype=dtype) if bias else None
    btypes = [BLOCK_TYPES[name] for name in names]
    gguf_segments_launch.linear(_randn(m, k, dtype=dtype), ws, btypes, rows, b, k, dequant)


G_GEMV = "gguf_moe_gate_up_gemv_kernel gguf_moe_down_gemv_kernel"  # combine fused
G_GROUPED = (
    "moe_align_kernel gguf_moe_gate_up_grouped_kernel gguf_moe_down_grouped_kernel "
    "moe_combine_kernel"
)


G_DEQUANT = "gguf_dequant_kernel"
G_PREFILL_MOE = f"gguf_dequant_kernel {MOE_GROUPED}"


def _gguf_cases() -> None:
    g = "gguf_linear_kernel"
    split = "gguf_linear_rows_kernel"  # K = 1024: 2 splits of 512, the last one reduces
    for name in GGUF_TYPES:
        add(f"gguf-{name}-linear-bf16-m1", split, _gguf_linear, name, BF16, 1)
        if name in ("Q8_0", "Q4_K"):  # the 16-row dot tile at decode (selectable)
            add(f"gguf-{name}-linear-bf16-m4-dot", g, _gguf_linear, name, BF16, 4, dot=True)
        add(f"gguf-{name}-linear-bf16-m127", g, _gguf_linear, name, BF16, 127)
        add(f"gguf-{name}-linear-bf16-m128-prefill", G_DEQUANT, _gguf_linear, name, BF16, 128)
        add(f"gguf-{name}-moe-bf16-gemv", G_GEMV, _gguf_moe, name, name, BF16, 1, True)
        add(f"gguf-{name}-moe-bf16-grouped", G_GROUPED, _gguf_moe, name, name, BF16, 40, False)
        add(f"gguf-{name}-moe-bf16-prefill", G_PREFILL_MOE, _gguf_moe, name, name, BF16, 130,
            False, dequant=True)  # fmt: skip
    add("gguf-Q4_K-linear-fp16-m16-nobias", split, _gguf_linear, "Q4_K", F16, 16, bias=False)
    add("gguf-Q4_K-linear-bf16-m3-one-row", "gguf_linear_gemv_kernel", _gguf_linear, "Q4_K",
        BF16, 3, rows=1)  # fmt: skip
    add("gguf-Q4_K-linear-bf16-m1-reduce-apart", f"{split} gemv_split_reduce_kernel",
        reduced_apart(_gguf_linear), "Q4_K", BF16, 1)  # fmt: skip
    add("gguf-Q6_K-linear-fp32-m64", g, _gguf_linear, "Q6_K", F32, 64)
    # the LM head (N >= HEAD_ROWS): the word tile (four rows, one warp), or with the word
    # path off the swept one-warp dot tile
    add("gguf-Q4_K-linear-bf16-m1-head", split, _gguf_linear, "Q4_K", BF16, 1, n=65536)
    add("gguf-Q4_K-linear-bf16-m1-head-bytes", g, _gguf_linear, "Q4_K", BF16, 1, n=65536,
        words=False)  # fmt: skip
    add("gguf-Q4_K-linear-fp16-m128-prefill", G_DEQUANT, _gguf_linear, "Q4_K", F16, 128)
    # the Q6_K word path (Q6K_WORDS): the head's one-warp tile, the linears' (fp32 and 16-bit
    # activations), and with the word path off the byte tiles; the MoE GEMVs' word builds are
    # gguf-Q6_K-moe-bf16-gemv and (Q6_K down alone) gguf-Q4_K+Q6_K-moe-fp16-gemv
    add("gguf-Q6_K-linear-bf16-m1-head", split, _q6k_words_on(_gguf_linear), "Q6_K", BF16, 1,
        n=65536)  # fmt: skip
    add("gguf-Q6_K-linear-bf16-m1-head-bytes", split, _gguf_linear, "Q6_K", BF16, 1, n=65536,
        words=False)  # fmt: skip
    add("gguf-Q6_K-linear-fp32-m2-words", split, _gguf_linear, "Q6_K", F32, 2, words=True)
    add("gguf-Q6_K-linear-fp16-m3-bytes", split, _gguf_linear, "Q6_K", F16, 3, words=False)
    add("gguf-Q6_K-moe-fp32-gemv", G_GEMV, _q6k_words_on(_gguf_moe), "Q6_K", "Q6_K", F32, 1, True)
    add("gguf-Q4_K+Q6_K-moe-fp16-gemv", G_GEMV, _q6k_words_on(_gguf_moe), "Q4_K", "Q6_K", F16, 2,
        True)  # fmt: skip
    add("gguf-Q4_K+Q6_K-moe-bf16-grouped-large", G_GROUPED, _gguf_moe, "Q4_K", "Q6_K", BF16,
        130, False, dequant=False)  # fmt: skip
    add("gguf-Q4_K+Q6_K-moe-fp16-prefill", G_PREFILL_MOE, _gguf_moe, "Q4_K", "Q6_K", F16, 130,
        False, dequant=True)  # fmt: skip
    # the Q8_0 word path (Q80_WORDS, off by default: these cases switch it on): the head's
    # one-warp tile, the linears' (bf16 / fp16 / fp32 activations), the MoE GEMVs'
    add("gguf-Q8_0-linear-bf16-m1-head-words", split, _q80_words_on(_gguf_linear), "Q8_0",
        BF16, 1, n=65536)  # fmt: skip
    add("gguf-Q8_0-linear-bf16-m1-words", split, _q80_words_on(_gguf_linear), "Q8_0", BF16, 1)
    add("gguf-Q8_0-linear-fp32-m2-words", split, _gguf_linear, "Q8_0", F32, 2, words=True)
    add("gguf-Q8_0-linear-fp16-m3-words", split, _gguf_linear, "Q8_0", F16, 3, words=True)
    for dtype, dname in ((BF16, "bf16"), (F16, "fp16"), (F32, "fp32")):
        add(f"gguf-Q8_0-moe-{dname}-gemv-words", G_GEMV, _q80_words_on(_gguf_moe), "Q8_0",
            "Q8_0", dtype, 1, True)  # fmt: skip
    add("gguf-Q8_0-moe-bf16-grouped-large", G_GROUPED, _gguf_moe, "Q8_0", "Q8_0", BF16, 130, False,
        dequant=False)  # fmt: skip
    add("gguf-Q8_0-moe-fp32-grouped", G_GROUPED, _gguf_moe, "Q8_0", "Q8_0", F32, 40, False)
    for dtype, name in ((BF16, "bf16"), (F32, "fp32")):  # dp4a, mul.rn as inline PTX
        add(f"gguf-Q4_K-moe-{name}-q8x", G_Q8X, _gguf_q8x_moe, "Q4_K", "Q4_K", dtype, 3)
    add("gguf-Q8_0+Q4_K-moe-bf16-q8x", G_Q8X, _gguf_q8x_moe, "Q8_0", "Q4_K", BF16, 1)
    add("gguf-Q4_K+Q8_0-moe-fp16-q8x", G_Q8X, _gguf_q8x_moe, "Q4_K", "Q8_0", F16, 2)
    add("gguf-Q4_K+Q6_K-moe-bf16-q8x", G_Q8X, _gguf_q8x_moe, "Q4_K", "Q6_K", BF16, 1)
    # a Q4_K_M qkv kept as segments (Q4_K q|k, Q6_K v): the one decode launch in each
    # activation dtype, its split-K partials added apart, the other order, Q8_0 words;
    # prefill-sized calls dequantize into one weight
    seg = "gguf_linear_segments_kernel"
    add("gguf-segments-Q4_K|Q6_K-bf16-m1", seg, _gguf_segments_linear, "Q4_K|Q6_K", BF16, 1)
    add("gguf-segments-Q4_K|Q6_K-fp32-m2", seg, _gguf_segments_linear, "Q4_K|Q6_K", F32, 2)
    add("gguf-segments-Q6_K|Q4_K-fp16-m16-nobias", seg, _gguf_segments_linear, "Q6_K|Q4_K", F16,
        16, bias=False)  # fmt: skip
    add("gguf-segments-Q4_K|Q6_K-bf16-m1-reduce-apart", f"{seg} gemv_split_reduce_kernel",
        reduced_apart(_gguf_segments_linear), "Q4_K|Q6_K", BF16, 1)  # fmt: skip
    add("gguf-segments-Q4_K|Q8_0-bf16-m3-words", seg, _q80_words_on(_gguf_segments_linear),
        "Q4_K|Q8_0", BF16, 3)  # fmt: skip
    add("gguf-segments-Q4_K|Q6_K-bf16-m128-prefill", G_DEQUANT, _gguf_segments_linear,
        "Q4_K|Q6_K", BF16, 128)  # fmt: skip
    for name in ("Q4_K", "Q8_0", "Q6_K"):
        add(f"gguf-{name}-linear-bf16-m3-q8x", "q8x_linear_kernel", _gguf_q8x_linear, name, BF16,
            3)  # fmt: skip
    # a Q8_0 row ending inside a step of 256
    add("gguf-Q8_0-linear-bf16-m2-q8x-k352", "q8x_linear_kernel", _gguf_q8x_linear, "Q8_0", BF16,
        2, k=352)  # fmt: skip
    add("gguf-Q4_K-linear-fp16-m16-q8x-reduce-apart",
        "q8x_linear_kernel gemv_split_reduce_kernel", reduced_apart(_gguf_q8x_linear), "Q4_K",
        F16, 16)  # fmt: skip


G_Q8X = "q8x_moe_gate_up_kernel q8x_moe_down_kernel"


def _gguf_q8x_linear(name: str, dtype, m: int, k: int = 1024) -> None:
    from xinfer.kernels import gguf_q8x_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    n = 96  # K = 1024: 4 steps of 256, split in two
    x, b = _randn(m, k, dtype=dtype), _randn(n, dtype=dtype)
    gguf_q8x_launch.linear(x, _gguf_rows(name, n, k), BLOCK_TYPES[name], b, n)


def _gguf_q8x_moe(t13: str, t2: str, dtype, tokens: int) -> None:
    from xinfer.kernels import gguf_q8x_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    num_experts, top_k, hidden_dim, inter = 8, 8, 512, 256
    w13 = _gguf_rows(t13, 2 * inter, hidden_dim, num_experts)
    w2 = _gguf_rows(t2, hidden_dim, inter, num_experts)
    weights, ids = _routing(num_experts, top_k, True)(tokens)
    gguf_q8x_launch.fused_moe(_randn(tokens, hidden_dim, dtype=dtype), ids, weights, w13,
                              BLOCK_TYPES[t13], w2, BLOCK_TYPES[t2], inter)  # fmt: skip


_gguf_cases()
