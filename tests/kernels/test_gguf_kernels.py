"""GPU: the GGUF block kernels compiled for the device equal their twins on random valid blocks
at Qwen3-30B-A3B's expert shapes (and a Qwen1.5 row of 1408 in 32-blocks), in bf16; a decode
linear row's bits do not depend on the batch (1..16 rows), an expert's bits do not depend on
the slot that holds it, and a CUDA graph replays the kernels to the same bits."""

from __future__ import annotations

import gguf_files as gf
import pytest
import torch

from xinfer.kernels import gguf_launch as gl
from xinfer.kernels import gguf_tiles as gt
from xinfer.kernels import reference
from xinfer.quant.gguf_formats import GGUFFormat

pytestmark = pytest.mark.gpu
TYPES = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]
DEV = "cuda"


def _raw(name: str, rows: int, k: int, seed: int, experts: int | None = None) -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts, DEV)


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2) -> None:
    """bf16 outputs against the twin (which rounds the weights to bf16): relative to the
    largest output."""
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=tol)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("m", [1, 7, 16, 300])
def test_linear_matches_twin(name, m) -> None:
    n, k = 2056, 2048  # N not a multiple of any BLOCK_N
    fmt = GGUFFormat(name)
    tensors = {"weight": _raw(name, n, k, seed=1)}
    g = torch.Generator(device=DEV).manual_seed(m)
    x = (torch.randn(m, k, device=DEV, generator=g) * 0.5).to(torch.bfloat16)
    bias = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16)
    _close(fmt.triton_linear(x, tensors, bias, n, k), fmt.reference_linear(x, tensors, bias, n, k))


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0"])
def test_decode_linear_rows_do_not_depend_on_the_batch(name) -> None:
    n, k = 1000, 2048
    raw = _raw(name, n, k, seed=2)
    x = torch.randn(16, k, device=DEV).to(torch.bfloat16)
    fmt = GGUFFormat(name)
    full = fmt.triton_linear(x, {"weight": raw}, None, n, k)
    for m in (1, 3, 8):
        part = fmt.triton_linear(x[:m], {"weight": raw}, None, n, k)
        assert torch.equal(part, full[:m])


