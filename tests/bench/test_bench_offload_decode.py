"""bench/bench_offload_decode.py: the serial and overlapped limits and ratios per (fraction,
prefetch, batch), prefetch figures (link bytes, recall, speed-up, GB per token), the
identity check, the tables, the engine plan (resident first; one engine per prefetch
distance; long prompts in eager engines of their own, `auto` with a reserve that holds
their KV cache), and one end-to-end run of the script on a tiny CPU model (three engines,
prefetch off and on, two batch sizes, a TTFT prompt)."""

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
    assert one["overlap_limit_ms"] == pytest.approx(10.0)  # the copies outlast t_resident
    assert one["overlap_ratio"] == pytest.approx(1.4)
    assert one["vs_serial_off"] == pytest.approx(13.0 / 14.0)  # its own limit: prefetch off
    assert one["hit_rate"] == pytest.approx(0.75)
    assert one["gb_per_token"] == pytest.approx(0.55)
    assert one["tok_s"] == pytest.approx(1000 / 14)
    assert eight["limit_ms"] == pytest.approx(5.0 + 40.0)  # t_resident of batch 8
    assert eight["overlap_limit_ms"] == pytest.approx(40.0)
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
    assert cliff[1]["overlap_limit_ms"] == pytest.approx(5.0)  # t_resident: nothing missed
    assert cliff[1]["gb_per_token"] == pytest.approx(50 / 8)
    no_bw = [_row("0", 1, 3.0), _row("0.2", 1, 4.0, bytes_moved=1e9)]
    rep.add_limits(no_bw, None)
    assert "ratio" not in no_bw[1] and no_bw[1]["gb_per_token"] == pytest.approx(0.1)


def _prefetch_rows() -> list[dict]:
    """Resident, prefetch off and 1 ahead at 10% (batch 1, 10 steps, experts of 110 MB)."""
    return [
        _row("0", 1, 3.0),
        # 20 misses of 110 MB in 10 steps: 0.22 GB a step, 4 ms at 55 GB/s
        _row("0.1", 1, 14.0, hits=60, misses=20, bytes_copied=5.5e9, bytes_moved=5.5e9,
             expert_bytes=1.1e8),
        # 10 misses (2.75 GB) and 20 prefetched (2.2 GB): 0.495 GB a step, 9 ms
        _row("0.1", 1, 9.0, hits=70, misses=10, bytes_copied=2.75e9, bytes_moved=4.95e9,
             prefetch=1, predictor="routing-model", expert_bytes=1.1e8, prefetch_predicted=40,
             prefetch_present=18, prefetch_prefetched=20, prefetch_dropped=2,
             prefetch_used=15, prefetch_wasted=5, prefetch_prefetched_bytes=2.2e9,
             prefetch_used_bytes=1.65e9, prefetch_wasted_bytes=0.55e9),
    ]  # fmt: skip


