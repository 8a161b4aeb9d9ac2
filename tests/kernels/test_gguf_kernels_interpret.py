"""The GGUF block kernels (`kernels/gguf_launch.py`) run by Triton's CPU interpreter against
their twins (`GGUFFormat.reference_*`: the `gguf_blocks` dequantizer, then the plain matmul /
MoE) on fresh random valid blocks of every quantized type, with row counts and K that are not
tile multiples; the expert kernels' bits do not depend on which ids address the experts, and
a decode linear row's bits do not depend on the batch. fp32 and fp16 activations (the
interpreter cannot tl.dot bf16)."""

from __future__ import annotations

import pytest
import torch
from gguf_interpret_cases import assert_close_scaled, block_rows, moe_case
from interpreter_child import child_only, interpreter_child_test

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
TYPES = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def _k_for(name: str, blocks: int) -> int:
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    return BLOCK_TYPES[name].block_size * blocks


# each type in one activation dtype, each dtype with a K-quant and 32-blocks
TYPE_DTYPES = [(t, torch.float32 if i % 2 == 0 else torch.float16) for i, t in enumerate(TYPES)]


@child_only
@pytest.mark.parametrize("name,dtype", TYPE_DTYPES, ids=TYPES)
def test_linear_matches_twin(gl, gt, name, dtype) -> None:
    from xinfer.quant.gguf_formats import GGUFFormat

    # K: 3 blocks of 32 (a partial chunk of SUBS=2 sub-blocks) or 2 super-blocks
    k = _k_for(name, 2 if name.endswith("_K") else 3)
    n = 19  # not a multiple of BLOCK_N
    fmt = GGUFFormat(name)
    tensors = {"weight": block_rows(name, n, k, seed=1)}
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(n, generator=g).to(dtype)
    for m, tiles in (
        (5, gt.GGUFTiles(16, 16, 8)),
        (6, gt.GGUFTiles(4, 8, 8)),  # the GEMV form: four rows a program (two programs)
        (37, gt.GGUFTiles(16, 16, 2)),
    ):
        x = (torch.randn(m, k, generator=g) * 0.1).to(dtype)
        ref = fmt.reference_linear(x, tensors, bias, n, k)
        out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
        assert_close_scaled(out, ref, dtype)


@child_only
@pytest.mark.parametrize("name", ["Q4_0", "Q6_K"])
def test_decode_linear_row_bits_do_not_depend_on_the_batch(gl, gt, name) -> None:
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    k, n = _k_for(name, 2 if name.endswith("_K") else 4), 24
    raw = block_rows(name, n, k, seed=3)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(4)).to(torch.float16)
    tiles = gt.linear_tiles(1, torch.float16)
    alone = gl.linear(x[4:5], raw, BLOCK_TYPES[name], None, n, k, tiles=tiles)
    batch = gl.linear(x, raw, BLOCK_TYPES[name], None, n, k, tiles=tiles)
    assert torch.equal(alone[0], batch[4])


def test_decode_tiles_depend_on_the_shape_and_type_only() -> None:
    """The LM-head tiles: Q4_K outputs of at least HEAD_ROWS rows, at every decode batch
    (one tile for M <= DECODE_M keeps a row's bits batch-invariant), the word tile with the
    word path on and the swept byte tile with it off; Q6_K's word tile (one for every decode
    batch) or with it off the general one; not other types/shapes."""
    from xinfer.kernels import gguf_tiles as gt
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    q4k, q6k, bf16 = BLOCK_TYPES["Q4_K"], BLOCK_TYPES["Q6_K"], torch.bfloat16
    for words in (True, False):
        head = {gt.linear_tiles(m, bf16, q4k, gt.HEAD_ROWS, words=words)
                for m in range(1, gt.DECODE_M + 1)}  # fmt: skip
        assert len(head) == 1
        tile = head.pop()
        assert tile.num_warps == 1 and tile.words == words
        assert tile.block_m == (4 if words else 16)
    general = gt.linear_tiles(1, bf16)
    assert gt.linear_tiles(1, bf16, q4k, gt.HEAD_ROWS - 1, words=False) == general
    assert gt.linear_tiles(1, bf16, q6k, gt.HEAD_ROWS, words=False) == general
    assert gt.linear_tiles(1, bf16, BLOCK_TYPES["Q5_K"], gt.HEAD_ROWS) == general
    q6_head = {gt.linear_tiles(m, bf16, q6k, gt.HEAD_ROWS, words=True)
               for m in range(1, gt.DECODE_M + 1)}  # fmt: skip
    assert q6_head == {gt._WORDS_HEAD["Q6_K"]} and gt._WORDS_HEAD["Q6_K"].num_warps == 1
    assert gt.linear_tiles(gt.DECODE_M + 1, bf16, q4k, gt.HEAD_ROWS).block_m > 16
    # below the head: the Q4_K word tile at every decode batch (Q4K_WORDS), one for all M
    words = {gt.linear_tiles(m, bf16, q4k, 5120, words=True) for m in range(1, gt.DECODE_M + 1)}
    assert len(words) == 1 and words.pop().words


