"""The Q4_K word path (`gguf_tiles.Q4K_WORDS`, `triton/gguf_q4k_words.py`) run by Triton's
CPU interpreter: which rows allow it (16-byte word loads), the four-row decode linear and the
MoE GEMVs against the twin within its tolerance (factored float32 sums, not the twin's bits),
a row's and a pair's bits alike alone and in the batch and whatever ids address the experts,
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


def test_q4k_words_takes_aligned_q4_k_rows_only() -> None:
    """`q4k_words` from the block type, strides and base alone: Q4_K rows on 16-byte
    boundaries (a 144-byte block is 9 x 16); a view 4 bytes in, padded rows, Q5_K: no."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q4k, k = BLOCK_TYPES["Q4_K"], 512
    w = block_rows("Q4_K", 8, k, seed=40, experts=3).clone()  # torch's allocation: 64-byte aligned
    assert w.data_ptr() % 16 == 0 and gt.q4k_words(w, q4k, k) and gt.q4k_words(w[1], q4k, k)
    shifted = torch.empty(w.numel() + 4, dtype=torch.uint8)[4:].view(w.shape)
    assert not gt.q4k_words(shifted, q4k, k)
    padded = torch.empty(8, q4k.row_bytes(k) + 4, dtype=torch.uint8)[:, : q4k.row_bytes(k)]
    assert not gt.q4k_words(padded, q4k, k)
    assert not gt.q4k_words(block_rows("Q5_K", 8, k, seed=41), BLOCK_TYPES["Q5_K"], k)


@child_only
@pytest.mark.parametrize(
    "k,m,dtype,warps",
    [
        # one row alone (the build every row count runs); K = 5 super-blocks split 3 + 2:
        # the first split's second step of two warps half past its range
        (1280, 1, torch.float32, 2),
        (768, 6, torch.float16, 2),  # two steps of two super-blocks, the last one half past K
        (512, 3, torch.bfloat16, 1),  # bf16 activations as 32-bit words
    ],
)
def test_q4k_words_linear_matches_twin_and_keeps_row_bits(gl, k, m, dtype, warps) -> None:
    """The four-row decode linear's word path: equal to the twin within its tolerance, N a
    tail of the 16-row tile (rows past N clamped, dropped at the store), bias added once
    over K splits; each row's bits alike alone and in the batch."""
    check_words_linear(gl, "Q4_K", k, m, dtype, warps, seed=42)


@child_only
@pytest.mark.parametrize(
    "hidden_dim,inter,dtype,tiles",
    [
        # gate/up: one super-block, two warps (the second step past K), I = 768 in tiles of
        # 512 rows (a tail); down: K = 768 = 3 super-blocks, H = 256 in a 512-row tile
        (256, 768, torch.float32, lambda: word_tiles(1, 512, 2, down=word_tiles(1, 512, 1))),
        (512, 256, torch.bfloat16, lambda: word_tiles(1, 64, 1)),  # two super-blocks a row
    ],
)
def test_q4k_words_moe_matches_twin(gl, hidden_dim, inter, dtype, tiles) -> None:
    """The MoE GEMVs' word path (gate/up and down) against the twin; a pair's bits alike
    alone and in the batch."""
    check_words_moe(gl, "Q4_K", "Q4_K", 44, hidden_dim, inter, dtype, tiles())


@child_only
def test_q4k_words_bits_do_not_depend_on_ids(gl) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation): the same word path, the same bits."""
    check_words_bits_do_not_depend_on_ids(gl, "Q4_K", seed=45)


@child_only
def test_q4k_words_switch_off_and_misaligned_weights_take_the_byte_path(
    gl, gt, monkeypatch
) -> None:
    """Q4K_WORDS off: the default tiles are the byte path's, bit for bit. Weights that do not
    allow 16-byte word loads (a view 4 bytes into its storage) take the byte path with the
    switch on, whatever tile asks for words, and still match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    check_words_switch_linear(gl, monkeypatch, "Q4_K", "Q4K_WORDS", seed=47, offset=4)

    # experts: w13 misaligned (byte path), w2 aligned (word path) in one call; the byte
    # tile widened to 64 rows (fewer interpreted programs)
    monkeypatch.setitem(gt._SWEPT_GEMV, "Q4_K", gt.GGUFTiles(1, 64, 8, num_warps=2))
    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q4_K", 49, 2, 256, 256)
    hidden, ids, weights, w2 = hidden[:1], ids[:1], weights[:1], w2.clone()
    fmt = GGUFFormat("Q4_K")
    assert gt.q4k_words(w2, fmt.btype, inter)
    s13 = offset_copy(w13, 4)
    tiles = word_tiles(1, 64, 1)
    ref = fmt.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    out = gl.fused_moe(hidden, ids, weights, s13, fmt.btype, w2, fmt.btype, inter, True, tiles)
    assert_close_scaled(out, ref, torch.float32)
    monkeypatch.setattr(gt, "Q4K_WORDS", False)
    off = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True, None)
    byte = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True,
                        gt.gemv_tiles(torch.float32, fmt.btype, words=False))  # fmt: skip
    assert torch.equal(off, byte)
