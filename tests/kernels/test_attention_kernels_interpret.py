"""CPU run of the attention/norm/RoPE/KV-store Triton kernels under the Triton interpreter,
so CI (no GPU) executes the kernel code. Small shapes; the GPU file covers the real sizes.

TRITON_INTERPRET must be set before the kernels are decorated and must not leak into the
rest of the process (GPU tests, and the CPU check that compiles every kernel for sm_90), so
in a normal run one test re-runs this file in a child pytest with TRITON_INTERPRET=1, and the
cases below run only there. Interpreter limits: tl.dot on
bfloat16 is wrong (raw bits) and float32 → bfloat16 casts truncate, so attention runs in
float32/float16 here and bfloat16 elementwise results get a 1-ulp tolerance."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import IS_CHILD, interpreter_child_test

from xinfer.kernels import reference

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


def _interpreted_launch():
    """attn_launch with interpreted kernels, in the child process only."""
    if not IS_CHILD:
        return None
    from triton.runtime.interpreter import InterpretedFunction

    from xinfer.kernels import attn_launch

    assert isinstance(attn_launch.attn_kernels.decode_kernel, InterpretedFunction)
    return attn_launch


L = _interpreted_launch()
ULP = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # elementwise kernels


@pytest.fixture(autouse=True)
def _seed(request):
    if L is None and request.node.name != "test_interpreter_child":
        pytest.skip("runs in test_interpreter_child's process")
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm(dtype):
    x = torch.randn(5, 3, 40, dtype=dtype)
    res, w = torch.randn_like(x), torch.randn(40, dtype=dtype)
    tol = dict(atol=ULP[dtype], rtol=ULP[dtype])
    out, new_res = L.rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = reference.rms_norm(x, w, 1e-6, res)
    torch.testing.assert_close(new_res, ref_res, **tol)
    torch.testing.assert_close(out, ref_out, atol=2 * tol["atol"], rtol=2 * tol["rtol"])
    torch.testing.assert_close(L.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 24])
def test_rope_strided(dtype, head_dim):
    qkv = torch.randn(7, 8 * head_dim, dtype=dtype)  # q: 4 heads, k: 2 heads, v: 2 heads
    q = qkv[:, : 4 * head_dim].view(7, 4, head_dim)
    k = qkv[:, 4 * head_dim : 6 * head_dim].view(7, 2, head_dim)
    cos_sin, pos = torch.randn(50, head_dim), torch.randint(0, 50, (7,))
    got, ref = L.apply_rope(q, k, pos, cos_sin), reference.apply_rope(q, k, pos, cos_sin)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=2 * ULP[dtype], rtol=2 * ULP[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv(dtype):
    k_cache = torch.randn(6, 16, 2, 24, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(5, 2, 24, dtype=dtype), torch.randn(5, 2, 24, dtype=dtype)
    slots = torch.tensor([3, -1, 90, 0, 17])
    got_k, got_v = k_cache.clone(), v_cache.clone()
    L.store_kv(k, v, got_k, got_v, slots)
    reference.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(got_k, k_cache) and torch.equal(got_v, v_cache)


def _paged_case(dtype, seq_lens, query_lens, hq, hk, head_dim=32, block_size=16):
    max_blocks = max((s + block_size - 1) // block_size for s in seq_lens) + 1
    num_blocks = len(seq_lens) * max_blocks + 3
    k_cache = torch.randn(num_blocks, block_size, hk, head_dim, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks)[: len(seq_lens) * max_blocks]
    block_tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    q = torch.randn(sum(query_lens), hq, head_dim, dtype=dtype)
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), qsl


ATTN_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=3e-3, rtol=3e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq, hk, split_len", [(2, 2, 16), (8, 2, 48), (8, 1, None)])
def test_decode_attention(dtype, hq, hk, split_len):
    seq_lens = [1, 17, 150, 0]  # 0 = graph padding row
    case = _paged_case(dtype, seq_lens, [1] * 4, hq, hk)
    ref = reference.paged_attention(*case, scale=0.17)
    got = L.paged_attention(*case, 0.17, max_query_len=1, max_seq_len=150, split_len=split_len)
    torch.testing.assert_close(got, ref, **ATTN_TOL[dtype])
    assert torch.count_nonzero(got[3]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq, hk", [(2, 2), (8, 2)])
def test_prefill_attention(dtype, hq, hk):
    # (query_len, seq_len): prefill, chunked prefill, a decode row, no new tokens
    pairs = [(20, 20), (9, 41), (1, 23), (0, 5)]
    case = _paged_case(dtype, [s for _, s in pairs], [q for q, _ in pairs], hq, hk)
    ref = reference.paged_attention(*case, scale=0.17)
    got = L.paged_attention(*case, 0.17)
    torch.testing.assert_close(got, ref, **ATTN_TOL[dtype])


def test_prefill_head_dim_24_group_3():
    case = _paged_case(torch.float32, [33, 12], [14, 12], 6, 2, head_dim=24)
    ref = reference.paged_attention(*case, scale=0.2)
    got = L.paged_attention(*case, 0.2, max_query_len=14, max_seq_len=33)
    torch.testing.assert_close(got, ref, **ATTN_TOL[torch.float32])


@pytest.mark.parametrize("block_size", [4, 32])  # a tile spans several blocks / half a block
def test_decode_block_sizes(block_size):
    case = _paged_case(torch.float32, [1, 17, 150, 0], [1] * 4, 8, 2, block_size=block_size)
    ref = reference.paged_attention(*case, scale=0.17)
    got = L.paged_attention(*case, 0.17, max_query_len=1, max_seq_len=150, split_len=48)
    torch.testing.assert_close(got, ref, **ATTN_TOL[torch.float32])


def test_decode_head_dim_24_group_3():
    case = _paged_case(torch.float16, [33, 12, 70], [1] * 3, 6, 2, head_dim=24)
    ref = reference.paged_attention(*case, scale=0.2)
    got = L.paged_attention(*case, 0.2, max_query_len=1, max_seq_len=70, split_len=32)
    torch.testing.assert_close(got, ref, **ATTN_TOL[torch.float16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_fp8_cache(dtype):
    q, k_cache, v_cache, *rest = _paged_case(dtype, [1, 40, 150, 0], [1] * 4, 8, 2)
    case = (q, k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn), *rest)
    ref = reference.paged_attention(*case, scale=0.17)
    got = L.paged_attention(*case, 0.17, max_query_len=1, max_seq_len=150)
    torch.testing.assert_close(got, ref, **ATTN_TOL[dtype])


def test_decode_table_rows():
    """Every DECODE_CONFIGS row as it runs on the GPU (tiles, splits, stages)."""
    case = _paged_case(torch.float16, [1, 70, 300, 0], [1] * 4, 8, 2)
    ref = reference.paged_attention(*case, scale=0.17)
    for _, row in L.DECODE_CONFIGS:
        got = L.paged_attention(*case, 0.17, max_query_len=1, max_seq_len=300, config=row)
        torch.testing.assert_close(got, ref, **ATTN_TOL[torch.float16])


def test_decode_bits_independent_of_bound_and_batch():
    """A sequence's result depends only on its own data and the split length: not on the
    bound the grid is sized from, nor on the other rows of the batch or their order."""
    q, k_cache, v_cache, tables, lens, qsl = _paged_case(
        torch.float32, [150, 37, 0, 90], [1] * 4, 8, 2
    )

    def run(rows, bound):
        sub = (q[rows], k_cache, v_cache, tables[rows], lens[rows], qsl[: len(rows) + 1])
        return L.paged_attention(*sub, 0.17, max_query_len=1, max_seq_len=bound, split_len=32)

    full = run([0, 1, 2, 3], 150)
    assert torch.equal(run([0, 1, 2, 3], 1000), full)
    assert torch.equal(run([3, 0, 2, 1], 150), full[[3, 0, 2, 1]])
    assert torch.equal(run([0], 150), full[:1])
    assert torch.count_nonzero(full[2]) == 0