def test_prefetch_limits_and_statistics():
    rows = _prefetch_rows()
    rep.add_limits(rows, 55.0)
    off, on = rows[1], rows[2]
    assert off["link_bytes_per_step"] == pytest.approx(5.5e8) and "recall" not in off
    assert on["link_bytes_per_step"] == pytest.approx(4.95e8)  # misses + prefetched
    assert on["gb_per_token"] == pytest.approx(0.495)
    assert on["limit_ms"] == pytest.approx(3.0 + 9.0) and on["ratio"] == pytest.approx(0.75)
    assert on["overlap_limit_ms"] == pytest.approx(9.0) and on["overlap_ratio"] == pytest.approx(1)
    # against prefetch-off's serial limit (3 + 10 ms), not its own
    assert on["vs_serial_off"] == pytest.approx(13.0 / 9.0)
    assert on["speedup"] == pytest.approx(14.0 / 9.0) and "speedup" not in off
    assert on["recall"] == pytest.approx(15 / (15 + 10))
    no_bw = _prefetch_rows()
    rep.add_limits(no_bw, None)  # no bandwidth: no limits, the speed-up all the same
    assert "vs_serial_off" not in no_bw[2] and no_bw[2]["speedup"] == pytest.approx(14.0 / 9.0)
    assert on["prefetch_predicted_gb_per_token"] == pytest.approx(40 * 0.11 / 10)
    assert on["prefetch_prefetched_gb_per_token"] == pytest.approx(0.22)
    assert on["prefetch_used_gb_per_token"] == pytest.approx(0.165)
    assert on["prefetch_wasted_gb_per_token"] == pytest.approx(0.055)
    rep.mark_identity(rows)
    table = rep.decode_table(rows).splitlines()
    assert table[-2].startswith("| 10% | off | 1 | 71.4 |")  # off first, then 1 ahead
    assert table[-1].startswith("| 10% | 1 ahead | 1 | 111.1 | 9.00 |")
    assert "| 83.3 | 0.75 | 111.1 | 1.00 | 1.44 | identical |" in table[-1]
    pf = rep.prefetch_table(rows).splitlines()
    assert len(pf) == 3  # the header, its rule and the one prefetch row
    assert pf[-1] == (
        "| 10% | 1 ahead (routing-model) | 1 | 1.56 | 0.440 | 0.220 | 0.165 | 0.055 | 0.20 "
        "| 60.0% |"
    )


def test_identity_against_the_first_resident_row():
    rows = [_row("0", 2, 1.0), _row("0.5", 2, 1.0), _row("0.1", 2, 1.0, tokens=[[1, 3]] * 2),
            _row("0", 2, 1.0), _row("0.1", 4, 1.0)]  # fmt: skip
    rep.mark_identity(rows)
    assert [r["identical"] for r in rows] == [None, True, False, True, None]
    table = rep.decode_table(rows)
    assert "| none (resident) | — | 2 |" in table and "DIFFERS" in table and "ref" in table


def test_tables():
    rows = [_row("0", 1, 3.0), _row("0.1", 1, 4.0, hits=9, misses=1, bytes_moved=5.5e8,
            slots=[13] * 3, num_experts=128, staging_copies=0)]  # fmt: skip
    rep.add_limits(rows, 55.0)
    rep.mark_identity(rows)
    line = rep.decode_table(rows).splitlines()[-1]
    assert line.startswith("| 10% (13/128) | off | 1 | 250.0 | 4.00 |")
    # serial 3 + 1 ms, overlapped max(3, 1) ms
    assert "| 90.0% | 0.055 | 0 | 250.0 | 1.00 | 333.3 | 1.33 | 1.00 | identical |" in line
    assert rep.prefetch_table(rows) == ""  # nothing prefetched
    ttft = rep.ttft_table([
        {"rate": "0", "ttft": [{"tokens": 2048, "ttft_s": 0.1}, {"tokens": 32768,
                                                                  "error": "over max-model-len"}]},
        {"rate": "auto", "slots": [40], "num_experts": 128,
         "ttft": [{"tokens": 2048, "ttft_s": 0.5, "bytes_moved": 2e10, "first_ttft_s": 0.61}]},
    ])  # fmt: skip
    assert "| GPU experts | 2k tokens | 32k tokens |" in ttft
    assert "| none (resident) | 0.10 s (20.5k tok/s) | over max-model-len |" in ttft
    assert "| auto (40/128) | 0.50 s (4.1k tok/s, 20 GB moved; first prompt 0.61 s) | — |" in ttft


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
    assert all(j["prefetch"] == 0 for j in jobs)  # off unless asked


