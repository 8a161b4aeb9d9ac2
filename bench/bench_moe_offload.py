"""Decode speed of the xinfer server at several MoE offload rates, one server per rate.

    python3 bench/bench_moe_offload.py --model PATH [--load-format dummy] \
        --rates 0,0.1,0.2,0.35,auto --out bench/results/NAME [--prompt-tokens N] \
        [--max-tokens 200] [--concurrency 1,8,32] [--routing qwen3-30b-a3b] \
        [--gpu-memory-limit-gb G] [--kvcache-dtype D] [--xinfer-bin CMD]

Per rate: start the server (XINFER_MOE_OFFLOAD=rate; rate 0 = unset), wait for /health,
send a warm-up and one streamed greedy request (EOS ignored), scrape the expert-cache
counters around it, then N streams at once for each concurrency N > 1 (a decode batch of
N), optionally a needle prompt of N tokens, and stop the server (SIGTERM). Then check that
the generated text is identical across rates, compare each rate with the PCIe limit, and
write NAME.md and NAME.json. With dummy weights the servers take their experts from the
routing model (`--routing`, default qwen3-30b-a3b): random-weight routers pick nearly the
same experts every token. Helpers live in bench/offload_bench/."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))

from offload_bench import client, needle, report, server  # noqa: E402
from offload_bench.parallel_streams import run_concurrent  # noqa: E402
from offload_bench.timing import stream_stats  # noqa: E402

PROMPT = (
    "Write a long, detailed story about a lighthouse keeper who finds a map in a bottle. "
    "Describe the sea, the weather, the people he meets and every step of his journey."
)
WARMUP_TOKENS = 8
NEEDLE_ANSWER_TOKENS = 32


def parse_rates(text: str) -> list[str]:
    """'0,0.1,auto' → ['0', '0.1', 'auto']; each is 0 (no offload), a fraction in (0, 1]
    or 'auto'."""
    rates = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part.lower() == "auto":
            rates.append("auto")
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"rate {part!r} is not a number or 'auto'") from None
        if not 0 <= value <= 1:
            raise ValueError(f"rate {part} must be 0 (no offload), in (0, 1], or 'auto'")
        rates.append("0" if value == 0 else f"{value:g}")
    if not rates:
        raise ValueError("--rates is empty; give e.g. 0,0.2,auto")
    return rates


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--model", required=True, help="model dir (a config.json is enough with dummy weights)")
    a("--load-format", default="auto", choices=["auto", "dummy"])
    a("--rates", default="0,0.1,0.2,0.35,auto")
    a("--out", required=True, help="writes OUT.md, OUT.json and server logs in OUT.logs/")
    a("--prompt-tokens", type=int, default=None, help="also run an N-token needle prompt")
    a("--max-tokens", type=int, default=200)
    a("--max-model-len", type=int, default=None)
    a("--gpu-memory-limit-gb", type=float, default=None)
    a("--kvcache-dtype", default=None)
    a("--device", default=None, help="forwarded to the server as --d (e.g. cpu, 0)")
    a("--xinfer-bin", default=None, help="server command (default: python -m xinfer.cli)")
    a("--server-args", default="", help="more server flags, one shell-quoted string")
    a("--health-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    a("--seed", type=int, default=0, help="seed of the needle's code and depth")
    a("--append", action="store_true", help="merge into OUT.json: rates split across runs")
    a("--routing", default=None,
      help="router | a routing-model preset | model:S,T,P | uniform | replay:FILE "
      "(default: qwen3-30b-a3b with --load-format dummy, else router)")  # fmt: skip
    a("--concurrency", default="1,8,32", help="streams at once (1 = the main measurement)")
    a("--concurrent-tokens", type=int, default=32, help="tokens per stream when N > 1")
    return p


def routing_source(args: argparse.Namespace) -> str:
    if args.routing is not None:
        return args.routing
    return "qwen3-30b-a3b" if args.load_format == "dummy" else "router"


def concurrency_levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if any(n < 1 for n in levels):
        raise ValueError("--concurrency takes positive stream counts, e.g. 1,8,32")
    return [n for n in levels if n > 1]


def server_command(args: argparse.Namespace, port: int, use_limit: bool = True) -> list[str]:
    cmd = shlex.split(args.xinfer_bin) if args.xinfer_bin else [sys.executable, "-m", "xinfer.cli"]
    cmd += ["--m", args.model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--load-format", args.load_format]
    for flag, value in (
        ("--d", args.device),
        ("--max-model-len", args.max_model_len),
        ("--gpu-memory-limit-gb", args.gpu_memory_limit_gb if use_limit else None),
        ("--kvcache-dtype", args.kvcache_dtype),
        ("--routing-source", None if routing_source(args) == "router" else routing_source(args)),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + shlex.split(args.server_args)


def server_env(rate: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    # the KV size and the expert share are read from the INFO log lines
    env["XINFER_LOG_LEVEL"] = "DEBUG" if env.get("XINFER_LOG_LEVEL") == "DEBUG" else "INFO"
    env.pop("XINFER_MOE_OFFLOAD", None)
    if rate != "0":
        env["XINFER_MOE_OFFLOAD"] = rate
    return env


def token_prompt(model: str, num_tokens: int, seed: int) -> list[int]:
    """Deterministic token ids for models without tokenizer files (dummy configs)."""
    try:
        vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    except (OSError, ValueError, KeyError):
        vocab = 1000
    rng = random.Random(seed)
    return [rng.randrange(10, min(vocab, 32000)) for _ in range(num_tokens)]


class Prompts:
    """The fixed prompt and the needle prompt, built once (on the first healthy server)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.main, self.needle, self.code = args, None, None, None

    def ensure(self, base: str, say) -> None:
        if self.main is not None:
            return
        args = self.args
        if client.has_tokenizer(base):
            self.main = PROMPT
            if args.prompt_tokens:
                say(f"building a {args.prompt_tokens}-token needle prompt")
                count = lambda text: client.count_chat_tokens(base, text)
                np = needle.build_needle_prompt(args.prompt_tokens, count, args.seed)
                self.needle, self.code = np.text, np.code
                say(f"needle prompt: {np.num_tokens} tokens, code at depth {np.depth:.0%}")
        else:
            say("the model has no tokenizer: token-id prompts, text = token ids")
            self.main = token_prompt(args.model, 32, args.seed)
            if args.prompt_tokens:
                self.needle = token_prompt(args.model, args.prompt_tokens, args.seed + 1)

    def variants(self, n: int) -> list:
        """n different prompts like the main one (same across rates)."""
        if isinstance(self.main, str):
            return [f"{self.main} (Version {i + 1}.)" for i in range(n)]
        return [token_prompt(self.args.model, 32, self.args.seed + 100 + i) for i in range(n)]


