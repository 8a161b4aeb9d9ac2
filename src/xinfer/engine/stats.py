"""What the engine tells its operator: a start-up summary (device, dtype, weights, load time,
KV cache, offload, prefix caching) and, while busy, a periodic stats line like vLLM's
(prompt and generation throughput, running and waiting requests, KV cache usage, prefix-
and expert-cache hit rates over the interval)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xinfer.engine.engine import Engine

logger = logging.getLogger("xinfer")
GIB = 1 << 30


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def startup_summary(engine: Engine, load_s: float, weight_bytes: int, expert_bytes: int) -> str:
    """One line once the engine is ready. `weight_bytes`: all weights in their formats;
    `expert_bytes`: the routed experts among them."""
    cfg, config = engine.model_config, engine.config
    phases = ", ".join(f"{name} {s:.1f}" for name, s in engine.startup_phases.items())
    parts = [
        f"ready in {load_s:.1f} s ({phases}): {cfg.architecture} on "
        f"{device_name(engine.device)}, {str(engine.dtype).removeprefix('torch.')}",
    ]
    manager = engine.offload_manager
    if manager is None:
        parts.append(f"weights {_gib(weight_bytes)} on the device")
    else:
        stats = manager.stats()
        slots, experts = manager.min_slots, max(stats["num_experts"], default=0)
        parts.append(
            f"weights {_gib(weight_bytes)}: {_gib(weight_bytes - expert_bytes)} on the device, "
            f"{_gib(expert_bytes)} of experts in host RAM"
        )
        how = "auto" if manager.config.is_auto else f"{manager.config.fraction:g}"
        pf = stats.get("prefetch")
        ahead = f"prefetch {pf['distance']} layers ahead" if pf else "no prefetch"
        reads = ""
        if "host_read_gbps" in stats:  # measured at start-up on CUDA (offload/link_check.py)
            reads = f", host reads {stats['host_read_gbps']:.1f} GB/s"
        parts.append(
            f"MoE offload {how}: {slots} of {experts} experts per layer in device slots "
            f"({stats['slot_gb']:.2f} GB, staging {stats['staging_gb']:.2f} GB, {ahead}{reads})"
        )
    kv_dtype = str(config.cache.kv_dtype or engine.dtype).removeprefix("torch.")
    parts.append(
        f"KV cache: {engine.kv_tokens} tokens ({kv_dtype}), max model len {engine.max_model_len}"
    )
    if engine.num_state_slots:  # hybrid models: per-request recurrent state
        copies = " (double-buffered)" if engine.state_copies == 2 else ""
        parts.append(
            f"recurrent state for {engine.num_state_slots} sequences{copies}, "
            f"{_gib(engine.state_bytes)}"
        )
    parts.append(f"prefix caching {'off' if engine.allocator.prefix_cache is None else 'on'}")
    graphs = engine.runner.graph_runner
    parts.append("CUDA graphs on" if graphs is not None else "eager")
    return "; ".join(parts)


@dataclass
class _Interval:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    expert_hits: int = 0
    expert_misses: int = 0


class StatsLogger:
    """Logs a stats line at most every `interval_s` seconds while the engine has work
    (never when `interval_s` is 0). Counts come from `record_step`; hit rates are deltas
    of the engine's cumulative counters over the interval."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._start: float | None = None  # when the interval's first step began
        self._counts = _Interval()
        self._last_totals = _Interval()

    def begin_step(self) -> None:
        """An interval starts when its first step begins, so idle time is not in it."""
        if self._start is None:
            self._start = self.clock()

    def record_step(self, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        self._counts.prompt_tokens += num_prompt_tokens
        self._counts.generation_tokens += num_generation_tokens

    def _totals(self, engine: Engine) -> _Interval:
        totals = _Interval()
        prefix = engine.prefix_cache_stats()
        if prefix is not None:
            totals.prefix_queries, totals.prefix_hits = prefix.queries, prefix.hits
        if engine.offload_manager is not None:  # one small device read per line
            stats = engine.offload_manager.stats()
            totals.expert_hits, totals.expert_misses = stats["hits"], stats["misses"]
        return totals

    def reset(self, engine: Engine) -> None:
        """Start a fresh interval (after the start-up warm-ups)."""
        self._start, self._counts = None, _Interval()
        self._last_totals = self._totals(engine)

    def maybe_log(self, engine: Engine) -> str | None:
        if self.interval_s <= 0 or self._start is None:
            return None
        now = self.clock()
        elapsed = now - self._start
        if elapsed < self.interval_s:
            return None
        totals = self._totals(engine)
        c, last = self._counts, self._last_totals
        line = (
            f"engine: prompt {c.prompt_tokens / elapsed:.1f} tok/s, "
            f"generation {c.generation_tokens / elapsed:.1f} tok/s, "
            f"{len(engine.scheduler.running)} running, {len(engine.scheduler.waiting)} waiting, "
            f"KV cache {100 * engine.allocator.usage:.1f}% used"
        )
        if engine.allocator.prefix_cache is not None:
            queries = totals.prefix_queries - last.prefix_queries
            hits = totals.prefix_hits - last.prefix_hits
            line += f", prefix cache {_percent(hits, queries)} hits"
        if engine.offload_manager is not None:
            hits = totals.expert_hits - last.expert_hits
            seen = hits + totals.expert_misses - last.expert_misses
            line += f", expert cache {_percent(hits, seen)} hits"
        self._start, self._counts, self._last_totals = None, _Interval(), totals
        logger.info("%s", line)
        return line


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
