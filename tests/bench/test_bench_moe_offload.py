"""bench/bench_moe_offload.py: the stream arithmetic, the needle builder and checker, the
/metrics parser, the Markdown writer, and one end-to-end run of the script against a tiny
CPU model (two rates) that must report identical text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from offload_bench import needle, report, server  # noqa: E402
from offload_bench.timing import inter_token_gaps, percentile, stream_stats  # noqa: E402


def test_percentile_interpolates_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 100) == 5.0
    assert percentile(xs, 90) == pytest.approx(4.6)
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_stream_stats_from_recorded_timestamps():
    # sent at 10.0; first token at 10.5; then chunks every 20 ms, the 4th carrying 2 tokens
    times = [10.5, 10.52, 10.54, 10.58, 10.60]
    counts = [1, 1, 1, 2, 1]
    s = stream_stats(10.0, times, counts)
    assert s.num_tokens == 6
    assert s.ttft_s == pytest.approx(0.5)
    assert s.decode_tok_s == pytest.approx(5 / 0.1)  # 5 tokens after the first in 100 ms
    assert s.step_s == pytest.approx(0.02)
    gaps = inter_token_gaps(times, counts)
    assert gaps == pytest.approx([0.02] * 5)  # the 40 ms gap split over its 2 tokens
    assert s.itl_p50_ms == pytest.approx(20) and s.itl_p99_ms == pytest.approx(20)
    # the usage count wins over the chunk counts
    assert stream_stats(10.0, times, counts, total_tokens=11).decode_tok_s == pytest.approx(100)


def test_stream_stats_edge_cases():
    empty = stream_stats(0.0, [], [])
    assert empty.ttft_s is None and empty.decode_tok_s is None and empty.itl_p50_ms is None
    one = stream_stats(0.0, [0.3], [1])
    assert one.ttft_s == pytest.approx(0.3) and one.decode_tok_s is None
    with pytest.raises(ValueError):
        stream_stats(0.0, [1.0], [])


def test_needle_prompt_hits_the_token_count_and_hides_the_fact():
    count = lambda text: len(text.split()) + 5  # a stand-in tokenizer: words + template
    p = needle.build_needle_prompt(500, count, seed=3)
    assert p.num_tokens == count(p.text) <= 500
    assert p.num_tokens > 500 - 20  # within one filler sentence of the target
    assert f"the secret code is {p.code}." in p.text
    assert 0.1 <= p.depth <= 0.9
    before = p.text.index(p.code) / len(p.text)
    assert abs(before - p.depth) < 0.1  # the fact sits at its depth
    assert p.text.endswith(needle.QUESTION)
    assert needle.build_needle_prompt(500, count, seed=3) == p  # deterministic
    assert needle.build_needle_prompt(500, count, seed=4).code != p.code
    with pytest.raises(ValueError):
        needle.build_needle_prompt(10, count)


def test_needle_checker():
    code = "4817-ORCHID"
    assert needle.contains_fact("The secret code is 4817-ORCHID.", code)
    assert needle.contains_fact("4817 orchid", code)
    assert needle.contains_fact("code: 4817-Orchid!", code)
    assert not needle.contains_fact("4817", code)
    assert not needle.contains_fact("4871-ORCHID", code)
    assert not needle.contains_fact("", code)


def test_prometheus_parser_and_expert_counters():
    text = """# HELP xinfer_expert_cache_hits_total Expert-cache lookups
