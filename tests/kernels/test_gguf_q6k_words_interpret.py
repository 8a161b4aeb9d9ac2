"""The Q6_K word path (`gguf_launch.Q6K_WORDS`, `triton/gguf_q6k_words.py`) run by Triton's
CPU interpreter: which rows allow it (16-bit loads), the four-row decode linear and the MoE
GEMVs against the twin within its tolerance (factored float32 sums, not the twin's bits), a
row's and a pair's bits alike alone and in the batch and whatever ids address the experts,
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


def _close(out, ref, dtype) -> None:
    """bf16: the twin rounds the weights and every intermediate to bf16 (2^-8 apart)."""
    if dtype == torch.bfloat16:
        scale = ref.float().abs().max()
        torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=3e-2)
    else:
        assert_close_scaled(out, ref, dtype)


def test_q6k_words_takes_even_q6_k_rows_only() -> None:
    """`q6k_words` from the block type, strides and base alone: Q6_K rows on 2-byte
    boundaries (210-byte blocks: a row of K = 768 is 630 bytes, allowed) from a 4-aligned
    base; a view 1 or 2 bytes in (or an odd row of 630 bytes in), rows padded to an odd
    stride, Q4_K: no."""
    from xinfer.kernels import gguf_launch as gl
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q6k, k = BLOCK_TYPES["Q6_K"], 768
    w = block_rows("Q6_K", 8, k, seed=50, experts=3).clone()
    assert w.stride(1) == 630 and gl.q6k_words(w, q6k, k) and gl.q6k_words(w[1], q6k, k)
    assert gl.words_allowed(w, q6k, k) and not gl.q4k_words(w, q6k, k)
    shifted = torch.empty(w.numel() + 1, dtype=torch.uint8)[1:].view(w.shape)
    assert not gl.q6k_words(shifted, q6k, k)
    two_in = torch.empty(w.numel() + 2, dtype=torch.uint8)[2:].view(w.shape)
    assert not gl.q6k_words(two_in, q6k, k) and not gl.q6k_words(w[:, 1:], q6k, k)
    assert gl.q6k_words(w[:, 2:], q6k, k)  # 1260 bytes in
    padded = torch.empty(8, q6k.row_bytes(k) + 1, dtype=torch.uint8)[:, : q6k.row_bytes(k)]
    assert not gl.q6k_words(padded, q6k, k)
    q4 = block_rows("Q4_K", 8, 512, seed=51)
    assert not gl.q6k_words(q4, BLOCK_TYPES["Q4_K"], 512)


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
    from xinfer.quant.gguf_formats import GGUFFormat

    n, fmt = 19, GGUFFormat("Q6_K")
    tensors = {"weight": block_rows("Q6_K", n, k, seed=52).clone()}
    assert gl.q6k_words(tensors["weight"], fmt.btype, k)
    g = torch.Generator().manual_seed(53)
    bias = torch.randn(n, generator=g).to(dtype)
    x = (torch.randn(m, k, generator=g) * 0.1).to(dtype)
    tiles = _words(4, 16, warps)
    if k == 1280:
        assert gl.decode_split(1, 2, k, tiles) == (768, 2)
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    _close(out, fmt.reference_linear(x, tensors, bias, n, k), dtype)
    alone = gl.linear(x[m - 1 :], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert torch.equal(alone[0], out[m - 1])
    if m > 1:
        first = gl.linear(x[:1], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
        assert torch.equal(first[0], out[0])


@child_only
def test_q6k_words_default_tiles(gl) -> None:
    """The launcher's own Q6_K word tiles (the decode linear's, the LM head's at N >=
    HEAD_ROWS is the same build but one warp) run and match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, k, n = GGUFFormat("Q6_K"), 512, 24
    t = gl.linear_tiles(2, torch.float32, fmt.btype, n)
    assert t.words and t == gl._WORDS_LINEAR["Q6_K"]
    assert gl.linear_tiles(1, torch.bfloat16, fmt.btype, gl.HEAD_ROWS).words
    w = block_rows("Q6_K", n, k, seed=54).clone()
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(55)) * 0.1
    out = gl.linear(x, w, fmt.btype, None, n, k)
    _close(out, fmt.reference_linear(x, {"weight": w}, None, n, k), torch.float32)
    head = gl._WORDS_HEAD["Q6_K"]
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k, tiles=head)[1],
                       gl.linear(x[1:], w, fmt.btype, None, n, k, tiles=head)[0])  # fmt: skip


