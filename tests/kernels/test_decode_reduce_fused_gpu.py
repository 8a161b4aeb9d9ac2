"""Decode attention merging its splits in the decode launch (`attention._merge_when_last`)
on the GPU, where the last split of a (sequence, KV head) reads the other splits' parts
after an acquire on its counter — what the CPU interpreter (one program at a time) cannot
test. At the tiles CUDA tensors get, on random inputs (Qwen3-30B-A3B's 32/4 heads of 128,
MHA, GQA 8, Gemma 3's 256-wide local heads with a window, float32, an fp8 cache, the 8192
bound's row), batches with padding rows: bit-equal to the two-launch path on many launches
in a row, counters zero after, and the same bits replayed from a CUDA graph. All `gpu`:
skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_graph_replays, assert_launches_repeat, run_switched

pytestmark = pytest.mark.gpu

# name: (dtype, Hq, Hk, head_dim, sliding window, cache dtype, host-side bound)
CASES = {
    "qwen3-moe-bf16": (torch.bfloat16, 32, 4, 128, None, None, 4096),
    "mha-fp16": (torch.float16, 16, 16, 64, None, None, 4096),
    "gqa8-bf16-bound8192": (torch.bfloat16, 32, 4, 128, None, None, 8192),
    "g8-bf16": (torch.bfloat16, 16, 2, 128, None, None, 4096),
    "gemma3-local-hd256": (torch.bfloat16, 8, 4, 256, 1024, None, 4096),
    "fp32-window": (torch.float32, 16, 4, 128, 700, None, 4096),
    "fp8-cache": (torch.bfloat16, 32, 4, 128, None, torch.float8_e4m3fn, 4096),
}


@pytest.fixture
def run(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("XINFER_DISABLE_TRITON", raising=False)
    from xinfer.kernels import attn_launch

    def run(call, fused):
        switched = (attn_launch, "FUSED_DECODE_REDUCE", "reduce_splits")
        return run_switched(*switched, monkeypatch, call, fused)

    return run


def _inputs(name: str, batch: int, seed: int, block_size: int = 16):
    """(q, k_cache, v_cache, block tables, seq_lens, query_start_loc), paged_attention's
    keyword arguments: random, with padding rows and a length that ends mid-split."""
    dtype, hq, hk, head_dim, window, cache_dtype, bound = CASES[name]
    g = torch.Generator("cuda").manual_seed(seed)
    lens = torch.randint(1, bound + 1, (batch,), generator=g, device="cuda")
    lens[batch // 2 :: 3] = 0  # padding rows (a graph's batch past the live rows)
    lens[0] = min(bound, 3 * 64 + 17)  # ends mid-split
    max_blocks = -(-bound // block_size)
    num_blocks = batch * max_blocks + 5
    shape = (num_blocks, block_size, hk, head_dim)
    k_cache = torch.randn(shape, generator=g, device="cuda").to(cache_dtype or dtype)
    v_cache = torch.randn(shape, generator=g, device="cuda").to(cache_dtype or dtype)
    perm = torch.randperm(num_blocks, generator=g, device="cuda")[: batch * max_blocks]
    tables = perm.view(batch, max_blocks).to(torch.int32)
    q = torch.randn(batch, hq, head_dim, generator=g, device="cuda").to(dtype)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    case = (q, k_cache, v_cache, tables, lens.to(torch.int32), qsl, head_dim**-0.5)
    return case, dict(max_query_len=1, max_seq_len=bound, sliding_window=window)


def _call(name: str, batch: int, seed: int):
    from xinfer.kernels import attn_launch

    case, kwargs = _inputs(name, batch, seed)
    return lambda: attn_launch.paged_attention(*case, **kwargs)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_fused_merge_has_the_reduce_kernels_bits(run, name, batch) -> None:
    assert_launches_repeat(run, _call(name, batch, seed=batch))


@pytest.mark.parametrize("name", ["qwen3-moe-bf16", "gemma3-local-hd256", "fp32-window"])
def test_fused_merge_replays_in_a_cuda_graph(run, name) -> None:
    assert_graph_replays(run, _call(name, 8, seed=11))


@pytest.mark.parametrize("name", ["qwen3-moe-bf16", "gemma3-local-hd256"])
def test_fused_merge_matches_the_reference(run, name) -> None:
    """The fused output against `reference.paged_attention` (the tests above compare the two
    kernel paths only)."""
    from xinfer.kernels import attn_launch, reference

    case, kwargs = _inputs(name, 4, seed=2)
    out, launches = run(lambda: attn_launch.paged_attention(*case, **kwargs), fused=True)
    assert launches == 0
    ref = reference.paged_attention(*case, sliding_window=kwargs["sliding_window"])
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
