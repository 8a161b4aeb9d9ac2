"""GPU: sliding-window paged attention in the compiled Triton kernels (decode and prefill) equals
the reference at Gemma-3-like sizes (window 512, head_dim 256, contexts past the window), and
a tiny Gemma 3 whose prompts pass its window runs on CUDA (graphs, float32) with the greedy
tokens and logprobs of transformers (the same model and prompts run through the Triton
kernels under the interpreter in test_attention_window_interpret.py)."""

from __future__ import annotations

import dense_models as dm
import pytest
import torch

from xinfer import LLM
from xinfer.kernels import attn_launch, reference

pytestmark = pytest.mark.gpu


def _paged(seq_lens, query_lens, hq, hk, head_dim, dtype, block_size=16):
    g = torch.Generator(device="cuda").manual_seed(0)
    max_blocks = max(-(-s // block_size) for s in seq_lens) + 1
    num_blocks = len(seq_lens) * max_blocks + 3
    shape = (num_blocks, block_size, hk, head_dim)
    k_cache = torch.randn(shape, device="cuda", generator=g).to(dtype)
    v_cache = torch.randn(shape, device="cuda", generator=g).to(dtype)
    perm = torch.randperm(num_blocks, device="cuda", generator=g)[: len(seq_lens) * max_blocks]
    tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    q = torch.randn(sum(query_lens), hq, head_dim, device="cuda", generator=g).to(dtype)
    qsl = torch.tensor([0, *query_lens], device="cuda").cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, tables, lens, qsl


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_window_decode_and_prefill_match_reference(dtype) -> None:
    window, scale = 512, 256**-0.5
    decode = _paged([1, 511, 513, 3000, 0], [1] * 5, 4, 1, 256, dtype)
    out = attn_launch.paged_attention(*decode, scale, 1, 3000, sliding_window=window)
    ref = reference.paged_attention(*decode, scale, sliding_window=window)
    torch.testing.assert_close(out[:4].float(), ref[:4].float(), atol=2e-2, rtol=2e-2)
    prefill = _paged([1500, 700, 2100], [1500, 200, 1024], 4, 1, 256, dtype)
    out = attn_launch.paged_attention(*prefill, scale, 1500, 2100, sliding_window=window)
    ref = reference.paged_attention(*prefill, scale, sliding_window=window)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_tiny_gemma3_past_its_window_on_cuda(tmp_path) -> None:
    """Engine on CUDA (graphs captured: the decode steps replay them) against transformers
    on CUDA, float32: greedy tokens equal and their logprobs within 1e-4, bar a near tie
    (dense_models.greedy_mismatch); a failure names the prompt, the first differing token,
    both picks and transformers' logit margin between them."""
    hf = dm.make_dense("gemma3_text")  # sliding_window 8, prompts up to 30 tokens
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cuda:0", dtype="float32", max_model_len=128)
    assert llm.engine.runner.graph_runner.graphs, "no CUDA graph was captured"
    dm.assert_greedy_matches(llm, hf.to("cuda"), dm.GEMMA3_WINDOW_PROMPTS, 24)