@child_only
@pytest.mark.parametrize(
    "t13,hidden_dim,inter,dtype,tiles",
    [
        # Q6_K gate/up: one super-block, two warps (the second step past K), I = 256;
        # down: K = 768 = 3 super-blocks (630-byte rows), H = 256 in a 512-row tile
        ("Q6_K", 256, 768, torch.float32, lambda: _words(1, 512, 2, down=_words(1, 512, 1))),
        ("Q6_K", 512, 256, torch.bfloat16, lambda: _words(1, 64, 1)),  # two super-blocks a row
        # a Q4_K_M layer: Q4_K gate/up, Q6_K down, the launcher's own tiles
        ("Q4_K", 256, 768, torch.float32, lambda: None),
    ],
)
def test_q6k_words_moe_matches_twin(gl, t13, hidden_dim, inter, dtype, tiles) -> None:
    """The MoE GEMVs' word path (gate/up and down) against the twin; a pair's bits alike
    alone and in the batch."""
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = moe_case(t13, "Q6_K", 56, 4, hidden_dim, inter)
    w13, w2 = w13.clone(), w2.clone()
    hidden = hidden[:2].to(dtype)
    ids, weights = ids[:2], weights[:2]
    f13, f2 = GGUFFormat(t13), GGUFFormat("Q6_K")
    assert gl.words_allowed(w13, f13.btype, hidden_dim) and gl.q6k_words(w2, f2.btype, inter)
    ref = f13.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, f2)
    t = tiles()
    if t is None:
        assert gl._down_tiles(f2.btype, w2, inter, None, None) == gl._WORDS_GEMV["Q6_K"].down
    out = gl.fused_moe(hidden, ids, weights, w13, f13.btype, w2, f2.btype, inter, True, t)
    _close(out, ref, dtype)
    one = gl.fused_moe(hidden[1:], ids[1:], weights[1:], w13, f13.btype, w2, f2.btype, inter,
                       True, t)  # fmt: skip
    assert torch.equal(one[0], out[1])


@child_only
def test_q6k_words_bits_do_not_depend_on_ids(gl) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation): the same word path, the same bits."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = moe_case("Q6_K", "Q6_K", 57, 4, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:2], ids[:2], weights[:2], w13.clone(), w2.clone()
    bt, tiles = BLOCK_TYPES["Q6_K"], _words(1, 64, 1)
    base = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True, tiles)
    slot_of = torch.randperm(6, generator=torch.Generator().manual_seed(58))[:4]
    s13 = torch.zeros(6, *w13.shape[1:], dtype=torch.uint8)
    s2 = torch.zeros(6, *w2.shape[1:], dtype=torch.uint8)
    s13[slot_of], s2[slot_of] = w13, w2
    assert gl.q6k_words(s13, bt, 256) and gl.q6k_words(s2, bt, inter)
    slot_ids = slot_of[ids.long()].to(torch.int32)
    out = gl.fused_moe(hidden, slot_ids, weights, s13, bt, s2, bt, inter, True, tiles)
    assert torch.equal(out, base)


@child_only
def test_q6k_words_switch_off_and_misaligned_weights_take_the_byte_path(gl, monkeypatch) -> None:
    """Q6K_WORDS off: the default tiles are the byte path's, bit for bit. Weights that do not
    allow 16-bit loads (a view 1 byte into its storage) take the byte path with the switch
    on, whatever tile asks for words, and still match the twin."""
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, dtype, k, n = GGUFFormat("Q6_K"), torch.float16, 512, 12
    w = block_rows("Q6_K", n, k, seed=59).clone()
    g = torch.Generator().manual_seed(60)
    x = (torch.randn(2, k, generator=g) * 0.1).to(dtype)
    byte_tiles = gl.linear_tiles(2, dtype, fmt.btype, n, words=False)
    assert not byte_tiles.words
    byte = gl.linear(x, w, fmt.btype, None, n, k, tiles=byte_tiles)
    monkeypatch.setattr(gl, "Q6K_WORDS", True)
    on = gl.linear(x, w, fmt.btype, None, n, k)
    monkeypatch.setattr(gl, "Q6K_WORDS", False)
    assert not gl.linear_tiles(2, dtype, fmt.btype, n).words
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), byte)
    monkeypatch.setattr(gl, "Q6K_WORDS", True)
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), on)
    _close(on, byte, dtype)

    shifted = torch.empty(w.numel() + 1, dtype=torch.uint8)[1:].view(w.shape)
    shifted.copy_(w)
    assert not gl.q6k_words(shifted, fmt.btype, k)
    for tiles in (None, _words(4, 16, 1)):
        out = gl.linear(x, shifted, fmt.btype, None, n, k, tiles=tiles)
        assert torch.equal(out, byte)
    assert_close_scaled(byte, fmt.reference_linear(x, {"weight": w}, None, n, k), dtype)

    # a Q4_K_M layer (Q4_K gate/up, Q6_K down), default tiles: Q6_K down on words with the
    # switch on and w2 aligned; on the byte tile of w13's type with the switch off or w2
    # misaligned (the same bits as before the Q6_K word path)
    monkeypatch.setitem(gl._SWEPT_GEMV, "Q4_K", gl.GGUFTiles(1, 64, 8, num_warps=2))
    hidden, ids, weights, w13, w2, inter = moe_case("Q4_K", "Q6_K", 61, 2, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:1], ids[:1], weights[:1], w13.clone(), w2.clone()
    q4, q6 = GGUFFormat("Q4_K").btype, fmt.btype
    ref = GGUFFormat("Q4_K").reference_moe(hidden, ids, weights, {"weight": w13},
                                           {"weight": w2}, inter, fmt)  # fmt: skip
    on = gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True)
    assert_close_scaled(on, ref, torch.float32)
    byte = gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True,
                        gl.gemv_tiles(torch.float32, q4, words=False))  # fmt: skip
    s2 = torch.empty(w2.numel() + 1, dtype=torch.uint8)[1:].view(w2.shape)
    s2.copy_(w2)
    monkeypatch.setattr(gl, "Q4K_WORDS", False)
    assert torch.equal(gl.fused_moe(hidden, ids, weights, w13, q4, s2, q6, inter, True), byte)
    monkeypatch.setattr(gl, "Q6K_WORDS", False)
    assert torch.equal(gl.fused_moe(hidden, ids, weights, w13, q4, w2, q6, inter, True), byte)