@child_only
@pytest.mark.parametrize(
    "name,block_m", [("Q8_0", 4), ("Q4_K", 4), ("Q6_K", 4), ("Q4_K", 16), ("Q6_K", 1)]
)
def test_decode_linear_split_k_matches_twin_and_keeps_row_bits(gl, gt, name, block_m) -> None:
    """K split into several chunks of SUBS * 32 (a partial last split and, for 32-blocks, a
    partial last chunk), on the 16-row dot tile and the GEMV form (block_m 1): the same as
    the twin, bias added once, and a row's bits alike in a batch of 1 and of 9."""
    from xinfer.quant.gguf_formats import GGUFFormat

    k = _k_for(name, 3 if name.endswith("_K") else 13)  # chunks of 64: 12 or 7 (last half)
    n, tiles = 19, gt.GGUFTiles(block_m, 16, 2)
    _, splits = gt.decode_split(1, 2, k, tiles)
    assert splits >= 3
    fmt = GGUFFormat(name)
    tensors = {"weight": block_rows(name, n, k, seed=5)}
    g = torch.Generator().manual_seed(6)
    bias = torch.randn(n, generator=g)
    x = torch.randn(9, k, generator=g) * 0.1
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert_close_scaled(out, fmt.reference_linear(x, tensors, bias, n, k), torch.float32)
    alone = gl.linear(x[4:5], tensors["weight"], fmt.btype, bias, n, k, tiles=tiles)
    assert torch.equal(alone[0], out[4])


PAIRS = [("Q4_K", "Q6_K"), ("Q8_0", "Q5_0"), ("Q5_K", "Q4_0")]


# each pair on both paths, the dtypes alternating: each path runs both dtypes
MOE_CASES = [
    pytest.param(t13, t2, gemv, dtype, id=f"{t13}-{t2}-{'gemv' if gemv else 'grouped'}")
    for i, (t13, t2) in enumerate(PAIRS)
    for gemv, dtype in (
        ((True, torch.float32), (False, torch.float16))
        if i % 2 == 0
        else ((True, torch.float16), (False, torch.float32))
    )
]


@child_only
@pytest.mark.parametrize("t13,t2,use_gemv,dtype", MOE_CASES)
def test_fused_moe_matches_twin(gl, gt, t13, t2, use_gemv, dtype) -> None:
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = moe_case(t13, t2, seed=5)
    hidden = hidden.to(dtype)
    f13, f2 = GGUFFormat(t13), GGUFFormat(t2)
    ref = f13.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, f2)
    tiles = gt.GGUFTiles(1, 32, 8) if use_gemv else gt.GGUFTiles(16, 32, 4)
    out = gl.fused_moe(hidden, ids, weights, w13, f13.btype, w2, f2.btype, inter, use_gemv, tiles)
    assert_close_scaled(out, ref, dtype)


@child_only
def test_q4_k_gemv_over_several_super_blocks_matches_twin(gl, gt) -> None:
    """The Q4_K MoE GEMV in both projections: equal to the twin (gate/up rows of two
    super-blocks, down rows of one), read in chunks of 4 sub-blocks (a chunk's offset inside
    its super-block; whole super-blocks, the default tile, run in test_fused_moe_matches_twin);
    a pair's bits are the same alone and in the batch. (Few programs: the interpreter takes
    ~0.1 s each.)"""
    subs = 4
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = moe_case(
        "Q4_K", "Q4_K", seed=11, hidden_dim=512, inter=256
    )
    fmt = GGUFFormat("Q4_K")
    ref = fmt.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    tiles = gt.GGUFTiles(1, 32, subs, num_warps=2)
    out = gl.fused_moe(hidden, ids, weights, w13, fmt.btype, w2, fmt.btype, inter, True, tiles)
    assert_close_scaled(out, ref, torch.float32)
    one = gl.fused_moe(hidden[1:2], ids[1:2], weights[1:2], w13, fmt.btype, w2, fmt.btype,
                       inter, True, tiles)  # fmt: skip
    assert torch.equal(one[0], out[1])


