"""Triton RMSNorm, RoPE, KV store and paged attention (decode, split-K, prefill, chunked
prefill, CUDA graph replay) against their `kernels/reference.py` twins on fresh random data.

Tolerances: RoPE, KV store and the residual sum are bit-exact; RMSNorm differs by the
float32 sum order and rsqrt (1 ulp of the dtype); attention by the softmax accumulation order
and, in bf16, by rounding P to bf16 before P @ V (atol = rtol = 2e-2)."""

from __future__ import annotations

import pytest
import torch

from xinfer import kernels
from xinfer.kernels import reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(autouse=True)
def _triton_or_skip(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("XINFER_DISABLE_TRITON", raising=False)
    torch.manual_seed(0)


def _launch():
    from xinfer.kernels import attn_launch

    return attn_launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens, hidden", [(1, 2048), (37, 1000), (300, 4096)])
def test_rms_norm(dtype, num_tokens, hidden):
    x = torch.randn(num_tokens, hidden, device=DEV, dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=DEV, dtype=dtype)
    ulp = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **ulp)
    out, new_res = kernels.rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = reference.rms_norm(x, w, 1e-6, res)
    assert torch.equal(new_res, ref_res)
    torch.testing.assert_close(out, ref_out, **ulp)


def test_rms_norm_strided_heads():
    """Qwen3 q_norm: per-head norm of a (T, Hq, D) view into the fused qkv output."""
    qkv = torch.randn(45, (32 + 8) * 128, device=DEV, dtype=torch.bfloat16)
    q = qkv[:, : 32 * 128].view(45, 32, 128)
    w = torch.randn(128, device=DEV, dtype=torch.bfloat16)
    got = kernels.rms_norm(q, w, 1e-6)
    torch.testing.assert_close(got, reference.rms_norm(q, w, 1e-6), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 37, 1000])
