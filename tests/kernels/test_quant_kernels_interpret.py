"""The quantized-format kernels (`kernels/quant_launch.py`) run by Triton's CPU interpreter
against each format's pure-torch twin: linears on the decode and prefill tiles, routed
experts on the GEMV and grouped paths (the prefill sizes both through `quant_prefill` and
through the in-register GEMMs), on fresh random weights whose sizes are not tile or block
multiples; and an expert's bits do not depend on which slot holds it.

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from quant_weights import random_weights

from xinfer.kernels import gemv_launch

triton = pytest.importorskip("triton")
tl = triton.language
from xinfer.kernels.triton.quant_dequant import _e2m1_scaled, _int4_minus  # noqa: E402

test_interpreter_child = interpreter_child_test(__file__)


def _formats():
    from xinfer.quant.awq import AwqInt4
    from xinfer.quant.compressed_tensors import PackQuantizedInt4
    from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {
        "fp8-16x32": Fp8Block(16, 32),
        "fp8-per-channel": Fp8Scaled(),
        "gptq-g32-sym": GptqInt4(group_size=32, has_zero=False),
        "awq-g64-asym": AwqInt4(group_size=64, has_zero=True),
        "ct-g32-asym-bf16": PackQuantizedInt4(32, True, torch.bfloat16),
        "nvfp4": Nvfp4(),
    }


FORMATS = [
    "fp8-16x32",
    "fp8-per-channel",
    "gptq-g32-sym",
    "awq-g64-asym",
    "ct-g32-asym-bf16",
    "nvfp4",
]
# (N, K): N off every tile; K a multiple of the group (int4, nvfp4), off the fp8 blocks
# (GPTQ and AWQ pack along N: their checkpoints have N % 8 == 0)
SHAPES = {"fp8-16x32": (37, 80), "nvfp4": (37, 96), "gptq-g32-sym": (40, 96)}
DEFAULT_SHAPE = (37, 128)
SHAPES["awq-g64-asym"] = (40, 128)


@pytest.fixture(scope="module")
def ql():
    from xinfer.kernels import quant_launch
    from xinfer.kernels.triton import quant_gemm

    require_interpreted(quant_gemm.quant_linear_kernel)
    return quant_launch


def _weights(fmt, n, k, seed, count=None):
    return random_weights(fmt, n, k, seed, count)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-3, atol=3e-3)


@child_only
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,dequant", [(1, None), (5, None), (21, None), (21, False)])
def test_linear_matches_twin(ql, name, dtype, m, dequant):
    fmt = _formats()[name]
    n, k = SHAPES.get(name, DEFAULT_SHAPE)
    tensors = _weights(fmt, n, k, seed=m)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    out = ql.linear(x, fmt, tensors, bias, n, k, dequant=dequant)
    ref = fmt.reference_linear(x, tensors, bias, n, k)
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out.float(), ref.float(), **_tol(dtype))


@child_only
@pytest.mark.parametrize(
    "name,rows",
    [(f, r) for f in ("fp8-16x32", "gptq-g32-sym", "nvfp4") for r in (4, 1)] + [("nvfp4", 16)],
)
def test_split_k_decode_linear_matches_twin_and_the_batch(ql, name, rows, monkeypatch):
    """K long enough that the decode tiles split it (partials added in split order, bias
    after), in the GEMV form with four rows a program (the default) or one, and the 16-row
    dot tile: equal to the twin, and a row's bits the same alone, in a batch of 3 (one
    program, rows past M skipped) and of 16."""
    fmt, n, k = _formats()[name], 24, 2048
    tensors = _weights(fmt, n, k, seed=7)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(16, k, generator=g)
    bias = torch.randn(n, generator=g)
    kw = fmt.kernel_weights(tensors, k)
    tiles = ql.linear_tiles(2, x.dtype, kw, k, fmt)  # the format's own (`decode_linear_tiles`)
    assert tiles.block_m == 4  # the default decode tile of these formats and shapes
    alone = ql.linear_tiles(1, x.dtype, kw, k, fmt)  # the one-row kernel where the format
    assert alone.block_m == (1 if fmt.decode_one_row_alone else 4)  # asks for it (FP8)
    assert dataclasses.replace(alone, block_m=4) == tiles  # ... on the same tile
    if rows == 1:
        tiles = dataclasses.replace(tiles, block_m=1)
    elif rows == 16:
        tiles = ql.QuantTiles(block_m=16, block_n=32, block_k=tiles.block_k // 2)
    n_tiles = -(-n // tiles.block_n)
    assert gemv_launch.decode_split(1, n_tiles, k, tiles.block_k)[1] >= 2  # K is split
    out = ql.linear(x, fmt, tensors, bias, n, k, tiles=tiles)
    torch.testing.assert_close(out, fmt.reference_linear(x, tensors, bias, n, k), **_tol(x.dtype))
    if rows == 16:  # (numpy's matmul, the interpreter's tl.dot, keeps a row's bits only
        # where the row sits alike in its micro-tile: row 3 alone and in 16 rows)
        assert torch.equal(ql.linear(x[3:4], fmt, tensors, bias, n, k, tiles=tiles), out[3:4])
        return
    assert torch.equal(ql.linear(x[5:6], fmt, tensors, bias, n, k, tiles=tiles), out[5:6])
    assert torch.equal(ql.linear(x[4:7], fmt, tensors, bias, n, k, tiles=tiles), out[4:7])
    # a row alone by default (the one-row kernel where the format asks for it) has its bits
    assert torch.equal(ql.linear(x[5:6], fmt, tensors, bias, n, k), out[5:6])
    if tiles.block_m == 4:  # ... and on the four-row kernel with rows 1-3 compiled out
        monkeypatch.setattr(ql, "ONE_ROW_PRUNED", True)
        assert torch.equal(ql.linear(x[5:6], fmt, tensors, bias, n, k, tiles=tiles), out[5:6])


# MoE paths: the decode GEMV at its default tiles (each group's sum scaled once), the GEMV
# rounding every weight as the twin does (`factored=False`, one format of each arithmetic:
# FP8, int4 with zeros, NVFP4), the dequantized grouped path, the in-register grouped GEMM
MOE_PATHS = {
    "gemv": (True, None, None),
    "gemv-per-weight": (True, None, False),
    "grouped": (False, None, None),
    "grouped-in-registers": (False, False, None),
}
PER_WEIGHT_FORMATS = ("fp8-16x32", "awq-g64-asym", "nvfp4")
MOE_CASES = [pytest.param(name, *MOE_PATHS[path], id=f"{path}-{name}")
             for path in MOE_PATHS for name in FORMATS
             if path != "gemv-per-weight" or name in PER_WEIGHT_FORMATS]  # fmt: skip


@child_only
@pytest.mark.parametrize("name,use_gemv,dequant,factored", MOE_CASES)
def test_fused_moe_matches_twin(ql, monkeypatch, name, use_gemv, dequant, factored):
    from xinfer.kernels import moe_align, reference

    fmt = _formats()[name]
    num_experts, top_k, tokens = 5, 2, 3
    _, k = SHAPES.get(name, DEFAULT_SHAPE)
    hidden_dim, inter = k, 32 if name != "awq-g64-asym" else 64
    w13 = _weights(fmt, 2 * inter, hidden_dim, seed=1, count=num_experts)
    w2 = _weights(fmt, hidden_dim, inter, seed=2, count=num_experts)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(tokens, hidden_dim, generator=g)
    weights, ids = reference.route_topk(torch.randn(tokens, num_experts, generator=g), top_k, True)
    tiles = ql.QuantTiles(block_m=16, block_n=16, block_k=32)
    if use_gemv:  # the default decode tiles; or other tiles rounding every weight
        per_weight = ql.QuantTiles(1, 8, 64, down_block_n=16, factored=False)
        tiles = None if factored is None else per_weight
    run = dict(use_gemv=use_gemv, tiles=tiles, dequant=dequant)
    out = ql.fused_moe(hidden, ids, weights, fmt, w13, w2, inter, **run)
    ref = fmt.reference_moe(hidden, ids, weights, w13, w2, inter)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

    # the same experts at permuted slot ids of a larger [S, ...] set: identical bits; on a
    # view of many more rows with the expert count as `max_ids` (handed to the grouped
    # path's align, which numbers the used rows first), too. The GEMV paths take no align
    # and read each pair's expert alike whatever the arithmetic: one view, and not again
    # for the per-weight variant (the interpreter's slowest cases)
    if factored is False:  # gate and up in one loop: the same sums, the same bits
        run["tiles"] = dataclasses.replace(per_weight, joined=True)
        assert torch.equal(ql.fused_moe(hidden, ids, weights, fmt, w13, w2, inter, **run), out)
        return
    seen, align = [], moe_align.align_pairs
    monkeypatch.setattr(moe_align, "align_pairs", lambda *a, **k: seen.append(k) or align(*a, **k))
    views = ((8, None),) if use_gemv else ((8, None), (40, num_experts))
    for slots, max_ids in views:
        perm = torch.randperm(slots, generator=g)[:num_experts]

        def to_slots(t, slots=slots, perm=perm):  # noqa: E306
            s = torch.zeros((slots, *t.shape[1:]), dtype=t.dtype)
            s[perm] = t
            return s

        s13 = {n: to_slots(t) for n, t in w13.items()}
        s2 = {n: to_slots(t) for n, t in w2.items()}
        slot_ids = perm[ids.long()].to(torch.int32)
        out_s = ql.fused_moe(hidden, slot_ids, weights, fmt, s13, s2, inter, **run,
                             max_ids=max_ids)  # fmt: skip
        assert torch.equal(out, out_s), (slots, max_ids)
    assert [k.get("max_ids") for k in seen] == ([] if use_gemv else [None, num_experts])


@child_only
@pytest.mark.parametrize("name", ["awq-g64-asym", "nvfp4"])
def test_4bit_gemvs_read_words_or_bytes_alike(ql, monkeypatch, name):
    """The 4-bit GEMVs (decode linear, MoE) read codes a 32-bit word at a time where groups
    are whole words (`quant_launch.words`), else a byte at a time: both equal the twin."""
    fmt = _formats()[name]
    n, k = SHAPES.get(name, DEFAULT_SHAPE)
    tensors = _weights(fmt, n, k, seed=11)
    kw = fmt.kernel_weights(tensors, k)
    assert ql.words(kw, ql.linear_tiles(1, torch.float32, kw, k).block_k, k)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, k, generator=g)
    inter, num_experts = 64, 3
    w13 = _weights(fmt, 2 * inter, k, seed=13, count=num_experts)
    w2 = _weights(fmt, k, inter, seed=14, count=num_experts)
    ids = torch.tensor([[0, 2], [1, 0], [2, 1]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=g)
    ref_lin = fmt.reference_linear(x, tensors, None, n, k)
    ref_moe = fmt.reference_moe(x, ids, weights, w13, w2, inter)
    for read_words in (True, False):
        if not read_words:
            monkeypatch.setattr(ql, "words", lambda *a: False)
        out = ql.linear(x, fmt, tensors, None, n, k)
        torch.testing.assert_close(out, ref_lin, **_tol(x.dtype))
        out = ql.fused_moe(x, ids, weights, fmt, w13, w2, inter, use_gemv=True)
        torch.testing.assert_close(out, ref_moe, rtol=1e-5, atol=1e-5)
        joined = dataclasses.replace(ql.gemv_tiles(fmt, fmt.kernel_weights(w13, k)), joined=True)
        assert torch.equal(ql.fused_moe(x, ids, weights, fmt, w13, w2, inter, use_gemv=True,
                                        tiles=joined), out)  # fmt: skip


@child_only
@pytest.mark.parametrize("name,k", [("fp8-16x32", 512), ("gptq-g32-sym", 2048)])
def test_even_tiles_load_unmasked_and_match_twin(ql, name, k):
    """Shapes of whole tiles (`quant_launch.even`): the GEMVs' unmasked loads equal the twin."""
    fmt, n, inter, num_experts = _formats()[name], 16, 64, 2
    tensors = _weights(fmt, n, k, seed=21)
    kw = fmt.kernel_weights(tensors, k)
    tiles = ql.linear_tiles(1, torch.float32, kw, k)
    assert ql.even(n, k, tiles.block_n, tiles.block_k)
    g = torch.Generator().manual_seed(22)
    x = torch.randn(2, k, generator=g)
    torch.testing.assert_close(
        ql.linear(x, fmt, tensors, None, n, k), fmt.reference_linear(x, tensors, None, n, k),
        **_tol(x.dtype),
    )  # fmt: skip
    w13 = _weights(fmt, 2 * inter, k, seed=23, count=num_experts)
    w2 = _weights(fmt, k, inter, seed=24, count=num_experts)
    t = ql.gemv_tiles(fmt, fmt.kernel_weights(w13, k))
    assert ql.even(inter, k, t.block_n, t.block_k) and ql.even(k, inter, t.down_block_n, inter)
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    weights = torch.rand(2, 2, generator=g)
    out = ql.fused_moe(x, ids, weights, fmt, w13, w2, inter, use_gemv=True)
    ref = fmt.reference_moe(x, ids, weights, w13, w2, inter)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@triton.jit
