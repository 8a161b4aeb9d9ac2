"""The vLLM-style Prometheus metric set, named `xinfer:<vLLM's name>` and labelled with
`model_name`, beside the server's own `xinfer_*` metrics: per-request latency histograms
(end to end, queue, prefill, decode, inference, time to first token, inter-token), request
and token counts, and, from an engine snapshot at scrape time, running and waiting
requests, KV cache usage, preemptions and prefix-cache queries and hits."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from xinfer.engine.request import RequestMetrics

PREFIX = "xinfer:"
# vLLM's buckets (seconds), so dashboards built for it read these the same way.
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_TOKEN_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))  # 1 … 500,000


class EngineMetrics:
    """Request-level metrics, observed by the server as requests finish."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=registry)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*labels, *extra], registry=registry)

        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish", _REQUEST_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Arrival to first schedule", _REQUEST_BUCKETS
        )
        self.prefill = histogram(
            "request_prefill_time_seconds", "First schedule to first token", _REQUEST_BUCKETS
        )
        self.decode = histogram(
            "request_decode_time_seconds", "First token to last token", _REQUEST_BUCKETS
        )
        self.inference = histogram(
            "request_inference_time_seconds", "First schedule to finish", _REQUEST_BUCKETS
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Arrival to first token", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Between consecutive tokens of a request", _ITL_BUCKETS
        )
        self.prompt_len = histogram(
            "request_prompt_tokens", "Prompt tokens per finished request", _TOKEN_BUCKETS
        )
        self.output_len = histogram(
            "request_generation_tokens", "Generated tokens per finished request", _TOKEN_BUCKETS
        )
        self.success = counter("request_success", "Finished requests", ("finished_reason",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")

    def observe_request(self, m: RequestMetrics) -> None:
        name = self.model_name
        for histogram, value in (
            (self.e2e, m.e2e_s),
            (self.queue, m.queue_s),
            (self.prefill, m.prefill_s),
            (self.decode, m.decode_s),
            (self.inference, m.inference_s),
            (self.ttft, m.queue_s + m.prefill_s),
            (self.prompt_len, m.num_prompt_tokens),
            (self.output_len, m.num_output_tokens),
        ):
            histogram.labels(model_name=name).observe(value)

    def observe_inter_token(self, seconds: float) -> None:
        self.itl.labels(model_name=self.model_name).observe(seconds)

    def observe_finish(self, num_prompt: int, num_output: int, reason: str | None) -> None:
        name = self.model_name
        self.success.labels(model_name=name, finished_reason=reason or "unknown").inc()
        self.prompt_tokens.labels(model_name=name).inc(num_prompt)
        self.generation_tokens.labels(model_name=name).inc(num_output)


def snapshot_families(snap, model_name: str):
    """The scrape-time engine gauges and counters of an `EngineSnapshot`, vLLM-named."""

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        return family

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        return family

    yield gauge("num_requests_running", "Requests in the batch", snap.num_running)
    yield gauge("num_requests_waiting", "Requests waiting to be scheduled", snap.num_waiting)
    yield gauge("kv_cache_usage_perc", "KV cache usage (1 = full)", snap.kv_usage)
    yield counter("num_preemptions", "Preemptions (KV cache full)", snap.num_preemptions)
    prefix = snap.prefix_cache
    yield counter(
        "prefix_cache_queries", "Prompt tokens looked up", 0 if prefix is None else prefix.queries
    )
    yield counter(
        "prefix_cache_hits", "Prompt tokens found cached", 0 if prefix is None else prefix.hits
    )
