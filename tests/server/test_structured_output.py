"""Structured output through the official `openai` client: `response_format` json_object and
json_schema (strict) answers parse and validate even from a tiny random model, streamed equals
not streamed, and a bad schema is a 400. The bundled demo model does the same in-process, with
and without decode look-ahead (same bytes)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Hello! Describe a user as JSON."}]


def _schema_format(schema: dict) -> dict:
    spec = {"name": "person", "schema": schema, "strict": True}
    return {"type": "json_schema", "json_schema": spec}


def test_json_object_parses(server):
    kw = dict(model="tiny_chat", messages=[{"role": "user", "content": "Hello!"}], temperature=0)
    client = server.client()
    out = client.chat.completions.create(response_format={"type": "json_object"}, **kw)
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.message.content), dict)
    # Without the grammar the random model writes no JSON at all.
    plain = client.chat.completions.create(max_tokens=16, **kw).choices[0].message.content
    with pytest.raises(ValueError):
        json.loads(plain)


def test_json_schema_validates_and_streams_the_same(server):
    client = server.client()
    kw = dict(model="tiny_chat", messages=ASK, temperature=0, max_tokens=200)
    out = client.chat.completions.create(response_format=_schema_format(PERSON), **kw)
    text = out.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)
    assert out.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        response_format=_schema_format(PERSON), stream=True, **kw
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text


def test_sampled_json_schema_validates(server):
    """Sampling (temperature 1, several seeds and choices) still yields valid objects."""
    out = server.client().chat.completions.create(
        model="tiny_chat",
        messages=ASK,
        response_format=_schema_format(PERSON),
        temperature=1.0,
        seed=7,
        n=3,
        max_tokens=200,
    )
    for choice in out.choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_completions_take_response_format_too(server):
    out = server.client().completions.create(
        model="tiny_chat",
        prompt="The quick brown fox",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": _schema_format({"enum": ["yes", "no"]})},
    )
    assert json.loads(out.choices[0].text) in ("yes", "no")


@pytest.mark.parametrize(
    "response_format, param",
    [
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema"),
        (_schema_format({"type": "object", "properties": {"a": {"type": "bogus"}}}), None),
        ({"type": "xml"}, None),
    ],
)
def test_bad_response_format_is_400(server, response_format, param):
    with pytest.raises(openai.BadRequestError) as err:
        server.client().chat.completions.create(
            model="tiny_chat", messages=ASK, response_format=response_format, max_tokens=8
        )
    body = err.value.body
    assert body["type"] == "invalid_request_error"
    assert body["param"] is not None and body["param"].startswith("response_format")
    if param:
        assert body["param"] == param


def _demo_outputs(look_ahead: bool) -> list[str]:
    from xinfer.config import EngineConfig
    from xinfer.engine.engine import Engine
    from xinfer.llm import demo_model_path
    from xinfer.sampling import SamplingParams
    from xinfer.structured import GrammarSpec

    config = EngineConfig(model=demo_model_path(), device="cpu", decode_look_ahead=look_ahead)
    engine = Engine(config, show_progress=False)
    tok = engine.tokenizer
    specs = [GrammarSpec("json_object"), GrammarSpec.json_schema(PERSON), None]
    prompts = ["Hello", "Describe a user as JSON.", "Hello"]
    texts = {}
    for spec, prompt in zip(specs, prompts):
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        params = SamplingParams(max_tokens=60, temperature=0, grammar=spec, ignore_eos=True)
        texts[engine.add_request(ids, params)] = ""
    while engine.has_unfinished():  # the three decode together: grammar rows beside a plain one
        for out in engine.step():
            texts[out.request_id] += out.new_text
    if look_ahead:
        assert engine.runner.look_ahead_counts["used"] > 0
    return list(texts.values())


def test_demo_model_json_is_valid_and_look_ahead_changes_nothing():
    on = _demo_outputs(look_ahead=True)
    assert isinstance(json.loads(on[0]), dict)
    jsonschema.validate(json.loads(on[1]), PERSON)
    assert on == _demo_outputs(look_ahead=False)