# TYPE xinfer_expert_cache_hits_total counter
xinfer_expert_cache_hits_total 120.0
xinfer_expert_cache_misses_total 30.0
xinfer_expert_cache_bytes_total 2.8e+08
xinfer_expert_cache_prefetch_bytes_total 2e+07
xinfer_http_requests_total{path="/v1/chat completions",status="200"} 3.0 1700000000000
xinfer_http_requests_total{path="/health",status="200"} 4.0
garbage line
xinfer_kv_cache_usage_ratio NaN
"""
    samples = server.parse_prometheus(text)
    assert samples['xinfer_http_requests_total{path="/v1/chat completions",status="200"}'] == 3
    assert server.metric_total(samples, "xinfer_http_requests") == 7
    assert server.metric_total(samples, "missing") is None
    # bytes: misses' and prefetch's copies, both over the link
    assert server.expert_counters(samples) == {"hits": 120, "misses": 30, "bytes": 3e8}
    assert server.expert_counters({"xinfer_moe_offload_enabled": 0.0}) is None
    before = {"hits": 100.0, "misses": 10.0, "bytes": 1e8}
    d = report.counter_delta(before, server.expert_counters(samples))
    assert d["hits"] == 20 and d["misses"] == 20 and d["hit_rate"] == 0.5


def test_startup_log_parser():
    log = (
        "INFO xinfer: MoE offload: 13 of 128 experts per layer on the GPU (auto), 48 layers\n"
        "INFO xinfer: KV cache: 58000 tokens (3625 blocks of 16), max model len 8192\n"
    )
    assert server.parse_startup_log(log) == {
        "kv_tokens": 58000,
        "gpu_experts": 13,
        "num_experts": 128,
    }
    assert server.parse_startup_log("")["kv_tokens"] is None
    summary = (  # the engine's start-up summary line
        "INFO xinfer: ready in 9.1 s: Qwen3MoeForCausalLM on cuda:0 (NVIDIA H200), bfloat16; "
        "weights 57.10 GiB: 3.10 GiB on the device, 54.00 GiB of experts in host RAM; MoE "
        "offload auto: 13 of 128 experts per layer in device slots (5.50 GB, staging 1.21 GB, "
        "prefetch 2 layers ahead); "
        "KV cache: 58000 tokens (bfloat16), max model len 8192; prefix caching on; CUDA graphs on"
    )
    assert server.parse_startup_log(log.splitlines()[0] + "\n" + summary)["kv_tokens"] == 58000


def _record(rate: str, tok_s: float, hits=None, nbytes=None, **kw) -> dict:
    m = {"num_tokens": 200, "ttft_s": 1.3, "decode_tok_s": tok_s, "step_s": 1 / tok_s}
    m.update(itl_p50_ms=37.2, itl_p90_ms=44.0, itl_p99_ms=49.4)
    delta = None
    if hits is not None:
        delta = {"hits": hits, "misses": 100 - hits, "bytes": nbytes, "hit_rate": hits / 100}
    return {"rate": rate, "measured": m, "expert_delta": delta, "kv_tokens": 58000, **kw}


def test_limits_and_markdown():
    records = [
        _record("0", 100.0),
        _record("0.2", 20.0, hits=20, nbytes=200 * 1e9, gpu_experts=26, num_experts=128),
        _record("auto", 25.0, hits=31, nbytes=100 * 1e9, gpu_experts=40, num_experts=128),
        {"rate": "0.1", "error": "xinfer: error: out of memory", "load_s": None},
    ]
    # 1 GB/token at 50 GB/s = 20 ms beside 10 ms resident → 33.3 tok/s; measured 20 → 60%
    report.add_limits(records, t_resident_s=0.01, bandwidth_gbps=50.0)
    assert records[1]["bytes_per_token"] == pytest.approx(1e9)
    assert records[1]["limit_tok_s"] == pytest.approx(1 / 0.03)
    assert records[1]["efficiency"] == pytest.approx(0.6)
    assert records[0]["limit_tok_s"] == pytest.approx(100) and records[0]["efficiency"] == 1
    assert report.limit_tok_s(None, 1e9, 50) is None and report.limit_tok_s(0.01, 1e9, None) is None
    meta = {
        "model": "bench/configs/qwen3_30b_a3b",
        "date": "2026-12-02",
        "gpu": "NVIDIA H200",
        "command": "python3 bench/bench_moe_offload.py ...",
        "load_format": "dummy",
        "max_tokens": 200,
        "kvcache_dtype": "auto",
        "bandwidth": {"copy_engine_expert_gbps": 54.5, "fill_kernel_gbps": 50.8},
        "bandwidth_gbps": 54.5,
        "t_resident_ms": 10.0,
        "verdict": "generated text byte-identical across rates 0, 0.2, auto",
    }
    page = report.render_markdown(meta, records)
    lines = page.splitlines()
    head = "| GPU experts | KV tokens | TTFT | Decode tok/s | Inter-token p50 / p90 / p99 ms |"
    assert any(ln.startswith(head) for ln in lines)
    assert "| none | 58k | 1.3 s | 100.0 | 37 / 44 / 49 | — | — | 100.0 | 100% |" in lines
    assert "| 20% (26/128) | 58k | 1.3 s | 20.0 | 37 / 44 / 49 | 20.0% | 1 | 33.3 | 60% |" in lines
    assert any(ln.startswith("| auto (31%) | 58k |") for ln in lines)
    assert any(ln.startswith("| 10% | does not run |") for ln in lines)
    assert "- 10% failed: xinfer: error: out of memory" in lines
    assert "byte-identical" in page and "NVIDIA H200" in page and "54.5 GB/s" in page
    main_rows = lines[lines.index(next(ln for ln in lines if ln.startswith(head))) :][:6]
    assert all(ln.count("|") == len(report.COLUMNS) + 1 for ln in main_rows)
    assert "\n\n\n" not in page


def test_concurrent_limits_and_table():
    def conc(n, step_s, nbytes=None, tokens=64, texts=("a", "b")):
        delta = None if nbytes is None else {"hits": 30, "misses": 10, "bytes": nbytes,
                                             "hit_rate": 0.75}  # fmt: skip
        return {"concurrency": n, "step_s": step_s, "decode_tok_s": n / step_s,
                "decode_tokens": tokens, "expert_delta": delta, "texts": list(texts),
                "itl_p50_ms": 40.0, "itl_p90_ms": 45.0}  # fmt: skip

    records = [
        {"rate": "0", "concurrent": [conc(8, 0.005)]},
        # 64 tokens moved 32 GB: 0.5 GB a token, 4 GB a step of 8 = 80 ms at 50 GB/s
        {"rate": "0.1", "gpu_experts": 13, "num_experts": 128,
         "concurrent": [conc(8, 0.1, nbytes=32e9), conc(32, 0.2, nbytes=1e9)]},
        {"rate": "0.2", "concurrent": [{"concurrency": 8, "error": "ReadTimeout: x"}]},
    ]  # fmt: skip
    records[1]["concurrent"][0]["texts"] = ["a", "c"]
    report.add_concurrent_limits(records, 50.0)
    c8 = records[1]["concurrent"][0]
    assert c8["bytes_per_token"] == pytest.approx(0.5e9)
    assert c8["limit_tok_s"] == pytest.approx(8 / 0.085)
    assert c8["efficiency"] == pytest.approx(0.85) and c8["identical"] is False
    assert "limit_tok_s" not in records[1]["concurrent"][1]  # no resident row of 32 streams
    page = report.render_markdown(
        {"model": "m", "date": "d", "gpu": "g", "command": "c", "load_format": "dummy",
         "max_tokens": 8, "kvcache_dtype": "auto", "bandwidth": {}, "bandwidth_gbps": 50.0,
         "verdict": "v", "routing": "qwen3-30b-a3b"},
        records,
    )  # fmt: skip
    lines = page.splitlines()
    assert "- routing: qwen3-30b-a3b" in lines
    assert "| 10% (13/128) | 8 | 80.0 | 100.0 | 40 / 45 | 75.0% | 0.5 | 94.1 | 85% | DIFFERS |" in (
        lines
    )
    assert "| none | 8 | 1600.0 | 5.0 | 40 / 45 | — | — | 1600.0 | 100% | ref |" in lines
    assert any(ln.startswith("| 20% | 8 | ReadTimeout: x |") for ln in lines)
    assert "\n\n\n" not in page


def test_routing_default_and_server_flag():
    from bench_moe_offload import build_parser, concurrency_levels, routing_source, server_command

    args = build_parser().parse_args(["--model", "m", "--out", "o", "--load-format", "dummy"])
    assert routing_source(args) == "qwen3-30b-a3b"
    assert server_command(args, 8123)[-2:] == ["--routing-source", "qwen3-30b-a3b"]
    real = build_parser().parse_args(["--model", "m", "--out", "o"])
    assert routing_source(real) == "router" and "--routing-source" not in server_command(real, 1)
    forced = build_parser().parse_args(["--model", "m", "--out", "o", "--routing", "uniform"])
    assert server_command(forced, 1)[-1] == "uniform"
    assert concurrency_levels("1,8,32") == [8, 32]
    with pytest.raises(ValueError):
        concurrency_levels("0,8")


def test_bandwidth_is_na_without_cuda():
    import torch
    from offload_bench import bandwidth

    if torch.cuda.is_available():
        pytest.skip("measures for real on a GPU")
    assert bandwidth.measure(9.44, 0) == {"cuda": False}


def test_merge_records_orders_rates_and_replaces_reruns():
    from bench_moe_offload import merge_records, parse_rates

    earlier = [{"rate": "auto", "text": "old"}, {"rate": "0.2"}, {"rate": "0"}]
    merged = merge_records(earlier, [{"rate": "auto", "text": "new"}, {"rate": "0.1"}])
    assert [r["rate"] for r in merged] == ["0", "0.1", "0.2", "auto"]
    assert merged[-1]["text"] == "new"
    assert parse_rates("0, 0.10,auto,1") == ["0", "0.1", "auto", "1"]
    for bad in ("1.5", "x", ""):
        with pytest.raises(ValueError):
            parse_rates(bad)


def test_identity_verdict():
    a, b = {"rate": "0", "text": "abc"}, {"rate": "0.5", "text": "abc"}
    assert report.identity_verdict([a, b])[0] is True
    assert report.identity_verdict([a])[0] is None
    same, text = report.identity_verdict([a, {"rate": "auto", "text": "abd"}])
    assert same is False and "char 2" in text


@pytest.mark.slow
def test_script_end_to_end_on_cpu(tmp_path):
    from chat_model import write_chat_model

    model = write_chat_model(tmp_path / "model")
    out = tmp_path / "res" / "tiny"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_moe_offload.py"), "--model", str(model)]
    cmd += ["--rates", "0,0.5", "--max-tokens", "16", "--device", "cpu"]
    cmd += ["--max-model-len", "512", "--prompt-tokens", "200", "--out", str(out)]
    cmd += ["--concurrency", "1,3", "--concurrent-tokens", "40"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[rate 0.5] measuring 16 tokens" in proc.stdout
    data = json.loads(out.with_name("tiny.json").read_text())
    assert data["is_identical"] is True
    r0, r5 = data["records"]
    assert r0["measured"]["num_tokens"] == r5["measured"]["num_tokens"] == 16
    assert r0["text"] == r5["text"] and r0["exit_code"] == r5["exit_code"] == 0
    assert r0["expert_delta"] is None and r5["expert_delta"]["hits"] > 0
    assert (r5["gpu_experts"], r5["num_experts"]) == (4, 8)
    assert r5["needle"]["num_tokens"] <= 200 and r5["needle"]["found"] in ("yes", "no")
    [c0], [c5] = r0["concurrent"], r5["concurrent"]
    assert c0["concurrency"] == c5["concurrency"] == 3 and c5["identical"] is True
    assert c5["decode_tokens"] > 0 and c5["expert_delta"]["hits"] + c5["expert_delta"]["misses"]
    page = out.with_name("tiny.md").read_text()
    assert "byte-identical across rates 0, 0.5" in page and "| 50% (4/8) |" in page
    assert "| 50% (4/8) | 3 |" in page
    assert proc.stdout.rstrip().endswith(page.rstrip().splitlines()[-1])  # table printed last
