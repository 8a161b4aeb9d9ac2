"""Offload statistics of every rank, for the user: rank 0's view of the OffloadManager
gathers each rank's snapshot (each rank has its own slots, host shard and counters) and
adds them up; the per-rank snapshots stay under "ranks"."""

from __future__ import annotations

from xinfer.offload.stats import format_summary
from xinfer.parallel.channel import RESET_STATS, STATS, StepChannel

_SUMMED = (
    "hits",
    "misses",
    "overflow_misses",
    "calls",
    "bytes_copied",
    "staging_copies",
    "staging_bytes",
    "bytes_moved",
)


def combine_stats(ranks: list[dict]) -> dict:
    """Counters and bytes summed over the ranks (each counts its own shard's lookups and
    copies), `max_call_misses` the largest; `slots_per_layer` the smallest of any rank; the
    rest from rank 0."""
    first = ranks[0]
    out = {k: v for k, v in first.items() if k not in ("layers", "ranks")}
    for k in (*_SUMMED, "pinned_gb", "slot_gb", "resident_gb", "staging_gb"):
        if k in first:
            out[k] = sum(r[k] for r in ranks)
    if "max_call_misses" in first:
        out["max_call_misses"] = max(r["max_call_misses"] for r in ranks)
    seen = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / seen if seen else 0.0
    out["slots_per_layer"] = [min(s) for s in zip(*(r["slots_per_layer"] for r in ranks))]
    layers = []
    for i, layer in enumerate(first["layers"]):
        row = {**layer, "slots": out["slots_per_layer"][i]}
        for k in _SUMMED:
            if k in layer:
                row[k] = sum(r["layers"][i][k] for r in ranks)
        if "max_call_misses" in layer:
            row["max_call_misses"] = max(r["layers"][i]["max_call_misses"] for r in ranks)
        seen = row["hits"] + row["misses"]
        row["hit_rate"] = row["hits"] / seen if seen else 0.0
        layers.append(row)
    out["layers"] = layers
    out["device"] = ",".join(r["device"] for r in ranks)
    out["tp_size"] = len(ranks)
    out["ranks"] = ranks
    return out


class TensorParallelOffloadView:
    """Rank 0's OffloadManager as the engine, CLI, server and benchmarks see it: stats of
    every rank; everything else (graph safety, slots, the store) is rank 0's own."""

    def __init__(self, manager, channel: StepChannel) -> None:
        self.manager, self.channel = manager, channel

    def __getattr__(self, name: str):
        return getattr(self.manager, name)

    def stats(self) -> dict:
        self.channel.send(STATS)
        ranks = self.channel.group.gather_objects(self.manager.stats())
        return combine_stats(ranks)

    def reset_stats(self) -> None:
        self.channel.send(RESET_STATS)
        self.manager.reset_stats()

    def format_summary(self, elapsed_s: float | None = None) -> str:
        stats = self.stats()
        rates = ", ".join(f"{100 * r['hit_rate']:.1f}%" for r in stats["ranks"])
        return f"{format_summary(stats, elapsed_s)}; per-rank hit rates {rates}"
