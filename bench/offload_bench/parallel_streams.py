"""Several streamed requests at once (a decode batch of N through the server): the streams
run in threads; the expert-cache counters are scraped once every stream has its first token
(the prompts' prefill is over) and again when all have finished, so hit rate and bytes per
token count decode only; the aggregate decode rate is the tokens after that first scrape
over the time they took."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from offload_bench import client, report
from offload_bench.timing import percentile


def run_concurrent(
    base: str,
    prompts: list,
    max_tokens: int,
    scrape: Callable[[], dict | None],
) -> dict:
    """`prompts`: one per stream (text or token ids); `scrape()`: the expert counters."""
    n = len(prompts)
    results: list[client.StreamResult | None] = [None] * n
    errors: list[str] = []
    first = [threading.Event() for _ in range(n)]  # set at each stream's first token

    def stream(i: int) -> None:
        try:
            results[i] = client.stream_generation(
                base, prompts[i], max_tokens, on_first_token=first[i].set
            )
        except Exception as e:  # noqa: BLE001 - reported with the row
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            first[i].set()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for event in first:
        event.wait(timeout=3600)
    t_before = time.perf_counter()
    before = scrape()
    for t in threads:
        t.join()
    after, t_after = scrape(), time.perf_counter()
    if errors or any(r is None for r in results):
        return {"concurrency": n, "error": errors[0] if errors else "a stream did not finish"}
    # tokens that arrived between the scrapes, and the window they arrived in
    arrivals = [(t, c) for r in results for t, c in zip(r.times, r.counts) if t > t_before]
    tokens = sum(c for _, c in arrivals)
    span = (max(t for t, _ in arrivals) - t_before) if arrivals else 0.0
    gaps = [1e3 * (b - a) for r in results for a, b in zip(r.times, r.times[1:]) if a > t_before]
    rate = tokens / span if span > 0 else None
    return {
        "concurrency": n,
        "decode_tok_s": rate,
        "step_s": n / rate if rate else None,  # one batch step of all N streams
        "decode_tokens": tokens,
        "ttft_max_s": max(r.times[0] - r.t_send for r in results),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p90_ms": percentile(gaps, 90),
        "expert_delta": report.counter_delta(before, after),
        "window_s": t_after - t_before,
        "texts": [r.text for r in results],
    }
