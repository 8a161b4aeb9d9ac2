"""Command line: `xinfer --m MODEL` serves the OpenAI API (plus the chat page with
`--ui-server`); `--prompt TEXT` streams one completion and exits; `--chat` is a terminal chat.
User mistakes end with one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from xinfer import __version__
from xinfer.args import EngineArgs
from xinfer.cli_args import RunArgs, SamplingArgs, ServerArgs, build_parser
from xinfer.errors import UserError
from xinfer.model_source import model_display_name
from xinfer.sampling import SamplingParams

logger = logging.getLogger("xinfer")


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


def run_prompt(engine, prompt: str, params: SamplingParams) -> None:
    if not prompt.strip():
        raise UserError("the prompt is empty")
    t0 = time.perf_counter()
    _, count, seconds = _stream(engine, prompt, params)
    sys.stdout.write("\n")
    _report(engine, count, seconds, t0)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        ns = build_parser(__version__).parse_args(argv)
        run = RunArgs.from_namespace(ns)
        logging.getLogger().setLevel(run.logging_level)
        sampling_args, server = SamplingArgs.from_namespace(ns), ServerArgs.from_namespace(ns)
        run.check_mode(sampling_args, server)
        engine_args = EngineArgs.from_namespace(ns)
        if engine_args.log_stats_interval is None and run.prompt is None and not run.chat:
            engine_args.log_stats_interval = 10.0  # a server logs its stats; a terminal not
        sampling = sampling_args.to_params()
        config = engine_args.create_engine_config()
        if server.served_model_name is None:  # a hub model is served under its repo id
            name = model_display_name(engine_args.model, config.model)
            server = dataclasses.replace(server, served_model_name=name)
        if run.prompt is None and not run.chat:
            from xinfer.server.launch import serve

            serve(config, server)
            return 0
        from xinfer.engine.engine import Engine

        engine = Engine(config, show_progress=True)
        try:
            if run.prompt is not None:
                run_prompt(engine, run.prompt, sampling)
            else:
                from xinfer.chat import run_chat

                run_chat(engine, sampling)
        finally:
            engine.close()
        return 0
    except UserError as e:
        print(f"xinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nxinfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
