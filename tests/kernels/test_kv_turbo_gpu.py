"""The TurboQuant KV-cache kernels compiled on the GPU against the twin: the store bit for
bit (codes and scales, bfloat16 and float16 rows, head_dim 128 and 80); decode and prefill
attention on turbo caches at real sizes (GQA 4, head_dim 128, long contexts, a window, the
merge apart and in the launch) against the reference on the dequantized cache; the whole
`kernels` path (rotations included) against the CPU twin's; and a decode step (qkv prep,
store, attention) replayed in a CUDA graph."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from turbo_cases import turbo_paged_case

from xinfer import kernels
from xinfer.kernels import reference
from xinfer.kv import turbo
from xinfer.kv.format import TurboQuant

pytestmark = pytest.mark.gpu
DEV = "cuda"
TOL = {torch.bfloat16: dict(atol=3e-2, rtol=3e-2), torch.float16: dict(atol=4e-3, rtol=4e-3)}


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels import attn_launch, kv_turbo_launch

    return attn_launch, kv_turbo_launch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim, bits", [(128, 4), (128, 3), (80, 4)])
def test_store_equals_the_twin_bit_for_bit(launch, dtype, head_dim, bits):
    _, store_launch = launch
    g = torch.Generator(device=DEV).manual_seed(head_dim + bits)
    k = torch.randn(300, 8, head_dim, generator=g, device=DEV).to(dtype) * 4
    v = torch.randn(300, 8, head_dim, generator=g, device=DEV).to(dtype)
    slots = torch.randperm(64 * 16, generator=g, device=DEV)[:300]
    slots[::7] = -1
    got = turbo.allocate(TurboQuant(bits), 64, 16, 8, head_dim, dtype, torch.device(DEV))
    want = turbo.allocate(TurboQuant(bits), 64, 16, 8, head_dim, dtype, torch.device(DEV))
    store_launch.store(k, v, got, slots)
    turbo.store(k, v, want, slots)
    for a, b in zip(got.tensors(), want.tensors(), strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _attend(attn_launch, case, scale, **kwargs):
    q, cache, tables, lens, qsl = case
    return attn_launch.paged_attention(
        q, cache.k_codes, cache.v_codes, tables, lens, qsl, scale, turbo=cache, **kwargs
    )


def _expected(case, dense, scale, window=None):
    q, _, tables, lens, qsl = case
    return reference.paged_attention(q, *dense, tables, lens, qsl, scale, window).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("window", [None, 700])
def test_decode_on_a_turbo_cache(launch, dtype, bits, fused, window):
    attn_launch, _ = launch
    seq_lens = [1, 130, 3000, 0, 777]
    case, dense = turbo_paged_case(dtype, seq_lens, None, 32, 8, 128, bits, seed=bits, device=DEV)
    want = _expected(case, dense, 0.088, window)
    with mock.patch.object(attn_launch, "FUSED_DECODE_REDUCE", fused):
        got = _attend(
            attn_launch, case, 0.088, max_query_len=1, max_seq_len=4096, sliding_window=window
        )
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("bits", [4, 3])
def test_lookup_by_shuffles_gives_the_same_attention(launch, bits):
    """`attn_launch.TURBO_LOOKUP_SHUFFLE` (the centroid table in registers, `tl.gather`):
    decode and prefill at real sizes within the tolerance of the reference, as the default."""
    attn_launch, _ = launch
    case, dense = turbo_paged_case(torch.bfloat16, [1, 3000, 777], None, 32, 8, 128, bits,
                                   seed=bits, device=DEV)  # fmt: skip
    with mock.patch.object(attn_launch, "TURBO_LOOKUP_SHUFFLE", True):
        got = _attend(attn_launch, case, 0.088, max_query_len=1, max_seq_len=4096)
    torch.testing.assert_close(got, _expected(case, dense, 0.088), **TOL[torch.bfloat16])
    pairs = [(700, 700), (90, 1500)]
    case, dense = turbo_paged_case(torch.bfloat16, [s for _, s in pairs], [q for q, _ in pairs],
                                   32, 8, 128, bits, seed=5, device=DEV)  # fmt: skip
    with mock.patch.object(attn_launch, "TURBO_LOOKUP_SHUFFLE", True):
        got = _attend(attn_launch, case, 0.088, max_query_len=700, max_seq_len=1500)
    torch.testing.assert_close(got, _expected(case, dense, 0.088), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [None, 300])
def test_prefill_on_a_turbo_cache(launch, dtype, window):
    attn_launch, _ = launch
    pairs = [(700, 700), (90, 1500), (1, 33), (0, 5)]
    case, dense = turbo_paged_case(
        dtype, [s for _, s in pairs], [q for q, _ in pairs], 32, 8, 128, 4, seed=5, device=DEV
    )
    want = _expected(case, dense, 0.088, window)
    got = _attend(attn_launch, case, 0.088, max_query_len=700, max_seq_len=1500,
                  sliding_window=window)  # fmt: skip
    torch.testing.assert_close(got, want, **TOL[dtype])


def _step_inputs(num_tokens, dtype, seed, hq=16, hk=4, head_dim=128):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(num_tokens, hq, head_dim, generator=g, device=DEV).to(dtype)
    k = torch.randn(num_tokens, hk, head_dim, generator=g, device=DEV).to(dtype)
    v = torch.randn(num_tokens, hk, head_dim, generator=g, device=DEV).to(dtype)
    return q, k, v


@pytest.mark.parametrize("bits", [4, 3])
def test_the_kernels_path_matches_the_cpu_twin(bits):
    """kernels.qkv_prep + paged_attention with a TurboKVCache (rotations, staging, store,
    attention) on CUDA against the same calls on CPU copies (the twin). The two devices round
    RoPE and the rotation differently in the last bit, which moves ~1% of the coordinates
    across a code boundary; so: the roped q close, the two caches' dequantized rows close
    (not equal), and attention on the GPU's cache equal to the reference on that cache."""
    dtype, hk, head_dim, block = torch.float16, 4, 128, 16
    q, k, v = _step_inputs(40, dtype, bits)
    cos_sin = torch.randn(4096, head_dim, device=DEV)
    positions = torch.arange(40, device=DEV)
    slots = torch.arange(40, device=DEV) + 3 * block
    tables = torch.tensor([[3, 4, 5, 0]], dtype=torch.int32, device=DEV)
    lens = torch.tensor([40], dtype=torch.int32, device=DEV)
    qsl = torch.tensor([0, 40], dtype=torch.int32, device=DEV)
    runs = []
    for dev in (DEV, "cpu"):
        cache = turbo.allocate(TurboQuant(bits), 8, block, hk, head_dim, dtype, torch.device(dev))
        args = [t.to(dev) for t in (q, k, v, positions, cos_sin)]
        q_rope = kernels.qkv_prep(*args, cache, None, slots.to(dev))
        out = kernels.paged_attention(
            q_rope, cache, None, tables.to(dev), lens.to(dev), qsl.to(dev), 0.088,
            max_query_len=40, max_seq_len=40,
        )  # fmt: skip
        runs.append((q_rope.cpu(), cache, out.cpu()))
    (q_gpu, cache_gpu, out_gpu), (q_cpu, cache_cpu, _) = runs
    torch.testing.assert_close(q_gpu, q_cpu, atol=2e-2, rtol=2e-2)
    dense = [turbo.dense_blocks(c, tables.to(c.k_codes.device), [40], torch.float32)
             for c in (cache_gpu, cache_cpu)]  # fmt: skip
    for a, b in zip(dense[0][:2], dense[1][:2], strict=True):  # the sequence's blocks
        a, b = a.cpu(), b.cpu()
        assert b.norm() > 0 and (a - b).norm() / b.norm() < 0.03
    cpu_cache = turbo.allocate(TurboQuant(bits), 8, block, hk, head_dim, dtype, torch.device("cpu"))
    for mine, theirs in zip(cpu_cache.tensors(), cache_gpu.tensors(), strict=True):
        mine.copy_(theirs.cpu())
    want = kernels.paged_attention(
        q_gpu, cpu_cache, None, tables.cpu(), lens.cpu(), qsl.cpu(), 0.088,
        max_query_len=40, max_seq_len=40,
    )  # fmt: skip
    torch.testing.assert_close(out_gpu, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [128, 80, 256])