def _moe(t13: str, t2: str, num_tokens: int, hidden: int = 2048, inter: int = 768, seed=3):
    num_experts = 16
    w13 = _raw(t13, 2 * inter, hidden, seed, experts=num_experts)
    w2 = _raw(t2, hidden, inter, seed + 1, experts=num_experts)
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(num_tokens, hidden, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
    logits = torch.randn(num_tokens, num_experts, device=DEV, generator=g)
    weights, ids = reference.route_topk(logits, 8, True)
    return x, ids, weights, w13, w2, inter


PAIRS = [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q8_0", "Q8_0"), ("Q5_K", "Q5_0"), ("Q4_0", "Q5_K")]


@pytest.mark.parametrize("t13,t2", PAIRS)
@pytest.mark.parametrize("num_tokens", [1, 5, 200])  # GEMV, GEMV, grouped GEMM
def test_fused_moe_matches_twin(t13, t2, num_tokens) -> None:
    x, ids, weights, w13, w2, inter = _moe(t13, t2, num_tokens)
    f13, f2 = GGUFFormat(t13), GGUFFormat(t2)
    args = (x, ids, weights, {"weight": w13}, {"weight": w2}, inter)
    _close(f13.triton_moe(*args, w2_fmt=f2), f13.reference_moe(*args, w2_fmt=f2))


def test_fused_moe_qwen15_rows_in_32_blocks() -> None:
    """Qwen1.5-MoE's down rows of 1408 (= 44 x 32, not a multiple of 256): Q5_0."""
    x, ids, weights, w13, w2, inter = _moe("Q4_K", "Q5_0", 3, inter=1408)
    f13, f2 = GGUFFormat("Q4_K"), GGUFFormat("Q5_0")
    args = (x, ids, weights, {"weight": w13}, {"weight": w2}, inter)
    _close(f13.triton_moe(*args, w2_fmt=f2), f13.reference_moe(*args, w2_fmt=f2))


def _slot_cache(ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor):
    """`_moe`'s 16 experts scattered over a cache of 24 slots (its own allocation): the slot
    ids of `ids`, and the cache's w13 and w2."""
    slot_of = torch.randperm(24, device=DEV)[:16]
    s13 = torch.zeros(24, *w13.shape[1:], dtype=torch.uint8, device=DEV)
    s2 = torch.zeros(24, *w2.shape[1:], dtype=torch.uint8, device=DEV)
    s13[slot_of], s2[slot_of] = w13, w2
    return slot_of[ids.long()].int(), s13, s2


@pytest.mark.parametrize("num_tokens", [1, 200])
def test_expert_bits_do_not_depend_on_the_slot(num_tokens) -> None:
    x, ids, weights, w13, w2, inter = _moe("Q4_K", "Q6_K", num_tokens)
    b13, b2 = GGUFFormat("Q4_K").btype, GGUFFormat("Q6_K").btype
    base = gl.fused_moe(x, ids, weights, w13, b13, w2, b2, inter)
    slot_ids, s13, s2 = _slot_cache(ids, w13, w2)
    out = gl.fused_moe(x, slot_ids, weights, s13, b13, s2, b2, inter)
    assert torch.equal(out, base)


def _assert_graph_replays(run, x: torch.Tensor) -> None:
    """`run()` (a tuple of outputs) captured in a CUDA graph, replayed on new values of its
    input `x` in the same buffer, gives what an eager call on them gives."""
    eager = run()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    x.mul_(1.5)  # new inputs in the same buffers
    graph.replay()
    torch.cuda.synchronize()
    again = run()
    assert all(torch.equal(a, b) for a, b in zip(captured, again))
    assert not torch.equal(eager[0], again[0])


def test_graph_replays_the_kernels() -> None:
    x, ids, weights, w13, w2, inter = _moe("Q4_K", "Q6_K", 4)
    b13, b2 = GGUFFormat("Q4_K").btype, GGUFFormat("Q6_K").btype
    head = _raw("Q6_K", 4096, 2048, seed=9)
    run = lambda: (  # noqa: E731
        gl.fused_moe(x, ids, weights, w13, b13, w2, b2, inter),
        gl.linear(x, head, b2, None, 4096, 2048),
    )
    _assert_graph_replays(run, x)


# --- the prefill path: dequantize to bf16, then the bf16 kernels ----------------------------


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_has_the_twin_bits(name) -> None:
    """Launched without FMA contraction: each weight is the twin's float32 value, rounded
    once (float32 output: the value itself; bf16: the twin's weight rounded to bf16)."""
    n, k = 1536, 2048
    bt = GGUFFormat(name).btype
    raw = _raw(name, n, k, seed=31, experts=3)
    twin = torch.stack([GGUFFormat(name).dequantize({"weight": raw[e]}, n, k) for e in range(3)])
    out = gl.dequantize(raw, bt, k, torch.empty(3, n, k, device=DEV))
    assert torch.equal(out, twin)
    ids = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
    out16 = torch.zeros(3, n, k, dtype=torch.bfloat16, device=DEV)
    gl.dequantize(raw, bt, k, out16, ids=ids)
    assert torch.equal(out16[0], twin[2].to(torch.bfloat16))
    assert torch.equal(out16[2], twin[0].to(torch.bfloat16)) and not out16[1].any()


@pytest.mark.parametrize("t13,t2", [("Q4_K", "Q6_K"), ("Q8_0", "Q8_0")])
@pytest.mark.parametrize("num_tokens", [520, 2048])  # the 64 x 64 and the large grouped tile
def test_prefill_moe_is_the_bf16_grouped_path_on_dequantized_experts(t13, t2, num_tokens):
    """A prefill-sized call equals moe_launch's grouped GEMMs on the dequantized experts, bit
    for bit, on the expert set and on a larger slot view with `max_ids`; the merge key's
    promise holds (two chunks joined == each chunk's call); a CUDA graph replays it."""
    from xinfer.kernels import moe_launch

    x, ids, weights, w13, w2, inter = _moe(t13, t2, num_tokens)
    f13, f2 = GGUFFormat(t13), GGUFFormat(t2)
    hidden_dim, num_experts = x.shape[1], w13.shape[0]
    d13 = torch.empty(num_experts, 2 * inter, hidden_dim, dtype=x.dtype, device=DEV)
    d2 = torch.empty(num_experts, hidden_dim, inter, dtype=x.dtype, device=DEV)
    gl.dequantize(w13, f13.btype, hidden_dim, d13)
    gl.dequantize(w2, f2.btype, inter, d2)
    args = (x, ids, weights, {"weight": w13}, {"weight": w2}, inter)
    out = f13.triton_moe(*args, w2_fmt=f2)
    assert torch.equal(out, moe_launch.fused_moe(x, ids, weights, d13, d2, use_gemv=False))
    _close(out, f13.reference_moe(*args, w2_fmt=f2))

    rows = torch.randperm(200, device=DEV)[:num_experts]  # a 200-row view, garbage elsewhere
    v13 = w13[torch.randint(0, num_experts, (200,), device=DEV)]
    v2 = w2[torch.randint(0, num_experts, (200,), device=DEV)]
    v13[rows], v2[rows] = w13, w2
    view_ids = rows[ids.long()].int()
    on_view = gl.fused_moe(x, view_ids, weights, v13, f13.btype, v2, f2.btype, inter,
                           max_ids=num_experts)  # fmt: skip
    assert torch.equal(on_view, out)

    # a second chunk of other tokens: joined, each row keeps the bits of its own chunk's call
    x2, ids2, weights2 = x.flip(0) * 0.5, ids.flip(0).contiguous(), weights.flip(0).contiguous()
    pairs = num_tokens * ids.shape[1]
    assert f13.moe_merge_key(pairs, x) == f13.moe_merge_key(2 * pairs, x) is not None
    other = f13.triton_moe(x2, ids2, weights2, {"weight": w13}, {"weight": w2}, inter, w2_fmt=f2)
    joined = f13.triton_moe(torch.cat([x, x2]), torch.cat([ids, ids2]),
                            torch.cat([weights, weights2]), {"weight": w13}, {"weight": w2},
                            inter, w2_fmt=f2)  # fmt: skip
    assert torch.equal(joined, torch.cat([out, other]))

    run = lambda: f13.triton_moe(*args, w2_fmt=f2)  # noqa: E731
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)


def test_prefill_linear_is_cublas_on_the_dequantized_weight() -> None:
    from xinfer import kernels

    n, k = 5120, 2048  # Qwen3-30B-A3B's qkv
    fmt = GGUFFormat("Q4_K")
    raw = _raw("Q4_K", n, k, seed=32)
    x = (torch.randn(1000, k, device=DEV) * 0.5).to(torch.bfloat16)
    dense = gl.dequantize_weight(raw, fmt.btype, k, torch.bfloat16)
    assert torch.equal(fmt.triton_linear(x, {"weight": raw}, None, n, k), kernels.linear(x, dense))


@pytest.mark.parametrize("words", [True, False])
def test_q4_k_head_tile_matches_twin_and_keeps_row_bits(words, monkeypatch) -> None:
    """The one-warp tiles of vocabulary-sized Q4_K outputs (gguf_tiles.HEAD_ROWS): the word
    tile (Q4K_WORDS on, the default) and the swept byte tile."""
    monkeypatch.setattr(gt, "Q4K_WORDS", words)
    n, k = gt.HEAD_ROWS, 2048
    fmt = GGUFFormat("Q4_K")
    raw = _raw("Q4_K", n, k, seed=33)
    tiles = gt.linear_tiles(1, torch.bfloat16, fmt.btype, n)
    assert tiles.num_warps == 1 and tiles.words == words
    assert gt.q4k_words(raw, fmt.btype, k)
    x = (torch.randn(8, k, device=DEV) * 0.5).to(torch.bfloat16)
    batch = fmt.triton_linear(x, {"weight": raw}, None, n, k)
    _close(batch, fmt.reference_linear(x, {"weight": raw}, None, n, k))
    assert torch.equal(fmt.triton_linear(x[3:4], {"weight": raw}, None, n, k)[0], batch[3])


# --- the Q4_K word path (gguf_tiles.Q4K_WORDS: factored sums, not the twin's bits) --------


@pytest.fixture
def words_on(monkeypatch):
    """The Q4_K word path switched on (`gguf_tiles.Q4K_WORDS`; the default since 2026-12-07)."""
    monkeypatch.setattr(gt, "Q4K_WORDS", True)


def test_q4k_words_are_the_decode_tiles_when_on(words_on) -> None:
    """Q4_K decode GEMVs (MoE and the decode linear) take the word tiles with the switch on, and the
    weights these tests draw (fresh allocations) allow them."""
    fmt = GGUFFormat("Q4_K")
    assert gt.gemv_tiles(torch.bfloat16, fmt.btype).words
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, 5120).words
    assert gt.q4k_words(_raw("Q4_K", 64, 2048, seed=40, experts=2), fmt.btype, 2048)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_q4k_words_moe_matches_twin_and_the_byte_path(dtype, num_tokens, monkeypatch, words_on):
    """Qwen3-30B-A3B's expert shapes (H 2048, I 768: down K = 3 super-blocks) in Q4_K: the
    word path within the twin's tolerance as the byte path is; a token's bits alike alone
    and in the batch."""
    x, ids, weights, w13, w2, inter = _moe("Q4_K", "Q4_K", num_tokens, seed=41)
    # random blocks' scales give outputs of ~4e4, past float16's range (the twin's too: inf,
    # then nan in the comparison, on an H100 in the thirty-first session); 1/64 of x keeps
    # them in range, an exact scaling
    x = (x / 64 if dtype == torch.float16 else x).to(dtype)
    fmt = GGUFFormat("Q4_K")
    bt = fmt.btype
    assert gt.q4k_words(w13, bt, x.shape[1]) and gt.q4k_words(w2, bt, inter)
    ref = fmt.reference_moe(x, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    out = gl.fused_moe(x, ids, weights, w13, bt, w2, bt, inter)
    _close(out, ref)
    last = num_tokens - 1
    alone = gl.fused_moe(x[last:], ids[last:], weights[last:], w13, bt, w2, bt, inter)
    assert torch.equal(alone[0], out[last])
    monkeypatch.setattr(gt, "Q4K_WORDS", False)
    _close(gl.fused_moe(x, ids, weights, w13, bt, w2, bt, inter), ref)


def _assert_words_moe(monkeypatch, t13: str, t2: str, switch: str, dtype, num_tokens: int,
                      seed: int) -> None:  # fmt: skip
    """The MoE GEMVs with the word path `switch` on: both weights allow words, the output is
    within the twin's tolerance as the byte path's (the switch off) is; the last token's
    bits alike alone and in the batch."""
    x, ids, weights, w13, w2, inter = _moe(t13, t2, num_tokens, seed=seed)
    x = (x / 64 if dtype == torch.float16 else x).to(dtype)  # float16's range (Q4_K's test)
    f13, f2 = GGUFFormat(t13), GGUFFormat(t2)
    assert gt.words_allowed(w2, f2.btype, inter)
    assert t13 != t2 or gt.words_allowed(w13, f13.btype, x.shape[1])
    ref = f13.reference_moe(x, ids, weights, {"weight": w13}, {"weight": w2}, inter, f2)
    out = gl.fused_moe(x, ids, weights, w13, f13.btype, w2, f2.btype, inter)
    _close(out, ref)
    last = num_tokens - 1
    alone = gl.fused_moe(x[last:], ids[last:], weights[last:], w13, f13.btype, w2, f2.btype,
                         inter)  # fmt: skip
    assert torch.equal(alone[0], out[last])
    monkeypatch.setattr(gt, switch, False)
    byte = gl.fused_moe(x, ids, weights, w13, f13.btype, w2, f2.btype, inter)
    _close(byte, ref)
    _close(out, byte)


def _word_linear_keeps_row_bits(name: str, n: int, k: int, seed: int):
    """The decode linear on `name` rows that allow words, bf16 x of 16 rows: within the
    twin's tolerance, a row's bits alike in batches of 1, 3, 8 and 16. Returns the output of
    the 16 rows and `run(m)`, the linear of the first m rows."""
    fmt = GGUFFormat(name)
    raw = _raw(name, n, k, seed=seed)
    assert gt.words_allowed(raw, fmt.btype, k)
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    x = (torch.randn(16, k, device=DEV, generator=g) * 0.5).to(torch.bfloat16)
    bias = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16)
    run = lambda m: fmt.triton_linear(x[:m], {"weight": raw}, bias, n, k)  # noqa: E731
    full = run(16)
    _close(full, fmt.reference_linear(x, {"weight": raw}, bias, n, k))
    for m in (1, 3, 8):
        assert torch.equal(run(m), full[:m])
    return full, run


