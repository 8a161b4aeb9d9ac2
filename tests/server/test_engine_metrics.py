"""The vLLM-style metric set beside ours: per-request latency histograms fed by the
engine's timings, preemptions and prefix-cache counters from the snapshot, all labelled
with `model_name`; and over a real server, a second request sharing a long prefix reports
prefix-cache hits and the same greedy text."""

from __future__ import annotations

import uuid

from prometheus_client.parser import text_string_to_metric_families

from xinfer.engine.async_engine import EngineSnapshot
from xinfer.engine.prefix_cache import PrefixCacheStats
from xinfer.engine.request import RequestMetrics
from xinfer.server.metrics import ServerMetrics


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_request_timings_and_snapshot_counters_render():
    metrics = ServerMetrics("org/model")
    metrics.on_request_metrics(
        RequestMetrics(e2e_s=2.0, queue_s=0.25, prefill_s=0.5, decode_s=1.25,
                       num_prompt_tokens=30, num_output_tokens=9, num_cached_tokens=16,
                       num_preemptions=1)
    )  # fmt: skip
    metrics.on_inter_token(0.03)
    metrics.on_finish(30, 9, "length")
    snap = EngineSnapshot(2, 1, 0.5, None, PrefixCacheStats(queries=100, hits=64), 3)
    got = samples(metrics.render(snap))
    m = (("model_name", "org/model"),)
    assert got[("xinfer:e2e_request_latency_seconds_sum", m)] == 2.0
    assert got[("xinfer:request_queue_time_seconds_sum", m)] == 0.25
    assert got[("xinfer:request_prefill_time_seconds_sum", m)] == 0.5
    assert got[("xinfer:request_decode_time_seconds_sum", m)] == 1.25
    assert got[("xinfer:request_inference_time_seconds_sum", m)] == 1.75
    assert got[("xinfer:time_to_first_token_seconds_sum", m)] == 0.75
    assert got[("xinfer:inter_token_latency_seconds_count", m)] == 1
    assert got[("xinfer:request_prompt_tokens_sum", m)] == 30
    assert got[("xinfer:request_success_total", (("finished_reason", "length"), *m))] == 1
    assert got[("xinfer:generation_tokens_total", m)] == 9
    assert got[("xinfer:num_requests_running", m)] == 2
    assert got[("xinfer:num_requests_waiting", m)] == 1
    assert got[("xinfer:kv_cache_usage_perc", m)] == 0.5
    assert got[("xinfer:num_preemptions_total", m)] == 3
    assert got[("xinfer:prefix_cache_queries_total", m)] == 100
    assert got[("xinfer:prefix_cache_hits_total", m)] == 64
    assert got[("xinfer_requests_running", ())] == 2  # ours stay beside them


def test_shared_prefix_over_the_server(server):
    """The same long prompt twice: the second is served from the prefix cache, same text."""
    client = server.client()
    prompt = f"{uuid.uuid4()} " + "the quick brown fox jumps over the lazy dog " * 12

    def complete() -> str:
        return (
            client.completions.create(model="tiny_chat", prompt=prompt, max_tokens=8, temperature=0)
            .choices[0]
            .text
        )

    def hits() -> float:
        return server.metrics()['xinfer:prefix_cache_hits_total{model_name="tiny_chat"}']

    first = complete()
    before = hits()
    assert complete() == first
    assert hits() - before >= 64
    m = server.metrics()
    label = '{model_name="tiny_chat"}'
    assert m[f"xinfer:e2e_request_latency_seconds_count{label}"] >= 2
    assert m[f"xinfer:request_queue_time_seconds_count{label}"] >= 2
    assert f"xinfer:num_preemptions_total{label}" in m