def test_rotation_kernel_is_the_matmul_and_ignores_the_other_rows(dtype, head_dim):
    """`kv_turbo_launch.rotate` (R^T as a transposed view, and R) within rounding of the
    float64 product, and each row alone with the bits it has among 300 rows."""
    from xinfer.kernels import kv_turbo_launch
    from xinfer.kv.turbo_codebook import rotation

    rot = rotation(head_dim).to(DEV, dtype)
    g = torch.Generator(device=DEV).manual_seed(head_dim)
    x = torch.randn(300, 4, head_dim, generator=g, device=DEV).to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    for m in (rot.t(), rot):
        got = kv_turbo_launch.rotate(x, m)
        torch.testing.assert_close(got, (x.double() @ m.double()).to(dtype), **tol)
        for rows in ([0], [7, 8], list(range(37, 70))):
            assert torch.equal(kv_turbo_launch.rotate(x[rows], m), got[rows]), rows


def test_greedy_tokens_do_not_depend_on_the_batch(tmp_path):
    """A turbo4 engine (bf16, CUDA graphs): each prompt generated alone gets the tokens it
    gets among the others."""
    import tiny_models as tm

    from xinfer import LLM, SamplingParams

    path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe"), tmp_path)
    llm = LLM(str(path), device=DEV, dtype="bfloat16", kv_cache_dtype="turbo4")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = tm.prompts(6)
    together = [o.token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert alone == together


def test_decode_step_replays_in_a_cuda_graph():
    """qkv prep (store) + decode attention on a turbo cache captured once, replayed with new
    inputs and lengths: equal to the same calls run eagerly on a copy of the cache."""
    dtype, batch, hk, head_dim, block = torch.bfloat16, 4, 4, 128, 16
    cache = turbo.allocate(TurboQuant(4), 64, block, hk, head_dim, dtype, torch.device(DEV))
    prefill_q, prefill_k, prefill_v = _step_inputs(batch * 100, dtype, 1)
    kernels.store_kv(prefill_k, prefill_v, cache, None, _slots(batch, 100, block, 0))
    cos_sin = torch.randn(4096, head_dim, device=DEV)
    q, k, v = (t[:batch].clone() for t in (prefill_q, prefill_k, prefill_v))
    positions = torch.full((batch,), 100, device=DEV)
    slots = _slots(batch, 1, block, 100)
    tables = torch.arange(64, dtype=torch.int32, device=DEV).view(batch, 16)
    lens = torch.full((batch,), 101, dtype=torch.int32, device=DEV)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=DEV)

    def step():
        q_rope = kernels.qkv_prep(q, k, v, positions, cos_sin, cache, None, slots)
        return kernels.paged_attention(
            q_rope, cache, None, tables, lens, qsl, 0.088, max_query_len=1, max_seq_len=1024
        )

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed, pos in ((7, 101), (8, 102)):
        new = _step_inputs(batch, dtype, seed)
        for dst, src in zip((q, k, v), new, strict=True):
            dst.copy_(src)
        positions.fill_(pos)
        slots.copy_(_slots(batch, 1, block, pos))
        lens.fill_(pos + 1)
        eager_cache = turbo.TurboKVCache(
            *(t.clone() for t in cache.tensors()),
            cache.bits,
            cache.rotation,
            cache.centroids,
            cache.boundaries,
        )
        q_rope = kernels.qkv_prep(q, k, v, positions, cos_sin, eager_cache, None, slots)
        want = kernels.paged_attention(
            q_rope, eager_cache, None, tables, lens, qsl, 0.088, max_query_len=1,
            max_seq_len=1024,
        )  # fmt: skip
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        for a, b in zip(cache.tensors(), eager_cache.tensors(), strict=True):
            assert torch.equal(a, b)


def _slots(batch: int, n: int, block: int, start: int) -> torch.Tensor:
    """Flat slots of positions [start, start + n) of each of `batch` sequences whose tables
    are rows of arange(64).view(batch, 16)."""
    pos = torch.arange(start, start + n, device=DEV)
    rows = torch.arange(batch, device=DEV)[:, None] * 16 + pos[None, :] // block
    return (rows * block + pos[None, :] % block).flatten()
