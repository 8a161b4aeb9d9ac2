"""The Q8_0 word path (`gguf_tiles.Q80_WORDS`, `triton/gguf_q80_words.py`) run by Triton's
CPU interpreter: which rows allow it (4-aligned rows, K a multiple of 256), the four-row
decode linear and the MoE GEMVs against the twin within its tolerance (factored float32
sums, not the twin's bits) and against the byte path, a row's and a pair's bits alike alone
and in the batch and whatever ids address the experts, and the byte path where the switch is
off or the weights do not allow words."""

from __future__ import annotations

import pytest
import torch
from gguf_interpret_cases import (
    assert_close_scaled,
    assert_close_words,
    block_rows,
    check_words_bits_do_not_depend_on_ids,
    check_words_linear,
    check_words_moe,
    check_words_switch_linear,
    moe_case,
    offset_copy,
    word_tiles,
)
from interpreter_child import child_only, interpreter_child_test

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(autouse=True)
def q80_words_on(monkeypatch):
    """The word path on for every test here (`Q80_WORDS` ships off until a GPU has run its
    tests); the tests of the switch turn it off themselves."""
    from xinfer.kernels import gguf_tiles

    monkeypatch.setattr(gguf_tiles, "Q80_WORDS", True)


def test_q80_words_takes_aligned_q8_0_rows_only() -> None:
    """`q80_words` from the block type, K, strides and base alone: Q8_0 rows on 8-byte
    boundaries (a row of K = 768 is 816 bytes, allowed) from an 8-aligned base, K a multiple
    of 256; a view 1, 2 or 4 bytes in, rows padded to a stride of 2 or 4 mod 8, K = 96
    (three blocks), Q6_K: no."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q8, k = BLOCK_TYPES["Q8_0"], 768
    w = block_rows("Q8_0", 8, k, seed=70, experts=3).clone()
    assert w.stride(1) == 816 and gt.q80_words(w, q8, k) and gt.q80_words(w[1], q8, k)
    assert gt.words_allowed(w, q8, k) and not gt.q4k_words(w, q8, k)
    assert not gt.q6k_words(w, q8, k)
    for off in (1, 2, 4):
        shifted = torch.empty(w.numel() + off, dtype=torch.uint8)[off:].view(w.shape)
        assert not gt.q80_words(shifted, q8, k)
    assert gt.q80_words(w[:, 1:], q8, k)  # 816 bytes in
    for pad in (2, 4):
        padded = torch.empty(8, q8.row_bytes(k) + pad, dtype=torch.uint8)[:, : q8.row_bytes(k)]
        assert not gt.q80_words(padded, q8, k)
    assert not gt.q80_words(block_rows("Q8_0", 8, 96, seed=71).clone(), q8, 96)
    q6 = block_rows("Q6_K", 8, 512, seed=72).clone()
    assert not gt.q80_words(q6, BLOCK_TYPES["Q6_K"], 512)


@child_only
@pytest.mark.parametrize(
    "k,m,dtype,warps",
    [
        # one row alone (the build every row count runs); K = 5 units of 256 split 3 + 2:
        # the first split's second step of two warps half past its range
        (1280, 1, torch.float32, 2),
        (768, 6, torch.float16, 2),  # 816-byte rows; the last step half past K
        (512, 3, torch.bfloat16, 1),  # bf16 activations as 32-bit words
    ],
)
def test_q80_words_linear_matches_twin_and_keeps_row_bits(gl, k, m, dtype, warps) -> None:
    """The four-row decode linear's word path: equal to the twin within its tolerance, N a
    tail of the 16-row tile (rows past N clamped, dropped at the store), bias added once
    over K splits; each row's bits alike alone and in the batch."""
    check_words_linear(gl, "Q8_0", k, m, dtype, warps, seed=73, first_alone=True)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q80_words_linear_matches_byte_path(gl, gt, dtype) -> None:
    """The word path and the byte path of one decode linear (K = 768, 4 rows, N = 40) agree
    within the twin's tolerance (fp32: 1e-5 of the largest output)."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, k, n = GGUFFormat("Q8_0"), 768, 40
    w = block_rows("Q8_0", n, k, seed=74).clone()
    x = (torch.randn(4, k, generator=torch.Generator().manual_seed(75)) * 0.1).to(dtype)
    words = gl.linear(x, w, fmt.btype, None, n, k, tiles=word_tiles(4, 16, 2))
    byte = gl.linear(x, w, fmt.btype, None, n, k,
                     tiles=gt.linear_tiles(4, dtype, fmt.btype, n, words=False))  # fmt: skip
    assert_close_words(words, byte, dtype)


@child_only
def test_q80_words_default_tiles(gl, gt) -> None:
    """The launcher's own Q8_0 word tiles (the decode linear's, the LM head's at N >=
    HEAD_ROWS is the same build with its own tile) run and match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, k, n = GGUFFormat("Q8_0"), 512, 24
    t = gt.linear_tiles(2, torch.float32, fmt.btype, n)
    assert t.words and t == gt._WORDS_LINEAR["Q8_0"]
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, gt.HEAD_ROWS).words
    assert gt.gemv_tiles(torch.bfloat16, fmt.btype) == gt._WORDS_GEMV["Q8_0"]
    w = block_rows("Q8_0", n, k, seed=76).clone()
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(77)) * 0.1
    out = gl.linear(x, w, fmt.btype, None, n, k)
    assert_close_scaled(out, fmt.reference_linear(x, {"weight": w}, None, n, k), torch.float32)
    head = gt._WORDS_HEAD["Q8_0"]
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k, tiles=head)[1],
                       gl.linear(x[1:], w, fmt.btype, None, n, k, tiles=head)[0])  # fmt: skip


