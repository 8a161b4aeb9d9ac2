"""What every tool-call format provides: `ToolParser` finds the calls in a finished answer
(`extract`), follows a streamed answer delta by delta (`feed` / `finish`, yielding text and
whole calls), and builds the grammar that forces a call (`tool_choice` required or named)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as the OpenAI API sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclass
class StreamEvent:
    """One piece of a streamed answer: plain text, or a complete tool call."""

    text: str = ""
    call: ToolCall | None = None


def call_from_json(payload: str) -> ToolCall | None:
    """`{"name": ..., "arguments": {...}}` (arguments as an object or as JSON text) → a call;
    None when the payload is not such an object."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def function_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of `{"name": one of the tools, "arguments": its parameters}`."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


class ToolParser:
    """A model family's tool-call format. Subclasses set `name` and implement the methods;
    one instance follows one streamed choice."""

    name = ""

    @classmethod
    def matches_template(cls, chat_template: str) -> bool:
        """Whether a chat template renders this format (how the server picks a parser)."""
        raise NotImplementedError

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the text outside the calls, or None if only calls; the calls) of a whole answer."""
        raise NotImplementedError

    def feed(self, delta: str) -> list[StreamEvent]:
        raise NotImplementedError

    def finish(self) -> list[StreamEvent]:
        """Whatever is still held back once the stream ends."""
        raise NotImplementedError

    def forced_grammar(
        self, tools: list[dict[str, Any]], is_parallel: bool, special_tokens: set[str]
    ) -> str:
        """A Lark grammar (llguidance dialect) whose every sentence is one call to one of
        `tools` (or several, if `is_parallel`) in this format; `special_tokens` are the
        tokenizer's special-token texts, which a grammar must name as tokens, not text."""
        raise NotImplementedError
