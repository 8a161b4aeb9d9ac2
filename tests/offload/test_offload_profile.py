"""XINFER_MOE_OFFLOAD_PROFILE=1: the end-of-run summary carries the per-MoE-call time split,
graphs are refused, and the output is unchanged."""

from __future__ import annotations

import tiny_models as tm

from xinfer import LLM, SamplingParams


def test_profile_mode_reports_split_and_keeps_output(tmp_path, monkeypatch):
    path = tm.write_checkpoint(tm.make_hf_model("olmoe"), tmp_path / "m")
    params = SamplingParams(temperature=0, max_tokens=12)
    prompt = tm.prompts(1, seed=4)[0]
    plain = LLM(str(path), device="cpu", moe_offload="0.5").generate([prompt], params)
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    llm = LLM(str(path), device="cpu", moe_offload="0.5")
    out = llm.generate([prompt], params)
    assert out[0].token_ids == plain[0].token_ids
    manager = llm.engine.offload_manager
    assert not manager.is_graph_safe(1)
    summary = manager.format_summary()
    for part in ("launch gap", "gpu wait", "host", "copy", "mean per MoE call over"):
        assert part in summary, summary
    assert llm.offload_stats()["profile"]["calls"] > 0