def test_engine_plan_with_prefetch():
    """One engine per (rate, distance); the resident one and TTFT-only rates never
    prefetch; the short TTFT prompts run in the first distance's engine only."""
    args = bench.build_parser().parse_args(
        ["--rates", "0.2,0.35", "--prefetch", "0,1", "--prefetch-margin", "0.25",
         "--ttft-rates", "0,0.2,0.5", "--ttft-tokens", "2048", "--batches", "1,8",
         "--steps", "16,4", "--warmup-steps", "8"]
    )  # fmt: skip
    jobs = bench.plan_jobs(args)
    assert [(j["rate"], j["prefetch"]) for j in jobs] == [
        ("0", 0), ("0.2", 0), ("0.2", 1), ("0.35", 0), ("0.35", 1), ("0.5", 0),
    ]  # fmt: skip
    assert [j["ttft_tokens"] for j in jobs] == [[2048], [2048], [], [], [], [2048]]
    assert jobs[-1]["batches"] == [] and all(j["prefetch_margin"] == 0.25 for j in jobs)
    meta = {"prefetch": [0, 1], "prefetch_margin": 0.25}
    assert bench.prefetch_setting(meta) == "off and 1 ahead (margin 0.25)"
    assert bench.prefetch_setting({"prefetch": [0], "prefetch_margin": None}) == "off"
    with pytest.raises(SystemExit):
        bench.plan_jobs(bench.build_parser().parse_args(["--prefetch", "-1"]))


def test_engine_plan_with_ttft_trace(tmp_path):
    """--trace-ttft: every TTFT engine whose context holds the traced prompt traces one more
    prompt into --trace-dir; without a directory it refuses."""
    args = bench.build_parser().parse_args(
        ["--batches", "", "--ttft-tokens", "2048,32768", "--ttft-rates", "0,0.1",
         "--trace-ttft", "16384", "--trace-dir", str(tmp_path)]
    )  # fmt: skip
    jobs = bench.plan_jobs(args)
    assert [(j["rate"], j["max_model_len"], j["trace_ttft"]) for j in jobs] == [
        ("0", 8256, None), ("0.1", 8256, None), ("0", 32832, 16384), ("0.1", 32832, 16384),
    ]  # fmt: skip
    assert all(j["trace_ttft_dir"] == str(tmp_path) for j in jobs)
    with pytest.raises(SystemExit, match="trace-dir"):
        bench.plan_jobs(bench.build_parser().parse_args(["--trace-ttft", "4096"]))


def test_ttft_trace_writes_a_chrome_trace(tmp_path):
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import LLM

    model = write_checkpoint(make_hf_model("qwen3_moe", seed=3), tmp_path / "m")
    llm = LLM(str(model), device="cpu", max_model_len=96, max_num_batched_tokens=16)
    row = engine_worker.trace_ttft(llm, 40, 96, tmp_path / "t" / "ttft.json")
    assert row["tokens"] == 40 and row["ttft_s"] > 0 and row["steps"] >= 1
    events = json.loads((tmp_path / "t" / "ttft.json").read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)


