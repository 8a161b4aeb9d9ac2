"""The Python API: `LLM(model, ...).generate(prompts, SamplingParams)` and `.chat(messages)`.
Batches all prompts through the engine's continuous batching and returns one result each."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from xinfer.args import EngineArgs, offload_from_env, parse_device  # noqa: F401 (re-exported)
from xinfer.engine.engine import Engine
from xinfer.engine.request import TokenLogprob
from xinfer.errors import UserError
from xinfer.model_source import demo_model_path, resolve_model  # noqa: F401 (re-exported)
from xinfer.sampling import SamplingParams

logger = logging.getLogger("xinfer")


@dataclass
class CompletionOutput:
    """One generated sequence of a prompt (a prompt has `SamplingParams.n` of them)."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class GenerationResult:
    """A prompt's result: `outputs` holds its n sequences; `text`, `token_ids` and the rest
    are those of the first (the only one when n = 1)."""

    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self.outputs[0].stop_reason

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.outputs[0].logprobs


def sequence_params(params: SamplingParams) -> list[SamplingParams]:
    """The n single-sequence params of a request; a seeded one gives sequence i seed + i
    (as the server does), so the n sequences differ yet each is reproducible."""
    if params.n == 1:
        return [params]
    return [
        replace(params, n=1, seed=None if params.seed is None else params.seed + i)
        for i in range(params.n)
    ]


def _is_chat(conv: Any) -> bool:
    """A list of message dicts, each with a string role and a string, list or None content."""
    return isinstance(conv, (list, tuple)) and all(
        isinstance(m, dict)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), (str, list, type(None)))
        for m in conv
    )


class LLM:
    """`LLM(model, **options)`: the options are `xinfer.args.EngineArgs`' fields (the same
    as the command line's engine flags), e.g. `device="cpu"`, `moe_offload=0.25`."""

    def __init__(self, model: str | None = "demo", *, show_progress: bool = False, **options):
        config = EngineArgs.from_kwargs(model=model, **options).create_engine_config()
        self.engine = Engine(config, show_progress=show_progress)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # a single prompt
        if not isinstance(prompts, (list, tuple)):
            raise UserError(
                "prompts must be a string, a list of token ids, or a list of them; got "
                f"{type(prompts).__name__}"
            )
        params_list = (
            params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        )
        if not all(isinstance(p, SamplingParams) for p in params_list):
            raise UserError("params must be a SamplingParams, or a list of one per prompt")
        if len(params_list) != len(prompts):
            raise UserError("give one SamplingParams, or one per prompt")
        results: list[GenerationResult] = []
        sequences: dict[str, CompletionOutput] = {}
        encoded = [self.engine.encode_prompt(prompt) for prompt in prompts]  # all valid first
        try:
            for ids, p in zip(encoded, params_list):
                result = GenerationResult(ids)
                for i, seq_params in enumerate(sequence_params(p)):
                    rid = self.engine.add_request(ids, seq_params)
                    sequences[rid] = CompletionOutput(i)
                    result.outputs.append(sequences[rid])
                results.append(result)
            while self.engine.has_unfinished():
                for delta in self.engine.step():
                    seq = sequences[delta.request_id]
                    seq.token_ids.extend(delta.new_token_ids)
                    seq.text += delta.new_text
                    seq.logprobs.extend(delta.new_logprobs)
                    if delta.finished:
                        seq.finish_reason = delta.finish_reason
                        seq.stop_reason = delta.stop_reason
        except BaseException:
            # a request refused midway (a later prompt's grammar, say), an error inside a step
            # or Ctrl-C: this call's requests are dropped so that the next call starts clean
            for rid in sequences:
                self.engine.abort_request(rid)
            raise
        return results

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        params: SamplingParams | None = None,
    ) -> list[GenerationResult]:
        if self.tokenizer is None:
            raise UserError("this model has no tokenizer files, so it cannot chat")
        is_one = isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], dict)
        convs = [messages] if is_one else messages
        if not isinstance(convs, (list, tuple)) or not all(_is_chat(c) for c in convs):
            raise UserError(
                "messages must be a list of {'role': str, 'content': str} dicts, or a list "
                "of such lists"
            )
        prompts = []
        for conv in convs:
            try:  # typed control tokens in a message stay text (the template writes any BOS)
                prompts.append(self.tokenizer.encode_chat(conv, add_generation_prompt=True))
            except UserError:
                raise
            except Exception as e:  # noqa: BLE001 - the template failed on these messages
                raise UserError(f"the chat template failed on these messages: {e}") from None
        return self.generate(prompts, params)

    def offload_stats(self) -> dict | None:
        """Per-layer and total expert-cache statistics, or None when offload is off."""
        return self.engine.offload_stats()

    def close(self) -> None:
        """Flush the files the engine writes (a routing trace) and stop the other
        tensor-parallel ranks now (else at exit)."""
        self.engine.close()