@pytest.mark.parametrize("n,k", [(2056, 2048), (2048, 4096)])  # an N tail; K split in programs
def test_q4k_words_linear_matches_twin_and_keeps_row_bits(n, k, words_on) -> None:
    """The decode linear's word path: within the twin's tolerance; a row's bits alike in
    batches of 1, 3, 8 and 16 (one build for every row count: on an H100 a build for one row
    alone gave one output of 2,048 other bits at 2048 x 4096, seen through the bias)."""
    _word_linear_keeps_row_bits("Q4_K", n, k, seed=42)


def _assert_words_slot_bits(t13: str, t2: str, seed: int) -> None:
    """The MoE GEMVs' outputs bit for bit alike with the experts in their stack and in a slot
    cache addressed by slot ids; the slot cache's down weights (and gate/up where both are
    one type) allow the word path."""
    x, ids, weights, w13, w2, inter = _moe(t13, t2, 3, seed=seed)
    b13, b2 = GGUFFormat(t13).btype, GGUFFormat(t2).btype
    base = gl.fused_moe(x, ids, weights, w13, b13, w2, b2, inter)
    slot_ids, s13, s2 = _slot_cache(ids, w13, w2)
    assert gt.words_allowed(s2, b2, inter)
    assert t13 != t2 or gt.words_allowed(s13, b13, x.shape[1])
    out = gl.fused_moe(x, slot_ids, weights, s13, b13, s2, b2, inter)
    assert torch.equal(out, base)