@pytest.mark.slow
def test_end_to_end_on_cpu(tmp_path):
    from tiny_models import make_hf_model, write_checkpoint

    model = write_checkpoint(make_hf_model("qwen3_moe", seed=3, num_experts=16), tmp_path / "m")
    out = tmp_path / "result"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_offload_decode.py"), "--model", str(model),
           "--device", "cpu", "--dtype", "float32", "--rates", "0.25", "--batches", "1,3",
           "--warmup-steps", "2", "--steps", "3", "--ttft-tokens", "40", "--prefetch", "0,1",
           "--prefetch-margin", "0", "--ttft-rates", "0.25", "--max-model-len", "96",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["rate"], r["prefetch"], r["batch"]): r for r in data["decode"]}
    assert set(rows) == {("0", 0, 1), ("0", 0, 3), ("0.25", 0, 1), ("0.25", 0, 3),
                         ("0.25", 1, 1), ("0.25", 1, 3)}  # fmt: skip
    assert all(r["identical"] for key, r in rows.items() if key[0] == "0.25")
    one = rows[("0.25", 0, 1)]
    assert one["hits"] + one["misses"] == 3 * 2 * 2  # 3 steps, 2 MoE layers, top-2
    three = rows[("0.25", 0, 3)]  # 3 x 2 ids > 4 slots: overflow rows, never a whole layer
    assert three["staging_copies"] == 0 and three["hits"] + three["misses"] > 0
    on = rows[("0.25", 1, 3)]  # the second MoE layer is predicted from the first
    assert on["predictor"] == "routing-model" and on["prefetch_predicted"] > 0
    assert on["prefetch_predicted"] == (
        on["prefetch_present"] + on["prefetch_prefetched"] + on["prefetch_dropped"]
    )
    assert on["bytes_moved"] == on["bytes_copied"] + on["prefetch_prefetched_bytes"]
    assert on["link_bytes_per_step"] * 3 == on["bytes_moved"]
    [ttft] = data["ttft"]
    assert [t["tokens"] for t in ttft["ttft"]] == [40] and ttft["ttft"][0]["ttft_s"] > 0
    page = out.with_suffix(".md").read_text()
    label = "25% (4/16, 2 stream buffers)"  # a fraction that fits keeps two
    assert f"| {label} | off | 1 |" in page and f"| {label} | 1 ahead | 3 |" in page
    assert ttft["stream_buffers"] == 2 and f"| {label} | " in page.split("Time to first")[1]
    assert "prefetch off and 1 ahead (margin 0)" in page and "40 tokens" in page
    assert "prefetch fill programs" not in page  # no fill kernel on CPU: no count reported


def test_policy_reaches_the_offload_engines_and_the_gpu_phase_parses():
    """`--policy lfu` goes to every offload engine's `--moe-offload-policy` (not the resident
    one's), and scripts/gpu_run.sh's `policyab` phase names only options the script takes."""
    from gpu_run_phases import gpu_run_args

    args = bench.build_parser().parse_args(
        ["--policy", "lfu", "--rates", "0.1", "--ttft-tokens", ""]
    )
    jobs = bench.plan_jobs(args)
    assert [j["policy"] for j in jobs] == ["lfu", "lfu"]
    kws = [engine_worker.engine_kwargs(j) for j in jobs]
    assert "moe_offload_policy" not in kws[0] and kws[1]["moe_offload_policy"] == "lfu"
    for policy in ("lru", "lfu"):
        phase = [
            a.replace("$p", policy) for a in gpu_run_args("policyab", "bench_offload_decode.py")
        ]
        assert bench.build_parser().parse_args(phase).policy == policy


def test_prefetch_phase_parses_and_takes_a_policy():
    """scripts/gpu_run.sh's `prefetchbench` names only options the bench takes, and
    PREFETCH_POLICY reaches its `--policy` (prefetch beside LRU slots; `lfu` by default)."""
    from gpu_run_phases import gpu_run_args

    plain = bench.build_parser().parse_args(
        gpu_run_args("prefetchbench", "bench_offload_decode.py")
    )
    assert plain.policy == "lfu" and plain.out == "/tmp/out/prefetch"
    env = {"PREFETCH_POLICY": "lru", "PREFETCH_PROGRAMS": "16"}
    lru = bench.build_parser().parse_args(
        gpu_run_args("prefetchbench", "bench_offload_decode.py", env)
    )
    assert (lru.policy, lru.prefetch_programs, lru.out) == ("lru", 16, "/tmp/out/prefetch_lru")
    jobs = bench.plan_jobs(lru)
    assert any(j.get("prefetch") for j in jobs) and all(j["policy"] == "lru" for j in jobs)


