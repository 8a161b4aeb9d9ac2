"""One engine of the offload decode benchmark, in a process of its own (so an engine never
runs after others were loaded and freed in the same process, which slowed later engines):
decode steps at each batch size (seeded sampling, every row decoding, timed step by step,
expert-cache counters read around the timed steps, the bare graph replay timed after), then
time to first token of long prompts. Prints one line `RESULT {json}` at the end.

    python3 bench/offload_bench/engine_worker.py '{"model": ..., "rate": "0.1", ...}'
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH.parent / "src"))
sys.path.insert(0, str(BENCH))

from cuda_timing import cuda_seconds  # noqa: E402

from xinfer import LLM, SamplingParams  # noqa: E402


def gpu_state() -> str:
    """SM clock, temperature and power right after a measurement ('' without nvidia-smi)."""
    query = "--query-gpu=clocks.sm,temperature.gpu,power.draw"
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def engine_kwargs(cfg: dict) -> dict:
    kw = dict(
        device=cfg["device"],
        dtype=cfg.get("dtype", "bfloat16"),
        load_format="dummy",
        max_model_len=cfg["max_model_len"],
        max_num_seqs=max(cfg.get("batches") or [1]),
        routing_source=cfg["routing"],
        routing_seed=cfg.get("routing_seed", 0),
        enforce_eager=cfg.get("enforce_eager", False),
        max_num_batched_tokens=cfg.get("max_num_batched_tokens", 2048),
    )
    if cfg.get("num_kv_blocks"):
        kw["num_kv_blocks"] = cfg["num_kv_blocks"]
    if cfg["rate"] != "0":
        kw["moe_offload"] = cfg["rate"]
        kw["moe_offload_fill"] = cfg.get("fill") or "kernel"
        kw["moe_offload_policy"] = cfg.get("policy") or "lfu"
        if cfg.get("compress"):
            kw["moe_offload_compress"] = True
        kw["moe_offload_stream_buffers"] = cfg.get("stream_buffers") or "auto"
    if cfg["rate"] == "auto":  # fractions size themselves; auto from the (limited) GPU
        kw["gpu_memory_limit_gb"] = cfg["gpu_memory_limit_gb"]
    if cfg.get("reserve_gb") is not None:
        kw["moe_offload_reserve_gb"] = cfg["reserve_gb"]
    if cfg["rate"] != "0":  # cross-layer prefetch, `prefetch` layers ahead (0: off)
        kw["moe_prefetch"] = int(cfg.get("prefetch") or 0)
    if cfg.get("prefetch"):
        if cfg.get("prefetch_margin") is not None:
            kw["moe_prefetch_margin"] = float(cfg["prefetch_margin"])
        if cfg.get("prefetch_fill"):
            kw["moe_prefetch_fill"] = cfg["prefetch_fill"]
        if cfg.get("prefetch_programs"):
            kw["moe_prefetch_programs"] = int(cfg["prefetch_programs"])
        if cfg.get("prefetch_issue"):
            kw["moe_prefetch_issue"] = cfg["prefetch_issue"]
    return kw


def prompt_ids(seed: int, num_tokens: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, min(vocab, 32000), (num_tokens,), generator=gen).tolist()


PREFETCH_KEYS = ("predicted", "present", "prefetched", "dropped", "used", "wasted",
                 "prefetched_bytes", "used_bytes", "wasted_bytes")  # fmt: skip


def counters(llm: LLM) -> dict:
    """The offload counters (with prefetch on, its counters as `prefetch_<key>`)."""
    st = llm.offload_stats() or {}
    keys = ("hits", "misses", "overflow_misses", "bytes_copied", "bytes_moved", "staging_copies")
    out = {k: st.get(k, 0) for k in keys}
    if "prefetch" in st:
        out.update({f"prefetch_{k}": st["prefetch"][k] for k in PREFETCH_KEYS})
    return out


def bare_replay_ms(engine, batch: int) -> float | None:
    """GPU time of the decode graph of this batch size replayed back to back (after the
    timed steps: the replays go on updating slot tables, harmless once counters are read)."""
    graphs = engine.runner.graph_runner.graphs if engine.runner.graph_runner else {}
    if batch not in graphs or not torch.cuda.is_available():
        return None
    return cuda_seconds(graphs[batch].replay, 32) * 1e3


def decode_row(llm: LLM, cfg: dict, batch: int, warmup: int, timed: int) -> dict:
    """`batch` requests decoding together: `warmup` steps (the prompts' prefill included),
    then `timed` steps, each of `batch` rows, none of which finishes in the window."""
    engine = llm.engine
    vocab, plen = engine.model_config.vocab_size, cfg["prompt_tokens"]
    chunks = -(-batch * plen // engine.config.scheduler.max_num_batched_tokens)
    warmup = max(warmup, chunks + 1)
    tokens: dict[str, list[int]] = {}
    for i in range(batch):
        params = SamplingParams(temperature=1.0, seed=1234 + i, ignore_eos=True,
                                max_tokens=warmup + timed + 2)  # fmt: skip
        rid = engine.add_request(prompt_ids(1000 * batch + i, plen, vocab), params)
        tokens[rid] = []

    def step() -> None:
        for d in engine.step():
            tokens[d.request_id].extend(d.new_token_ids)

    for _ in range(warmup):
        step()
    before, looked = counters(llm), dict(engine.runner.look_ahead_counts)
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    after = counters(llm)
    while engine.has_unfinished():
        step()
    row = {k: after[k] - before[k] for k in after}
    row.update(
        rate=cfg["rate"],
        batch=batch,
        steps=timed,
        warmup_steps=warmup,
        step_ms=1e3 * statistics.median(times),
        step_mean_ms=1e3 * statistics.fmean(times),
        replay_ms=bare_replay_ms(engine, batch),
        look_ahead={k: v - looked[k] for k, v in engine.runner.look_ahead_counts.items()},
        tokens=list(tokens.values()),
        gpu_state=gpu_state(),
    )
    return row


def ttft_row(llm: LLM, num_tokens: int, max_model_len: int, seed: int | None = None) -> dict:
    """Time from adding one `num_tokens`-token prompt (its tokens drawn from `seed`, by
    default one per length) to its first token, the engine idle."""
    engine = llm.engine
    if num_tokens + 1 > max_model_len:
        return {"tokens": num_tokens, "error": f"over max-model-len {max_model_len}"}
    seed = 7 + num_tokens if seed is None else seed
    prompt = prompt_ids(seed, num_tokens, engine.model_config.vocab_size)
    greedy_one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    before = counters(llm)
    t0 = time.perf_counter()
    engine.add_request(prompt, greedy_one)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    ttft = time.perf_counter() - t0
    after = counters(llm)
    return {"tokens": num_tokens, "ttft_s": ttft, "steps": steps,
            **{k: after[k] - before[k] for k in after}}  # fmt: skip


def trace_steps(llm: LLM, cfg: dict, path: Path) -> None:
    """Chrome trace (host ops and GPU kernels) of four batch-1 decode steps after a warm-up."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    params = SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True)
    engine.add_request(prompt_ids(99, cfg["prompt_tokens"], engine.model_config.vocab_size),
                       params)  # fmt: skip
    for _ in range(8):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def trace_ttft(llm: LLM, num_tokens: int, max_model_len: int, path: Path) -> dict:
    """Chrome trace (host ops, GPU kernels, copies) of one more `num_tokens`-token prompt to
    its first token (fresh tokens: no prefix-cache hit on the timed rows' prompts)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        row = ttft_row(llm, num_tokens, max_model_len, seed=1_000_003 + num_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return row


def run(cfg: dict) -> dict:
    t0 = time.perf_counter()
    llm = LLM(cfg["model"], **engine_kwargs(cfg))
    out: dict = {"rate": cfg["rate"], "prefetch": int(cfg.get("prefetch") or 0),
                 "load_s": time.perf_counter() - t0, "decode": [], "ttft": [],
                 "max_model_len": cfg["max_model_len"],
                 "load_phases_s": dict(llm.engine.startup_phases)}  # fmt: skip
    stats = llm.offload_stats()
    manager = llm.engine.offload_manager
    if stats is not None:
        out.update(slots=stats["slots_per_layer"] or None, num_experts=max(stats["num_experts"]),
                   resident_layers=stats.get("resident_layers"),
                   compressed=stats.get("compressed", False),
                   stream_buffers=stats.get("stream_buffers"))  # fmt: skip
        if manager.executors:
            out["expert_bytes"] = manager.executors[0].cache.expert_bytes
        if "prefetch" in stats:  # {"distance", "predictor"}, the margin and fill programs
            out["predictor"] = stats["prefetch"]["predictor"]
            out["prefetch_margin"] = manager.config.prefetch_cut
            # None on the copy engine or off CUDA; the engine's own choice, packed or not
            out["prefetch_fill_programs"] = manager.prefetcher.fill_programs
    name = f"rate {cfg['rate']}" + (f" prefetch {out['prefetch']}" if out["prefetch"] else "")
    phases = ", ".join(f"{k} {v:.1f}" for k, v in out["load_phases_s"].items())
    buffers = f", {out['stream_buffers']} stream buffers" if out.get("stream_buffers") else ""
    print(f"[{name}] loaded in {out['load_s']:.1f} s ({phases}){buffers}", flush=True)
    for batch, warm, timed in zip(cfg.get("batches") or [], cfg["warmup"], cfg["steps"]):
        row = decode_row(llm, cfg, batch, warm, timed)
        keys = ("prefetch", "slots", "num_experts", "expert_bytes", "predictor", "compressed",
                "stream_buffers")  # fmt: skip
        row.update({k: out[k] for k in keys if k in out})
        out["decode"].append(row)
        print(f"[{name}] batch {batch}: {row['step_ms']:.2f} ms/step, "
              f"{row['bytes_moved'] / max(1, timed) / 1e9:.3f} GB/step", flush=True)  # fmt: skip
    for n in cfg.get("ttft_tokens") or []:
        # the first prompt of a length pays one-time costs (the allocator growing to the
        # prompt's activations, kernels first launched at its sizes): a server pays them
        # once, so the row is the second prompt (other tokens) and keeps the first beside it
        first = ttft_row(llm, n, cfg["max_model_len"], seed=2_000_003 + n)
        row = ttft_row(llm, n, cfg["max_model_len"])
        if first.get("ttft_s") is not None:
            row["first_ttft_s"] = first["ttft_s"]
        out["ttft"].append(row)
        print(f"[{name}] TTFT {n} tokens: {row.get('ttft_s') or row['error']} "
              f"(first prompt {first.get('ttft_s')})", flush=True)  # fmt: skip
    if cfg.get("trace_ttft"):
        n = cfg["trace_ttft"]
        path = Path(cfg["trace_ttft_dir"]) / f"ttft_{cfg['rate']}_{n}.json"
        row = trace_ttft(llm, n, cfg["max_model_len"], path)
        out["ttft_traced"] = row
        print(f"[{name}] traced TTFT {n} tokens: {row.get('ttft_s') or row['error']} -> {path}",
              flush=True)  # fmt: skip
    if cfg.get("trace_dir") and cfg.get("batches"):
        suffix = f"_prefetch{out['prefetch']}" if out["prefetch"] else ""
        trace_steps(llm, cfg, Path(cfg["trace_dir"]) / f"offload_{cfg['rate']}{suffix}.json")
    return out


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