@pytest.mark.parametrize("heads, head_dim", [((32, 4), 128), ((8, 8), 80), ((16, 2), 64)])
def test_rope(dtype, num_tokens, heads, head_dim):
    hq, hk = heads
    qkv = torch.randn(num_tokens, (hq + 2 * hk) * head_dim, device=DEV, dtype=dtype)
    q = qkv[:, : hq * head_dim].view(num_tokens, hq, head_dim)  # strided views, like the model
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(num_tokens, hk, head_dim)
    cos_sin = torch.randn(4096, head_dim, device=DEV)
    pos = torch.randint(0, 4096, (num_tokens,), device=DEV)
    got_q, got_k = kernels.apply_rope(q, k, pos, cos_sin)
    ref_q, ref_k = reference.apply_rope(q, k, pos, cos_sin)
    # bf16: the kernel may fuse q*cos + rot(q)*sin (one rounding) where torch rounds each
    # product; seen on the H200 (2026-12-02) as last-bit differences. One bf16 ulp is 2^-7
    # relative; |q*cos| here reaches ~10, hence the absolute term.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=8e-3)
    torch.testing.assert_close(got_q, ref_q, **tol)
    torch.testing.assert_close(got_k, ref_k, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv(dtype):
    num_tokens, hk, d, nb, bs = 37, 4, 128, 20, 16
    k_cache = torch.randn(nb, bs, hk, d, device=DEV, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    kv = torch.randn(num_tokens, 2 * hk * d, device=DEV, dtype=dtype)
    k, v = kv[:, : hk * d].view(-1, hk, d), kv[:, hk * d :].view(-1, hk, d)
    slots = torch.randperm(nb * bs, device=DEV)[:num_tokens]
    slots[::5] = -1  # padding tokens write nothing
    got_k, got_v = k_cache.clone(), v_cache.clone()
    kernels.store_kv(k, v, got_k, got_v, slots)
    reference.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(got_k, k_cache) and torch.equal(got_v, v_cache)


def _paged_case(dtype, seq_lens, query_lens, hq, hk, head_dim=128, block_size=16):
    """Random caches and non-contiguous block tables (a random permutation of the blocks)."""
    max_blocks = max((s + block_size - 1) // block_size for s in seq_lens) + 2
    num_blocks = len(seq_lens) * max_blocks + 7
    k_cache = torch.randn(num_blocks, block_size, hk, head_dim, device=DEV, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks, device=DEV)[: len(seq_lens) * max_blocks]
    block_tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    q = torch.randn(sum(query_lens), hq, head_dim, device=DEV, dtype=dtype)
    qsl = torch.tensor([0, *query_lens], device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, lens, qsl


GQA = [(8, 8), (16, 4), (32, 4)]  # ratios 1, 4, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, hk", GQA)
@pytest.mark.parametrize("split_len", [None, 64, 300])
def test_decode_attention(dtype, hq, hk, split_len):
    seq_lens = [1, 17, 1000, 0, 2100, 129]  # 0 = a graph padding row: must come back zeros
    case = _paged_case(dtype, seq_lens, [1] * len(seq_lens), hq, hk)
    ref = reference.paged_attention(*case, scale=0.088)
    got = _launch().paged_attention(
        *case, scale=0.088, max_query_len=1, max_seq_len=2100, split_len=split_len
    )
    torch.testing.assert_close(got, ref, **TOL[dtype])
    assert torch.count_nonzero(got[3]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80, 256])
def test_decode_attention_head_dims(dtype, head_dim):
    case = _paged_case(dtype, [33, 700], [1, 1], 16, 2, head_dim=head_dim)
    ref = reference.paged_attention(*case, scale=head_dim**-0.5)
    got = kernels.paged_attention(*case, head_dim**-0.5, max_query_len=1, max_seq_len=700)
    torch.testing.assert_close(got, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_table_rows(dtype):
    """Every DECODE_CONFIGS row compiles and is right, at the bound it is chosen for."""
    case = _paged_case(dtype, [1, 150, 0, 4000, 1030], [1] * 5, 32, 4)
    ref = reference.paged_attention(*case, scale=0.088)
    for bound, row in _launch().DECODE_CONFIGS:
        got = _launch().paged_attention(
            *case, scale=0.088, max_query_len=1, max_seq_len=max(bound, 4000), config=row
        )
        torch.testing.assert_close(got, ref, **TOL[torch.bfloat16])
        assert torch.count_nonzero(got[2]) == 0


def test_decode_attention_fp8_cache():
    q, k_cache, v_cache, *rest = _paged_case(torch.bfloat16, [1, 17, 1000, 0], [1] * 4, 32, 4)
    case = (q, k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn), *rest)
    ref = reference.paged_attention(*case, scale=0.088)
    got = kernels.paged_attention(*case, 0.088, max_query_len=1, max_seq_len=4096)
    torch.testing.assert_close(got, ref, **TOL[torch.bfloat16])


def test_decode_bits_independent_of_bound_and_batch():
    """Compiled: a sequence's bits depend on neither the bound (same launch config) nor the
    other rows of the batch or their order."""
    q, k_cache, v_cache, tables, lens, qsl = _paged_case(
        torch.bfloat16, [150, 3000, 0, 90], [1] * 4, 32, 4
    )
    cfg = dict(SPLIT_LEN=64, BLOCK_N=32, num_warps=4, num_stages=2)

    def run(rows, bound):
        sub = (q[rows], k_cache, v_cache, tables[rows], lens[rows], qsl[: len(rows) + 1])
        return _launch().paged_attention(
            *sub, 0.088, max_query_len=1, max_seq_len=bound, config=cfg
        )

    full = run([0, 1, 2, 3], 3000)
    assert torch.equal(run([0, 1, 2, 3], 8192), full)
    assert torch.equal(run([3, 0, 2, 1], 3000), full[[3, 0, 2, 1]])
    assert torch.equal(run([0], 3000), full[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, hk", GQA)
def test_prefill_attention(dtype, hq, hk):
    # (query_len, seq_len): full prefill, chunked prefill (seq_len > query_len), a decode row
    # in a mixed batch, and a sequence with no new tokens this step
    pairs = [(17, 17), (1000, 1000), (5, 1030), (1, 40), (0, 50), (130, 333)]
    case = _paged_case(dtype, [s for _, s in pairs], [q for q, _ in pairs], hq, hk)
    ref = reference.paged_attention(*case, scale=0.088)
    got = kernels.paged_attention(*case, 0.088, max_query_len=1000, max_seq_len=1030)
    torch.testing.assert_close(got, ref, **TOL[dtype])
    got = kernels.paged_attention(*case, 0.088)  # bounds read from the device
    torch.testing.assert_close(got, ref, **TOL[dtype])


def test_prefill_head_dim_80():
    case = _paged_case(torch.bfloat16, [77, 300], [77, 45], 8, 2, head_dim=80)
    ref = reference.paged_attention(*case, scale=0.11)
    got = kernels.paged_attention(*case, 0.11, max_query_len=77, max_seq_len=300)
    torch.testing.assert_close(got, ref, **TOL[torch.bfloat16])


def test_decode_attention_cuda_graph():
    """Captured once with a host bound; replayed after seq_lens/block tables change in place."""
    q, k_cache, v_cache, tables, lens, qsl = _paged_case(
        torch.bfloat16, [5, 2048, 64, 0], [1] * 4, 32, 4
    )

    def run():
        return kernels.paged_attention(
            q, k_cache, v_cache, tables, lens, qsl, 0.088, max_query_len=1, max_seq_len=2048
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for new_lens in ([1, 2048, 17, 0], [300, 0, 1999, 5]):
        lens.copy_(torch.tensor(new_lens, device=DEV, dtype=torch.int32))
        tables.copy_(tables[torch.randperm(4, device=DEV)])
        q.normal_()
        graph.replay()
        ref = reference.paged_attention(q, k_cache, v_cache, tables, lens, qsl, 0.088)
        torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])