def test_q4k_words_expert_bits_do_not_depend_on_the_slot(words_on) -> None:
    _assert_words_slot_bits("Q4_K", "Q4_K", seed=44)


def _assert_decode_graph_replays(name: str, seed: int) -> None:
    """One token's MoE layer and a qkv linear (5120 x 2048), all `name`, in a CUDA graph."""
    x, ids, weights, w13, w2, inter = _moe(name, name, 1, seed=seed)
    bt = GGUFFormat(name).btype
    qkv = _raw(name, 5120, 2048, seed=seed + 1)
    run = lambda: (  # noqa: E731
        gl.fused_moe(x, ids, weights, w13, bt, w2, bt, inter),
        gl.linear(x, qkv, bt, None, 5120, 2048),
    )
    _assert_graph_replays(run, x)


def test_q4k_words_graph_replays_the_kernels(words_on) -> None:
    _assert_decode_graph_replays("Q4_K", seed=45)


def _assert_misaligned_takes_the_byte_path(monkeypatch, name: str, switch: str, offset: int,
                                           seed: int) -> None:  # fmt: skip
    """1000 `name` rows of K = 2048 copied `offset` bytes into their storage, which does not
    allow words: within the twin's tolerance, and the bits of `switch` off on that storage."""
    fmt = GGUFFormat(name)
    n, k = 1000, 2048
    raw = _raw(name, n, k, seed=seed)
    shifted = torch.empty(raw.numel() + offset, dtype=torch.uint8, device=DEV)[offset:]
    shifted = shifted.view(raw.shape)
    shifted.copy_(raw)
    assert not gt.words_allowed(shifted, fmt.btype, k)
    x = (torch.randn(2, k, device=DEV) * 0.5).to(torch.bfloat16)
    out = fmt.triton_linear(x, {"weight": shifted}, None, n, k)
    _close(out, fmt.reference_linear(x, {"weight": raw}, None, n, k))
    monkeypatch.setattr(gt, switch, False)
    assert torch.equal(out, fmt.triton_linear(x, {"weight": shifted}, None, n, k))


