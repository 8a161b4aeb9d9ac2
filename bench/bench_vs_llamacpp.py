"""xinfer's half of the llama.cpp comparison (`bench_vs_llamacpp.sh`): one GGUF file, batch-1
decode tok/s (128 tokens after a 32-token prompt, as llama-bench's tg128) and the prefill
rate of one long prompt (pp8192), per placement: fully resident, and under a GPU budget
(`--moe-offload auto --gpu-memory-limit-gb G`) with a model of real routing
(`--routing-source`, since random weights route unrealistically). Quantized GGUF weights run
in their blocks; `--isq` quantizes a float file's experts at load. One JSON line per run.

    python3 bench/bench_vs_llamacpp.py --gguf /tmp/q3-q4_k.gguf --label "qwen3-30b-a3b q4_k" \\
        --budget-gb 12 --routing-source qwen3-30b-a3b"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_decode

from bench_decode import export_step_trace  # noqa: E402

from xinfer import LLM, SamplingParams  # noqa: E402
from xinfer.config import DEFAULT_PREFETCH_DISTANCE  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    _sync()
    start = time.perf_counter()
    llm.generate([prompt], params)
    _sync()
    return time.perf_counter() - start


def measure(llm: LLM, prompt_len: int, decode_tokens: int) -> dict:
    vocab = llm.engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    short = torch.randint(100, vocab - 100, (32,), generator=gen).tolist()
    longs = [torch.randint(100, vocab - 100, (prompt_len,), generator=gen).tolist() for _ in "ab"]
    _timed(llm, short, 8)  # warm-up: graphs, Triton compiles
    first = min(_timed(llm, short, 1) for _ in range(2))
    manager = llm.engine.offload_manager
    if manager is not None:  # the decode runs' own offload counters (`_decode_offload`)
        manager.reset_stats()
    full = min(_timed(llm, short, decode_tokens + 1) for _ in range(2))
    decode_stats = _decode_offload(manager.stats(), 2 * (decode_tokens + 1)) if manager else {}
    # a fresh prompt each time (and prefix caching off): every token is computed
    prefill = min(_timed(llm, long, 1) for long in longs)
    return {
        "decode_tok_s": round(decode_tokens / (full - first), 1),
        f"pp{prompt_len}_tok_s": round(prompt_len / prefill, 1),
        **decode_stats,
    }


def _decode_offload(s: dict, tokens: int) -> dict:
    """The two decode runs' offload counters (each a 32-token prompt, then `tokens` / 2
    tokens; the short prompt's lookups are in them too): hit rate, MB moved a token, and with
    prefetch what it predicted, copied, and how much of the copied was used or wasted."""
    out = {
        "decode_hit_rate": round(s["hit_rate"], 4),
        "decode_mb_per_token": round(s["bytes_moved"] / tokens / 1e6, 1),
    }
    if (pf := s.get("prefetch")) is not None:
        out["prefetch"] = {k: pf[k] for k in ("predicted", "present", "prefetched", "dropped",
                                              "used", "wasted")}  # fmt: skip
        out["prefetch"]["wasted_mb_per_token"] = round(pf["wasted_bytes"] / tokens / 1e6, 1)
    return out


def _offload_summary(llm: LLM) -> dict:
    manager = llm.engine.offload_manager
    if manager is None:
        return {}
    s = manager.stats()
    return {
        "slots_per_layer": min(s["slots_per_layer"]),
        "num_experts": max(s["num_experts"]),
        "stream_buffers": s.get("stream_buffers"),  # the prompt pass's, as the engine took
        "hit_rate": round(s["hit_rate"], 3),
        "gb_moved": round(s["bytes_moved"] / 1e9, 2),
    }


def _formats(llm: LLM) -> str:
    moe = llm.engine.model.moe_layers()
    if not moe:
        return ""
    ew = moe[0].expert_weights

    def stored(proj: str) -> str:  # ISQ: the block type the rows really use (fallbacks)
        fmt = ew.proj_fmt(proj)
        if hasattr(fmt, "block_format"):
            return f"{fmt.name}({fmt.block_format(ew.proj_nk(proj)[1]).name})"
        return fmt.name

    w13, w2 = stored("w13"), stored("w2")
    return w13 if w13 == w2 else f"{w13}+{w2}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--label", required=True, help="row name, e.g. 'qwen3-30b-a3b q4_k'")
    ap.add_argument("--budget-gb", type=float, default=None, help="also run under this budget")
    ap.add_argument("--skip-resident", action="store_true", help="the file does not fit the GPU")
    ap.add_argument("--routing-source", default="qwen3-30b-a3b",
                    help="routing model for the budget runs ('router': the weights' own)")  # fmt: skip
    ap.add_argument("--isq", default=None, help="quantize the experts at load (q8_0, q4k, ...)")
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument(
        "--trace-dir", default=None,
        help="resident row: a Chrome trace of four graphed batch-1 steps here "
        "(vs_trace_<label>.json; per kernel: bench/trace_summary.py FILE --steps 4 --chain)",
    )  # fmt: skip
    ap.add_argument("--budget-chunk", type=int, default=2048,
                    help="step token budget of the budget runs: a longer prompt takes the "
                         "prompt pass (each layer's experts streamed once, overlapped)")  # fmt: skip
    ap.add_argument("--q8x", action="store_true",
                    help="Q4_K decode GEMVs on int8 activations (gguf_launch.Q8X_MOE, Q8X_LINEAR)")  # fmt: skip
    ap.add_argument("--q6k-bytes", action="store_true",
                    help="Q6_K decode GEMVs on the byte path (gguf_tiles.Q6K_WORDS off; the "
                         "word path is the default since the thirty-fifth session)")  # fmt: skip
    ap.add_argument("--q80-words", action="store_true",
                    help="Q8_0 decode GEMVs on the word path (gguf_tiles.Q80_WORDS on; off by "
                         "default until a GPU has run its tests)")  # fmt: skip
    ap.add_argument(
        "--policy",
        default="lfu",
        choices=("lru", "lfu"),
        help="--moe-offload-policy of the budget run (lfu: the engine's default)",
    )
    ap.add_argument("--compress", action="store_true",
                    help="--moe-offload-compress for the budget run (bf16 experts packed)")  # fmt: skip
    ap.add_argument("--stream-buffers", default="auto", choices=("auto", "1", "2"),
                    help="--moe-offload-stream-buffers of the budget run (the prompt pass's "
                    "buffers; the row's stream_buffers is the count the engine took)")  # fmt: skip
    ap.add_argument("--reserve-gb", type=float, default=None,
                    help="--moe-offload-reserve-gb of the budget run (what `auto` leaves free; "
                    "default: the engine's)")  # fmt: skip
    ap.add_argument("--prefetch", type=int, default=DEFAULT_PREFETCH_DISTANCE,
                    help="--moe-prefetch of the budget run (layers ahead; 0: off; default: "
                    "the engine's)")  # fmt: skip
    return ap


def engine_runs(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(placement label, engine options) of each run: resident unless skipped, then the
    budget run when asked."""
    # resident: the prompt in one chunk (the fastest there); under a budget, chunks shorter than
    # the prompt, so that it takes the prompt pass: in one chunk the call's missing experts
    # come through the per-call path instead (2026-12-04 H200: 4,002 tok/s at pp8192)
    runs = [] if args.skip_resident else [("resident", {"max_num_batched_tokens": args.prompt_len})]
    if args.budget_gb:
        budget = {
            "moe_offload": "auto",
            "gpu_memory_limit_gb": args.budget_gb,
            "max_num_batched_tokens": min(args.budget_chunk, args.prompt_len),
        }
        if args.routing_source != "router":
            budget["routing_source"] = args.routing_source
        where = f"{args.budget_gb:g} GB auto"
        budget["moe_offload_policy"] = args.policy
        if args.policy != "lfu":  # rows name the policy where it is not the default
            where += f" {args.policy}"
        if args.compress:
            budget["moe_offload_compress"] = True
            where += " packed"
        if args.stream_buffers != "auto":  # rows name a forced count
            budget["moe_offload_stream_buffers"] = args.stream_buffers
            where += f" {args.stream_buffers} stream buffer" + ("s" * (args.stream_buffers != "1"))
        if args.reserve_gb is not None:  # rows name a reserve they were given
            budget["moe_offload_reserve_gb"] = args.reserve_gb
            where += f" reserve {args.reserve_gb:g} GB"
        budget["moe_prefetch"] = args.prefetch  # rows before 2026-12-06 ran without it
        if args.prefetch:
            where += f" prefetch {args.prefetch}"
        runs.append((where, budget))
    return runs


