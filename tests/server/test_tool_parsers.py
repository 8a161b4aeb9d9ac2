"""The Hermes (Qwen) tool-call parser: whole answers and streams split at every position agree;
malformed calls stay text; the forced-call grammar accepts exactly well-formed calls; a chat
template that does not render tools is refused before anything runs."""

from __future__ import annotations

import json

import pytest
from chat_model import CHATML, TOOLS_CHATML, write_tokenizer

from xinfer.server.errors import ApiError
from xinfer.server.protocol import ChatCompletionRequest
from xinfer.server.tools import plan_tools
from xinfer.structured import GrammarCompiler, GrammarSpec
from xinfer.tokenizer import Tokenizer
from xinfer.tool_parsers import parser_for_template
from xinfer.tool_parsers.hermes import HermesToolParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def _streamed(text: str, cut: int) -> tuple[str, list]:
    parser = HermesToolParser()
    events = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish()
    return "".join(e.text for e in events), [e.call for e in events if e.call]


@pytest.mark.parametrize(
    "text, content, names",
    [
        ("Sure. " + CALL, "Sure.", ["get_weather"]),
        (CALL + "\n" + CALL, None, ["get_weather", "get_weather"]),
        ("no calls here <tool", "no calls here <tool", []),
        ("<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
        (CALL[: -len("</tool_call>")], None, ["get_weather"]),  # cut short by max_tokens
    ],
)
def test_extract_and_every_stream_split_agree(text, content, names):
    got_content, calls = HermesToolParser().extract(text)
    assert got_content == content
    assert [c.name for c in calls] == names
    for c in calls:
        assert json.loads(c.arguments) == {"city": "Paris"}
    for cut in range(len(text) + 1):
        streamed_text, streamed_calls = _streamed(text, cut)
        assert [c.name for c in streamed_calls] == names
        assert [c.arguments for c in streamed_calls] == [c.arguments for c in calls]
        assert streamed_text.strip() == (content or "")


def test_forced_grammar_accepts_only_calls(tmp_path):
    write_tokenizer(tmp_path, chat_template=TOOLS_CHATML)
    tok = Tokenizer.from_dir(tmp_path)
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    lark = HermesToolParser().forced_grammar(TOOLS, False, set(tok.special_tokens))
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for text, ok in [(good, True), (good.replace("get_weather", "get_time"), False),
                     (good.replace('"city"', '"town"'), False), ("Sure", False)]:  # fmt: skip
        matcher = compiler.matcher(GrammarSpec("lark", lark))
        accepted = all(matcher.accept(t) for t in tok.encode_text_only(text))
        assert accepted == ok, text
        if ok:
            assert matcher.is_finished  # one call, parallel off: nothing may follow


def test_parser_is_picked_from_the_template():
    assert parser_for_template(TOOLS_CHATML) is HermesToolParser
    assert parser_for_template(CHATML) is None


def test_a_template_without_tools_refuses_them(tmp_path):
    write_tokenizer(tmp_path, chat_template=CHATML)
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    )
    with pytest.raises(ApiError) as err:
        plan_tools(req, Tokenizer.from_dir(tmp_path))
    assert err.value.status == 400 and err.value.param == "tools"
