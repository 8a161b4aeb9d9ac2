"""Sliding-window paged attention (Gemma 3's local layers: a query at position p sees keys
(p - W, p]) in the Triton decode and prefill kernels, run by Triton's CPU interpreter against
`reference.paged_attention`: windows shorter than the context, splits and tiles wholly
before the window, chunked prefill with cached context, GQA; a decode row's bits do not
depend on the batch. And the GPU test's tiny Gemma 3 through the Triton kernels at their CUDA
tile sizes, against transformers."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from paged_cases import paged_case

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=3e-3, rtol=3e-3)}


@pytest.fixture(scope="module")
def al():
    from xinfer.kernels import attn_launch

    require_interpreted(attn_launch.attn_kernels.decode_kernel)
    return attn_launch


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window, split_len", [(5, 16), (40, 16), (37, 48)])
def test_decode_window_matches_reference(al, dtype, window, split_len):
    from xinfer.kernels import reference

    seq_lens = [1, 17, 150, 0, 41]  # 0: a graph padding row
    case = paged_case(dtype, seq_lens, [1] * 5, hq=8, hk=2)
    out = al.paged_attention(*case, 0.2, 1, 150, split_len=split_len, sliding_window=window)
    ref = reference.paged_attention(*case, 0.2, sliding_window=window)
    live = torch.tensor(seq_lens) > 0
    torch.testing.assert_close(out[live], ref[live], **TOL[dtype])
    # one row alone gives the bits it gets in the batch
    one = tuple(t[2:3] for t in case[:1]) + case[1:3] + (case[3][2:3], case[4][2:3])
    alone = al.paged_attention(*one, torch.tensor([0, 1], dtype=torch.int32), 0.2, 1, 150,
                               split_len=split_len, sliding_window=window)  # fmt: skip
    assert torch.equal(alone[0], out[2])


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [3, 20, 64])
def test_prefill_window_matches_reference(al, dtype, window):
    from xinfer.kernels import reference

    # whole prompts and chunks after a cached context (seq_len > query_len)
    seq_lens, query_lens = [70, 33, 9, 100], [70, 13, 9, 37]
    case = paged_case(dtype, seq_lens, query_lens, hq=4, hk=2, seed=1)
    out = al.paged_attention(*case, 0.3, max(query_lens), max(seq_lens), sliding_window=window)
    ref = reference.paged_attention(*case, 0.3, sliding_window=window)
    torch.testing.assert_close(out, ref, **TOL[dtype])


@child_only
def test_tiny_gemma3_through_the_triton_kernels(al, monkeypatch, tmp_path):
    """test_attention_window.py's GPU case on CPU: the same model (window 8) and prompts (30
    and 12 tokens; 12 greedy tokens — the GPU case's 24 took the interpreter ~110 s — still
    past the window from both prompts; decode look-ahead on, stale KV in every block)
    with the Triton kernels (norms, qkv prep, windowed prefill and decode attention) run by
    the interpreter at the tiles CUDA tensors get, against transformers' sliding-window mask
    (keys (p - 8, p]): tokens equal and logprobs within 1e-4."""
    import dense_models as dm

    import xinfer.kernels as kernels
    from xinfer import LLM

    monkeypatch.setattr(kernels, "use_triton", lambda t: True)  # CPU tensors too
    monkeypatch.setattr(al, "SMALL_INTERPRETER_TILES", False)
    windowed = {"prefill": 0, "decode": 0}
    paged_attention = al.paged_attention

    def counted(*args, **kwargs):
        if kwargs.get("sliding_window") is not None:
            windowed["decode" if kwargs.get("max_query_len") == 1 else "prefill"] += 1
        return paged_attention(*args, **kwargs)

    monkeypatch.setattr(al, "paged_attention", counted)
    hf = dm.make_dense("gemma3_text")
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", max_model_len=48,
              decode_look_ahead=True)  # fmt: skip
    # stale KV in every block, as the CUDA warm-up's prompts leave it (and stricter: random
    # values everywhere; running that warm-up here took the interpreter ~26 s)
    g = torch.Generator().manual_seed(5)
    for k, v in llm.engine.runner.kv_caches:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    dm.assert_greedy_matches(llm, hf, dm.GEMMA3_WINDOW_PROMPTS, 12)
    assert windowed["prefill"] > 0 and windowed["decode"] > 0, windowed
