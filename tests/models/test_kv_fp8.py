"""An fp8 (e4m3) KV cache: half the bytes per token, values saturate instead of becoming
NaN, and the logits stay close to a full-precision cache."""

from __future__ import annotations

import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams, UserError
from xinfer.config import parse_kv_dtype
from xinfer.engine.request import Request
from xinfer.engine.scheduler import ScheduledRequest, SchedulerOutput
from xinfer.kernels import reference


def test_store_saturates_instead_of_nan():
    cache = torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn)
    other = torch.zeros_like(cache)
    k = torch.full((1, 1, 8), 1e6)
    reference.store_kv(k, -k, cache, other, torch.tensor([3]))
    assert torch.isfinite(cache.float()).all() and cache.float().max() == 448.0
    assert other.float().min() == -448.0


def _last_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Prefill `prompt` (its K/V go through the cache) and return the last logits."""
    engine = llm.engine
    req = Request("probe", list(prompt), SamplingParams())
    req.block_ids = engine.allocator.allocate(engine.allocator.blocks_for(len(prompt)))
    try:
        inp = engine.runner.prepare(SchedulerOutput([ScheduledRequest(req, len(prompt))]))
        return engine.model.compute_logits(engine.runner.forward(inp)[inp.logits_indices])[0]
    finally:
        engine.allocator.free(req.block_ids)


def test_fp8_cache_logits_close_to_full_precision(tmp_path):
    path = tm.write_checkpoint(tm.make_hf_model("qwen2_moe"), tmp_path / "m")
    full = LLM(str(path), device="cpu", dtype="float32")
    fp8 = LLM(str(path), device="cpu", dtype="float32", kv_cache_dtype="fp8")
    bf16 = LLM(str(path), device="cpu", dtype="float32", kv_cache_dtype="bf16")
    assert fp8.engine.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    for prompt in tm.prompts(3, seed=6):
        ref = _last_logits(full, prompt)
        got, half = _last_logits(fp8, prompt), _last_logits(bf16, prompt)
        assert torch.isfinite(got).all()
        rel = ((got - ref).norm() / ref.norm()).item()
        rel_bf16 = ((half - ref).norm() / ref.norm()).item()
        # e4m3 keeps 3 mantissa bits (relative rounding 2^-4 = 6%), bf16 keeps 8 (0.2%): the
        # logits error must be quantisation-sized (measured here: ~10% vs <1%), not a bug.
        assert 0 < rel < 0.15, f"fp8 cache: relative logits error {rel:.3e}"
        assert rel_bf16 < 0.02 and rel_bf16 < rel


def test_unknown_kv_dtype_is_a_user_error():
    assert parse_kv_dtype("fp8") == torch.float8_e4m3fn
    with pytest.raises(UserError, match="use auto, bf16, fp16, fp8, turbo4 or turbo3"):
        parse_kv_dtype("turbo5")
