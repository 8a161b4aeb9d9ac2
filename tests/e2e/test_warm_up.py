"""The start-up prefill warm-up (run on CUDA so the first long prompt does not wait for
kernel compilation) computes every token of its prompts (none is another's cached prefix),
takes the prompt pass, and leaves nothing behind: no request, every KV block free, no
output, and the next generations equal those of an engine that never warmed up."""

from __future__ import annotations

from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams


def test_warm_up_leaves_no_trace(tmp_path):
    path = str(write_checkpoint(make_hf_model("qwen3_moe", seed=2), tmp_path))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cold = LLM(path, device="cpu", max_model_len=160, max_num_batched_tokens=64)
    warm = LLM(path, device="cpu", max_model_len=160, max_num_batched_tokens=64)
    engine = warm.engine
    ran = []
    add = engine.add_request
    engine.add_request = lambda ids, params, request_id: (
        ran.append(len(ids)) or add(ids, params, request_id=request_id)
    )
    passes = []
    run_pass = engine.runner.prompt_pass.run
    engine.runner.prompt_pass.run = lambda s: passes.append(s.prompt_pass) or run_pass(s)
    engine.warm_up_prefill()
    del engine.add_request, engine.runner.prompt_pass.run
    # the budget, one token less, and 2·budget − 1 (a prompt pass, chunks after a prefix)
    assert ran == [127, 64, 63] and passes and passes[-1].is_last
    stats = engine.prefix_cache_stats()
    assert stats is not None and stats.queries > 0 and stats.hits == 0  # each one computed
    assert not engine.has_unfinished() and not engine.requests
    assert engine.allocator.num_free == engine.allocator.num_blocks
    batch = prompts(3, seed=9)
    expected = [r.token_ids for r in cold.generate(batch, params)]
    assert [r.token_ids for r in warm.generate(batch, params)] == expected