@child_only
@pytest.mark.parametrize("use_gemv", [True, False], ids=["gemv", "grouped"])
def test_fused_moe_bits_do_not_depend_on_ids(gl, gt, use_gemv) -> None:
    """Expert ids on the [E, ...] set vs slot ids on a permuted, larger [S, ...] set."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = moe_case("Q4_0", "Q8_0", seed=7)
    hidden = hidden.to(torch.float16)
    b13, b2 = BLOCK_TYPES["Q4_0"], BLOCK_TYPES["Q8_0"]
    tiles = gt.GGUFTiles(1, 32, 8) if use_gemv else gt.GGUFTiles(16, 32, 4)
    base = gl.fused_moe(hidden, ids, weights, w13, b13, w2, b2, inter, use_gemv, tiles)
    num_slots = 6
    slot_of = torch.randperm(num_slots, generator=torch.Generator().manual_seed(8))[:4]
    s13 = torch.zeros(num_slots, *w13.shape[1:], dtype=torch.uint8)
    s2 = torch.zeros(num_slots, *w2.shape[1:], dtype=torch.uint8)
    s13[slot_of], s2[slot_of] = w13, w2
    slot_ids = slot_of[ids.long()].to(torch.int32)
    out = gl.fused_moe(hidden, slot_ids, weights, s13, b13, s2, b2, inter, use_gemv, tiles)
    assert torch.equal(out, base)
    # the layer's E as `max_ids`: the grouped path's align numbers the used slots first
    out = gl.fused_moe(hidden, slot_ids, weights, s13, b13, s2, b2, inter, use_gemv, tiles,
                       max_ids=4)  # fmt: skip
    assert torch.equal(out, base)


# --- the prefill path: dequantize to the activation dtype, then the bf16 kernels ----------


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", TYPES)
def test_dequantize_has_the_twin_bits(gl, name, dtype) -> None:
    """The dequant kernel gives each weight the twin's float32 value rounded once to the
    dtype; a range of experts, or ids gathered (a negative id skipped, its rows kept)."""
    from xinfer.quant.gguf_blocks import BLOCK_TYPES, dequantize

    bt = BLOCK_TYPES[name]
    k, n = _k_for(name, 2 if name.endswith("_K") else 9), 37  # 9 blocks: a partial chunk
    experts = block_rows(name, n, k, seed=21, experts=4)
    twin = torch.stack([dequantize(experts[e], bt, k) for e in range(4)]).to(dtype)
    assert torch.equal(gl.dequantize_weight(experts[1], bt, k, dtype), twin[1])
    two = gl.dequantize(experts, bt, k, torch.empty(2, n, k, dtype=dtype), 2)
    assert torch.equal(two, twin[2:])
    out = torch.full((3, n, k), 7.0, dtype=dtype)
    ids = torch.tensor([0, 3, -1, 1], dtype=torch.int32)
    gl.dequantize(experts, bt, k, out, first=1, ids=ids)
    assert torch.equal(out[0], twin[3]) and torch.equal(out[2], twin[1])
    assert (out[1] == 7.0).all()


@child_only
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q5_0"])
def test_prefill_linear_is_the_float_linear_on_the_twin_weight(gl, name) -> None:
    from xinfer.kernels import quant_launch, reference
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, dtype = GGUFFormat(name), torch.float16
    k, n = _k_for(name, 2 if name.endswith("_K") else 5), 19
    tensors = {"weight": block_rows(name, n, k, seed=22)}
    dense = fmt.dequantize(tensors, n, k).to(dtype)
    g = torch.Generator().manual_seed(23)
    bias = torch.randn(n, generator=g).to(dtype)
    x = (torch.randn(3, 7, k, generator=g) * 0.1).to(dtype)  # asked for the prefill path
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, dequant=True)
    assert out.shape == (3, 7, n) and torch.equal(out, reference.linear(x, dense, bias))
    rows = (torch.randn(quant_launch.PREFILL_MIN_ROWS, k, generator=g) * 0.1).to(dtype)
    want = reference.linear(rows, dense, bias)  # the default from PREFILL_MIN_ROWS rows
    assert torch.equal(gl.linear(rows, tensors["weight"], fmt.btype, bias, n, k), want)


@child_only
def test_prefill_linear_of_a_large_weight_runs_in_column_blocks(gl, monkeypatch) -> None:
    """A weight whose dense copy exceeds CHUNK_BYTES (an LM head) is dequantized a block of
    output columns at a time (multiples of 128 rows; the last block shorter), each block the
    float linear on its twin rows."""
    from xinfer.kernels import quant_prefill, reference
    from xinfer.quant.gguf_formats import GGUFFormat

    fmt, dtype, n, k = GGUFFormat("Q8_0"), torch.float16, 300, 64
    tensors = {"weight": block_rows("Q8_0", n, k, seed=27)}
    dense = fmt.dequantize(tensors, n, k).to(dtype)
    g = torch.Generator().manual_seed(28)
    bias = torch.randn(n, generator=g).to(dtype)
    x = (torch.randn(5, k, generator=g) * 0.1).to(dtype)
    monkeypatch.setattr(quant_prefill, "CHUNK_BYTES", 128 * k * 2)  # 128 rows a block
    out = gl.linear(x, tensors["weight"], fmt.btype, bias, n, k, dequant=True)
    blocks = [slice(0, 128), slice(128, 256), slice(256, 300)]
    want = torch.cat([reference.linear(x, dense[b], bias[b]) for b in blocks], dim=1)
    assert torch.equal(out, want)


@child_only
@pytest.mark.parametrize("t13,t2", PAIRS)
def test_prefill_moe_is_the_float_grouped_path_on_twin_weights(gl, t13, t2) -> None:
    """Prefill-sized expert calls (forced here: `dequant=True`) equal the bf16 grouped GEMMs
    on the twin-dequantized experts, bit for bit, w2 in another block type; on a larger
    slot view with a `max_ids` bound, the same bits; each row's bits are its own (a joined
    call over two chunks == the chunks' calls: the merge key's promise)."""
    from xinfer.kernels import moe_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES, dequantize

    dtype = torch.float16
    hidden, ids, weights, w13, w2, inter = moe_case(t13, t2, seed=24)
    hidden = hidden.to(dtype)
    b13, b2 = BLOCK_TYPES[t13], BLOCK_TYPES[t2]
    num_experts, hidden_dim = w13.shape[0], hidden.shape[1]
    d13 = torch.stack([dequantize(w13[e], b13, hidden_dim) for e in range(num_experts)])
    d2 = torch.stack([dequantize(w2[e], b2, inter) for e in range(num_experts)])
    cfg = moe_launch.MoeConfig(block_m=16, block_n=16, block_k=32, num_warps=4)
    ref = moe_launch.fused_moe(hidden, ids, weights, d13.to(dtype), d2.to(dtype), cfg, False)
    run = dict(use_gemv=False, dequant=True, config=cfg)
    out = gl.fused_moe(hidden, ids, weights, w13, b13, w2, b2, inter, **run)
    assert torch.equal(out, ref)

    rows = torch.tensor([9, 2, 30, 17])  # expert → its row of a 32-row view of garbage
    v13 = w13[torch.randint(0, num_experts, (32,), generator=torch.Generator().manual_seed(25))]
    v2 = w2[torch.randint(0, num_experts, (32,), generator=torch.Generator().manual_seed(26))]
    v13[rows], v2[rows] = w13, w2
    view_ids = rows[ids.long()].to(torch.int32)
    on_view = gl.fused_moe(hidden, view_ids, weights, v13, b13, v2, b2, inter, max_ids=4, **run)
    assert torch.equal(on_view, ref)

    parts = [gl.fused_moe(hidden[s], ids[s], weights[s], w13, b13, w2, b2, inter, **run)
             for s in (slice(0, 1), slice(1, 3))]  # fmt: skip
    assert torch.equal(torch.cat(parts), out)
