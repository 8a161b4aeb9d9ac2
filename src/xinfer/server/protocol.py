"""Pydantic v2 models of the request bodies (OpenAI names, known fields type-checked). Fields
outside these models are refused with a 400 naming them (`check_fields`), except the few in
`IGNORED_FIELDS`, which are accepted and ignored on purpose (docs/server.md lists both)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    model_validator,
)
from pydantic_core import PydanticCustomError

from xinfer.server.errors import ApiError

MAX_N = 8  # most choices per request
MAX_STOP = 16  # most stop strings per request
MAX_STOP_CHARS = 256  # longest stop string
MAX_STOP_TOKEN_IDS = 256
MAX_TOOLS = 128
# Accepted and ignored on purpose: they do not change what is generated.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})


class _Body(BaseModel):
    # Infinity / NaN (Python's json reads them) are no sampling value: 400, not accepted.
    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)


def _find_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string in `value` that is not valid Unicode (a lone UTF-16
    surrogate such as "\\ud800", which JSON can carry but UTF-8 cannot encode)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and _find_surrogate(key, path) is not None:
                return path or "body"
            found = _find_surrogate(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    return None


class _Request(_Body):
    """A whole request body: strings must be valid Unicode (else 400, not a 500 later)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if isinstance(data, (dict, list)):
            where = _find_surrogate(data, "")
            if where is not None:
                raise PydanticCustomError(
                    "invalid_unicode",
                    "'{where}' contains a lone UTF-16 surrogate (e.g. \\ud800), which is not "
                    "valid Unicode; send well-formed text",
                    {"where": where},
                )
        return data


class StreamOptions(_Body):
    include_usage: StrictBool = False


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(_Request):
    """The sampling options shared by chat and text completions (None: the default)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None  # only empty / null: refused otherwise


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    refusal: None = None  # an assistant message may echo back `refusal: null`

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """Image, audio or video parts get one clear sentence (every model here generates
        from text; a multimodal checkpoint's vision tower is not loaded)."""
        parts = data.get("content") if isinstance(data, dict) else None
        for part in parts if isinstance(parts, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in (None, "text"):
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: this server takes "
                    "text only (send the message as text)"
                )
        return data

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class FunctionDef(_Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None


TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[StrictInt]


def check_fields(body: BaseModel, path: str = "") -> None:
    """Refuse (400, naming it) any field this server does not implement, at any depth."""
    for name in body.model_extra or {}:
        if not path and name in IGNORED_FIELDS:
            continue
        where = f"{path}{name}"
        raise ApiError(
            400, f"'{where}' is not supported by this server.", where, "unsupported_parameter"
        )
    for name in type(body).model_fields:
        value = getattr(body, name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                index = f"[{i}]" if isinstance(value, list) else ""
                check_fields(item, f"{path}{name}{index}.")


def usage(num_prompt: int, num_completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }


def model_card(name: str, max_model_len: int, created: int | None = None) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created or int(time.time()),
        "owned_by": "xinfer",
        "max_model_len": max_model_len,
    }
