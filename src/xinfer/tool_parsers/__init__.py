"""Tool-call formats, one module per model family; `parser_for_template` picks the one a
model's chat template renders (Qwen's Hermes-style `<tool_call>` first)."""

from __future__ import annotations

from xinfer.tool_parsers.base import StreamEvent, ToolCall, ToolParser
from xinfer.tool_parsers.hermes import HermesToolParser

PARSERS: tuple[type[ToolParser], ...] = (HermesToolParser,)


def parser_for_template(chat_template: str | None) -> type[ToolParser] | None:
    """The tool-call format a chat template teaches its model, or None if no known one."""
    if not chat_template:
        return None
    for parser in PARSERS:
        if parser.matches_template(chat_template):
            return parser
    return None


__all__ = ["PARSERS", "StreamEvent", "ToolCall", "ToolParser", "parser_for_template"]
