"""The Q6_K word path (`gguf_tiles.Q6K_WORDS`, `triton/gguf_q6k_words.py`) run by Triton's
CPU interpreter: which rows allow it (16-bit loads), the four-row decode linear and the MoE
GEMVs against the twin within its tolerance (factored float32 sums, not the twin's bits), a
row's and a pair's bits alike alone and in the batch and whatever ids address the experts,
and the byte path where the switch is off or the weights do not allow words."""

from __future__ import annotations

import pytest
import torch
from gguf_interpret_cases import (
    assert_close_scaled,
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
def q6k_words_on(monkeypatch):
    """The word path on for every test here (`Q6K_WORDS`, on by default, may be turned off);
    the tests of the switch turn it off themselves."""
    from xinfer.kernels import gguf_tiles

    monkeypatch.setattr(gguf_tiles, "Q6K_WORDS", True)


def test_q6k_words_takes_even_q6_k_rows_only() -> None:
    """`q6k_words` from the block type, strides and base alone: Q6_K rows on 2-byte
    boundaries (210-byte blocks: a row of K = 768 is 630 bytes, allowed) from a 4-aligned
    base; a view 1 or 2 bytes in (or an odd row of 630 bytes in), rows padded to an odd
    stride, Q4_K: no."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q6k, k = BLOCK_TYPES["Q6_K"], 768
    w = block_rows("Q6_K", 8, k, seed=50, experts=3).clone()
    assert w.stride(1) == 630 and gt.q6k_words(w, q6k, k) and gt.q6k_words(w[1], q6k, k)
    assert gt.words_allowed(w, q6k, k) and not gt.q4k_words(w, q6k, k)
    shifted = torch.empty(w.numel() + 1, dtype=torch.uint8)[1:].view(w.shape)
    assert not gt.q6k_words(shifted, q6k, k)
    two_in = torch.empty(w.numel() + 2, dtype=torch.uint8)[2:].view(w.shape)
    assert not gt.q6k_words(two_in, q6k, k) and not gt.q6k_words(w[:, 1:], q6k, k)
    assert gt.q6k_words(w[:, 2:], q6k, k)  # 1260 bytes in
    padded = torch.empty(8, q6k.row_bytes(k) + 1, dtype=torch.uint8)[:, : q6k.row_bytes(k)]
    assert not gt.q6k_words(padded, q6k, k)
    q4 = block_rows("Q4_K", 8, 512, seed=51)
    assert not gt.q6k_words(q4, BLOCK_TYPES["Q4_K"], 512)


@child_only
@pytest.mark.parametrize(
    "k,m,dtype,warps",
    [
        # one row alone (the build every row count runs); K = 5 super-blocks split 3 + 2:
        # the first split's second step of two warps half past its range
        (1280, 1, torch.float32, 2),
        (768, 6, torch.float16, 2),  # 630-byte rows (2-aligned); the last step half past K
        (512, 3, torch.bfloat16, 1),  # bf16 activations as 32-bit words
    ],
)
def test_q6k_words_linear_matches_twin_and_keeps_row_bits(gl, k, m, dtype, warps) -> None:
    """The four-row decode linear's word path: equal to the twin within its tolerance, N a
    tail of the 16-row tile (rows past N clamped, dropped at the store), bias added once
    over K splits; each row's bits alike alone and in the batch."""
    check_words_linear(gl, "Q6_K", k, m, dtype, warps, seed=52, first_alone=True)


@child_only
def test_q6k_words_default_tiles(gl, gt) -> None:
    """The launcher's own Q6_K word tiles (the decode linear's, the LM head's at N >=
    HEAD_ROWS is the same build but one warp) run and match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, k, n = GGUFFormat("Q6_K"), 512, 24
    t = gt.linear_tiles(2, torch.float32, fmt.btype, n)
    assert t.words and t == gt._WORDS_LINEAR["Q6_K"]
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, gt.HEAD_ROWS).words
    w = block_rows("Q6_K", n, k, seed=54).clone()
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(55)) * 0.1
    out = gl.linear(x, w, fmt.btype, None, n, k)
    assert_close_scaled(out, fmt.reference_linear(x, {"weight": w}, None, n, k), torch.float32)
    head = gt._WORDS_HEAD["Q6_K"]
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k, tiles=head)[1],
                       gl.linear(x[1:], w, fmt.btype, None, n, k, tiles=head)[0])  # fmt: skip


@child_only
@pytest.mark.parametrize(
    "t13,hidden_dim,inter,dtype,tiles",
    [
        # Q6_K gate/up: one super-block, two warps (the second step past K), I = 256;
        # down: K = 768 = 3 super-blocks (630-byte rows), H = 256 in a 512-row tile
        ("Q6_K", 256, 768, torch.float32, lambda: word_tiles(1, 512, 2, word_tiles(1, 512, 1))),
        ("Q6_K", 512, 256, torch.bfloat16, lambda: word_tiles(1, 64, 1)),  # two super-blocks a row
        # a Q4_K_M layer: Q4_K gate/up, Q6_K down, the launcher's own tiles
        ("Q4_K", 256, 768, torch.float32, lambda: None),
    ],
)
def test_q6k_words_moe_matches_twin(gl, t13, hidden_dim, inter, dtype, tiles) -> None:
    """The MoE GEMVs' word path (gate/up and down) against the twin; a pair's bits alike
    alone and in the batch."""
    check_words_moe(gl, t13, "Q6_K", 56, hidden_dim, inter, dtype, tiles())


@child_only
def test_q6k_words_bits_do_not_depend_on_ids(gl) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation): the same word path, the same bits."""
    check_words_bits_do_not_depend_on_ids(gl, "Q6_K", seed=57)


@child_only
def test_q6k_words_switch_off_and_misaligned_weights_take_the_byte_path(
    gl, gt, monkeypatch
) -> None:
    """Q6K_WORDS off: the default tiles are the byte path's, bit for bit. Weights that do not
    allow 16-bit loads (a view 1 byte into its storage) take the byte path with the switch
    on, whatever tile asks for words, and still match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt = GGUFFormat("Q6_K")
    on, byte = check_words_switch_linear(gl, monkeypatch, "Q6_K", "Q6K_WORDS", seed=59, offset=1)
    assert_close_scaled(on, byte, torch.float16)

    # a Q4_K_M layer (Q4_K gate/up, Q6_K down), default tiles: Q6_K down on words with the
    # switch on and w2 aligned; on the byte tile of w13's type with the switch off or w2
    # misaligned (the same bits as before the Q6_K word path)
    monkeypatch.setitem(gt._SWEPT_GEMV, "Q4_K", gt.GGUFTiles(1, 64, 8, num_warps=2))
    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q6_K", 61, 2, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:1], ids[:1], weights[:1], w13.clone(), w2.clone()
    q4, q6 = GGUFFormat("Q4_K").btype, fmt.btype
    ref = GGUFFormat("Q4_K").reference_moe(hidden, ids, weights, {"weight": w13},
                                           {"weight": w2}, inter, fmt)  # fmt: skip
    on = gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True)
    assert_close_scaled(on, ref, torch.float32)
    byte = gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True,
                        gt.gemv_tiles(torch.float32, q4, words=False))  # fmt: skip
    s2 = offset_copy(w2, 1)
    monkeypatch.setattr(gt, "Q4K_WORDS", False)
    assert torch.equal(gl.fused_moe(hidden, ids, weights, w13, q4, s2, q6, inter, True), byte)
    monkeypatch.setattr(gt, "Q6K_WORDS", False)
    assert torch.equal(gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True), byte)
