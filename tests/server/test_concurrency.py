"""Continuous batching seen from clients: 16 concurrent greedy streams each get exactly
the text they get alone; a client that disconnects mid-stream has its request aborted and
its KV blocks freed (visible in /metrics); the Prometheus metrics are all there."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

PROMPTS = [
    f"{w} number {i}:" for i, w in enumerate(["Hello", "The quick", "Mixture", "one two"] * 4)
]


def _wait_idle(server, timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["xinfer_requests_running"] == 0 and m["xinfer_kv_cache_usage_ratio"] == 0:
            return m
        assert time.monotonic() < deadline, f"server never became idle: {m}"
        time.sleep(0.1)


def test_sixteen_concurrent_streams_match_solo_runs(server):
    kw = dict(model="tiny_chat", temperature=0, max_tokens=24)
    client = server.client()
    alone = [client.completions.create(prompt=p, **kw).choices[0].text for p in PROMPTS]
    assert len(set(alone)) > 4  # the prompts really lead to different texts

    async def one(aclient, prompt: str) -> tuple[str, int]:
        stream = await aclient.completions.create(prompt=prompt, stream=True, **kw)
        text, num_chunks = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                num_chunks += 1
        return text, num_chunks

    async def all_at_once() -> list[tuple[str, int]]:
        aclient = server.async_client()
        try:
            return await asyncio.gather(*(one(aclient, p) for p in PROMPTS))
        finally:
            await aclient.close()

    before = server.metrics()
    results = asyncio.run(all_at_once())
    assert [text for text, _ in results] == alone
    assert all(n > 1 for _, n in results)
    after = _wait_idle(server)
    done = 'xinfer_requests_total{finish_reason="length"}'
    assert after.get(done, 0) - before.get(done, 0) + sum(
        after.get(k, 0) - before.get(k, 0) for k in after if 'finish_reason="stop"' in k
    ) == len(PROMPTS)


def test_disconnect_aborts_and_frees_the_slot(server):
    _wait_idle(server)
    aborted = 'xinfer_requests_total{finish_reason="abort"}'
    before = server.metrics().get(aborted, 0)
    body = {
        "model": "tiny_chat",
        "prompt": "Hello",
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.v1}/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(4)]
            assert any(line.startswith("data: {") for line in got)
            m = server.metrics()
            assert m["xinfer_requests_running"] == 1
            assert m["xinfer_kv_cache_usage_ratio"] > 0
        # leaving the block closes the connection mid-stream
    m = _wait_idle(server)
    assert m.get(aborted, 0) == before + 1
    # and the server goes on serving
    out = server.client().completions.create(model="tiny_chat", prompt="Hi", max_tokens=3)
    assert out.usage.completion_tokens >= 1


def test_disconnect_aborts_a_non_streamed_request(server):
    _wait_idle(server)
    aborted = 'xinfer_requests_total{finish_reason="abort"}'
    before = server.metrics().get(aborted, 0)
    body = {"model": "tiny_chat", "prompt": "Hello", "max_tokens": 500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{server.v1}/completions", json=body, timeout=httpx.Timeout(5, read=0.15))
    m = _wait_idle(server)
    assert m.get(aborted, 0) == before + 1


def test_metrics_exposition(server):
    server.client().chat.completions.create(
        model="tiny_chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    m = server.metrics()
    for name in (
        "xinfer_prompt_tokens_total",
        "xinfer_generation_tokens_total",
        "xinfer_time_to_first_token_seconds_count",
        "xinfer_inter_token_latency_seconds_count",
        "xinfer_requests_running",
        "xinfer_requests_waiting",
        "xinfer_kv_cache_usage_ratio",
        "xinfer_moe_offload_enabled",
    ):
        assert name in m, name
    assert m["xinfer_time_to_first_token_seconds_count"] >= 1
    assert m["xinfer_generation_tokens_total"] >= 4
    assert m["xinfer_moe_offload_enabled"] == 0  # this server runs without offload
    assert any(k.startswith('xinfer_http_requests_total{path="/v1/chat/completions"') for k in m)
    stats = httpx.get(f"{server.v1}/xinfer/stats").json()
    assert stats["offload_enabled"] is False and stats["expert_cache_hit_rate"] is None