def main() -> None:
    args = build_parser().parse_args()
    if args.q8x:
        from xinfer.kernels import gguf_launch

        gguf_launch.Q8X_MOE = gguf_launch.Q8X_LINEAR = True
    if args.q6k_bytes:
        from xinfer.kernels import gguf_tiles

        gguf_tiles.Q6K_WORDS = False
    if args.q80_words:
        from xinfer.kernels import gguf_tiles

        gguf_tiles.Q80_WORDS = True
    runs = engine_runs(args)
    label = args.label + (f" isq {args.isq}" if args.isq else "") + (" q8x" if args.q8x else "")
    label += " q6k-bytes" if args.q6k_bytes else ""
    label += " q80-words" if args.q80_words else ""
    for placement, options in runs:
        if torch.cuda.is_available():  # what an earlier engine of this process still holds
            free, total = torch.cuda.mem_get_info()
            used = (total - free) / 2**30  # to stderr: stdout carries the JSON rows only
            print(f"[{placement}] GPU memory in use before loading: {used:.2f} GiB",
                  file=sys.stderr, flush=True)  # fmt: skip
        start = time.perf_counter()
        llm = LLM(
            args.gguf,
            max_model_len=args.prompt_len + 256,
            # Qwen1.5's 8192-token window: the prompt plus the decoded tokens pass it
            # (random weights; only the timing is read)
            allow_long_max_model_len=True,
            enable_prefix_caching=False,
            isq=args.isq,
            **options,
        )
        row = {"engine": "xinfer", "model": label, "placement": placement}
        row["chunk"] = options["max_num_batched_tokens"]
        row["load_s"] = round(time.perf_counter() - start, 1)
        row["experts"] = _formats(llm)
        row.update(measure(llm, args.prompt_len, args.decode_tokens))
        row.update(_offload_summary(llm))
        if args.trace_dir and placement == "resident":
            name = "".join(c if c.isalnum() else "_" for c in label)
            trace = Path(args.trace_dir) / f"vs_trace_{name}.json"
            trace.parent.mkdir(parents=True, exist_ok=True)
            row["anatomy"] = export_step_trace(llm, 64, trace)
        print(json.dumps(row), flush=True)
        free = {k: round(v / 2**30, 3) for k, v in llm.engine.startup_free.items()}
        print(f"[{placement}] free GPU GiB after each start-up step: {free}",
              file=sys.stderr, flush=True)  # fmt: skip
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
