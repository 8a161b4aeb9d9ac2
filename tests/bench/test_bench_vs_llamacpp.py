"""bench/bench_vs_llamacpp.py's run plan (the script itself runs on the GPU machine): the
resident run, then the budget run with each option of the command line in its engine options
and its row's name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_vs_llamacpp as vs  # noqa: E402


def test_the_runs_carry_their_options():
    parse = vs.build_parser().parse_args
    base = ["--gguf", "m.gguf", "--label", "q15"]
    [(where, options)] = vs.engine_runs(parse(base))
    assert where == "resident" and options == {"max_num_batched_tokens": 8192}
    args = parse(base + ["--budget-gb", "12", "--compress", "--prefetch", "1", "--skip-resident"])
    [(where, options)] = vs.engine_runs(args)
    assert where == "12 GB auto packed prefetch 1"
    assert options == {"moe_offload": "auto", "gpu_memory_limit_gb": 12.0,
                       "max_num_batched_tokens": 2048, "routing_source": "qwen3-30b-a3b",
                       "moe_offload_policy": "lfu", "moe_offload_compress": True,
                       "moe_prefetch": 1}  # fmt: skip
    runs = vs.engine_runs(parse(base + ["--budget-gb", "12", "--policy", "lru"]))
    assert [w for w, _ in runs] == ["resident", "12 GB auto lru prefetch 2"]  # the default
    assert runs[1][1]["moe_prefetch"] == 2
    runs = vs.engine_runs(parse(base + ["--budget-gb", "12", "--prefetch", "0"]))
    assert runs[1] == ("12 GB auto", {**runs[1][1], "moe_prefetch": 0})  # off, said as before
    runs = vs.engine_runs(parse(base + ["--budget-gb", "12", "--stream-buffers", "1"]))
    assert runs[1][0] == "12 GB auto 1 stream buffer prefetch 2"
    assert runs[1][1]["moe_offload_stream_buffers"] == "1"
    runs = vs.engine_runs(parse(base + ["--budget-gb", "12", "--stream-buffers", "2"]))
    assert runs[1][0] == "12 GB auto 2 stream buffers prefetch 2"
    auto = vs.engine_runs(parse(base + ["--budget-gb", "12"]))[1][1]
    assert "moe_offload_stream_buffers" not in auto  # the engine's auto


def test_decode_offload_reports_rates_per_token_and_prefetch_use() -> None:
    """The decode runs' counters: hit rate, MB a token, and prefetch's counts with its waste
    a token (only when prefetch is on)."""
    stats = {"hit_rate": 0.93812, "bytes_moved": 66 * 2_654_208}
    assert vs._decode_offload(stats, 66) == {"decode_hit_rate": 0.9381, "decode_mb_per_token": 2.7}
    pf = {"predicted": 100, "present": 60, "prefetched": 30, "dropped": 10, "used": 21,
          "wasted": 9, "wasted_bytes": 9 * 2_654_208, "distance": 2}  # fmt: skip
    row = vs._decode_offload({**stats, "prefetch": pf}, 66)
    assert row["prefetch"] == {"predicted": 100, "present": 60, "prefetched": 30, "dropped": 10,
                               "used": 21, "wasted": 9, "wasted_mb_per_token": 0.4}  # fmt: skip
