"""Decode under MoE offload at several GPU-expert fractions and batch sizes, with cross-layer
prefetch off and/or on (`--prefetch 0,1`: each fraction once per distance), each beside its
serial limit `t_resident(batch) + link bytes ÷ host→GPU bandwidth` and its overlapped limit
`max(t_resident(batch), link bytes ÷ bandwidth)` (link bytes: slot fills and prefetches,
offload_bench/decode_report.py), plus time to first token of long prompts. Dummy weights;
the experts come from the routing model (`--routing`) unless told otherwise, since
random-weight routers pick nearly the same experts every token.

    python3 bench/bench_offload_decode.py --model bench/configs/qwen3_30b_a3b \
        --rates 0.1,0.2,0.35,0.5,auto --batches 1,8,32 --gpu-memory-limit-gb 24 \
        --ttft-tokens 2048,8192 --prefetch 0,1 --out bench/results/offload

Each engine runs in a process of its own (offload_bench/engine_worker.py), the resident
one (rate 0, giving t_resident per batch) first; prefetch is set when an engine is built
(its decode graphs capture it), so each (fraction, distance) loads an engine of its own.
Prompts no longer than the decode engines' `--max-model-len` are timed in those engines (the
first distance of a fraction); longer ones (32k) get eager engines of their own at the TTFT
rates (`auto` there with the reserve raised to hold that prompt's KV cache).
Tokens of every rate are compared with the resident engine's: placement never changes the
output. Results are rewritten after every engine, so a run cut short keeps what it did."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from offload_bench import decode_report  # noqa: E402
from offload_bench.bandwidth import slow_host_note  # noqa: E402

GIB = 1 << 30
_KV_WORKSPACE_GB = 1.0  # what plan_num_blocks keeps aside besides the KV cache


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def per_batch(text: str, batches: list[int], name: str) -> list[int]:
    if not batches:
        return []
    values = int_list(text)
    if len(values) == 1:
        return values * len(batches)
    if len(values) != len(batches):
        raise SystemExit(f"--{name} needs one value or one per batch size ({len(batches)})")
    return values


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = ap.add_argument
    a("--model", default=str(HERE / "configs" / "qwen3_30b_a3b"))
    a("--device", default="cuda:0")
    a("--dtype", default="bfloat16")
    a("--rates", default="0.1,0.2,0.35,0.5,auto", help="decode rates (0 = resident, always run)")
    a("--batches", default="1,8,32")
    a("--warmup-steps", default="64,4,2", help="per batch size (or one value)")
    a("--steps", default="128,16,6", help="timed steps per batch size (or one value)")
    a("--prompt-tokens", type=int, default=64, help="prompt length of the decode rows")
    a("--ttft-tokens", default="2048,8192,32768", help="prompt lengths of the TTFT table")
    a("--ttft-rates", default="0,0.1,0.2,auto")
    a("--max-model-len", type=int, default=8256, help="decode engines' (and short TTFT's)")
    a("--gpu-memory-limit-gb", type=float, default=24.0, help="the budget of `auto`")
    a("--routing", default="qwen3-30b-a3b",
      help="router | a routing-model preset | model:S,T,P | uniform | replay:FILE")  # fmt: skip
    a("--routing-seed", type=int, default=0)
    a("--max-num-batched-tokens", type=int, default=2048)
    a("--resident-again", action="store_true", help="run the resident engine again at the end")
    a("--trace-dir", default=None, help="also write a Chrome trace of batch-1 steps per rate")
    a("--trace-ttft", type=int, default=None, metavar="TOKENS",
      help="each TTFT engine also traces one more prompt of TOKENS tokens (needs --trace-dir)")  # fmt: skip
    a("--prefetch", default="0",
      help="prefetch distances per rate, 0 = off (0,2: an engine each); default off, where "
      "the engine's default is 2, so rows compare with earlier ones: ask for it")  # fmt: skip
    a("--fill", default="kernel", choices=("kernel", "copy-engine"),
      help="--moe-offload-fill of the offload engines")  # fmt: skip
    a(
        "--policy",
        default="lfu",
        choices=("lru", "lfu"),
        help="--moe-offload-policy of the offload engines (which expert a miss evicts; lfu: "
        "the engine's default)",
    )
    a("--compress", action="store_true",
      help="--moe-offload-compress for the offload engines (bf16 experts packed, 12 bits)")  # fmt: skip
    a("--stream-buffers", default="auto", choices=("auto", "1", "2"),
      help="--moe-offload-stream-buffers of the offload engines (the prompt pass's buffers; "
      "the rows name the count each engine took)")  # fmt: skip
    a(
        "--prefetch-issue",
        default="after-fill",
        choices=("after-fill", "before-lookup"),
        help="where layer l issues the prefetch of l + d (= --moe-prefetch-issue)",
    )
    a("--prefetch-fill", default=None, choices=("kernel", "copy-engine"),
      help="--moe-prefetch-fill of the prefetch engines (default: as --fill)")  # fmt: skip
    a("--prefetch-programs", type=int, default=None,
      help="the prefetch fill kernel's programs in all (default: 16)")  # fmt: skip
    a("--prefetch-margin", type=float, default=None,
      help="--moe-prefetch-margin of the prefetch engines (default: the engine's)")  # fmt: skip
    a("--out", default="bench/results/offload")
    return ap


def model_kv_bytes_per_token(model: str, dtype_bytes: int = 2) -> int:
    hf = json.loads((Path(model) / "config.json").read_text())
    hf = {**hf, **hf.get("text_config", {})}  # multimodal checkpoints: the text model's
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    kv_heads = hf.get("num_key_value_heads") or heads
    # hybrid models keep KV only in their full-attention layers
    types = hf.get("layer_types") or ["full_attention"] * hf["num_hidden_layers"]
    kv_layers = sum(t == "full_attention" for t in types)
    return 2 * kv_layers * kv_heads * head_dim * dtype_bytes


def plan_jobs(args: argparse.Namespace) -> list[dict]:
    """One job per engine: the resident one first, then each decode rate (with the TTFT
    lengths that fit its max-model-len when the rate is a TTFT rate), then eager engines
    for longer TTFT prompts."""
    batches = int_list(args.batches)
    warmup = per_batch(args.warmup_steps, batches, "warmup-steps")
    steps = per_batch(args.steps, batches, "steps")
    ttft_tokens = int_list(args.ttft_tokens)
    ttft_rates = [r for r in args.ttft_rates.split(",") if r] if ttft_tokens else []
    if args.trace_ttft and not args.trace_dir:
        raise SystemExit("--trace-ttft writes its traces to --trace-dir: give one")
    rates = ["0"] + [r for r in args.rates.split(",") if r and r != "0"]
    distances = list(dict.fromkeys(int_list(args.prefetch))) or [0]
    if any(d < 0 for d in distances):
        raise SystemExit("--prefetch takes distances >= 0 (0 = off)")
    rates += [r for r in ttft_rates if r not in rates]
    short = [n for n in ttft_tokens if n < args.max_model_len]
    long = [n for n in ttft_tokens if n >= args.max_model_len]
    block = 16
    kv_blocks = -(-args.max_model_len // block) + max(batches or [1]) * (
        -(-(args.prompt_tokens + max(warmup + steps or [0]) + 4) // block)
    )
    base = dict(model=args.model, device=args.device, dtype=args.dtype, routing=args.routing,
                routing_seed=args.routing_seed, prompt_tokens=args.prompt_tokens,
                gpu_memory_limit_gb=args.gpu_memory_limit_gb, trace_dir=args.trace_dir,
                max_num_batched_tokens=args.max_num_batched_tokens, prefetch=0,
                prefetch_margin=args.prefetch_margin, fill=args.fill, policy=args.policy,
                compress=args.compress, prefetch_issue=args.prefetch_issue,
                stream_buffers=args.stream_buffers,
                prefetch_fill=args.prefetch_fill,
                prefetch_programs=args.prefetch_programs)  # fmt: skip
    jobs = []
    for rate in rates + (["0"] if args.resident_again else []):
        decoding = bool(batches) and (rate == "0" or rate in args.rates.split(","))
        if not decoding and not (short and rate in ttft_rates):
            continue  # nothing for this engine to do
        # the resident engine and TTFT-only engines do not prefetch (prefetch is decode's)
        for i, distance in enumerate(distances if rate != "0" and decoding else [0]):
            jobs.append({
                **base, "rate": rate, "max_model_len": args.max_model_len,
                "batches": batches if decoding else [], "warmup": warmup, "steps": steps,
                "ttft_tokens": short if rate in ttft_rates and i == 0 else [],
                "trace_ttft": _traced(args, rate in ttft_rates and i == 0 and short,
                                      args.max_model_len),
                "trace_ttft_dir": args.trace_dir,
                "num_kv_blocks": None if rate == "auto" else kv_blocks, "prefetch": distance,
            })  # fmt: skip
    if long:
        max_len = max(long) + 64
        kv_gb = model_kv_bytes_per_token(args.model) * max_len / GIB
        for rate in ttft_rates:
            jobs.append({
                **base, "rate": rate, "max_model_len": max_len, "batches": [], "warmup": [],
                "steps": [], "ttft_tokens": long, "enforce_eager": True, "trace_dir": None,
                "trace_ttft": _traced(args, True, max_len), "trace_ttft_dir": args.trace_dir,
                "num_kv_blocks": None if rate == "auto" else -(-max_len // block) + 4,
                # auto must leave room for this prompt's KV cache: raise the reserve
                "reserve_gb": (kv_gb + _KV_WORKSPACE_GB) / 0.9 + 0.5 if rate == "auto" else None,
            })  # fmt: skip
    return jobs


def _traced(args: argparse.Namespace, is_ttft_engine: bool, max_model_len: int) -> int | None:
    """The prompt length this engine traces (--trace-ttft), if it times TTFT and the prompt
    fits its context."""
    n = args.trace_ttft
    return n if n and is_ttft_engine and n < max_model_len else None


_RUNNING: list[subprocess.Popen] = []


def _stop_worker(signum, frame) -> None:
    """SIGTERM (a `timeout` around the benchmark): take the running worker down too, so
    it does not hold the GPU after we are gone; results so far are already written."""
    for proc in _RUNNING:
        proc.kill()
    sys.exit(128 + signum)


def run_job(job: dict) -> dict:
    """The worker's RESULT, or {"rate", "prefetch", "error"} when it failed; its output is
    streamed."""
    cmd = [sys.executable, str(HERE / "offload_bench" / "engine_worker.py"), json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _RUNNING[:] = [proc]
    result, tail = None, []
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            continue
        if "it/s]" not in line:  # progress bars
            print(line, end="", flush=True)
            tail = (tail + [line.strip()])[-5:]
    proc.wait()
    if result is None:
        return {"rate": job["rate"], "prefetch": job.get("prefetch", 0),
                "error": f"exit code {proc.returncode}: {' | '.join(tail)}",
                "decode": [], "ttft": []}  # fmt: skip
    return result


def measure_bandwidth(device: str) -> dict:
    """Host → GPU bandwidth in a process of its own (offload_bench/bandwidth.py)."""
    if not device.startswith("cuda"):
        return {"cuda": False}
    index = device.split(":")[1] if ":" in device else "0"
    cmd = [sys.executable, str(HERE / "offload_bench" / "bandwidth.py"), "--device", index]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"cuda": None, "error": f"{type(e).__name__}: {e}"}


def collect(results: list[dict], bandwidth_gbps: float | None) -> tuple[list[dict], list[dict]]:
    """(decode rows, TTFT rows per engine) with limits and identity filled in."""
    decode = [row for r in results for row in r["decode"]]
    for r in results:
        if r.get("error") and not r["decode"]:
            decode.append({"rate": r["rate"], "prefetch": r.get("prefetch", 0), "batch": 0,
                           "error": r["error"]})  # fmt: skip
    decode_report.add_limits(decode, bandwidth_gbps)
    decode_report.mark_identity(decode)
    ttft: dict[str, dict] = {}
    for r in results:
        if r["ttft"]:
            entry = ttft.setdefault(r["rate"], {"rate": r["rate"], "ttft": []})
            entry["ttft"] += r["ttft"]
            for key in ("slots", "num_experts", "stream_buffers"):
                entry.setdefault(key, r.get(key))
    return decode, list(ttft.values())


def prefetch_fill_note(meta: dict, results: list[dict] = ()) -> str:
    """', prefetch fill `copy-engine`' where the prefetch copies move otherwise than the fill;
    with prefetch on the fill kernel, its programs: given, or the engine's default as the
    prefetch engines (`results`) report it."""
    fill = meta.get("fill", "kernel")
    pf, programs = meta.get("prefetch_fill"), meta.get("prefetch_programs")
    note = f", prefetch fill `{pf}`" if pf and pf != fill else ""
    if not any(meta.get("prefetch") or [0]) or (pf or fill) != "kernel":
        return note
    if programs:
        return note + f" ({programs} prefetch fill programs)"
    used = sorted({r["prefetch_fill_programs"] for r in results if r.get("prefetch_fill_programs")})
    if not used:
        return note
    return note + f" ({'/'.join(map(str, used))} prefetch fill programs, the default)"


def stream_buffers_note(meta: dict, results: list[dict] = ()) -> str:
    """', prompt-pass stream buffers auto (1 and 2 taken)': the setting, and the counts the
    offload engines (`results`) report (the rows name each engine's)."""
    taken = sorted({r["stream_buffers"] for r in results if r.get("stream_buffers")})
    setting = meta.get("stream_buffers") or "auto"
    if not taken:
        return f", prompt-pass stream buffers {setting}" if setting != "auto" else ""
    counts = " and ".join(map(str, taken))
    return f", prompt-pass stream buffers {setting} ({counts} taken)"


def prefetch_setting(meta: dict) -> str:
    """'off', 'off and 1 ahead (margin 0.5)' for the page."""
    parts = [decode_report.prefetch_label(d) for d in meta.get("prefetch") or [0]]
    margin = meta.get("prefetch_margin")
    on = any(meta.get("prefetch") or [0])
    return " and ".join(parts) + (f" (margin {margin:g})" if on and margin is not None else "")


def write(out: Path, meta: dict, results: list[dict]) -> str:
    decode, ttft = collect(results, meta["bandwidth_gbps"])
    lines = [
        f"# Offload decode and TTFT: {meta['model']}",
        "",
        f"- {meta['date']}, {meta['gpu']}, routing `{meta['routing']}`, dtype {meta['dtype']}",
        f"- host→GPU (copy engine, 512 MiB) {decode_report._f(meta['bandwidth_gbps'], '.1f')} "
        f"GB/s; fill kernel {decode_report._f(meta['bandwidth'].get('fill_kernel_gbps'), '.1f')}"
        f" GB/s ({decode_report._f(meta['bandwidth'].get('fill_kernel_hostalloc_gbps'), '.1f')}"
        " from cudaHostAlloc memory)",
        *([f"- **{note}**"] if (note := slow_host_note(meta["bandwidth"])) else []),
        f"- command: `{meta['command']}`",
        "",
        f"Decode, routing `{meta['routing']}`, prefetch {prefetch_setting(meta)} (issued "
        f"{meta.get('prefetch_issue', 'before-lookup')}), fill `{meta.get('fill', 'kernel')}`, "
        f"slot policy `{meta.get('policy', 'lfu')}`"
        f"{', experts packed (--moe-offload-compress)' if meta.get('compress') else ''}"
        f"{prefetch_fill_note(meta, results)}{stream_buffers_note(meta, results)}:",
        "",
        decode_report.decode_table(decode),
        "",
        "Link bytes = slot fills (misses) + prefetched experts per step; serial limit = "
        "t_resident(batch) + link bytes ÷ bandwidth; overlapped limit = max(t_resident(batch), "
        "link bytes ÷ bandwidth); tok/s ÷ serial (off) = tok/s ÷ the serial-limit tok/s of the "
        "same fraction and batch without prefetch; GB/token = all bytes moved per step ÷ batch "
        "(prefetches included); whole-layer copies = staging copies during the timed steps "
        "(each moves a whole layer and counts no misses: step / limit ≫ 1).",
        "",
    ]
    packed = decode_report.packed_table(decode)
    if packed:
        lines += ["Packed experts: the limits above count the packed bytes that crossed the "
                  "link; against the bytes as the slots hold them (unpacked):", "", packed, ""]  # fmt: skip
    prefetch = decode_report.prefetch_table(decode)
    if prefetch:
        lines += ["Prefetch (per token over the timed steps; recall = used ÷ (used + misses): "
                  "the needed experts a prefetch brought in time):", "", prefetch, ""]  # fmt: skip
    if ttft:
        lines += ["Time to first token (prefill tok/s, GB moved host→GPU):", "",
                  decode_report.ttft_table(ttft), ""]  # fmt: skip
    for r in results:
        engine = f"rate {r['rate']}" + (f", prefetch {r['prefetch']}" if r.get("prefetch") else "")
        if r.get("stream_buffers"):
            engine += f", {r['stream_buffers']} prompt-pass stream buffers"
        lines.append(f"- {engine}: load {decode_report._f(r.get('load_s'), '.1f')} s"
                     + (f", FAILED: {r['error']}" if r.get("error") else ""))  # fmt: skip
    page = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(page)
    payload = {"meta": meta, "decode": decode, "ttft": ttft, "engines": results}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    return page


def main(argv: list[str] | None = None, script: str | None = None) -> int:
    """Run the engines and write the page; `script` names the command's script on the page
    when another bench calls this one in-process (default: this process's own)."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_worker)
    jobs = plan_jobs(args)
    bw = measure_bandwidth(args.device)
    used = bw.get("copy_engine_block_gbps")
    print(f"host→GPU bandwidth: {json.dumps(bw)}", flush=True)
    if note := slow_host_note(bw):
        print(note, flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": bw.get("gpu") or args.device,
            "model": args.model, "routing": args.routing, "dtype": args.dtype,
            "bandwidth": bw, "bandwidth_gbps": used,
            "gpu_memory_limit_gb": args.gpu_memory_limit_gb,
            "prefetch": list(dict.fromkeys(int_list(args.prefetch))) or [0],
            "prefetch_margin": args.prefetch_margin, "fill": args.fill, "policy": args.policy,
            "compress": args.compress, "stream_buffers": args.stream_buffers,
            "prefetch_issue": args.prefetch_issue, "prefetch_fill": args.prefetch_fill,
            "prefetch_programs": args.prefetch_programs,
            "command": "python3 " + " ".join([script or sys.argv[0], *(argv or sys.argv[1:])])}  # fmt: skip
    out, results, page = Path(args.out), [], ""
    for job in jobs:
        t0 = time.perf_counter()
        results.append(run_job(job))
        results[-1]["wall_s"] = time.perf_counter() - t0
        page = write(out, meta, results)
    print(page, flush=True)
    decode, _ = collect(results, used)
    return 1 if any(r.get("identical") is False for r in decode) else 0


if __name__ == "__main__":
    sys.exit(main())
