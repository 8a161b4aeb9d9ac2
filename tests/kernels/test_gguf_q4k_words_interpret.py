"""The Q4_K word path (`gguf_launch.Q4K_WORDS`, `triton/gguf_q4k_words.py`) run by Triton's
CPU interpreter: which rows allow it (16-byte word loads), the four-row decode linear and the
MoE GEMVs against the twin within its tolerance (factored float32 sums, not the twin's bits),
a row's and a pair's bits alike alone and in the batch and whatever ids address the experts,
and the byte path where the switch is off or the weights do not allow words."""

from __future__ import annotations

import pytest
import torch
from gguf_interpret_cases import assert_close_scaled, block_rows, interpreted_gguf_launch, moe_case
from interpreter_child import child_only, interpreter_child_test

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def gl():
    return interpreted_gguf_launch()


def _words(block_m: int, block_n: int, warps: int, down=None):
    """A word tile: block_n rows (block_n / 8 a thread), a super-block a warp each step."""
    from xinfer.kernels import gguf_launch

    return gguf_launch.GGUFTiles(block_m, block_n, 8 * warps, num_warps=warps, words=True,
                                 down=down)  # fmt: skip


def _bf16_tol(out: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 outputs: the twin rounds the weights and every intermediate to bf16 (2^-8 apart;
    the MoE case's byte path is 0.023 from it as well)."""
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=3e-2)


def _close(out, ref, dtype) -> None:
    if dtype == torch.bfloat16:
        _bf16_tol(out, ref)
    else:
        assert_close_scaled(out, ref, dtype)


def test_q4k_words_takes_aligned_q4_k_rows_only() -> None:
    """`q4k_words` from the block type, strides and base alone: Q4_K rows on 16-byte
    boundaries (a 144-byte block is 9 x 16); a view 4 bytes in, padded rows, Q5_K: no."""
    from xinfer.kernels import gguf_launch as gl
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q4k, k = BLOCK_TYPES["Q4_K"], 512
    w = block_rows("Q4_K", 8, k, seed=40, experts=3).clone()  # torch's allocation: 64-byte aligned
    assert w.data_ptr() % 16 == 0 and gl.q4k_words(w, q4k, k) and gl.q4k_words(w[1], q4k, k)
    shifted = torch.empty(w.numel() + 4, dtype=torch.uint8)[4:].view(w.shape)
    assert not gl.q4k_words(shifted, q4k, k)
    padded = torch.empty(8, q4k.row_bytes(k) + 4, dtype=torch.uint8)[:, : q4k.row_bytes(k)]
    assert not gl.q4k_words(padded, q4k, k)
    assert not gl.q4k_words(block_rows("Q5_K", 8, k, seed=41), BLOCK_TYPES["Q5_K"], k)


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
    from xinfer.quant.gguf_formats import GGUFFormat

    n, fmt = 19, GGUFFormat("Q4_K")
    tensors = {"weight": block_rows("Q4_K", n, k, seed=42).clone()}
    assert gl.q4k_words(tensors["weight"], fmt.btype, k)
    g = torch.Generator().manual_seed(43)
    bias = torch.randn(n, generator=g).to(dtype)
    x = (torch.randn(m, k, generator=g) * 0.1).to(dtype)
    tiles = _words(4, 16, warps)
    if k == 1280:
        assert gl.decode_split(1, 2, k, tiles) == (768, 2)
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    _close(out, fmt.reference_linear(x, tensors, bias, n, k), dtype)
    alone = gl.linear(x[m - 1 :], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert torch.equal(alone[0], out[m - 1])


@child_only
@pytest.mark.parametrize(
    "hidden_dim,inter,dtype,tiles",
    [
        # gate/up: one super-block, two warps (the second step past K), I = 768 in tiles of
        # 512 rows (a tail); down: K = 768 = 3 super-blocks, H = 256 in a 512-row tile
        (256, 768, torch.float32, lambda: _words(1, 512, 2, down=_words(1, 512, 1))),
        (512, 256, torch.bfloat16, lambda: _words(1, 64, 1)),  # two super-blocks a row
    ],
)
def test_q4k_words_moe_matches_twin(gl, hidden_dim, inter, dtype, tiles) -> None:
    """The MoE GEMVs' word path (gate/up and down) against the twin; a pair's bits alike
    alone and in the batch."""
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q4_K", 44, 4, hidden_dim, inter)
    w13, w2 = w13.clone(), w2.clone()  # torch's allocations: 64-byte aligned
    hidden = hidden[:2].to(dtype)
    ids, weights = ids[:2], weights[:2]
    fmt = GGUFFormat("Q4_K")
    assert gl.q4k_words(w13, fmt.btype, hidden_dim) and gl.q4k_words(w2, fmt.btype, inter)
    ref = fmt.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    t = tiles()
    out = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True, t)
    _close(out, ref, dtype)
    one = gl.fused_moe(hidden[1:], ids[1:], weights[1:], w13, fmt.btype, w2, fmt.btype, inter,
                       True, t)  # fmt: skip
    assert torch.equal(one[0], out[1])


@child_only
def test_q4k_words_bits_do_not_depend_on_ids(gl) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation): the same word path, the same bits."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q4_K", 45, 4, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:2], ids[:2], weights[:2], w13.clone(), w2.clone()
    bt, tiles = BLOCK_TYPES["Q4_K"], _words(1, 64, 1)
    base = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True, tiles)
    slot_of = torch.randperm(6, generator=torch.Generator().manual_seed(46))[:4]
    s13 = torch.zeros(6, *w13.shape[1:], dtype=torch.uint8)
    s2 = torch.zeros(6, *w2.shape[1:], dtype=torch.uint8)
    s13[slot_of], s2[slot_of] = w13, w2
    assert gl.q4k_words(s13, bt, 256) and gl.q4k_words(s2, bt, inter)
    slot_ids = slot_of[ids.long()].to(torch.int32)
    out = gl.fused_moe(hidden, slot_ids, weights, s13, bt, s2, bt, inter, True, tiles)
    assert torch.equal(out, base)


