"""Turns a chat or text completion request into a `Job` (token ids and validated
`SamplingParams` per choice, a grammar for structured output or a forced tool call), runs it
to the end for non-streamed answers, and converts the engine's logprobs and tool calls into
the OpenAI shapes. Building a job tokenizes: routes call it off the event loop."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from xinfer.engine.async_engine import AsyncEngine
from xinfer.errors import UserError
from xinfer.sampling import MAX_LOGPROBS, SEED_RANGE, SamplingParams
from xinfer.server.errors import ApiError
from xinfer.server.protocol import (
    MAX_N,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
    SamplingFields,
    check_fields,
    usage,
)
from xinfer.server.tools import message_dicts, plan_tools, template_kwargs
from xinfer.structured import GrammarSpec
from xinfer.tool_parsers import ToolCall, ToolParser

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
)


@dataclass
class Job:
    is_chat: bool
    request_id: str
    model: str
    prompts: list[list[int]]  # one per choice (a prompt repeated n times)
    params: list[SamplingParams]
    num_prompt_tokens: int  # summed over distinct prompts
    logprobs: int | None  # top alternatives asked for; None: no logprobs
    include_usage: bool
    echo: list[str] | None = None  # per choice: the prompt text to put before the output
    is_stream: bool = False
    tool_parser: type[ToolParser] | None = None  # tool calls are parsed out of the answer
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Choice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None


def _sampling_params(
    req: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    offset: int,
    grammar: GrammarSpec | None = None,
    skip_special_tokens: bool | None = None,
) -> SamplingParams:
    kw = {name: getattr(req, name) for name in _SAMPLING_FIELDS if getattr(req, name) is not None}
    if skip_special_tokens is not None:
        kw["skip_special_tokens"] = skip_special_tokens
    seed = None if req.seed is None else req.seed + offset  # n > 1: each choice its own seed
    try:
        return SamplingParams(
            max_tokens=max_tokens, seed=seed, logprobs=logprobs, grammar=grammar, **kw
        )
    except UserError as e:
        param = str(e).split(" ", 1)[0]
        raise ApiError(
            400,
            str(e),
            param=param if param in kw or param in ("max_tokens", "seed", "logprobs") else None,
            code="invalid_value",
        ) from None


def _check_request_limits(req: SamplingFields) -> None:
    """Bounds that keep one request from costing the server more than a request should."""
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOP:
        message = f"at most {MAX_STOP} stop strings are allowed."
        raise ApiError(400, message, "stop", "invalid_value")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        message = f"stop strings may be at most {MAX_STOP_CHARS} characters."
        raise ApiError(400, message, "stop", "invalid_value")
    if len(req.stop_token_ids or []) > MAX_STOP_TOKEN_IDS:
        raise ApiError(
            400,
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed.",
            "stop_token_ids",
            "invalid_value",
        )
    if req.seed is not None and not (
        SEED_RANGE[0] <= req.seed and req.seed + req.n - 1 <= SEED_RANGE[1]
    ):
        raise ApiError(
            400,
            f"seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1] - req.n + 1} (64 bits; "
            "choice i of n uses seed + i).",
            "seed",
            "invalid_value",
        )
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported.", "logit_bias", "unsupported_parameter")


def grammar_for(rf: ResponseFormat | None) -> GrammarSpec | None:
    """The grammar `response_format` asks for (None for plain text)."""
    if rf is not None and rf.type != "json_schema" and rf.json_schema is not None:
        raise ApiError(
            400,
            f"response_format.json_schema needs type 'json_schema', not '{rf.type}'.",
            "response_format.json_schema",
            "invalid_value",
        )
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return GrammarSpec("json_object")
    if rf.json_schema is None or rf.json_schema.json_schema is None:
        raise ApiError(
            400,
            "response_format of type 'json_schema' needs json_schema.schema.",
            "response_format.json_schema",
            "invalid_value",
        )
    try:
        return GrammarSpec.json_schema(rf.json_schema.json_schema)
    except UserError as e:
        raise ApiError(400, str(e), "response_format.json_schema", "invalid_value") from None


def _check_grammar(engine: AsyncEngine, grammar: GrammarSpec | None, param: str) -> None:
    """Compile the grammar once here (off the event loop), so a bad schema is a 400."""
    if grammar is None:
        return
    try:
        engine.engine.grammar_compiler.matcher(grammar)
    except UserError as e:
        raise ApiError(400, str(e), param, "invalid_value") from None


def _max_tokens(
    asked: int | None, prompt_len: int, max_model_len: int, param: str, prompt_param: str
) -> int:
    """The output budget: what the client asked for (checked against the context), or all
    the room the context leaves when it asked for nothing."""
    if prompt_len >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens. Shorten the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if asked is None:
        return max_model_len - prompt_len
    if asked < 1:
        raise ApiError(400, f"{param} must be >= 1, got {asked}.", param, "invalid_value")
    if prompt_len + asked > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len} tokens and {param} asks for {asked} more. Lower {param} or shorten "
            "the prompt.",
            param=param,
            code="context_length_exceeded",
        )
    return asked


def _check_common(engine: AsyncEngine, req: SamplingFields, model: str) -> None:
    check_fields(req)
    _check_request_limits(req)
    if req.model is not None and req.model != model:
        raise ApiError(
            404,
            f"The model '{req.model}' does not exist; this server serves '{model}'.",
            param="model",
            code="model_not_found",
        )
    if not 1 <= req.n <= MAX_N:
        raise ApiError(400, f"n must be between 1 and {MAX_N}, got {req.n}.", "n", "invalid_value")
    vocab = engine.engine.model_config.vocab_size
    bad = next((t for t in req.stop_token_ids or [] if not 0 <= t < vocab), None)
    if bad is not None:  # an id no step can sample would never stop anything
        raise ApiError(
            400,
            f"stop_token_ids must be token ids in [0, {vocab}), got {bad}.",
            "stop_token_ids",
            "invalid_value",
        )
    if req.stream_options is not None and not req.stream:
        raise ApiError(
            400,
            "stream_options is only allowed with stream: true.",
            "stream_options",
            "invalid_value",
        )


def _check_fits_queue(engine: AsyncEngine, num_choices: int, param: str) -> None:
    """A request of more sequences than the waiting queue holds could never be admitted: a
    400 saying so, not a 503 "retry later" forever."""
    if num_choices > engine.max_waiting:
        raise ApiError(
            400,
            f"this request asks for {num_choices} sequences (prompts times n), more than this "
            f"server queues at once ({engine.max_waiting}); split it into smaller requests.",
            param,
            "invalid_value",
        )


def _tokenizer(engine: AsyncEngine, what: str):
    if engine.tokenizer is None:
        raise ApiError(400, f"This model has no tokenizer files; {what} is not available.")
    return engine.tokenizer


def chat_prompt_ids(
    engine: AsyncEngine, messages: list, add_generation_prompt: bool, **kwargs: Any
) -> list[int]:
    """The chat's token ids; only the template's own control tokens are special."""
    if not messages:
        raise ApiError(400, "messages must not be empty.", "messages", "invalid_value")
    tok = _tokenizer(engine, "chat")
    try:
        return tok.encode_chat(message_dicts(messages), add_generation_prompt, **kwargs)
    except ApiError:
        raise
    except UserError as e:
        raise ApiError(400, str(e), "messages") from None
    except Exception as e:  # noqa: BLE001 - a template failing on these messages
        raise ApiError(400, f"the chat template failed on these messages: {e}", "messages") from e


def chat_job(engine: AsyncEngine, req: ChatCompletionRequest, model: str) -> Job:
    _check_common(engine, req, model)
    _check_fits_queue(engine, req.n, "n")
    plan = plan_tools(req, _tokenizer(engine, "chat"))
    grammar = grammar_for(req.response_format)
    if grammar is not None and plan.grammar is not None:
        raise ApiError(
            400,
            "response_format and a forced tool call (tool_choice required or named) cannot "
            "both constrain one answer.",
            "response_format",
            "invalid_value",
        )
    grammar = grammar or plan.grammar
    _check_grammar(engine, grammar, "tools" if plan.grammar else "response_format")
    kwargs = template_kwargs(req)
    if plan.tools is not None:
        kwargs["tools"] = plan.tools
    ids = chat_prompt_ids(engine, req.messages, req.add_generation_prompt, **kwargs)
    asked, param = req.max_completion_tokens, "max_completion_tokens"
    if asked is None:
        asked, param = req.max_tokens, "max_tokens"
    max_tokens = _max_tokens(asked, len(ids), engine.max_model_len, param, "messages")
    logprobs = None
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise ApiError(
            400,
            f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}.",
            "top_logprobs",
            "invalid_value",
        )
    if req.logprobs:
        logprobs = req.top_logprobs or 0
    elif req.top_logprobs is not None:
        raise ApiError(400, "top_logprobs needs logprobs: true.", "top_logprobs", "invalid_value")
    # Tool-call markers may be special tokens: keep them in the text the parser reads.
    skip_special = False if plan.parser is not None else None
    params = [
        _sampling_params(req, max_tokens, logprobs, i, grammar, skip_special) for i in range(req.n)
    ]
    return Job(
        True,
        f"chatcmpl-{uuid.uuid4().hex}",
        model,
        [ids] * req.n,
        params,
        len(ids),
        logprobs,
        bool(req.stream_options and req.stream_options.include_usage),
        is_stream=req.stream,
        tool_parser=plan.parser,
    )


def completion_job(engine: AsyncEngine, req: CompletionRequest, model: str) -> Job:
    _check_common(engine, req, model)
    if req.suffix:
        raise ApiError(400, "suffix is not supported.", "suffix", "unsupported")
    if req.echo and req.logprobs is not None:
        raise ApiError(
            400,
            "logprobs with echo (the prompt's logprobs) is not supported; send one of them.",
            "logprobs",
            "unsupported_parameter",
        )
    raw = req.prompt
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        raw = [raw]
    if not raw:
        raise ApiError(400, "prompt must not be empty.", "prompt", "invalid_value")
    _check_fits_queue(engine, len(raw) * req.n, "prompt")
    grammar = grammar_for(req.response_format)
    _check_grammar(engine, grammar, "response_format")
    vocab = engine.engine.model_config.vocab_size
    prompts, echo, params = [], [], []
    total = 0
    for p in raw:
        if isinstance(p, str):
            ids = _tokenizer(engine, "a text prompt").encode(p) if p else []
            text = p
        else:
            if any(not 0 <= t < vocab for t in p):
                raise ApiError(400, f"prompt token ids must be in [0, {vocab}).", "prompt")
            ids = list(p)
            text = engine.tokenizer.decode(ids) if engine.tokenizer else ""
        if not ids:
            raise ApiError(400, "prompt must not be empty.", "prompt", "invalid_value")
        max_tokens = _max_tokens(
            req.max_tokens, len(ids), engine.max_model_len, "max_tokens", "prompt"
        )
        total += len(ids)
        for i in range(req.n):
            params.append(_sampling_params(req, max_tokens, req.logprobs, i, grammar))
            prompts.append(ids)
            echo.append(text)
    return Job(
        False,
        f"cmpl-{uuid.uuid4().hex}",
        model,
        prompts,
        params,
        total,
        req.logprobs,
        bool(req.stream_options and req.stream_options.include_usage),
        echo if req.echo else None,
        is_stream=req.stream,
    )


def _top(lp: Any) -> list[tuple[int, float]]:
    if hasattr(lp, "top_ids"):  # sampling.TokenLogprobs
        return list(zip(lp.top_ids, lp.top_logprobs))
    return list(getattr(lp, "top", []))  # request.TokenLogprob


def token_text(engine: AsyncEngine, token_id: int) -> str:
    tok = engine.tokenizer
    return tok.decode([token_id], skip_special_tokens=False) if tok else str(token_id)


def chat_logprobs(engine: AsyncEngine, lps: list[Any]) -> dict[str, Any]:
    def entry(tid: int, value: float) -> dict[str, Any]:
        s = token_text(engine, tid)
        return {"token": s, "logprob": value, "bytes": list(s.encode("utf-8"))}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in _top(lp)]}
            for lp in lps
        ]
    }


def completion_logprobs(engine: AsyncEngine, lps: list[Any], offset: int) -> dict[str, Any]:
    tokens = [token_text(engine, lp.token_id) for lp in lps]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{token_text(engine, t): v for t, v in _top(lp)} for lp in lps],
        "text_offset": offsets,
    }


async def run_to_end(engine: AsyncEngine, job: Job) -> list[Choice]:
    choices = [Choice() for _ in job.params]
    async for i, out in engine.generate_choices(job.prompts, job.params, job.request_id):
        c = choices[i]
        c.text += out.new_text
        c.token_ids += out.new_token_ids
        c.logprobs += out.new_logprobs
        if out.finished:
            c.finish_reason = out.finish_reason
    return choices


def full_response(engine: AsyncEngine, job: Job, choices: list[Choice]) -> dict[str, Any]:
    num_completion = sum(len(c.token_ids) for c in choices)
    items = []
    for i, c in enumerate(choices):
        lp = None
        if job.is_chat:
            if job.logprobs is not None:
                lp = chat_logprobs(engine, c.logprobs)
            msg, reason = chat_message(job, c.text, c.finish_reason)
            items.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": reason})
        else:
            prefix = job.echo[i] if job.echo else ""
            if job.logprobs is not None:
                lp = completion_logprobs(engine, c.logprobs, len(prefix))
            items.append(
                {
                    "index": i,
                    "text": prefix + c.text,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }
            )
    return {
        "id": job.request_id,
        "object": "chat.completion" if job.is_chat else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": items,
        "usage": usage(job.num_prompt_tokens, num_completion),
    }


def chat_message(job: Job, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a whole answer and its finish reason ("tool_calls" when the
    model called tools)."""
    if job.tool_parser is None:
        return {"role": "assistant", "content": text}, reason
    content, calls = job.tool_parser().extract(text)
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [c.to_openai() for c in calls]
        reason = "tool_calls" if reason == "stop" else reason
    return msg, reason


def tool_call_delta(call: ToolCall, index: int) -> dict[str, Any]:
    return {"tool_calls": [call.to_openai(index)]}