def run_rate(args, rate: str, prompts: Prompts, logs: Path, use_limit: bool = True) -> dict:
    """One server, one rate: returns the record (an `error` key when it failed)."""
    rec: dict = {"rate": rate, "is_unlimited_baseline": not use_limit}
    tag = f"[rate {rate}{'' if use_limit else ', no memory limit'}]"
    say = lambda msg: print(f"{time.strftime('%H:%M:%S')} {tag} {msg}", flush=True)
    port = server.free_port()
    cmd = server_command(args, port, use_limit)
    name = f"rate-{rate}{'' if use_limit else '-nolimit'}.log"
    say(f"starting server: {shlex.join(cmd)}")
    poller = server.GpuMemoryPoller(server.gpu_index(args.device))
    with poller:
        proc = server.ServerProcess(cmd, server_env(rate), logs / name, port)
        try:
            rec["load_s"] = proc.wait_healthy(args.health_timeout)
            rec.update(server.parse_startup_log(proc.log_text()))
            say(f"healthy after {rec['load_s']:.1f} s; KV tokens {rec['kv_tokens']}")
            prompts.ensure(proc.base, say)
            say("warm-up")
            client.stream_generation(proc.base, prompts.main, WARMUP_TOKENS)
            before = server.expert_counters(proc.metrics())
            say(f"measuring {args.max_tokens} tokens")
            res = client.stream_generation(proc.base, prompts.main, args.max_tokens)
            after = server.expert_counters(proc.metrics())
            m = stream_stats(res.t_send, res.times, res.counts, res.completion_tokens)
            rec["measured"] = m.to_dict()
            rec["text"] = res.text
            rec["chunk_times_s"] = [t - res.t_send for t in res.times]
            rec["chunk_tokens"] = res.counts
            rec["expert_delta"] = report.counter_delta(before, after)
            rec["stats"] = proc.stats()
            say(f"{m.decode_tok_s or 0:.1f} tok/s, TTFT {report.fmt_seconds(m.ttft_s)}")
            rec["concurrent"] = []
            for n in concurrency_levels(args.concurrency):
                say(f"{n} streams at once, {args.concurrent_tokens} tokens each")
                streams = prompts.variants(n)
                scrape = lambda: server.expert_counters(proc.metrics())  # noqa: E731
                row = run_concurrent(proc.base, streams, args.concurrent_tokens, scrape)
                rec["concurrent"].append(row)
                say(f"{n} streams: {row.get('decode_tok_s') or 0:.1f} tok/s in all")
            if prompts.needle is not None:
                rec["needle"] = run_needle(args, proc.base, prompts, say)
        except Exception as e:  # noqa: BLE001 - one failed rate must not stop the others
            errors = [ln for ln in proc.log_text().splitlines() if "error:" in ln]
            rec["error"] = errors[-1].strip() if errors else f"{type(e).__name__}: {e}"
            say(f"FAILED: {rec['error']}\n{proc.log_tail()}")
        finally:
            rec["exit_code"] = proc.stop()
            say(f"stopped (exit code {rec['exit_code']})")
    rec["peak_gpu_mib"], rec["idle_gpu_mib"] = poller.peak_mib, poller.idle_mib
    return rec