@child_only
def test_q4k_words_switch_off_and_misaligned_weights_take_the_byte_path(gl, monkeypatch) -> None:
    """Q4K_WORDS off: the default tiles are the byte path's, bit for bit. Weights that do not
    allow 16-byte word loads (a view 4 bytes into its storage) take the byte path with the
    switch on, whatever tile asks for words, and still match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, dtype, k, n = GGUFFormat("Q4_K"), torch.float16, 512, 12
    w = block_rows("Q4_K", n, k, seed=47).clone()
    assert gl.q4k_words(w, fmt.btype, k)
    g = torch.Generator().manual_seed(48)
    x = (torch.randn(2, k, generator=g) * 0.1).to(dtype)
    byte_tiles = gl.linear_tiles(2, dtype, fmt.btype, n, words=False)
    assert not byte_tiles.words
    byte = gl.linear(x, w, fmt.btype, None, n, k, tiles=byte_tiles)
    monkeypatch.setattr(gl, "Q4K_WORDS", True)
    on = gl.linear(x, w, fmt.btype, None, n, k)
    monkeypatch.setattr(gl, "Q4K_WORDS", False)
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), byte)
    monkeypatch.setattr(gl, "Q4K_WORDS", True)
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), on)

    shifted = torch.empty(w.numel() + 4, dtype=torch.uint8)[4:].view(w.shape)
    shifted.copy_(w)
    assert not gl.q4k_words(shifted, fmt.btype, k)
    for tiles in (None, _words(4, 16, 1)):
        out = gl.linear(x, shifted, fmt.btype, None, n, k, tiles=tiles)
        assert torch.equal(out, byte)
    assert_close_scaled(byte, fmt.reference_linear(x, {"weight": w}, None, n, k), dtype)

    # experts: w13 misaligned (byte path), w2 aligned (word path) in one call; the byte
    # tile widened to 64 rows (fewer interpreted programs)
    monkeypatch.setitem(gl._SWEPT_GEMV, "Q4_K", gl.GGUFTiles(1, 64, 8, num_warps=2))
    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q4_K", 49, 2, 256, 256)
    hidden, ids, weights, w2 = hidden[:1], ids[:1], weights[:1], w2.clone()
    assert gl.q4k_words(w2, fmt.btype, inter)
    s13 = torch.empty(w13.numel() + 4, dtype=torch.uint8)[4:].view(w13.shape)
    s13.copy_(w13)
    tiles = _words(1, 64, 1)
    ref = fmt.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    out = gl.fused_moe(hidden, ids, weights, s13, fmt.btype, w2, fmt.btype, inter, True, tiles)
    assert_close_scaled(out, ref, torch.float32)
    monkeypatch.setattr(gl, "Q4K_WORDS", False)
    off = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True, None)
    byte = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True,
                        gl.gemv_tiles(torch.float32, fmt.btype, words=False))  # fmt: skip
    assert torch.equal(off, byte)
