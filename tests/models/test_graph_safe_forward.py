"""Every MoE and hybrid architecture's forward and LM head make no tensor from host data and
read nothing back from the device (CPU, no offload: the CPU twins of the offload lookup read
their ids on the host by design, the Triton kernels do not). On CUDA either would break the
decode graphs' capture, as Gemma 3's embedding scale once did; the dense models are checked
in test_dense_parity.py."""

from __future__ import annotations

import pytest
import tiny_models as tm
from host_data import watch_forward

from xinfer import LLM, SamplingParams


@pytest.mark.parametrize("arch", list(tm.ARCHS))
def test_forward_makes_no_tensor_from_host_data(arch, tmp_path, monkeypatch):
    tm.write_checkpoint(tm.make_hf_model(arch), tmp_path)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32")
    host_data = watch_forward(llm.engine.runner.model, monkeypatch)
    prompts = tm.prompts(2, seed=3)  # a batch: prefill then batched decode
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3))
    assert host_data.seen == []
