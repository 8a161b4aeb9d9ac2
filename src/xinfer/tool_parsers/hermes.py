"""Qwen's (Hermes-style) tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n
</tool_call>`, as Qwen2.5 / Qwen3 chat templates teach the model (vLLM's `hermes` parser)."""

from __future__ import annotations

import json
import re
from typing import Any

from xinfer.structured.spec import JSON_GRAMMAR_OPTIONS
from xinfer.tool_parsers.base import (
    StreamEvent,
    ToolCall,
    ToolParser,
    call_from_json,
    function_call_schema,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self) -> None:
        self._buffer = ""  # text not yet emitted
        self._is_in_call = False

    @classmethod
    def matches_template(cls, chat_template: str) -> bool:
        return OPEN in chat_template and CLOSE in chat_template

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if OPEN not in text:
            return text, []
        calls, rest, last = [], [], 0
        for match in _CALL.finditer(text):
            call = call_from_json(match.group(1).strip())
            if call is None:  # not a well-formed call: leave it as text
                continue
            calls.append(call)
            rest.append(text[last : match.start()])
            last = match.end()
        rest.append(text[last:])
        content = "".join(rest).strip()
        return (content or None), calls

    def feed(self, delta: str) -> list[StreamEvent]:
        self._buffer += delta
        events: list[StreamEvent] = []
        while True:
            if not self._is_in_call:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    text = self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(text) :]
                    if text:
                        events.append(StreamEvent(text=text))
                    return events
                if start > 0:
                    events.append(StreamEvent(text=self._buffer[:start]))
                self._buffer = self._buffer[start + len(OPEN) :]
                self._is_in_call = True
            end = self._buffer.find(CLOSE)
            if end < 0:
                return events
            payload = self._buffer[:end]
            self._buffer = self._buffer[end + len(CLOSE) :].lstrip("\n")
            self._is_in_call = False
            call = call_from_json(payload.strip())
            events.append(
                StreamEvent(call=call) if call else StreamEvent(text=OPEN + payload + CLOSE)
            )

    def finish(self) -> list[StreamEvent]:
        buffer, self._buffer = self._buffer, ""
        if not self._is_in_call:
            return [StreamEvent(text=buffer)] if buffer else []
        self._is_in_call = False
        call = call_from_json(buffer.strip())  # cut short (max_tokens) but maybe complete
        return [StreamEvent(call=call) if call else StreamEvent(text=OPEN + buffer)]

    def forced_grammar(
        self, tools: list[dict[str, Any]], is_parallel: bool, special_tokens: set[str]
    ) -> str:
        def literal(text: str) -> str:
            return text if text in special_tokens else json.dumps(text)

        schema = {**function_call_schema(tools), "x-guidance": JSON_GRAMMAR_OPTIONS}
        schema = json.dumps(schema, ensure_ascii=False)
        call = f'{literal(OPEN)} "\\n" %json {schema} "\\n" {literal(CLOSE)}'
        start = 'start: call ("\\n" call)*' if is_parallel else "start: call"
        return f"{start}\ncall: {call}\n"
