"""Offload statistics: per-layer counters kept on the device (updated by the lookup kernel
and the prompt pass's layer streaming, so reading them is the only sync), the stats dict
behind `LLM.offload_stats()` and the server's metrics, and the opt-in per-call time profile.

Keys of `OffloadStats.snapshot()` (totals at the top level, the same per layer in "layers"):
  hits, misses          distinct experts per lookup call found in / copied into slots or
                        overflow rows (the call's experts, never more)
  hit_rate              hits / (hits + misses), 0.0 before the first call
  overflow_misses       misses that went to the call-local overflow rows (every slot was
                        taken by the same call)
  max_call_misses       the most experts one lookup call copied (per layer: its maximum;
                        total: the maximum over layers)
  bytes_copied          misses * expert bytes (zero-copy fills host → slots / overflow);
                        every byte count here is what crossed the link: with
                        `--moe-offload-compress`, a packed expert's stored bytes
  staging_copies        whole-layer streams of prompt passes (once per long prompt and layer)
  staging_bytes         bytes those streams moved host → device (experts already in slots
                        are used in place and not counted)
  bytes_moved           bytes_copied + staging_bytes
  calls                 lookup calls
plus policy (the slot policy, `lru` or `lfu`), compressed (some experts are packed in the
host store, `--moe-offload-compress`), slots_per_layer (all E for a resident layer),
num_experts, num_layers, resident_layers (layers whose every expert fits on the device: they
run resident, with no slots, lookups or copies, so their counters stay 0), offloaded_layers,
pinned_gb, slot_gb (offloaded layers' slots), resident_gb, staging_gb (the shared overflow /
streaming regions), stream_buffers (the prompt pass's, 1 or 2: offload/sizing.py; 0 when no
layer is offloaded), device, on CUDA host_read_gbps and link_gbps (the fill kernel reading
the host store, and the copy engine, timed at start-up: offload/link_check.py) and, with
XINFER_MOE_OFFLOAD_PROFILE=1, "profile" (seconds summed over calls, and call count). Each
entry of "layers" says `resident`.

With prefetch on (offload/prefetch.py), "prefetch" (totals; per layer the same keys under
each layer's "prefetch") counts, for the layers prefetched into:
  predicted             distinct experts predicted (per reservation)
  present / prefetched / dropped   of those: already in a slot / copied into one / no slot
                        left (predicted = present + prefetched + dropped)
  used / wasted / pending   of the prefetched: hit before they left their slot / not /
                        not settled yet (the last prediction of each layer) — they add up
  prefetched_bytes, used_bytes, wasted_bytes   the same in bytes
and bytes_moved includes prefetched_bytes (hits and misses count only the lookups)."""

from __future__ import annotations

import logging
import time

import torch

from xinfer.offload.prefetch_table import (
    DROPPED,
    NUM_PREFETCH_COUNTERS,
    PREDICTED,
    PREFETCHED,
    PRESENT,
    USED,
    WASTED,
)
from xinfer.offload.slot_cache import (
    CALLS,
    HITS,
    MAX_CALL_MISSES,
    MISSES,
    NUM_COUNTERS,
    OVERFLOW,
    STAGING_COPIES,
    STREAMED,
)

logger = logging.getLogger("xinfer")
GB = 1e9
_PROFILE_KEYS = ("launch_gap", "gpu_wait", "host", "copy")


def _rates(row: list[int], expert_bytes: int) -> dict:
    hits, misses, streamed = row[HITS], row[MISSES], row[STREAMED]
    return {
        "hits": hits,
        "misses": misses,
        "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "overflow_misses": row[OVERFLOW],
        "max_call_misses": row[MAX_CALL_MISSES],
        "bytes_copied": misses * expert_bytes,
        "staging_copies": row[STAGING_COPIES],
        "staging_bytes": streamed * expert_bytes,
        "bytes_moved": (misses + streamed) * expert_bytes,
        "calls": row[CALLS],
    }


