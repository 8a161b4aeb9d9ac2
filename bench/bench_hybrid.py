"""Decode and prefill of a hybrid model (Qwen3.5-MoE / Qwen3-Next: Gated DeltaNet + gated
attention) with dummy bf16 weights, beside the memory floor of each decode step.

    python3 bench/bench_hybrid.py --model bench/configs/qwen3_5_35b_a3b --out bench/results/hybrid

The floor counts what a decode step must move at the measured device copy bandwidth: every
resident weight but the embedding table, the routed experts the batch touches (expected
distinct count under uniform routing), the KV cache of the full-attention layers, and each
sequence's recurrent state read and written once. Also times 2k and 8k prefills and lists
the kernels of one eager batch-1 decode step and of one 2k prefill. `--device cpu` (tests
only) runs the same steps on a tiny model without the floor and the kernel lists."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from bench_decode import kernel_breakdown, time_engine_decode, time_engine_prefill
from cuda_timing import device_copy_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import LLM, SamplingParams  # noqa: E402


def floor_bytes(model, cfg, dtype: torch.dtype, batch: int, context: int) -> float:
    """Bytes one decode step of `batch` sequences at `context` tokens must move."""
    weights = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if "embed_tokens" not in name or cfg.tie_word_embeddings
    )
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    experts = len(cfg.moe_layer_ids) * touched * cfg.expert_bytes(dtype)
    kv = batch * context * cfg.kv_bytes_per_token(dtype)
    state = 2 * batch * cfg.state_bytes_per_seq(dtype)  # read and written back
    return weights + experts + kv + state


def prefill_breakdown(llm: LLM, n: int) -> list[tuple[str, float, int]]:
    """(kernel, ms, calls) of one `n`-token prefill, the 12 costliest."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    ids = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(3)).tolist()
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        while engine.has_unfinished():
            engine.step()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append((ev.key[:60], t / 1000, ev.count))
    return sorted(rows, key=lambda r: -r[1])[:12]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench/configs/qwen3_5_35b_a3b")
    ap.add_argument("--out", default="bench/results/hybrid")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prefill-lens", default="2048,8192")
    ap.add_argument("--device", default="cuda:0", help="cpu: a dry run (no floor, no kernels)")
    ap.add_argument("--dtype", default="bfloat16")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    device = torch.device(args.device)
    is_cuda = device.type == "cuda"
    bw = device_copy_bandwidth(device) if is_cuda else None
    if bw is not None:
        print(f"device copy bandwidth: {bw / 1e12:.2f} TB/s", flush=True)
    gpu = torch.cuda.get_device_name(device) if is_cuda else args.device
    result: dict = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu}
    result.update(model=args.model, copy_bw=bw, torch=torch.__version__)
    prefill_lens = [int(n) for n in args.prefill_lens.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    common = dict(device=args.device, dtype=args.dtype, load_format="dummy")
    t = time.perf_counter()
    llm = LLM(
        args.model,
        max_model_len=max(prefill_lens) + 64,
        max_num_seqs=max(batches),
        max_num_batched_tokens=max(prefill_lens),
        **common,
    )
    print(f"engine ready in {time.perf_counter() - t:.0f} s", flush=True)
    rows = []
    engine = llm.engine
    for b in batches:
        sec = time_engine_decode(llm, b, args.prompt_len, args.steps)
        context = args.prompt_len + args.steps // 2
        row = dict(batch=b, step_ms=sec * 1e3, tok_s=b / sec)
        line = f"decode batch {b}: {b / sec:.1f} tok/s ({sec * 1e3:.2f} ms/step)"
        if bw is not None:
            floor = floor_bytes(engine.model, engine.model_config, engine.dtype, b, context) / bw
            row.update(floor_ms=floor * 1e3, of_floor=floor / sec)
            line += (
                f", floor {floor * 1e3:.2f} ms ({b / floor:.0f} tok/s) → "
                f"{100 * floor / sec:.0f}% of floor"
            )
        rows.append(row)
        print(line, flush=True)
    result["decode"] = rows
    result["prefill_tok_s"] = {}
    for n in prefill_lens:
        sec = time_engine_prefill(llm, n)
        result["prefill_tok_s"][n] = n / sec
        print(f"prefill {n}: {n / sec:.0f} tok/s ({sec * 1e3:.0f} ms)", flush=True)
    save(result, args.out)  # the measurements, should the kernel lists fail
    if is_cuda:  # the kernel lists profile CUDA kernels
        result["prefill_breakdown"] = prefill_breakdown(llm, prefill_lens[0])
        del llm, engine  # (the decode loop's `engine` held it too: 64.6 GB still allocated)
        gc.collect()  # the engine holds reference cycles: free its weights and KV cache now
        torch.cuda.empty_cache()
        eager = LLM(args.model, enforce_eager=True, max_num_seqs=1, max_model_len=4096, **common)
        result["decode_breakdown"] = kernel_breakdown(eager, args.prompt_len)
        for what in ("decode_breakdown", "prefill_breakdown"):
            print(what)
            for name, ms, calls in result[what]:
                print(f"  {ms:8.3f} ms  {calls:5d}  {name}")
    save(result, args.out)


def save(result: dict, out: str) -> None:
    path = Path(out).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