def test_q4k_words_misaligned_weights_take_the_byte_path(monkeypatch, words_on) -> None:
    """Rows 4 bytes into their storage cannot load 16 bytes at a time: the byte path (the
    switch off gives the same bits on the same storage), within the twin's tolerance. (Not
    the bits of the aligned copy: the compiled byte kernel differs with the base's alignment
    and so, on an H100, did its bits — thirty-first session.)"""
    _assert_misaligned_takes_the_byte_path(monkeypatch, "Q4_K", "Q4K_WORDS", offset=4, seed=47)


# --- the Q6_K word path (gguf_tiles.Q6K_WORDS: factored sums, not the twin's bits) --------


@pytest.fixture
def q6k_words_on(monkeypatch):
    """The Q6_K word path switched on (`gguf_tiles.Q6K_WORDS`)."""
    monkeypatch.setattr(gt, "Q6K_WORDS", True)


def test_q6k_words_are_the_decode_tiles_when_on(q6k_words_on) -> None:
    """Q6_K decode GEMVs (MoE, the decode linear, the LM head) take the word tiles with the
    switch on; a Q4_K_M layer's Q6_K down (630-byte rows at I = 768) allows them."""
    fmt = GGUFFormat("Q6_K")
    assert gt.gemv_tiles(torch.bfloat16, fmt.btype).words
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, 5120).words
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, gt.HEAD_ROWS).words
    assert gt.q6k_words(_raw("Q6_K", 64, 768, seed=50, experts=2), fmt.btype, 768)


