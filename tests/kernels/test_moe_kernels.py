"""Triton MoE kernels on CUDA against `kernels/reference.py` (also on CUDA): fused_moe on the
decode (GEMV) and prefill (grouped GEMM) paths, the placement-independence of its bits, CUDA
graph capture, route_topk, silu_and_mul and sigmoid_gated_add. All `gpu`: skipped without CUDA.

Tolerances: fp32 1e-4 relative (both sides accumulate in fp32, only the order differs).
bf16/fp16 compare relative to the output's scale: the reference (cuBLAS) and the kernel round
the same fp32 sums, but a different accumulation order flips the last bit of some gate/up
values (bf16 ulp = 2^-8 = 0.4%), which SiLU*up and the down GEMM carry on: 2e-2 of max|ref|
elementwise and 1e-2 in norm leave ~3x margin over the ~3e-3 this produces."""

from __future__ import annotations

import pytest
import torch

from xinfer.kernels import reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def ml():
    pytest.importorskip("triton")
    from xinfer.kernels import moe_launch

    return moe_launch


@pytest.fixture
def ma():
    pytest.importorskip("triton")
    from xinfer.kernels import moe_align

    return moe_align


def _inputs(num_tokens, top_k, hidden_dim, inter_dim, num_experts, dtype, seed=0):
    g = torch.Generator(DEV).manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_dim, generator=g, device=DEV).to(dtype)
    w13 = torch.randn(num_experts, 2 * inter_dim, hidden_dim, generator=g, device=DEV)
    w2 = torch.randn(num_experts, hidden_dim, inter_dim, generator=g, device=DEV)
    logits = torch.randn(num_tokens, num_experts, generator=g, device=DEV)
    weights, ids = reference.route_topk(logits, top_k, renormalize=True)
    w13 = (w13 / hidden_dim**0.5).to(dtype)
    w2 = (w2 / inter_dim**0.5).to(dtype)
    return hidden, ids, weights, w13, w2


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = 1e-4 if ref.dtype == torch.float32 else 2e-2
    out, ref = out.float(), ref.float()
    scale = ref.abs().max().item()
    if tol == 1e-4:
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol * scale)
        return
    err = (out - ref).abs().max().item()
    rel_norm = ((out - ref).norm() / ref.norm()).item()
    assert err <= tol * scale and rel_norm <= tol / 2, (err, scale, rel_norm)


