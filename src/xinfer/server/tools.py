"""Tool calling in the OpenAI shape: checks `tools` / `tool_choice`, turns the request's
messages (assistant `tool_calls`, `role: tool` results) into what chat templates expect, picks
the tool-call format the model's template teaches, and, for `tool_choice` "required" or a
named function, the grammar that forces a call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from xinfer.server.errors import ApiError
from xinfer.server.protocol import MAX_TOOLS, ChatCompletionRequest, ChatMessage
from xinfer.structured import GrammarSpec
from xinfer.tokenizer import Tokenizer
from xinfer.tool_parsers import ToolParser, parser_for_template

_RESERVED_TEMPLATE_KWARGS = {"messages", "tools", "add_generation_prompt", "documents"}


@dataclass
class ToolPlan:
    tools: list[dict[str, Any]] | None  # what the chat template renders (None: no tools)
    parser: type[ToolParser] | None  # None: the answer is returned as text
    grammar: GrammarSpec | None  # a forced call (tool_choice required or named)


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as chat templates read them: text content ("" for none), assistant
    `tool_calls` with their arguments as objects, and `tool_call_id` / `name` where given."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if part.type == "text" and part.text is None:
                    raise ApiError(
                        400,
                        "a content part of type 'text' needs its 'text'.",
                        f"messages[{i}].content[{j}].text",
                        "invalid_value",
                    )
                if part.type != "text":
                    raise ApiError(
                        400,
                        f"content parts of type '{part.type}' are not supported (text only).",
                        f"messages[{i}].content[{j}].type",
                        "unsupported_parameter",
                    )
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            if m.role != "assistant":
                raise ApiError(400, "only assistant messages carry tool_calls.", f"messages[{i}]")
            msg["tool_calls"] = [_call_dict(c, i) for c in m.tool_calls]
        out.append(msg)
    return out


def _call_dict(call, i: int) -> dict[str, Any]:
    args = call.function.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = None
    if not isinstance(args, dict):
        raise ApiError(
            400,
            "tool call arguments must be a JSON object.",
            f"messages[{i}].tool_calls",
            "invalid_value",
        )
    fn = {"name": call.function.name, "arguments": args}
    return {"id": call.id, "type": "function", "function": fn}


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    kwargs = dict(req.chat_template_kwargs or {})
    for key in kwargs:
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise ApiError(
                400,
                f"chat_template_kwargs may not set '{key}'; use the request field.",
                "chat_template_kwargs",
                "invalid_value",
            )
    return kwargs


def plan_tools(req: ChatCompletionRequest, tokenizer: Tokenizer) -> ToolPlan:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools.", "tool_choice", "invalid_value")
        return ToolPlan(None, None, None)
    if len(req.tools) > MAX_TOOLS:
        raise ApiError(400, f"at most {MAX_TOOLS} tools are allowed.", "tools", "invalid_value")
    tools = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise ApiError(400, "tool names must be unique.", "tools", "invalid_value")
    template = tokenizer.chat_template or ""
    if "tools" not in template:
        raise ApiError(
            400,
            "this model's chat template does not render tools, so the model cannot be told "
            "about them; send the request without 'tools'.",
            "tools",
            "unsupported_parameter",
        )
    if choice == "none":
        return ToolPlan(tools, None, None)  # rendered, never parsed (OpenAI semantics)
    parser = parser_for_template(template)
    if parser is None:
        raise ApiError(
            400,
            "this model's tool-call format is not one xinfer can parse (supported: Qwen / "
            "Hermes <tool_call>); send tool_choice 'none' or no tools.",
            "tools",
            "unsupported_parameter",
        )
    grammar = None
    if choice == "required" or not isinstance(choice, (str, type(None))):
        forced = tools
        if not isinstance(choice, str) and choice is not None:
            forced = [t for t in tools if t["function"]["name"] == choice.function.name]
            if not forced:
                raise ApiError(
                    400,
                    f"tool_choice names '{choice.function.name}', which is not in tools.",
                    "tool_choice",
                    "invalid_value",
                )
        is_parallel = req.parallel_tool_calls and choice == "required"
        lark = parser().forced_grammar(forced, is_parallel, set(tokenizer.special_tokens))
        grammar = GrammarSpec("lark", lark)
    return ToolPlan(tools, parser, grammar)
