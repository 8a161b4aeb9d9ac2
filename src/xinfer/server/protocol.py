"""Pydantic v2 models of the request bodies (OpenAI names; unknown fields are allowed and
ignored, known ones are type-checked) and the small response pieces shared by routes."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

MAX_N = 8  # most choices per request


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: StrictBool = False


class SamplingFields(_Body):
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
    user: str | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

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
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True


TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[StrictInt]


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