# (T, k, H, I, E): decode GEMV sizes (T*k <= 64), grouped with BLOCK_M 16 (<= 1024 pairs)
# and BLOCK_M 64; H, I, T off every block multiple; the last is the Qwen3-30B-A3B shape
SHAPES = [
    (1, 8, 200, 72, 16),
    (7, 4, 129, 51, 9),
    (33, 8, 200, 88, 16),
    (257, 4, 136, 72, 12),
    (301, 8, 264, 100, 32),
    (1, 8, 2048, 768, 128),
    (512, 8, 2048, 768, 128),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_moe_matches_reference(ml, shape, dtype) -> None:
    args = _inputs(*shape, dtype=dtype)
    _check(ml.fused_moe(*args), reference.fused_moe(*args))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_gemv", [True, False])
def test_both_paths_on_one_size(ml, dtype, use_gemv) -> None:
    args = _inputs(5, 8, 200, 72, 16, dtype=dtype)
    _check(ml.fused_moe(*args, use_gemv=use_gemv), reference.fused_moe(*args))


def test_launcher_dispatches_to_triton(ml) -> None:
    from xinfer import kernels

    args = _inputs(3, 2, 64, 32, 4, torch.bfloat16)
    assert torch.equal(kernels.fused_moe(*args), ml.fused_moe(*args))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_tokens", [1, 6, 33, 300])
@pytest.mark.parametrize("num_slots", [24, 96, 200])
def test_fused_moe_bits_do_not_depend_on_ids(ml, num_tokens, num_slots, dtype) -> None:
    """Expert ids on [E, ...] vs slot ids on a permuted [S, ...] set: bitwise equal."""
    num_experts, top_k = 128, 8
    hidden, _, weights, w13, w2 = _inputs(num_tokens, top_k, 256, 96, num_experts, dtype)
    g = torch.Generator(DEV).manual_seed(7)
    used = torch.randperm(num_experts, generator=g, device=DEV)[: min(num_slots, num_experts)]
    pick = torch.randint(0, len(used), (num_tokens, top_k), generator=g, device=DEV)
    ids = used[pick].to(torch.int32)
    slot_of = torch.full((num_experts,), -1, dtype=torch.long, device=DEV)
    slot_of[used] = torch.randperm(num_slots, generator=g, device=DEV)[: len(used)]
    w13_slots = torch.randn(num_slots, *w13.shape[1:], generator=g, device=DEV).to(dtype)
    w2_slots = torch.randn(num_slots, *w2.shape[1:], generator=g, device=DEV).to(dtype)
    w13_slots[slot_of[used]] = w13[used]
    w2_slots[slot_of[used]] = w2[used]
    slot_ids = slot_of[ids.long()].to(torch.int32)
    out_e = ml.fused_moe(hidden, ids, weights, w13, w2)
    out_s = ml.fused_moe(hidden, slot_ids, weights, w13_slots, w2_slots)
    assert torch.equal(out_e, out_s)


@pytest.mark.parametrize("num_tokens", [1, 8, 32])
def test_fused_moe_in_cuda_graph(ml, num_tokens) -> None:
    """Decode sizes must capture (no host sync) and replay with new routing."""
    hidden, ids, weights, w13, w2 = _inputs(num_tokens, 8, 256, 96, 64, torch.bfloat16)
    static = [hidden.clone(), ids.clone(), weights.clone()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ml.fused_moe(*static, w13, w2)  # warm-up compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ml.fused_moe(*static, w13, w2)
    new_hidden, new_ids, new_weights, _, _ = _inputs(num_tokens, 8, 256, 96, 64, torch.bfloat16, 3)
    for dst, src in zip(static, (new_hidden, new_ids, new_weights)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ml.fused_moe(new_hidden, new_ids, new_weights, w13, w2))


@pytest.mark.parametrize("num_ids", [128, 1024, 2048])
def test_align_pairs_sort_equals_kernel_and_captures(ma, num_ids) -> None:
    """The sort path (prefill-sized calls: 16384 pairs, offload views of up to 2048 rows)
    gives the kernel's outputs bit for bit, captures in a CUDA graph (no host sync) and
    replays with new ids."""
    g = torch.Generator(DEV).manual_seed(num_ids)
    ids = torch.randint(-1, num_ids, (2048, 8), generator=g, device=DEV).to(torch.int32)
    kernel = ma.align_pairs(ids, num_ids, 64, method="kernel")
    sort = ma.align_pairs(ids, num_ids, 64, method="sort")
    for a, b in zip(kernel, sort, strict=True):
        assert torch.equal(a, b)
    static = ids.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ma.align_pairs(static, num_ids, 64, method="sort")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ma.align_pairs(static, num_ids, 64, method="sort")
    static.copy_(torch.randint(0, num_ids, (2048, 8), generator=g, device=DEV))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, ma.align_pairs(static, num_ids, 64, method="kernel"), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("num_tokens,block_m", [(9, 16), (64, 16), (511, 64)])
@pytest.mark.parametrize("view_rows", [1000, 3338])
def test_align_pairs_numbered_on_a_view_equals_sort_and_captures(
    ma, num_tokens, block_m, view_rows
) -> None:
    """Decode batches (k=8) on an offload slot view, `max_ids` the layer's 128 experts: the
    kernel numbering the used rows first gives the sort's outputs below num_rows and the
    unnumbered kernel's everywhere its shorter outputs reach, captures in a CUDA graph (no
    host sync) and replays with new ids."""

    def view_ids(seed: int) -> torch.Tensor:
        g = torch.Generator(DEV).manual_seed(seed)
        rows = torch.randperm(view_rows, generator=g, device=DEV)[:128]
        ids = rows[torch.randint(0, 128, (num_tokens, 8), generator=g, device=DEV)]
        ids[0, 1] = -1  # a left-out pair
        return ids.to(torch.int32)

    def check(got, ids) -> None:
        sort = ma.align_pairs(ids, view_rows, block_m, method="sort")
        kernel = ma.align_pairs(ids, view_rows, block_m, method="kernel")
        num_rows = sort[2].item()
        assert torch.equal(got[2], sort[2]) and torch.equal(got[2], kernel[2])
        assert torch.equal(got[0][:num_rows], sort[0][:num_rows])
        assert torch.equal(got[1][: num_rows // block_m], sort[1][: num_rows // block_m])
        assert torch.equal(got[0], kernel[0][: got[0].numel()])
        assert torch.equal(got[1], kernel[1][: got[1].numel()])

    ids = view_ids(view_rows + num_tokens)
    assert ma._numbered_bound(view_rows, ids.numel(), 128) > 0  # the numbered kernel runs
    check(ma.align_pairs(ids, view_rows, block_m, method="kernel", max_ids=128), ids)
    static = ids.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ma.align_pairs(static, view_rows, block_m, method="kernel", max_ids=128)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ma.align_pairs(static, view_rows, block_m, method="kernel", max_ids=128)
    static.copy_(view_ids(view_rows + num_tokens + 1))
    graph.replay()
    torch.cuda.synchronize()
    check(captured, static)


@pytest.mark.parametrize(
    "num_pairs,num_ids,block_m,max_ids",
    [
        (16384, 128, 64, None),  # a 2048-token chunk at top-8: 3 launches
        (65536, 128, 128, None),  # a joined 8k-token prompt call: 4 launches (512 x 128 counts)
        (4095, 3338, 16, None),  # an offload slot view, unnumbered: 4 launches
        (4095, 3338, 64, 128),  # ... with the layer's 128 experts as max_ids
    ],
)
def test_align_pairs_count_equals_sort_and_captures(
    ma, num_pairs, num_ids, block_m, max_ids
) -> None:
    """The counting sort (`triton/moe_sort.py`) gives the torch sort's outputs bit for bit
    (all of them; with `max_ids` its shorter outputs, and the numbered kernel's in full),
    captures in a CUDA graph (no host sync) and replays with new ids."""

    def make_ids(seed: int) -> torch.Tensor:
        g = torch.Generator(DEV).manual_seed(seed)
        used = max_ids or num_ids
        rows = torch.randperm(num_ids, generator=g, device=DEV)[:used]
        ids = rows[torch.randint(0, used, (num_pairs,), generator=g, device=DEV)]
        ids[torch.randint(0, num_pairs, (num_pairs // 8,), generator=g, device=DEV)] = -1
        return ids.to(torch.int32).view(num_pairs, 1)

    def check(got, ids) -> None:
        sort = ma.align_pairs(ids, num_ids, block_m, method="sort")
        assert torch.equal(got[2], sort[2])
        if max_ids is None:
            assert got[0].numel() == sort[0].numel() and got[1].numel() == sort[1].numel()
        assert torch.equal(got[0], sort[0][: got[0].numel()])
        assert torch.equal(got[1], sort[1][: got[1].numel()])
        if max_ids is not None:
            kernel = ma.align_pairs(ids, num_ids, block_m, method="kernel", max_ids=max_ids)
            for a, b in zip(got, kernel, strict=True):
                assert torch.equal(a, b)

    args = (num_ids, block_m)
    ids = make_ids(num_pairs + num_ids)
    check(ma.align_pairs(ids, *args, method="count", max_ids=max_ids), ids)
    static = ids.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ma.align_pairs(static, *args, method="count", max_ids=max_ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ma.align_pairs(static, *args, method="count", max_ids=max_ids)
    static.copy_(make_ids(num_pairs + num_ids + 1))
    graph.replay()
    torch.cuda.synchronize()
    check(captured, static)


@pytest.mark.parametrize("num_experts,top_k", [(8, 2), (60, 4), (128, 8), (512, 10), (7, 7)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_matches_reference(ml, num_experts, top_k, renormalize) -> None:
    g = torch.Generator(DEV).manual_seed(num_experts)
    logits = torch.randn(67, num_experts, generator=g, device=DEV)
    weights, ids = ml.route_topk(logits, top_k, renormalize)
    ref_w, ref_ids = reference.route_topk(logits, top_k, renormalize)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_route_topk_half_logits(ml, dtype) -> None:
    # distinct values: random half-precision logits have exact ties, where torch.topk's
    # order is unspecified (the kernel takes the lowest index)
    g = torch.Generator(DEV).manual_seed(1)
    logits = torch.stack([torch.randperm(64, generator=g, device=DEV) for _ in range(9)])
    logits = (logits * 0.05 - 1.6).to(dtype)
    weights, ids = ml.route_topk(logits, 6, True)
    ref_w, ref_ids = reference.route_topk(logits, 6, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1536), (37, 2 * 1111), (4, 3, 2 * 768)])
def test_silu_and_mul_matches_reference(ml, shape, dtype) -> None:
    x = (torch.randn(*shape, device=DEV) * 3).to(dtype)
    out, ref = ml.silu_and_mul(x), reference.silu_and_mul(x)
    assert out.shape == ref.shape and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    else:  # elementwise, same rounding steps: at most one ulp apart (exp differs slightly)
        torch.testing.assert_close(out, ref, rtol=8e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gated_add_computing_its_gate_matches_reference(ml, dtype) -> None:
    """The shared-expert gate's dot product inside the add (Qwen3.5 widths): within a
    rounding of the gate of cuBLAS's linear then the three ops; row bits batch-invariant."""
    base, x = (torch.randn(37, 2048, device=DEV).to(dtype) for _ in range(2))
    gate_in = torch.randn(37, 2048, device=DEV).to(dtype)
    gate_w = (torch.randn(1, 2048, device=DEV) / 16).to(dtype)
    out = ml.sigmoid_gated_add(base, gate_in, x, gate_weight=gate_w)
    ref = reference.sigmoid_gated_add(base, reference.linear(gate_in, gate_w), x)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:  # a gate one ulp apart moves sigmoid by <= 0.25 ulp * |gate|: scaled by |x|
        err = (out.float() - ref.float()).abs().max().item()
        assert err <= 2e-2 * x.float().abs().max().item(), err
    alone = ml.sigmoid_gated_add(base[5:6], gate_in[5:6], x[5:6], gate_weight=gate_w)
    assert torch.equal(alone[0], out[5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gated_add_matches_reference(ml, dtype) -> None:
    base, x = (torch.randn(37, 2048, device=DEV).to(dtype) for _ in range(2))
    gate = (torch.randn(37, 1, device=DEV) * 3).to(dtype)
    out, ref = ml.sigmoid_gated_add(base, gate, x), reference.sigmoid_gated_add(base, gate, x)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    else:  # the reference's three roundings, same order: at most an ulp apart (exp differs)
        torch.testing.assert_close(out, ref, rtol=8e-3, atol=1e-3)