def _decode_all_codes(out_ptr):
    """out[0:16]: e2m1 code c times 2^14 back; out[16 + 16 z + c]: int4 code c minus zero z."""
    c = tl.arange(0, 16)
    tl.store(out_ptr + c, _e2m1_scaled(c) * 16384.0)
    z = tl.arange(0, 16).to(tl.float32)
    tl.store(out_ptr + 16 + 16 * tl.arange(0, 16)[:, None] + c[None, :],
             _int4_minus(c[None, :], z[:, None]))  # fmt: skip


@child_only
def test_4bit_code_decoders_are_exact(ql):
    """The bit-trick decoders (no int→float conversion) give every code's exact value."""
    out = torch.full((16 + 256,), float("nan"))
    _decode_all_codes[(1,)](out)
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    assert torch.equal(out[:16], torch.cat([e2m1, -e2m1]))
    codes = torch.arange(16.0)
    assert torch.equal(out[16:].view(16, 16), codes[None, :] - codes[:, None])


def test_gemv_options_come_from_format_shapes_and_alignment(monkeypatch):
    """The GEMV options the launcher picks (no kernel runs): four words a thread only where
    every row, expert and the base sit on 16-byte boundaries (else one, the same for every
    slot cache of that shape); chunked sums only for a format that asks for them (FP8), on
    groups of 32 columns or more; the int4 zero by `sub.f16x2` only outside the
    interpreter and for int4 codes."""
    from xinfer.kernels import quant_launch as ql
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gptq import GptqInt4

    gptq, fp8 = GptqInt4(group_size=128, has_zero=False), Fp8Block(128, 128)
    kw = gptq.kernel_weights(random_weights(gptq, 64, 2048, seed=5, count=2), 2048)
    assert ql.word_vec(kw, 2048, 2048, 4) == 4 and ql.word_vec(kw, 2048, 2048, 1) == 1
    shifted = torch.empty(kw.w.numel() + 4, dtype=torch.uint8)[4:].view(kw.w.shape)
    assert ql.word_vec(dataclasses.replace(kw, w=shifted), 2048, 2048, 4) == 1
    odd_rows = torch.empty(2, 64, 1028, dtype=torch.uint8)[:, :, :1024]  # rows 1,028 bytes apart
    assert ql.word_vec(dataclasses.replace(kw, w=odd_rows), 2048, 2048, 4) == 1
    assert ql.gemv_tiles(gptq, kw).word_vec == ql.MOE_WORD_VEC

    assert ql.chunk(128, ql.gemv_tiles(fp8, kw)) == 8
    assert ql.chunk(16, ql.gemv_tiles(fp8, kw)) == 0  # NVFP4-sized groups
    assert ql.chunk(128, ql.gemv_tiles(gptq, kw)) == 0
    assert ql.chunk(128, ql.linear_tiles(1, torch.bfloat16, kw, 2048, fp8)) == 8
    monkeypatch.setattr(ql, "CHUNK_SUMS", False)
    assert ql.chunk(128, ql.gemv_tiles(fp8, kw)) == 0

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert ql.half2(kw)
    fp8_kw = fp8.kernel_weights(random_weights(fp8, 64, 256, seed=6), 256)
    assert not ql.half2(fp8_kw)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not ql.half2(kw)
