"""bench/bench_offload_decode.py: the limit and ratio arithmetic per (fraction, batch), the
identity check, the tables, the engine plan (resident first; long prompts in eager engines
of their own, `auto` with a reserve that holds their KV cache), and one end-to-end run of
the script on a tiny CPU model (two engines, two batch sizes, a TTFT prompt)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_offload_decode as bench  # noqa: E402
from offload_bench import decode_report as rep  # noqa: E402
from offload_bench import engine_worker  # noqa: E402


def _row(rate, batch, step_ms, **kw):
    base = dict(rate=rate, batch=batch, step_ms=step_ms, hits=0, misses=0, bytes_moved=0,
                steps=10, tokens=[[1, 2]] * batch)  # fmt: skip
    return {**base, **kw}


def test_limits_and_ratio_per_batch():
    rows = [
        _row("0", 1, 3.0),
        _row("0", 8, 5.0),
        # 10 steps moved 5.5 GB: 0.55 GB a step, 10 ms at 55 GB/s
        _row("0.1", 1, 14.0, hits=60, misses=20, bytes_moved=5.5e9),
        _row("0.1", 8, 30.0, hits=10, misses=30, bytes_moved=22e9),
        _row("0", 1, 3.3),  # resident again: t_resident stays the first one's
    ]
    rep.add_limits(rows, 55.0)
    one, eight = rows[2], rows[3]
    assert one["limit_ms"] == pytest.approx(3.0 + 10.0)
    assert one["ratio"] == pytest.approx(14.0 / 13.0)
    assert one["hit_rate"] == pytest.approx(0.75)
    assert one["gb_per_token"] == pytest.approx(0.55)
    assert one["tok_s"] == pytest.approx(1000 / 14)
    assert eight["limit_ms"] == pytest.approx(5.0 + 40.0)  # t_resident of batch 8
    assert eight["gb_per_token"] == pytest.approx(2.2 / 8)
    assert eight["tok_s"] == pytest.approx(8000 / 30) and eight["limit_tok_s"] == pytest.approx(
        8000 / 45
    )
    assert "limit_ms" not in rows[0] and rows[1]["tok_s"] == pytest.approx(1600)
    # a whole-layer copy: 50 GB moved, nothing missed through the slots
    cliff = [_row("0", 8, 5.0), _row("0.1", 8, 1000.0, bytes_moved=500e9, bytes_copied=0,
                                       staging_copies=480)]  # fmt: skip
    rep.add_limits(cliff, 55.0)
    assert cliff[1]["limit_ms"] == pytest.approx(5.0) and cliff[1]["ratio"] == pytest.approx(200)
    assert cliff[1]["gb_per_token"] == pytest.approx(50 / 8)
    no_bw = [_row("0", 1, 3.0), _row("0.2", 1, 4.0, bytes_moved=1e9)]
    rep.add_limits(no_bw, None)
    assert "ratio" not in no_bw[1] and no_bw[1]["gb_per_token"] == pytest.approx(0.1)


def test_identity_against_the_first_resident_row():
    rows = [_row("0", 2, 1.0), _row("0.5", 2, 1.0), _row("0.1", 2, 1.0, tokens=[[1, 3]] * 2),
            _row("0", 2, 1.0), _row("0.1", 4, 1.0)]  # fmt: skip
    rep.mark_identity(rows)
    assert [r["identical"] for r in rows] == [None, True, False, True, None]
    table = rep.decode_table(rows)
    assert "| none (resident) | 2 |" in table and "DIFFERS" in table and "ref" in table


def test_tables():
    rows = [_row("0", 1, 3.0), _row("0.1", 1, 4.0, hits=9, misses=1, bytes_moved=5.5e8,
            slots=[13] * 3, num_experts=128, staging_copies=0)]  # fmt: skip
    rep.add_limits(rows, 55.0)
    rep.mark_identity(rows)
    line = rep.decode_table(rows).splitlines()[-1]
    assert line.startswith("| 10% (13/128) | 1 | 250.0 | 4.00 |")
    assert "| 90.0% | 0.055 | 0 | 250.0 | 1.00 | identical |" in line  # limit 3 + 1 ms
    ttft = rep.ttft_table([
        {"rate": "0", "ttft": [{"tokens": 2048, "ttft_s": 0.1}, {"tokens": 32768,
                                                                  "error": "over max-model-len"}]},
        {"rate": "auto", "slots": [40], "num_experts": 128,
         "ttft": [{"tokens": 2048, "ttft_s": 0.5, "bytes_moved": 2e10}]},
    ])  # fmt: skip
    assert "| GPU experts | 2k tokens | 32k tokens |" in ttft
    assert "| none (resident) | 0.10 s (20.5k tok/s) | over max-model-len |" in ttft
    assert "| auto (40/128) | 0.50 s (4.1k tok/s, 20 GB moved) | — |" in ttft


def test_engine_plan():
    args = bench.build_parser().parse_args(
        ["--rates", "0.1,auto", "--ttft-rates", "0,0.2,auto", "--ttft-tokens", "2048,32768",
         "--batches", "1,8", "--steps", "16,4", "--warmup-steps", "8"]
    )  # fmt: skip
    jobs = bench.plan_jobs(args)
    assert [(j["rate"], j["max_model_len"]) for j in jobs] == [
        ("0", 8256), ("0.1", 8256), ("auto", 8256), ("0.2", 8256),
        ("0", 32832), ("0.2", 32832), ("auto", 32832),
    ]  # fmt: skip
    assert jobs[0]["batches"] == [1, 8] and jobs[0]["steps"] == [16, 4]
    assert jobs[0]["warmup"] == [8, 8] and jobs[0]["ttft_tokens"] == [2048]
    assert jobs[1]["ttft_tokens"] == [] and jobs[3]["batches"] == []  # 0.2: TTFT only
    assert jobs[2]["num_kv_blocks"] is None  # auto sizes its KV cache from the budget
    assert all(j["max_num_batched_tokens"] == 2048 for j in jobs)
    wide = bench.plan_jobs(bench.build_parser().parse_args(["--max-num-batched-tokens", "8192"]))
    assert {engine_worker.engine_kwargs(j)["max_num_batched_tokens"] for j in wide} == {8192}
    long_auto = jobs[-1]
    assert long_auto["enforce_eager"] and long_auto["ttft_tokens"] == [32768]
    kv_gb = bench.model_kv_bytes_per_token(args.model) * 32832 / 2**30  # ~3.0 GB for Qwen3
    assert 2.9 < kv_gb < 3.2 and long_auto["reserve_gb"] > kv_gb + 1.0
    assert jobs[-2]["reserve_gb"] is None and jobs[-2]["num_kv_blocks"] >= 32832 // 16
    only_long = bench.plan_jobs(bench.build_parser().parse_args(
        ["--batches", "", "--ttft-tokens", "32768", "--ttft-rates", "0,0.1"]))  # fmt: skip
    assert [(j["rate"], j["max_model_len"]) for j in only_long] == [("0", 32832), ("0.1", 32832)]
    with pytest.raises(SystemExit):
        bench.plan_jobs(bench.build_parser().parse_args(["--batches", "1,8", "--steps", "1,2,3"]))


@pytest.mark.slow
def test_end_to_end_on_cpu(tmp_path):
    from tiny_models import make_hf_model, write_checkpoint

    model = write_checkpoint(make_hf_model("qwen3_moe", seed=3, num_experts=16), tmp_path / "m")
    out = tmp_path / "result"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_offload_decode.py"), "--model", str(model),
           "--device", "cpu", "--dtype", "float32", "--rates", "0.25", "--batches", "1,3",
           "--warmup-steps", "2", "--steps", "3", "--ttft-tokens", "40",
           "--ttft-rates", "0.25", "--max-model-len", "96", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["rate"], r["batch"]): r for r in data["decode"]}
    assert set(rows) == {("0", 1), ("0", 3), ("0.25", 1), ("0.25", 3)}
    assert all(r["identical"] for key, r in rows.items() if key[0] == "0.25")
    one = rows[("0.25", 1)]
    assert one["hits"] + one["misses"] == 3 * 2 * 2  # 3 steps, 2 MoE layers, top-2
    three = rows[("0.25", 3)]  # 3 x 2 ids > 4 slots: overflow rows, never a whole layer
    assert three["staging_copies"] == 0 and three["hits"] + three["misses"] > 0
    [ttft] = data["ttft"]
    assert [t["tokens"] for t in ttft["ttft"]] == [40] and ttft["ttft"][0]["ttft_s"] > 0
    page = out.with_suffix(".md").read_text()
    assert "| 25% (4/16) | 1 |" in page and "40 tokens" in page
