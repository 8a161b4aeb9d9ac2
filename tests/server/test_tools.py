"""Tool calling through the official `openai` client on a tiny random model whose chat template
renders tools as Qwen's do: `tool_choice` required / named is forced by a grammar (valid calls
even from a random model), streamed deltas carry the same calls, a tool result goes back in
through the template, `none` parses nothing, and impossible requests are 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _create(server, **kw):
    kw.setdefault("max_tokens", 100)
    messages = kw.pop("messages", ASK)
    return server.client().chat.completions.create(
        model="tiny_chat", messages=messages, tools=TOOLS, temperature=0, **kw
    )


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_tool_call_and_the_result_round_trips(server):
    out = _create(server, tool_choice="required", parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    _check_calls(calls)
    assert len(calls) == 1 and choice.message.content is None

    # The assistant's call and the tool's result go back in through the chat template.
    call = calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = _create(server, messages=history, tool_choice="none", max_tokens=8)
    assert answer.choices[0].message.tool_calls is None
    assert answer.usage.prompt_tokens > out.usage.prompt_tokens
    tokens = httpx.post(
        f"{server.base}/tokenize", json={"model": "tiny_chat", "messages": history}, timeout=60
    ).json()["tokens"]
    prompt = httpx.post(f"{server.base}/detokenize", json={"tokens": tokens}, timeout=60).json()[
        "prompt"
    ]
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert f'"name": "{call.function.name}", "arguments": {call.function.arguments}' in prompt


def test_named_tool_choice_streams_the_same_call(server):
    named = {"type": "function", "function": {"name": "get_time"}}
    whole = _create(server, tool_choice=named).choices[0]
    assert [c.function.name for c in whole.message.tool_calls] == ["get_time"]
    _check_calls(whole.message.tool_calls)
    stream = _create(server, tool_choice=named, stream=True)
    deltas, reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            reasons.append(choice.finish_reason)
    assert [d.function.name for d in deltas] == ["get_time"]
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_")
    assert deltas[0].function.arguments == whole.message.tool_calls[0].function.arguments
    assert reasons[-1] == whole.finish_reason == "tool_calls"


def test_tool_choice_none_leaves_the_text_alone(server):
    out = _create(server, tool_choice="none", max_tokens=8).choices[0]
    assert out.message.tool_calls is None and out.message.content


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS * 2}, "tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, None),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, None),
    ],
)
def test_impossible_tool_requests_are_400(server, kw, param):
    body = {"model": "tiny_chat", "messages": ASK, "tools": TOOLS, "max_tokens": 4, **kw}
    r = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    if param:
        assert r.json()["error"]["param"] == param


def test_tool_choice_without_tools_is_400(server):
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(
            model="tiny_chat", messages=ASK, tool_choice="required", max_tokens=4
        )