@pytest.mark.parametrize("t13", ["Q6_K", "Q4_K"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_q6k_words_moe_matches_twin_and_the_byte_path(t13, dtype, num_tokens, monkeypatch,
                                                      q6k_words_on):  # fmt: skip
    """Qwen3-30B-A3B's expert shapes with Q6_K down (K = 768: 630-byte rows, 2-aligned), and
    Q6_K or Q4_K (a Q4_K_M layer) gate/up: the word path within the twin's tolerance as the
    byte path is; a token's bits alike alone and in the batch."""
    _assert_words_moe(monkeypatch, t13, "Q6_K", "Q6K_WORDS", dtype, num_tokens, seed=51)


@pytest.mark.parametrize("name,switch,seed", [("Q6_K", "Q6K_WORDS", 52), ("Q8_0", "Q80_WORDS", 62)])
@pytest.mark.parametrize("n,k", [(2056, 2048), (2048, 4096), (gt.HEAD_ROWS, 2048)])
def test_words_linear_matches_twin_and_keeps_row_bits(name, switch, seed, n, k, monkeypatch):
    """The decode linear's (and the LM head's) Q6_K and Q8_0 word paths (`switch` on): within
    the twin's tolerance and the byte path's; a row's bits alike in batches of 1, 3, 8 and
    16."""
    monkeypatch.setattr(gt, switch, True)
    full, run = _word_linear_keeps_row_bits(name, n, k, seed=seed)
    monkeypatch.setattr(gt, switch, False)
    _close(full, run(16))


def test_q6k_words_expert_bits_do_not_depend_on_the_slot(q6k_words_on) -> None:
    _assert_words_slot_bits("Q4_K", "Q6_K", seed=54)


def test_q6k_words_graph_replays_the_kernels(q6k_words_on) -> None:
    _assert_decode_graph_replays("Q6_K", seed=55)


def test_q6k_words_misaligned_weights_take_the_byte_path(monkeypatch, q6k_words_on) -> None:
    """Rows 1 byte into their storage cannot load 16 bits at a time: the byte path (the
    switch off gives the same bits on the same storage), within the twin's tolerance."""
    _assert_misaligned_takes_the_byte_path(monkeypatch, "Q6_K", "Q6K_WORDS", offset=1, seed=57)


# --- the Q8_0 word path (gguf_tiles.Q80_WORDS: factored sums, not the twin's bits) --------


@pytest.fixture
def q80_words_on(monkeypatch):
    """The Q8_0 word path switched on (`gguf_tiles.Q80_WORDS`, off until these tests pass)."""
    monkeypatch.setattr(gt, "Q80_WORDS", True)


def test_q80_words_are_the_decode_tiles_when_on(q80_words_on) -> None:
    """Q8_0 decode GEMVs (MoE, the decode linear, the LM head) take the word tiles with the
    switch on; expert rows of K = 768 (816 bytes) and 2048 allow them."""
    fmt = GGUFFormat("Q8_0")
    assert gt.gemv_tiles(torch.bfloat16, fmt.btype).words
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, 5120).words
    assert gt.linear_tiles(1, torch.bfloat16, fmt.btype, gt.HEAD_ROWS).words
    assert gt.q80_words(_raw("Q8_0", 64, 768, seed=60, experts=2), fmt.btype, 768)
    assert gt.q80_words(_raw("Q8_0", 64, 2048, seed=60, experts=2), fmt.btype, 2048)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_q80_words_moe_matches_twin_and_the_byte_path(dtype, num_tokens, monkeypatch,
                                                      q80_words_on):  # fmt: skip
    """Qwen3-30B-A3B's expert shapes in Q8_0 (gate/up K = 2048, down K = 768: 816-byte
    rows): the word path within the twin's tolerance as the byte path is; a token's bits
    alike alone and in the batch."""
    _assert_words_moe(monkeypatch, "Q8_0", "Q8_0", "Q80_WORDS", dtype, num_tokens, seed=61)


def test_q80_words_expert_bits_do_not_depend_on_the_slot(q80_words_on) -> None:
    _assert_words_slot_bits("Q8_0", "Q8_0", seed=63)


def test_q80_words_graph_replays_the_kernels(q80_words_on) -> None:
    _assert_decode_graph_replays("Q8_0", seed=64)


def test_q80_words_misaligned_weights_take_the_byte_path(monkeypatch, q80_words_on) -> None:
    """Rows 4 bytes into their storage cannot load aligned 64-bit words: the byte path (the
    switch off gives the same bits on the same storage), within the twin's tolerance."""
    _assert_misaligned_takes_the_byte_path(monkeypatch, "Q8_0", "Q80_WORDS", offset=4, seed=65)
