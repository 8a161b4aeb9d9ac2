"""`/v1/xinfer/stats` of a hybrid model says how many sequences' recurrent states fit
(`state_slots`, issue 17), beside the KV tokens; 0 for a model without recurrent state."""

from __future__ import annotations

import pytest
import tiny_models as tm
from fastapi.testclient import TestClient

from xinfer import LLM
from xinfer.engine.async_engine import AsyncEngine
from xinfer.server.app import build_app


@pytest.mark.parametrize(("arch", "num_slots"), [("qwen3_5_moe", 3), ("qwen3_moe", 0)])
def test_stats_report_state_slots(arch, num_slots, tmp_path):
    path = tm.write_checkpoint(tm.make_hf_model(arch), tmp_path / "m")
    engine = LLM(str(path), device="cpu", max_num_seqs=3).engine
    async_engine = AsyncEngine(engine).start()
    try:
        with TestClient(build_app(async_engine, "tiny")) as client:
            stats = client.get("/v1/xinfer/stats").json()
    finally:
        async_engine.stop()
    assert stats["state_slots"] == engine.num_state_slots == num_slots
    assert stats["kv_tokens"] == engine.kv_tokens > 0
