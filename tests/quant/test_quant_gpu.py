"""GPU checks of quantized checkpoints through the engine (run on the H200 test machine):
for each format, greedy bf16 output is the same resident, offloaded eagerly and offloaded
with CUDA graphs; and `--load-format dummy` makes valid weights of the declared format."""

from __future__ import annotations

import pytest
import quant_ckpt as qk
import tiny_models as tm

from xinfer import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PARAMS = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("kind", ["fp8", "nvfp4", "gptq", "awq", "ct-asym-g64", "gptq-actorder"])
def test_offload_graph_equals_eager_equals_resident(kind, tmp_path):
    _, path = qk.write_quantized(
        "qwen3_moe", kind, tmp_path / kind, seed=1, reference=False, num_experts=16
    )
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64)

    def run(**extra):
        llm = LLM(str(path), **kw, **extra)
        out = [r.token_ids for r in llm.generate(tm.prompts(3), PARAMS)]
        out += [llm.generate(p, PARAMS)[0].token_ids for p in tm.prompts(2)]
        return out, llm.offload_stats()

    base, _ = run(enforce_eager=True)
    assert run(enforce_eager=False)[0] == base, f"{kind}: resident graphs differ from eager"
    for frac in (0.25, 0.5):
        eager, stats = run(enforce_eager=True, moe_offload=frac)
        assert eager == base and stats["misses"] > 0, (kind, frac)
        graphed, _ = run(enforce_eager=False, moe_offload=frac)
        assert graphed == base, (kind, frac)


@pytest.mark.parametrize("kind", ["fp8", "nvfp4", "gptq", "ct", "gptq-actorder-asym-g32"])
def test_dummy_weights_in_each_format_generate(kind, tmp_path):
    _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind, reference=False)
    llm = LLM(str(path), device="cuda:0", dtype="bfloat16", load_format="dummy",
              num_kv_blocks=64)  # fmt: skip
    layer = llm.engine.model.moe_layers()[0]
    assert layer.weight_format.is_quantized
    out = llm.generate(tm.prompts(2), PARAMS)
    assert all(len(r.token_ids) == 32 for r in out)
