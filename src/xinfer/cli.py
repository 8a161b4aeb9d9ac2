"""Command line: `xinfer --m MODEL` serves the OpenAI API (plus the chat page with
`--ui-server`); `--prompt TEXT` streams one completion and exits; `--chat` is a terminal chat.
User mistakes end with one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from xinfer import envs
from xinfer.config import (
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
    parse_dtype,
    parse_kv_dtype,
)
from xinfer.errors import UserError
from xinfer.llm import offload_from_env, resolve_model_path
from xinfer.parallel.devices import resolve_parallel
from xinfer.sampling import SamplingParams

logger = logging.getLogger("xinfer")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every user error
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="xinfer", description="MoE inference with GPU expert caches.")
    a = p.add_argument
    a("--m", "--model", dest="model", default=None, help="HF model dir, or 'demo' (default)")
    a(
        "--d",
        "--device",
        dest="device",
        default=None,
        help="cpu, a GPU index, or several ('0,1'; 'cpu,cpu' on CPUs) for tensor parallelism",
    )
    a("--prompt", default=None, help="generate one completion, stream it and exit")
    a("--chat", action="store_true", help="interactive chat in the terminal")
    a("--max-tokens", type=int, default=256)
    a("--temperature", type=float, default=0.0)
    a("--top-p", type=float, default=1.0)
    a("--top-k", type=int, default=0)
    a("--min-p", type=float, default=0.0)
    a("--repetition-penalty", type=float, default=1.0)
    a("--presence-penalty", type=float, default=0.0)
    a("--frequency-penalty", type=float, default=0.0)
    a("--seed", type=int, default=None, help="sampling seed (reproducible sampling)")
    a("--stop", action="append", default=None, help="stop string (repeatable)")
    a("--ignore-eos", action="store_true")
    a("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    a("--max-model-len", type=int, default=None)
    a("--load-format", default="auto", choices=["auto", "dummy"])
    a("--kvcache-dtype", default="auto", help="auto | bf16 | fp16 | fp8 (turbo4/turbo3: not yet)")
    a("--isq", default=None, help="in-situ quantization of experts (not yet supported)")
    a("--num-speculative-tokens", type=int, default=0, help="(not yet supported)")
    a("--moe-offload", default=None, help="fraction in (0, 1] or 'auto' (env XINFER_MOE_OFFLOAD)")
    a("--moe-offload-reserve-gb", type=float, default=None)
    a("--moe-offload-profile", action="store_true", default=None)
    a("--gpu-memory-limit-gb", type=float, default=None, help="size as if the GPU had G GB")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--disable-cuda-graph", action="store_true")
    a("--max-num-seqs", type=int, default=64)
    a("--max-num-batched-tokens", type=int, default=2048)
    a("--max-waiting", type=int, default=256, help="bounded queue; beyond it: HTTP 503")
    a("--block-size", type=int, default=16)
    a("--host", default="0.0.0.0")
    a("--port", type=int, default=8000)
    a("--ui-server", action="store_true", help="serve the chat page on port + 1")
    a("--api-key", default=None, help="require this bearer key (env XINFER_API_KEY)")
    a("--served-model-name", default=None)
    a("--log-level", default=None)
    return p


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    if args.isq:
        raise UserError("--isq is not supported yet; run the checkpoint's own dtype")
    if args.num_speculative_tokens:
        raise UserError("--num-speculative-tokens is not supported yet")
    device, parallel = resolve_parallel(args.device)  # several devices: tensor parallel
    return EngineConfig(
        model=resolve_model_path(args.model),
        device=device,
        parallel=parallel,
        dtype=parse_dtype(args.dtype),
        max_model_len=args.max_model_len,
        load_format=args.load_format,
        enforce_eager=args.disable_cuda_graph,
        gpu_memory_limit_gb=args.gpu_memory_limit_gb,
        cache=CacheConfig(
            block_size=args.block_size,
            kv_dtype=parse_kv_dtype(args.kvcache_dtype),
            gpu_memory_utilization=args.gpu_memory_utilization,
        ),
        offload=offload_from_env(
            args.moe_offload, args.moe_offload_reserve_gb, args.moe_offload_profile
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_waiting=args.max_waiting,
        ),
    )


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )


def _stream(engine, prompt: str | list[int], params: SamplingParams) -> tuple[str, int, float]:
    """Stream one completion to stdout; returns (text, tokens, seconds after the first)."""
    rid = engine.add_request(prompt, params)
    text, count, t_first = "", 0, None
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.request_id != rid:
                continue
            if t_first is None:
                t_first = time.perf_counter()
            count += len(delta.new_token_ids)
            text += delta.new_text
            if engine.tokenizer is None:
                sys.stdout.write(" ".join(map(str, delta.new_token_ids)) + " ")
            else:
                sys.stdout.write(delta.new_text)
            sys.stdout.flush()
    return text, count, time.perf_counter() - (t_first or time.perf_counter())


def _report(engine, count: int, seconds: float, t_start: float) -> None:
    rate = (count - 1) / seconds if count > 1 and seconds > 0 else 0.0
    logger.info(
        "%d tokens in %.2f s (%.1f tok/s decode)", count, time.perf_counter() - t_start, rate
    )
    if engine.offload_manager is not None:
        logger.info("%s", engine.offload_manager.format_summary())


def run_prompt(engine, args: argparse.Namespace) -> None:
    if not args.prompt.strip():
        raise UserError("the prompt is empty")
    t0 = time.perf_counter()
    _, count, seconds = _stream(engine, args.prompt, sampling_from_args(args))
    sys.stdout.write("\n")
    _report(engine, count, seconds, t0)


def run_chat(engine, args: argparse.Namespace) -> None:
    tok = engine.tokenizer
    if tok is None or not tok.has_chat_template:
        raise UserError("this model has no chat template; use --prompt instead")
    messages: list[dict[str, str]] = []
    print("Chat with the model. /reset clears the conversation, /exit (or Ctrl-D) quits.")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/reset":
            messages.clear()
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        prompt = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        text, _, _ = _stream(engine, prompt, sampling_from_args(args))
        print()
        messages.append({"role": "assistant", "content": text})


def main(argv: list[str] | None = None) -> int:
    level = envs.XINFER_LOG_LEVEL()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        if args.log_level:
            logging.getLogger().setLevel(args.log_level.upper())
        config = engine_config_from_args(args)
        if args.prompt is None and not args.chat:
            from xinfer.server.launch import serve

            serve(config, args)
            return 0
        from xinfer.engine.engine import Engine

        engine = Engine(config, show_progress=True)
        if args.prompt is not None:
            run_prompt(engine, args)
        else:
            run_chat(engine, args)
        return 0
    except UserError as e:
        print(f"xinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nxinfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