def run_needle(args, base: str, prompts: Prompts, say) -> dict:
    say(f"needle run ({args.prompt_tokens} tokens)")
    res = client.stream_generation(base, prompts.needle, NEEDLE_ANSWER_TOKENS, ignore_eos=False)
    m = stream_stats(res.t_send, res.times, res.counts, res.completion_tokens)
    n = res.prompt_tokens
    found = "n/a"
    if prompts.code is not None and args.load_format != "dummy":
        found = "yes" if needle.contains_fact(res.text, prompts.code) else "no"
    out = {"num_tokens": n, "ttft_s": m.ttft_s, "answer": res.text, "found": found}
    out["prefill_tok_s"] = n / m.ttft_s if n and m.ttft_s else None
    say(f"prefill {out['prefill_tok_s'] or 0:.0f} tok/s, needle found: {found}")
    return out


def measure_bandwidth(args) -> dict:
    if args.device == "cpu":
        return {"cuda": False}
    dev = args.device if args.device and args.device.isdigit() else "0"
    cmd = [sys.executable, str(HERE / "offload_bench" / "bandwidth.py"), "--device", dev]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"cuda": None, "error": f"{type(e).__name__}: {e}"}


def previous_run(out: Path) -> dict:
    """OUT.json of an earlier invocation (for --append), or {} when there is none."""
    try:
        return json.loads(out.with_name(out.name + ".json").read_text())
    except (OSError, ValueError):
        return {}


def merge_records(earlier: list[dict], new: list[dict]) -> list[dict]:
    """Earlier records whose rate was not run again, then the new ones, in rate order
    (0 first, fractions ascending, auto last)."""
    key = lambda r: (r["rate"], r.get("is_unlimited_baseline", False))
    fresh = {key(r) for r in new}
    merged = [r for r in earlier if key(r) not in fresh] + new
    order = lambda r: (r["rate"] == "auto", 0.0 if r["rate"] == "auto" else float(r["rate"]))
    return sorted(merged, key=order)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rates = parse_rates(args.rates)
        concurrency_levels(args.concurrency)
    except ValueError as e:
        parser.error(str(e))
    out = Path(args.out)
    logs = out.with_name(out.name + ".logs")
    earlier = previous_run(out) if args.append else {}
    bw = earlier.get("bandwidth") or {}
    if not bw.get("cuda"):
        print("measuring host→GPU bandwidth", flush=True)
        bw = measure_bandwidth(args)
    rates_bw = [bw.get(k) for k in ("fill_kernel_gbps", "copy_engine_expert_gbps")]
    used_bw = max((b for b in rates_bw if b), default=None)
    print(f"bandwidth: {json.dumps(bw)}", flush=True)
    prompts, records = Prompts(args), []
    for rate in rates:
        records.append(run_rate(args, rate, prompts, logs))
        if rate == "0" and "measured" not in records[-1] and args.gpu_memory_limit_gb:
            records.append(run_rate(args, rate, prompts, logs, use_limit=False))
    records = merge_records(earlier.get("records", []), records)
    base = next((r for r in records if r["rate"] == "0" and r.get("measured")), None)
    t_res = base["measured"]["step_s"] if base else None
    report.add_limits(records, t_res, used_bw)
    report.add_concurrent_limits(records, used_bw)
    same, text = report.identity_verdict(records)
    gpu = bw.get("gpu") or ("CPU" if args.device == "cpu" else server.nvidia_smi("name", "0"))
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu or f"CPU ({platform.processor() or platform.machine()})",
        "command": "python3 " + shlex.join(sys.argv),
        "commands": earlier.get("commands", []) + ["python3 " + shlex.join(sys.argv)],
        "model": args.model,
        "load_format": args.load_format,
        "routing": routing_source(args),
        "max_tokens": args.max_tokens,
        "kvcache_dtype": args.kvcache_dtype or "auto",
        "bandwidth": bw,
        "bandwidth_gbps": used_bw,
        "t_resident_ms": None if t_res is None else 1e3 * t_res,
        "is_identical": same,
        "verdict": text,
        "args": vars(args),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    page = report.render_markdown(meta, records)
    out.with_name(out.name + ".md").write_text(page)
    out.with_name(out.name + ".json").write_text(json.dumps({**meta, "records": records}, indent=1))
    print(f"\n{text}\nwrote {out}.md, {out}.json\n\n{page}", flush=True)
    return 0 if same is not False else 1


if __name__ == "__main__":
    sys.exit(main())