def test_packed_rows_get_the_limit_of_the_unpacked_bytes():
    """`--compress`: the decode table's limits count the packed bytes that crossed the
    link; the packed table adds the limit of the bytes as the slots hold them."""
    rows = [
        _row("0", 1, 3.0),
        # 20 misses of 110 MB experts in 10 steps: 0.22 GB a step unpacked, 4 ms at 55 GB/s;
        # packed, 0.165 GB a step crossed the link (3 ms)
        _row(
            "0.1",
            1,
            6.5,
            hits=60,
            misses=20,
            bytes_moved=1.65e9,
            bytes_copied=1.65e9,
            expert_bytes=110e6,
            compressed=True,
        ),  # fmt: skip
        _row(
            "0.1",
            1,
            7.0,
            hits=60,
            misses=20,
            bytes_moved=2.2e9,
            bytes_copied=2.2e9,
            expert_bytes=110e6,
        ),  # fmt: skip
    ]
    rep.add_limits(rows, 55.0)
    packed, plain = rows[1], rows[2]
    assert packed["limit_ms"] == pytest.approx(6.0)
    assert packed["unpacked_limit_ms"] == pytest.approx(7.0)
    assert packed["unpacked_ratio"] == pytest.approx(6.5 / 7.0)
    assert packed["unpacked_gb_per_token"] == pytest.approx(0.22)
    assert "unpacked_ratio" not in plain and plain["limit_ms"] == pytest.approx(7.0)
    table = rep.packed_table(rows)
    assert table.count("\n") == 2 and "| 0.93 |" in table
    assert rep.packed_table(rows[2:]) == ""


def test_compress_reaches_the_offload_engines_and_the_gpu_phase_parses():
    """`--compress` goes to every offload engine's `--moe-offload-compress` (not the resident
    one's); scripts/gpu_run.sh's `compressab` phase names only options the bench takes."""
    from gpu_run_phases import gpu_run_args

    args = bench.build_parser().parse_args(["--compress", "--rates", "0.1", "--ttft-tokens", ""])
    kws = [engine_worker.engine_kwargs(j) for j in bench.plan_jobs(args)]
    assert "moe_offload_compress" not in kws[0] and kws[1]["moe_offload_compress"] is True
    phase = gpu_run_args("compressab", "bench_offload_decode.py")
    for flag in ("", "--compress"):  # $f: the plain run's nothing, the packed run's flag
        argv = [flag if a == "$f" else a for a in phase if a != "$f" or flag]
        parsed = bench.build_parser().parse_args(argv)
        assert parsed.compress == bool(flag) and parsed.rates == "0.1,0.2,0.35"


@pytest.mark.parametrize("phase", ["offloadbench", "hybridoffload"])
def test_an_empty_ttft_list_in_the_gpu_phase_means_no_ttft_engines(phase):
    """OFFLOAD_TTFT="" runs no TTFT rows (it once fell back to the default and spent a call's
    engines on them); unset, the phase keeps its default lengths."""
    from gpu_run_phases import gpu_run_args

    none = bench.build_parser().parse_args(
        gpu_run_args(phase, "bench_offload_decode.py", {"OFFLOAD_TTFT": ""})
    )
    default = bench.build_parser().parse_args(gpu_run_args(phase, "bench_offload_decode.py"))
    assert none.ttft_tokens == "" and default.ttft_tokens == "2048,8192"
    assert not any(j["ttft_tokens"] for j in bench.plan_jobs(none))
    assert any(j["ttft_tokens"] for j in bench.plan_jobs(default))


def test_a_slow_host_is_flagged_in_the_page(tmp_path):
    """A host whose fill kernel reads well below its copy engine (the H100 hosts at 27-34
    GB/s against 55) gets a warning line in the header; a healthy one (50.8 / 55.5) none."""
    from offload_bench.bandwidth import slow_host_note

    healthy = {"fill_kernel_gbps": 50.8, "copy_engine_block_gbps": 55.5}
    slow = {"fill_kernel_gbps": 34.2, "copy_engine_block_gbps": 55.1}
    assert slow_host_note(healthy) == "" and slow_host_note({"cuda": False}) == ""
    assert "0.62 of the copy engine's 55.1" in slow_host_note(slow)
    with_alloc = {**slow, "fill_kernel_hostalloc_gbps": 51.0}  # the driver's memory, measured
    assert "34.2 GB/s (51.0 from cudaHostAlloc memory)" in slow_host_note(with_alloc)
    meta = {"model": "m", "date": "d", "gpu": "g", "routing": "r", "dtype": "bf16",
            "command": "c", "bandwidth_gbps": 55.1}  # fmt: skip
    for bw, flagged in ((healthy, False), (slow, True), (with_alloc, True)):
        page = bench.write(tmp_path / "o", {**meta, "bandwidth": bw}, [])
        assert ("SLOW HOST" in page) is flagged
    assert "fill kernel 34.2 GB/s (51.0 from cudaHostAlloc memory)" in page


