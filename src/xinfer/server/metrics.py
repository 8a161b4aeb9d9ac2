"""Prometheus metrics on a registry of the app's own: request and token counters, time to
first token and inter-token histograms (fed by the AsyncEngine as its observer), and, read
from an engine snapshot at scrape time, running/waiting requests, KV usage and the expert
cache's hits, misses and bytes copied (prefetch's among them). Beside them, the vLLM-style
set with a `model_name` label (`engine_metrics.py`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from xinfer.engine.async_engine import EngineSnapshot
from xinfer.engine.request import RequestMetrics
from xinfer.server.engine_metrics import EngineMetrics, snapshot_families

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def expert_cache_counts(stats: dict | None) -> dict[str, float] | None:
    """Totals from `OffloadManager.stats()` (keys documented in `xinfer/offload/stats.py`):
    hits, misses, bytes copied into slots on a miss, whole-layer staging copies and their
    bytes, and cross-layer prefetch's experts copied ahead, used, wasted and bytes (0 with
    prefetch off)."""
    if stats is None:
        return None
    pf = stats.get("prefetch") or {}
    return {
        "hits": float(stats["hits"]),
        "misses": float(stats["misses"]),
        "bytes": float(stats["bytes_copied"]),
        "staging_copies": float(stats["staging_copies"]),
        "staging_bytes": float(stats["staging_bytes"]),
        "prefetched": float(pf.get("prefetched", 0)),
        "prefetch_used": float(pf.get("used", 0)),
        "prefetch_wasted": float(pf.get("wasted", 0)),
        "prefetch_bytes": float(pf.get("prefetched_bytes", 0)),
    }


class _SnapshotCollector:
    """Emits the engine-state metrics from the last snapshot taken by the /metrics route."""

    def __init__(self, model_name: str) -> None:
        self.snapshot: EngineSnapshot | None = None
        self.model_name = model_name

    def collect(self):
        snap = self.snapshot
        if snap is None:
            return
        yield from snapshot_families(snap, self.model_name)
        yield GaugeMetricFamily(
            "xinfer_requests_running", "Requests in the decode batch", value=snap.num_running
        )
        yield GaugeMetricFamily(
            "xinfer_requests_waiting", "Requests queued for a batch slot", value=snap.num_waiting
        )
        yield GaugeMetricFamily(
            "xinfer_kv_cache_usage_ratio", "Fraction of KV cache blocks in use", value=snap.kv_usage
        )
        counts = expert_cache_counts(snap.offload)
        yield GaugeMetricFamily(
            "xinfer_moe_offload_enabled",
            "1 when routed experts are offloaded",
            value=int(counts is not None),
        )
        if counts is not None:
            for name, doc in (
                ("hits", "Expert-cache lookups that found the expert in a GPU slot"),
                ("misses", "Expert-cache lookups that had to fill a slot from host memory"),
                ("bytes", "Bytes copied from host memory into expert slots"),
                ("staging_copies", "Whole-layer expert streams of long prompts (one per layer)"),
                ("staging_bytes", "Bytes those long-prompt layer streams copied"),
                ("prefetched", "Experts copied into a slot ahead of use by prefetch"),
                ("prefetch_used", "Prefetched experts a lookup then found (hits they made)"),
                ("prefetch_wasted", "Prefetched experts evicted or replaced before any use"),
                ("prefetch_bytes", "Bytes prefetch copied from host memory into slots"),
            ):
                yield CounterMetricFamily(f"xinfer_expert_cache_{name}", doc, value=counts[name])


class ServerMetrics:
    """The app's metrics; also the AsyncEngine's `EngineObserver`."""

    def __init__(self, model_name: str = "xinfer") -> None:
        self.registry = r = CollectorRegistry()
        self.engine_metrics = EngineMetrics(r, model_name)
        self.requests = Counter(
            "xinfer_requests", "Generation requests finished", ["finish_reason"], registry=r
        )
        self.http_requests = Counter(
            "xinfer_http_requests", "HTTP requests answered", ["path", "status"], registry=r
        )
        self.prompt_tokens = Counter("xinfer_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("xinfer_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "xinfer_time_to_first_token_seconds",
            "Time from submission to the first output token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "xinfer_inter_token_latency_seconds",
            "Time between consecutive output tokens of one request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._snapshot = _SnapshotCollector(model_name)
        r.register(self._snapshot)

    # EngineObserver
    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.engine_metrics.observe_inter_token(seconds)

    def on_finish(self, num_prompt: int, num_output: int, reason: str | None) -> None:
        self.requests.labels(finish_reason=reason or "unknown").inc()
        self.prompt_tokens.inc(num_prompt)
        self.generation_tokens.inc(num_output)
        self.engine_metrics.observe_finish(num_prompt, num_output, reason)

    def on_request_metrics(self, metrics: RequestMetrics) -> None:
        self.engine_metrics.observe_request(metrics)

    def render(self, snapshot: EngineSnapshot) -> bytes:
        self._snapshot.snapshot = snapshot
        return generate_latest(self.registry)
