"""Shared pieces of the GGUF kernels' interpreter tests (`tests/kernels/test_gguf_*_interpret.py`):
the launcher with its kernels checked to run interpreted, random valid block rows, a small
MoE case in any pair of block types, and the tolerance against the twin scaled to the
largest output; and the checks that the Q4_K and Q6_K word paths' tests share."""

from __future__ import annotations

import gguf_files as gf
import torch
from interpreter_child import require_interpreted


def interpreted_gguf_launch():
    """`kernels.gguf_launch`, failing unless its kernels run under the interpreter."""
    from xinfer.kernels import gguf_launch
    from xinfer.kernels.triton import gguf_gemm

    require_interpreted(gguf_gemm.gguf_linear_kernel)
    return gguf_launch


def block_rows(name: str, rows: int, k: int, seed: int, experts: int | None = None) -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts)


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal to within `tol` of the largest output (fp16: the twin rounds the weights)."""
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=tol)


def moe_case(
    t13: str, t2: str, seed: int, num_experts: int = 4, hidden_dim: int = 256, inter: int = 0
):
    """hidden_dim 256 (one super-block, or 8 legacy blocks) by default; inter 256 for K-quant
    w2, else 96 (a partial last chunk for 32-blocks)."""
    from xinfer.kernels import reference

    inter = inter or (256 if t2.endswith("_K") else 96)
    w13 = block_rows(t13, 2 * inter, hidden_dim, seed, experts=num_experts)
    w2 = block_rows(t2, hidden_dim, inter, seed + 1, experts=num_experts)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, hidden_dim, generator=g) * 0.05
    weights, ids = reference.route_topk(torch.randn(3, num_experts, generator=g), 2, True)
    return hidden, ids, weights, w13, w2, inter


# --- the word paths (`gguf_tiles.Q4K_WORDS`, `Q6K_WORDS`): shared by their interpreter tests


def word_tiles(block_m: int, block_n: int, warps: int, down=None):
    """A word tile: block_n rows (block_n / 8 a thread), a super-block a warp each step."""
    from xinfer.kernels import gguf_tiles

    return gguf_tiles.GGUFTiles(block_m, block_n, 8 * warps, num_warps=warps, words=True,
                                 down=down)  # fmt: skip


def assert_close_words(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """A word path's output against the twin: `assert_close_scaled`, but bf16 within 3e-2
    (the twin rounds the weights and every intermediate to bf16, 2^-8 apart; the Q4_K MoE
    case's byte path is 0.023 from it as well)."""
    if dtype == torch.bfloat16:
        scale = ref.float().abs().max()
        torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=3e-2)
    else:
        assert_close_scaled(out, ref, dtype)


