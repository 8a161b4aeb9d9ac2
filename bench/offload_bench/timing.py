"""Arithmetic on one streamed response: percentiles (linear interpolation, like numpy's
default), time to first token, decode tok/s and inter-token latencies from the arrival
times of the SSE chunks and the number of tokens each chunk carried."""

from __future__ import annotations

from dataclasses import asdict, dataclass


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`, interpolating linearly between ranks."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class StreamStats:
    num_tokens: int
    ttft_s: float | None  # request sent → first token chunk
    decode_tok_s: float | None  # tokens after the first ÷ (last chunk − first chunk)
    step_s: float | None  # 1 / decode_tok_s: the measured decode step
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    itl_p99_ms: float | None
    itl_mean_ms: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def inter_token_gaps(times: list[float], counts: list[int]) -> list[float]:
    """Seconds between tokens: a chunk that carried n tokens after a gap g counts as n
    gaps of g / n (a token that ends mid-UTF-8 character arrives with the next one)."""
    gaps = []
    for prev, t, n in zip(times, times[1:], counts[1:]):
        n = max(1, n)
        gaps += [(t - prev) / n] * n
    return gaps


def stream_stats(
    t_send: float, times: list[float], counts: list[int], total_tokens: int | None = None
) -> StreamStats:
    """`times[i]`: arrival of chunk i (perf_counter seconds), `counts[i]`: its tokens;
    `total_tokens` (the usage count, when the server sent one) wins over sum(counts)."""
    if len(times) != len(counts):
        raise ValueError("times and counts must have the same length")
    total = total_tokens if total_tokens is not None else sum(counts)
    if not times:
        return StreamStats(total, None, None, None, None, None, None, None)
    ttft = times[0] - t_send
    span = times[-1] - times[0]
    after_first = total - max(1, counts[0])
    rate = after_first / span if span > 0 and after_first > 0 else None
    gaps = inter_token_gaps(times, counts)
    ms = [1e3 * g for g in gaps]
    return StreamStats(
        num_tokens=total,
        ttft_s=ttft,
        decode_tok_s=rate,
        step_s=1 / rate if rate else None,
        itl_p50_ms=percentile(ms, 50),
        itl_p90_ms=percentile(ms, 90),
        itl_p99_ms=percentile(ms, 99),
        itl_mean_ms=sum(ms) / len(ms) if ms else None,
    )