@child_only
@pytest.mark.parametrize(
    "hidden_dim,inter,dtype,tiles",
    [
        # gate/up: one unit of 256, two warps (the second step past K), I = 256; down:
        # K = 768 = 3 units (816-byte rows), H = 256 in a 512-row tile
        (256, 768, torch.float32, lambda: word_tiles(1, 512, 2, word_tiles(1, 512, 1))),
        (512, 256, torch.bfloat16, lambda: word_tiles(1, 64, 1)),  # two units a row
        (512, 768, torch.float16, lambda: None),  # the launcher's own tiles
    ],
)
def test_q80_words_moe_matches_twin(gl, hidden_dim, inter, dtype, tiles) -> None:
    """The MoE GEMVs' word path (gate/up and down) against the twin; a pair's bits alike
    alone and in the batch."""
    check_words_moe(gl, "Q8_0", "Q8_0", 78, hidden_dim, inter, dtype, tiles())


@child_only
def test_q80_words_moe_matches_byte_path(gl, gt) -> None:
    """The MoE GEMVs' word path and byte path (float32, three tokens) within 1e-5 of the
    largest output."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = moe_case("Q8_0", "Q8_0", 79, 4, 512, 256)
    w13, w2, bt = w13.clone(), w2.clone(), BLOCK_TYPES["Q8_0"]
    words = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True)
    byte = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True,
                        gt.gemv_tiles(torch.float32, bt, words=False))  # fmt: skip
    assert_close_scaled(words, byte, torch.float32)


@child_only
def test_q80_words_bits_do_not_depend_on_ids(gl) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation): the same word path, the same bits."""
    check_words_bits_do_not_depend_on_ids(gl, "Q8_0", seed=80)


@child_only
def test_q80_words_switch_off_and_misaligned_weights_take_the_byte_path(
    gl, gt, monkeypatch
) -> None:
    """Q80_WORDS off: the default tiles are the byte path's, bit for bit. Weights that do not
    allow 64-bit loads (a view 4 bytes into its storage) take the byte path with the switch
    on, whatever tile asks for words, and still match the twin; so do experts 4 bytes in."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    on, byte = check_words_switch_linear(gl, monkeypatch, "Q8_0", "Q80_WORDS", seed=81, offset=4)
    assert_close_scaled(on, byte, torch.float16)

    monkeypatch.setitem(gt._SWEPT_GEMV, "Q8_0", gt.GGUFTiles(1, 64, 8, num_warps=2))
    hidden, ids, weights, w13, w2, inter = moe_case("Q8_0", "Q8_0", 82, 2, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:1], ids[:1], weights[:1], w13.clone(), w2.clone()
    bt = BLOCK_TYPES["Q8_0"]
    byte = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True,
                        gt.gemv_tiles(torch.float32, bt, words=False))  # fmt: skip
    s13, s2 = offset_copy(w13, 4), offset_copy(w2, 4)
    assert not gt.words_allowed(s13, bt, 256) and not gt.words_allowed(s2, bt, inter)
    assert torch.equal(gl.fused_moe(hidden, ids, weights, s13, bt, s2, bt, inter, True), byte)
    assert gt.gemv_tiles(torch.float32, bt).words
    monkeypatch.setattr(gt, "Q80_WORDS", False)
    assert not gt.gemv_tiles(torch.float32, bt).words
    assert torch.equal(gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True), byte)