def offset_copy(w: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of the bytes `w` `offset` bytes into its own storage (rows no longer aligned)."""
    shifted = torch.empty(w.numel() + offset, dtype=torch.uint8)[offset:].view(w.shape)
    shifted.copy_(w)
    return shifted


def check_words_linear(gl, name: str, k: int, m: int, dtype, warps: int, seed: int,
                       first_alone: bool = False) -> None:  # fmt: skip
    """The four-row decode linear's word path on `name` rows: equal to the twin within its
    tolerance, N = 19 a tail of the 16-row tile (rows past N clamped, dropped at the store),
    bias added once over K splits (K = 1280: 3 + 2 super-blocks); the last row's bits (and
    with `first_alone` the first's) alike alone and in the batch."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_formats import GGUFFormat

    n, fmt = 19, GGUFFormat(name)
    tensors = {"weight": block_rows(name, n, k, seed=seed).clone()}
    assert gt.words_allowed(tensors["weight"], fmt.btype, k)
    g = torch.Generator().manual_seed(seed + 1)
    bias = torch.randn(n, generator=g).to(dtype)
    x = (torch.randn(m, k, generator=g) * 0.1).to(dtype)
    tiles = word_tiles(4, 16, warps)
    if k == 1280:
        assert gt.decode_split(1, 2, k, tiles) == (768, 2)
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert_close_words(out, fmt.reference_linear(x, tensors, bias, n, k), dtype)
    alone = gl.linear(x[m - 1 :], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert torch.equal(alone[0], out[m - 1])
    if first_alone and m > 1:
        first = gl.linear(x[:1], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
        assert torch.equal(first[0], out[0])


def check_words_moe(gl, t13: str, t2: str, seed: int, hidden_dim: int, inter: int, dtype,
                    tiles) -> None:  # fmt: skip
    """The MoE GEMVs' word path (gate/up and down) of a case of two tokens against the twin
    (tiles None: the launcher's own, its down tile the word one); a pair's bits alike alone
    and in the batch."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = moe_case(t13, t2, seed, 4, hidden_dim, inter)
    w13, w2 = w13.clone(), w2.clone()  # torch's allocations: 64-byte aligned
    hidden = hidden[:2].to(dtype)
    ids, weights = ids[:2], weights[:2]
    f13, f2 = GGUFFormat(t13), GGUFFormat(t2)
    assert gt.words_allowed(w13, f13.btype, hidden_dim) and gt.words_allowed(w2, f2.btype, inter)
    ref = f13.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, f2)
    if tiles is None:
        assert gt.down_tiles(f2.btype, w2, inter, None, None) == gt._WORDS_GEMV[t2].down
    out = gl.fused_moe(hidden, ids, weights, w13, f13.btype, w2, f2.btype, inter, True, tiles)
    assert_close_words(out, ref, dtype)
    one = gl.fused_moe(hidden[1:], ids[1:], weights[1:], w13, f13.btype, w2, f2.btype, inter,
                       True, tiles)  # fmt: skip
    assert torch.equal(one[0], out[1])


def check_words_bits_do_not_depend_on_ids(gl, name: str, seed: int) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] slot cache
    (its own allocation), `name` gate/up and down: the same word path, the same bits."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = moe_case(name, name, seed, 4, 256, 256)
    hidden, ids, weights, w13, w2 = hidden[:2], ids[:2], weights[:2], w13.clone(), w2.clone()
    bt, tiles = BLOCK_TYPES[name], word_tiles(1, 64, 1)
    base = gl.fused_moe(hidden, ids, weights, w13, bt, w2, bt, inter, True, tiles)
    slot_of = torch.randperm(6, generator=torch.Generator().manual_seed(seed + 1))[:4]
    s13 = torch.zeros(6, *w13.shape[1:], dtype=torch.uint8)
    s2 = torch.zeros(6, *w2.shape[1:], dtype=torch.uint8)
    s13[slot_of], s2[slot_of] = w13, w2
    assert gt.words_allowed(s13, bt, 256) and gt.words_allowed(s2, bt, inter)
    slot_ids = slot_of[ids.long()].to(torch.int32)
    out = gl.fused_moe(hidden, slot_ids, weights, s13, bt, s2, bt, inter, True, tiles)
    assert torch.equal(out, base)


def check_words_switch_linear(gl, monkeypatch, name: str, switch: str, seed: int,
                              offset: int):  # fmt: skip
    """The decode linear of 2 fp16 rows by 12 `name` rows of K = 512 (aligned, allowing
    words): with `switch` off the default tiles are the byte path's, bit for bit; on, the
    word path, again the same bits once back on. A copy `offset` bytes into its storage does
    not allow words: the byte path with the switch on, whatever tile asks for words, within
    the twin's tolerance. Returns (the word output, the byte output); the switch left on."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, dtype, k, n = GGUFFormat(name), torch.float16, 512, 12
    w = block_rows(name, n, k, seed=seed).clone()
    assert gt.words_allowed(w, fmt.btype, k)
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(2, k, generator=g) * 0.1).to(dtype)
    byte_tiles = gt.linear_tiles(2, dtype, fmt.btype, n, words=False)
    assert not byte_tiles.words
    byte = gl.linear(x, w, fmt.btype, None, n, k, tiles=byte_tiles)
    monkeypatch.setattr(gt, switch, True)
    on = gl.linear(x, w, fmt.btype, None, n, k)
    monkeypatch.setattr(gt, switch, False)
    assert not gt.linear_tiles(2, dtype, fmt.btype, n).words
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), byte)
    monkeypatch.setattr(gt, switch, True)
    assert torch.equal(gl.linear(x, w, fmt.btype, None, n, k), on)

    shifted = offset_copy(w, offset)
    assert not gt.words_allowed(shifted, fmt.btype, k)
    for tiles in (None, word_tiles(4, 16, 1)):
        out = gl.linear(x, shifted, fmt.btype, None, n, k, tiles=tiles)
        assert torch.equal(out, byte)
    assert_close_scaled(byte, fmt.reference_linear(x, {"weight": w}, None, n, k), dtype)
    return on, byte
