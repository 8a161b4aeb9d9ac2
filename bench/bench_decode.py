"""Decode and prefill speed of xinfer beside Hugging Face transformers and the memory floor.

    python3 bench/bench_decode.py --model bench/configs/qwen3_30b_a3b --out bench/results/decode

One run: measures the device copy bandwidth, times transformers eager (same weights), then
xinfer (CUDA graphs) at batch 1/8/32 and a 2k-token prefill, checks that both agree on greedy
tokens, profiles one eager decode step per kernel, and writes NAME.json and NAME.md."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from cuda_timing import device_copy_bandwidth  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import LLM, SamplingParams  # noqa: E402
from xinfer.config import ModelConfig  # noqa: E402
from xinfer.weights.loader import load_weights  # noqa: E402


def step_bytes(cfg: ModelConfig, batch: int, context: int, elem: int = 2) -> float:
    """Bytes a decode step must read: non-expert weights, the experts the batch touches
    (expected distinct count under uniform routing), the KV cache and the LM head."""
    h, e, k = cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok
    attn = (
        h * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + cfg.num_heads * cfg.head_dim * h
    )
    router = h * e
    touched = e * (1 - (1 - k / e) ** batch)
    experts = touched * 3 * h * cfg.moe_intermediate_size
    shared = 3 * h * cfg.shared_expert_intermediate_size
    per_layer = (attn + router + experts + shared) * elem
    kv = batch * context * cfg.kv_bytes_per_token(torch.bfloat16) / cfg.num_layers
    return cfg.num_layers * (per_layer + kv) + cfg.vocab_size * h * elem


def time_engine_decode(llm: LLM, batch: int, prompt_len: int, steps: int) -> float:
    """Median seconds per pure-decode step for `batch` concurrent sequences."""
    engine = llm.engine
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(0, 1000, (prompt_len,), generator=g).tolist(), params)
    times = []
    while engine.has_unfinished():
        decode = (
            engine.scheduler.running
            and not engine.scheduler.waiting
            and all(r.num_pending_tokens == 1 for r in engine.scheduler.running)
        )
        t = time.perf_counter()
        engine.step()
        if decode and len(engine.scheduler.running) == batch:
            times.append(time.perf_counter() - t)
    return statistics.median(times[2:] or times)


def time_engine_prefill(llm: LLM, n: int, repeats: int = 3) -> float:
    """Seconds to prefill an n-token prompt (and sample its first token): the median of
    `repeats` timed prompts, each of other tokens (no cache hit), after one untimed
    warm-up. (One timed prompt read 25.3k and 48.7k tok/s for the same bf16 engine on two
    H100 days: a single sample is not a figure.)"""
    engine = llm.engine
    times = []
    for seed in range(repeats + 1):
        gen = torch.Generator().manual_seed(7 + seed)
        ids = torch.randint(0, 1000, (n,), generator=gen).tolist()
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        if seed:  # the first prompt warms up (compiles, allocator)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def kernel_breakdown(llm_eager: LLM, prompt_len: int) -> list[tuple[str, float, int]]:
    """(kernel, ms per decode step, calls) of one eager batch-1 decode step."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm_eager.engine
    engine.add_request(
        list(range(prompt_len)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    for _ in range(4):
        engine.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
    while engine.has_unfinished():
        engine.step()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append((ev.key[:60], t / 1000, ev.count))
    return sorted(rows, key=lambda r: -r[1])[:12]


def export_step_trace(llm: LLM, prompt_len: int, path: Path) -> dict:
    """Chrome trace (host ops and GPU kernels) of four graphed batch-1 decode steps, and
    the step's anatomy: wall time per step vs the GPU time of one bare graph replay."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    engine.add_request(
        list(range(prompt_len)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    )
    for _ in range(8):
        engine.step()
    steps = []
    for _ in range(16):
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    prof.export_chrome_trace(str(path))
    runner = engine.runner.graph_runner
    graph = runner.graphs[1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / 20
    step_ms = statistics.median(steps) * 1e3
    print(
        f"batch-1 anatomy: step {step_ms:.3f} ms, bare graph replay {replay_ms:.3f} ms, "
        f"outside the graph {step_ms - replay_ms:.3f} ms",
        flush=True,
    )
    return {"step_ms": step_ms, "graph_replay_ms": replay_ms}


def hf_baseline(model_dir: str, device, prompt_len: int, new_tokens: int, prefill_len: int):
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 1000, (1, prompt_len), device=device)
    hf.generate(ids, max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    t_gen = time.perf_counter() - t
    long = torch.randint(0, 1000, (1, prefill_len), device=device)
    with torch.no_grad():
        hf(long[:, :64])
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf(long)
        torch.cuda.synchronize()
    t_prefill = time.perf_counter() - t
    return hf, {
        "decode_tok_s": new_tokens / t_gen,
        "prefill_tok_s": prefill_len / t_prefill,
        "greedy_ids": out[0, prompt_len:].tolist(),
        "prompt_ids": ids[0].tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--out", default="bench/results/decode")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--kv-blocks", type=int, default=1024)
    ap.add_argument("--trace", default=None, help="write a Chrome trace of batch-1 steps here")
    ap.add_argument(
        "--separate-tails",
        action="store_true",
        help="the MoE combine and split-K reduce as launches of their own (the A side of an "
        "A/B against the fused tails, kernels/arrivals.py)",
    )
    ap.add_argument(
        "--fused-attention-merge",
        action="store_true",
        help="decode attention's splits merged by their last program "
        "(attn_launch.FUSED_DECODE_REDUCE, off by default until timed)",
    )
    ap.add_argument(
        "--pdl",
        action="store_true",
        help="decode kernels launched with programmatic dependent launch "
        "(kernels/pdl.py ENABLED, off by default until timed)",
    )
    ap.add_argument(
        "--router",
        choices=("apart", "one-launch"),
        default=None,
        help="the router GEMV and its top-k as two launches or one (router_launch.ENABLED; "
        "default: the module's setting)",
    )
    args = ap.parse_args()
    from xinfer.kernels import router_launch

    if args.router is not None:
        router_launch.ENABLED = args.router == "one-launch"
    if args.pdl:
        from xinfer.kernels import pdl

        pdl.ENABLED = True
    if args.fused_attention_merge:
        from xinfer.kernels import attn_launch

        attn_launch.FUSED_DECODE_REDUCE = True
    if args.separate_tails:
        from xinfer.kernels import gemv_launch, moe_launch

        moe_launch.FUSED_COMBINE = gemv_launch.FUSED_SPLIT_REDUCE = False
    device = torch.device("cuda:0")
    cfg = ModelConfig.from_dir(args.model)
    bw = device_copy_bandwidth(device)
    print(f"device copy bandwidth: {bw / 1e12:.2f} TB/s", flush=True)
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(device),
        "model": args.model,
        "copy_bw": bw,
        "torch": torch.__version__,
        "tails": "separate" if args.separate_tails else "fused",
        "attention_merge": "fused" if args.fused_attention_merge else "apart",
        "pdl": args.pdl,
        "router": "one launch" if router_launch.ENABLED else "apart",
    }
    hf = None
    if not args.no_hf:
        hf, result["hf"] = hf_baseline(args.model, device, 32, 32, args.prefill_len)
        print(
            f"transformers: {result['hf']['decode_tok_s']:.1f} tok/s decode, "
            f"{result['hf']['prefill_tok_s']:.0f} tok/s prefill",
            flush=True,
        )
    common = dict(
        device="cuda:0",
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=4096,
        num_kv_blocks=args.kv_blocks,
        max_num_batched_tokens=max(2048, args.prefill_len),
    )
    llm = LLM(args.model, max_num_seqs=max(int(b) for b in args.batches.split(",")), **common)
    if hf is not None:  # same weights as the transformers run
        load_weights(
            llm.engine.model, hf.state_dict().items(), type(llm.engine.model).checkpoint_renames
        )
        ours = llm.generate(
            [result["hf"]["prompt_ids"]], SamplingParams(temperature=0, max_tokens=32)
        )
        ref = result["hf"]["greedy_ids"]
        same = next((i for i, (a, b) in enumerate(zip(ours[0].token_ids, ref)) if a != b), len(ref))
        result["greedy_prefix_match"] = same
        print(f"greedy tokens equal to transformers for the first {same}/32", flush=True)
        del hf
        torch.cuda.empty_cache()
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        sec = time_engine_decode(llm, b, args.prompt_len, args.steps)
        floor = step_bytes(cfg, b, args.prompt_len + args.steps // 2) / bw
        rows.append(
            {
                "batch": b,
                "step_ms": sec * 1e3,
                "tok_s": b / sec,
                "floor_ms": floor * 1e3,
                "floor_tok_s": b / floor,
                "of_floor": floor / sec,
            }
        )
        print(
            f"batch {b}: {b / sec:.1f} tok/s ({sec * 1e3:.2f} ms/step), floor {b / floor:.0f} tok/s"
            f" → {100 * floor / sec:.0f}% of floor",
            flush=True,
        )
    result["decode"] = rows
    if args.trace:
        result["anatomy"] = export_step_trace(llm, args.prompt_len, Path(args.trace))
    t = time_engine_prefill(llm, args.prefill_len)
    result["prefill_tok_s"] = args.prefill_len / t
    print(f"prefill {args.prefill_len}: {args.prefill_len / t:.0f} tok/s", flush=True)
    del llm
    gc.collect()  # the engine's reference cycles would keep its weights alive
    torch.cuda.empty_cache()
    eager = LLM(args.model, enforce_eager=True, max_num_seqs=1, **common)
    result["breakdown"] = kernel_breakdown(eager, args.prompt_len)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Decode benchmark, {result['date']}, {result['gpu']}",
        "",
        f"copy bandwidth {bw / 1e12:.2f} TB/s",
        "",
        "| batch | tok/s | ms/step | floor tok/s | % of floor |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['batch']} | {r['tok_s']:.1f} | {r['step_ms']:.2f} | {r['floor_tok_s']:.0f} | "
        f"{100 * r['of_floor']:.0f}% |"
        for r in rows
    ]
    lines += ["", f"prefill {args.prefill_len} tokens: {result['prefill_tok_s']:.0f} tok/s"]
    if "hf" in result:
        lines += [
            f"transformers eager: {result['hf']['decode_tok_s']:.1f} tok/s decode, "
            f"{result['hf']['prefill_tok_s']:.0f} tok/s prefill"
        ]
    lines += ["", "| kernel (eager batch-1 step) | ms | calls |", "|---|---|---|"]
    lines += [f"| {k} | {ms:.3f} | {n} |" for k, ms, n in result["breakdown"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
