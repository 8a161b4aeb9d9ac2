"""AsyncEngine with a fake Engine: outputs reach their callers, a UserError at add_request
goes to that caller only, a failing step fails the in-flight requests and the thread keeps
serving, leaving a stream early aborts it, and a full waiting queue raises QueueFullError."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import pytest

from xinfer.engine.async_engine import AsyncEngine, EngineError, QueueFullError
from xinfer.engine.request import RequestOutput
from xinfer.errors import UserError
from xinfer.sampling import SamplingParams


class FakeEngine:
    """Each request emits `max_tokens` tokens, one per step; prompt "bad" is rejected."""

    def __init__(self) -> None:
        self.requests: dict[str, list] = {}
        self.scheduler = SimpleNamespace(waiting=deque(), running=[], num_preemptions=0)
        self.allocator = SimpleNamespace(usage=0.0)
        self.fail_next_step = False
        self.aborted: list[str] = []
        self.tokenizer, self.max_model_len = None, 64

    def add_request(self, prompt, params, request_id):
        if prompt == "bad":
            raise UserError("the prompt is bad")
        self.requests[request_id] = [params.max_tokens, 0]
        return request_id

    def abort_request(self, request_id):
        if self.requests.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def has_unfinished(self):
        return bool(self.requests)

    def offload_stats(self):
        return None

    def close(self):
        pass

    def prefix_cache_stats(self):
        return None

    def step(self):
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("boom")
        outs = []
        for rid, state in list(self.requests.items()):
            state[1] += 1
            done = state[1] >= state[0]
            outs.append(
                RequestOutput(rid, [state[1]], f"t{state[1]} ", done, "length" if done else None)
            )
            if done:
                del self.requests[rid]
        return outs


@pytest.fixture
def engines():
    fake = FakeEngine()
    async_engine = AsyncEngine(fake, max_waiting=4).start()
    yield fake, async_engine
    async_engine.stop()


async def _collect(async_engine, prompt, max_tokens, rid):
    text = ""
    async for out in async_engine.generate(prompt, SamplingParams(max_tokens=max_tokens), rid):
        text += out.new_text
    return text


def test_outputs_errors_and_recovery(engines):
    fake, async_engine = engines

    async def scenario():
        a, b = await asyncio.gather(
            _collect(async_engine, "x", 3, "a"), _collect(async_engine, "y", 2, "b")
        )
        assert (a, b) == ("t1 t2 t3 ", "t1 t2 ")
        with pytest.raises(UserError):
            await _collect(async_engine, "bad", 2, "c")
        fake.fail_next_step = True
        with pytest.raises(EngineError):
            await _collect(async_engine, "x", 5, "d")
        assert not fake.requests  # the failed step's requests were dropped
        assert await _collect(async_engine, "x", 2, "e") == "t1 t2 "
        snap = await async_engine.snapshot()
        assert snap.num_running == 0 and snap.offload is None

    asyncio.run(scenario())
    assert async_engine.is_alive


def test_leaving_a_stream_aborts_it(engines):
    fake, async_engine = engines

    async def scenario():
        stream = async_engine.generate("x", SamplingParams(max_tokens=10**9), "long")
        async for _ in stream:
            break
        await stream.aclose()
        await async_engine.snapshot()  # a step boundary has passed since the abort

    asyncio.run(scenario())
    assert fake.aborted == ["long-0"] and not fake.requests


def test_full_queue_raises(engines):
    fake, async_engine = engines
    fake.scheduler.waiting.extend(range(4))
    async_engine._num_waiting = 4  # as if four requests were waiting for a batch slot

    async def scenario():
        with pytest.raises(QueueFullError):
            await _collect(async_engine, "x", 2, "q")

    asyncio.run(scenario())


def test_expert_cache_counts_reads_the_offload_stats(tmp_path):
    """The metrics read the real `OffloadManager.stats()` of an offloaded engine."""
    import tiny_models as tm

    from xinfer import LLM, SamplingParams
    from xinfer.server.metrics import expert_cache_counts

    assert expert_cache_counts(None) is None
    path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe"), tmp_path / "m")
    long_prompt = tm.prompts(4)[3]  # 30 tokens > the budget: a prompt pass streams its layers
    for prefetch in (0, None):  # off, and on by default
        llm = LLM(str(path), device="cpu", moe_offload="0.25", max_num_batched_tokens=16,
                  moe_prefetch=prefetch)  # fmt: skip
        llm.generate([long_prompt], SamplingParams(temperature=0, max_tokens=8))
        stats = llm.offload_stats()
        pf = stats.get("prefetch", {})
        counts = expert_cache_counts(stats)
        assert counts == {
            "hits": stats["hits"],
            "misses": stats["misses"],
            "bytes": stats["bytes_copied"],
            "staging_copies": stats["staging_copies"],
            "staging_bytes": stats["staging_bytes"],
            "prefetched": pf.get("prefetched", 0),
            "prefetch_used": pf.get("used", 0),
            "prefetch_wasted": pf.get("wasted", 0),
            "prefetch_bytes": pf.get("prefetched_bytes", 0),
        }
        assert counts["hits"] + counts["misses"] > 0 and counts["staging_copies"] > 0
        assert ("prefetch" in stats) == (prefetch is None), stats  # its counts, 0 when off