_PREFETCH_KEYS = ("predicted", "present", "prefetched", "dropped", "used", "wasted", "pending")


def _prefetch(row: list[int], expert_bytes: int) -> dict:
    out = {
        "predicted": row[PREDICTED],
        "present": row[PRESENT],
        "prefetched": row[PREFETCHED],
        "dropped": row[DROPPED],
        "used": row[USED],
        "wasted": row[WASTED],
        "pending": row[PREFETCHED] - row[USED] - row[WASTED],
    }
    for key in ("prefetched", "used", "wasted"):
        out[f"{key}_bytes"] = out[key] * expert_bytes
    return out


def _prefetch_total(layers: list[dict]) -> dict:
    keys = _PREFETCH_KEYS + ("prefetched_bytes", "used_bytes", "wasted_bytes")
    return {k: sum(la["prefetch"][k] for la in layers) for k in keys}


class OffloadStats:
    def __init__(self, num_layers: int, device: torch.device, policy: str) -> None:
        self.device = device
        self.policy = policy
        # (L, NUM_COUNTERS) int64, columns as in slot_cache.py — row i is layer i's.
        self.counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int64, device=device)
        self.expert_bytes: list[int] = []  # per layer: an expert as the slots hold it
        self.moved_expert_bytes: list[int] = []  # per layer: what a miss moves (packed: less)
        self.slots: list[int] = []
        self.num_experts: list[int] = []
        self.is_resident: list[bool] = []  # per layer: all experts on the device
        self.pinned_bytes = 0
        self.staging_buffer_bytes = 0  # device memory of the staging rows and buffers
        self.stream_buffers = 0  # the prompt pass's stream buffers (slot_pool.py regions)
        self.profile: CallProfile | None = None
        # (L, NUM_PREFETCH_COUNTERS) int64, columns as in prefetch_table.py (prefetch on)
        self.prefetch_counters = torch.zeros(
            num_layers, NUM_PREFETCH_COUNTERS, dtype=torch.int64, device=device
        )
        self.prefetch: dict | None = None  # {"distance", "predictor"} when prefetch is on
        self.prefetcher = None  # its reset also clears pending slots
        # {"host_read_gbps", "link_gbps"}: measured at start-up on CUDA (link_check.py)
        self.link: dict[str, float] | None = None

    def reset(self) -> None:
        self.counters.zero_()
        self.prefetch_counters.zero_()
        if self.prefetcher is not None:
            self.prefetcher.reset_stats()
        if self.profile is not None:
            self.profile.reset()

    def snapshot(self) -> dict:
        both = torch.cat([self.counters, self.prefetch_counters], dim=1).cpu().tolist()
        layers = []
        for i, row in enumerate(both):  # the one device read
            layer = {
                "layer": i,
                "slots": self.slots[i],
                "resident": self.is_resident[i],
                **_rates(row[:NUM_COUNTERS], self.moved_expert_bytes[i]),
            }
            if self.prefetch is not None:
                layer["prefetch"] = _prefetch(row[NUM_COUNTERS:], self.moved_expert_bytes[i])
                layer["bytes_moved"] += layer["prefetch"]["prefetched_bytes"]
            layers.append(layer)
        summed = ("hits", "misses", "calls", "overflow_misses", "bytes_copied")
        summed += ("staging_copies", "staging_bytes", "bytes_moved")
        total = {k: sum(layer[k] for layer in layers) for k in summed}
        total["max_call_misses"] = max((la["max_call_misses"] for la in layers), default=0)
        seen = total["hits"] + total["misses"]
        total["hit_rate"] = total["hits"] / seen if seen else 0.0
        per_layer = list(zip(self.slots, self.expert_bytes, self.is_resident))
        out = {
            **total,
            "policy": self.policy,
            "compressed": self.moved_expert_bytes != self.expert_bytes,
            "num_layers": len(layers),
            "resident_layers": sum(self.is_resident),
            "offloaded_layers": len(layers) - sum(self.is_resident),
            "slots_per_layer": list(self.slots),
            "num_experts": list(self.num_experts),
            "pinned_gb": self.pinned_bytes / GB,
            "slot_gb": sum(s * b for s, b, resident in per_layer if not resident) / GB,
            "resident_gb": sum(s * b for s, b, resident in per_layer if resident) / GB,
            "staging_gb": self.staging_buffer_bytes / GB,
            "stream_buffers": self.stream_buffers,
            "device": str(self.device),
            "layers": layers,
        }
        if self.prefetch is not None:
            out["prefetch"] = {**self.prefetch, **_prefetch_total(layers)}
        if self.link is not None:
            out.update(self.link)
        if self.profile is not None:
            out["profile"] = self.profile.totals()
        return out


