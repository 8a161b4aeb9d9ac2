"""The command line's option groups beside the engine's (`args.EngineArgs`): `SamplingArgs`
for `--prompt` and `--chat`, `ServerArgs` for the server, `RunArgs` for the mode and logging;
`OPTION_SETS` lists every group and `build_parser` builds `xinfer`'s parser from them, whose
mistakes are UserErrors."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from xinfer import envs
from xinfer.args import EngineArgs
from xinfer.errors import UserError
from xinfer.options import OptionSet, at_least, option, within
from xinfer.sampling import SamplingParams

LOG_LEVELS = envs.LOG_LEVELS


@dataclass
class SamplingArgs(OptionSet):
    """Sampling for `--prompt` and `--chat` (the server takes it per request)."""

    GROUP = "sampling (--prompt and --chat)"

    max_tokens: int = option(256, "most tokens to generate per answer")
    temperature: float = option(0.0, "0 = greedy")
    top_p: float = option(1.0, "nucleus sampling: keep the smallest set with this probability")
    top_k: int = option(0, "keep the k most likely tokens (0 = off)")
    min_p: float = option(0.0, "drop tokens below min_p times the top probability")
    repetition_penalty: float = option(1.0, "HF repetition penalty (1 = off)")
    presence_penalty: float = option(0.0, "OpenAI presence penalty")
    frequency_penalty: float = option(0.0, "OpenAI frequency penalty")
    seed: int | None = option(None, "sampling seed (reproducible sampling)")
    stop: list[str] | None = option(None, "stop string (repeatable)")
    ignore_eos: bool = option(False, "keep generating after the end-of-sequence token")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.to_params()  # SamplingParams' own checks, before any model is loaded

    def to_params(self) -> SamplingParams:
        names = [f.name for f, _ in self.options()]
        return SamplingParams(**{name: getattr(self, name) for name in names})


def _log_level(value: str) -> str | None:
    if value.lower() in LOG_LEVELS:
        return None
    return f"must be one of {', '.join(LOG_LEVELS)}"


@dataclass
class ServerArgs(OptionSet):
    """The OpenAI-compatible server (the default mode)."""

    GROUP = "server"

    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8000, "port of the OpenAI API", check=within(1, 65534))
    ui_server: bool = option(False, "also serve the chat page on port + 1")
    api_key: str | None = option(
        None, "require this bearer key on /v1 requests", env=envs.XINFER_API_KEY
    )
    served_model_name: str | None = option(
        None,
        "model name in the API (default: the model directory's name)",
        check=lambda name: None if name.strip() else "must not be empty",
    )
    shutdown_grace_s: float = option(
        5.0, "on SIGTERM, seconds open requests get before they are aborted", check=at_least(0)
    )


@dataclass
class RunArgs(OptionSet):
    """What the command does: serve (default), one completion, or a terminal chat."""

    GROUP = "mode"

    prompt: str | None = option(None, "generate one completion, stream it and exit")
    chat: bool = option(False, "interactive chat in the terminal")
    log_level: str | None = option(
        None,
        f"logging: {', '.join(LOG_LEVELS)}",
        env=envs.XINFER_LOG_LEVEL,
        check=_log_level,
        metavar="LEVEL",
    )

    def check_mode(self, sampling: SamplingArgs, server: ServerArgs) -> None:
        """Options of another mode than the one run are refused, not dropped."""
        if self.prompt is not None and self.chat:
            raise UserError("--prompt and --chat are two modes; give one of them")
        if self.prompt is None and not self.chat:
            given = sampling.changed()
            if given:
                raise UserError(
                    f"{given[0]} sets the sampling of --prompt and --chat; the server takes "
                    "sampling per request (set it in the request)"
                )
            return
        given = server.changed()
        if given:
            mode = "--prompt" if self.prompt is not None else "--chat"
            raise UserError(f"{given[0]} applies to the server; drop it with {mode}")

    @property
    def logging_level(self) -> int:
        return getattr(logging, (self.value("log_level") or "info").upper())


OPTION_SETS: tuple[type[OptionSet], ...] = (RunArgs, EngineArgs, SamplingArgs, ServerArgs)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UserErrors: one line on stderr, exit code 2."""

    def error(self, message: str) -> None:
        raise UserError(message)


def build_parser(version: str) -> ArgumentParser:
    parser = ArgumentParser(
        prog="xinfer", description="Inference for Mixture-of-Experts models that do not fit "
        "in GPU memory: an OpenAI-compatible server (default), --prompt, or --chat.",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"xinfer {version}")
    for option_set in OPTION_SETS:
        option_set.add_arguments(parser)
    return parser
