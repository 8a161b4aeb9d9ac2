"""bfloat16 on the CPU: runs, and its logits stay within bf16 rounding of float32."""

from __future__ import annotations

import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams


def test_bfloat16_cpu_close_to_float32(tmp_path):
    hf = tm.make_hf_model("qwen2_moe")
    path = tm.write_checkpoint(hf, tmp_path / "m")
    llm = LLM(str(path), device="cpu", dtype="bfloat16")
    assert llm.engine.dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    for prompt in tm.prompts(3, seed=2):
        r = llm.generate([prompt], params)[0]
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
        ids = torch.tensor(r.logprobs[0].top_ids)
        ours = torch.tensor(r.logprobs[0].top_logprobs)
        rel = (ours - ref[ids]).norm() / ref[ids].norm()
        assert rel < 3e-2, f"bf16 relative error {rel:.3e}"
        assert r.logprobs[0].top_ids[0] == int(ref.argmax())