def test_the_page_names_the_prefetch_fill_programs():
    """With prefetch on the fill kernel the page says how many programs copied (given, or
    the engine's default as its prefetch engines report it); without prefetch, or on the
    copy engine, it says none."""
    on = {"prefetch": [0, 1], "fill": "kernel"}
    off_row, on_row = {"rate": "0.2", "prefetch": 0}, {"rate": "0.2", "prefetch": 1}
    assert bench.prefetch_fill_note(on, [off_row, {**on_row, "prefetch_fill_programs": 64}]) == (
        " (64 prefetch fill programs, the default)"
    )
    assert bench.prefetch_fill_note(on, [on_row]) == ""  # nothing reported (CPU): not guessed
    assert bench.prefetch_fill_note({**on, "prefetch_programs": 32}) == (
        " (32 prefetch fill programs)"
    )
    assert bench.prefetch_fill_note({"prefetch": [0], "fill": "kernel"}) == ""
    ce = {**on, "prefetch_fill": "copy-engine"}
    assert bench.prefetch_fill_note(ce) == ", prefetch fill `copy-engine`"


def test_stream_buffers_reach_the_offload_engines_and_the_rows_name_them():
    """`--stream-buffers` goes to every offload engine's `--moe-offload-stream-buffers` (not
    the resident one's); each row's label names the count its engine reports, and the page
    the setting with the counts taken."""
    args = bench.build_parser().parse_args(
        ["--stream-buffers", "1", "--rates", "0.1", "--ttft-tokens", ""]
    )
    kws = [engine_worker.engine_kwargs(j) for j in bench.plan_jobs(args)]
    assert "moe_offload_stream_buffers" not in kws[0]
    assert kws[1]["moe_offload_stream_buffers"] == "1"
    default = bench.plan_jobs(bench.build_parser().parse_args(["--rates", "0.1"]))
    assert engine_worker.engine_kwargs(default[1])["moe_offload_stream_buffers"] == "auto"
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--stream-buffers", "3"])
    assert rep.rate_label("auto", [9] * 24, 60, 1) == "auto (9/60, 1 stream buffer)"
    assert rep.rate_label("0.1", [13], 128, 2) == "10% (13/128, 2 stream buffers)"
    assert rep.rate_label("0.1", None, None, 2) == "10% (2 stream buffers)"
    assert rep.rate_label("1", [8], 8, 0) == "100% (8/8)"  # all resident: none
    rows = [_row("0", 1, 3.0), _row("auto", 1, 4.0, slots=[9], num_experts=60, stream_buffers=1)]
    rep.add_limits(rows, 55.0)
    assert rep.decode_table(rows).splitlines()[-1].startswith("| auto (9/60, 1 stream buffer) |")
    results = [{"rate": "0"}, {"rate": "auto", "stream_buffers": 1},
               {"rate": "0.5", "stream_buffers": 2}]  # fmt: skip
    meta = {"stream_buffers": "auto"}
    assert bench.stream_buffers_note(meta, results) == (
        ", prompt-pass stream buffers auto (1 and 2 taken)"
    )
    assert bench.stream_buffers_note(meta, results[:1]) == ""
    assert bench.stream_buffers_note({"stream_buffers": "1"}, []) == (
        ", prompt-pass stream buffers 1"
    )