def format_summary(stats: dict, elapsed_s: float | None = None) -> str:
    """One line for the end of a CLI generation: hit rate, GB moved and (given the elapsed
    time) the host → GPU rate."""
    if stats["num_layers"] and not stats["offloaded_layers"]:
        return (
            f"MoE offload: every expert fits on the device; all {stats['num_layers']} MoE "
            "layers run resident (no lookups, nothing moved)"
        )
    moved = stats["bytes_moved"] / GB
    line = (
        f"MoE offload: hit rate {100 * stats['hit_rate']:.1f}% "
        f"({stats['hits']} hits, {stats['misses']} misses), {moved:.2f} GB moved host→device "
        f"({stats['bytes_copied'] / GB:.2f} GB slot fills, {stats['staging_copies']} layer "
        f"streams of {stats['staging_bytes'] / GB:.2f} GB for long prompts)"
    )
    pf = stats.get("prefetch")
    if pf:  # its bytes are in `moved`: say how many, and how many a lookup then used
        line += (
            f"; prefetch {pf['distance']} layers ahead copied {pf['prefetched_bytes'] / GB:.2f} GB "
            f"({pf['prefetched']} experts, {pf['used']} used, {pf['wasted']} wasted)"
        )
    if elapsed_s:
        line += f", {moved / elapsed_s:.2f} GB/s over {elapsed_s:.1f} s"
    prof = stats.get("profile")
    if prof and prof["calls"]:  # XINFER_MOE_OFFLOAD_PROFILE=1: the per-call time split
        n = prof["calls"]
        split = ", ".join(
            f"{k.replace('_', ' ')} {1e3 * prof[f'{k}_s'] / n:.3f} ms" for k in _PROFILE_KEYS
        )
        line += f"; mean per MoE call over {n} calls: {split}"
    return line


class CallProfile:
    """XINFER_MOE_OFFLOAD_PROFILE=1: wall-time split of every MoE call, summed over calls.

    launch_gap: host time between the end of the previous MoE call and this one;
    gpu_wait: syncs waiting for earlier and for this call's GEMM work; host: launching the
    expert GEMM; copy: lookup + fill from launch to completion."""

    def __init__(self, device: torch.device, log_every: int = 2000) -> None:
        self.device, self.log_every = device, log_every
        self.reset()

    def reset(self) -> None:
        self.sums = dict.fromkeys(_PROFILE_KEYS, 0.0)
        self.num_calls = 0
        self.last_exit: float | None = None

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def add(self, **seconds: float) -> None:
        for k, v in seconds.items():
            self.sums[k] += v
        self.num_calls += 1
        self.last_exit = time.perf_counter()
        if self.num_calls % self.log_every == 0:
            logger.info("%s", self.format())

    def totals(self) -> dict:
        return {**{f"{k}_s": v for k, v in self.sums.items()}, "calls": self.num_calls}

    def format(self) -> str:
        n = max(1, self.num_calls)
        parts = ", ".join(
            f"{k.replace('_', ' ')} {1e3 * v / n:.3f} ms" for k, v in self.sums.items()
        )
        return f"MoE offload profile, mean per MoE call over {self.num_calls} calls: {parts}"
