"""The OpenAI API through the official `openai` client against a real uvicorn server: chat
and text completions streamed and not, usage counts, stop strings, seeded sampling, n,
logprobs, /v1/models, /tokenize and /detokenize."""

from __future__ import annotations

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "Hello! How are you today?"}]
GREEDY = dict(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _prompt_tokens(server, messages) -> int:
    r = httpx.post(f"{server.base}/tokenize", json={"messages": messages})
    return r.json()["count"]


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny_chat"]
    assert client.models.retrieve("tiny_chat").id == "tiny_chat"


def test_chat_streamed_equals_not_streamed(server, client):
    full = client.chat.completions.create(model="tiny_chat", messages=MESSAGES, **GREEDY)
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    n_prompt = _prompt_tokens(server, MESSAGES)
    assert full.usage.prompt_tokens == n_prompt
    assert full.usage.total_tokens == n_prompt + full.usage.completion_tokens
    if choice.finish_reason == "length":
        assert full.usage.completion_tokens == GREEDY["max_tokens"]

    stream = client.chat.completions.create(
        model="tiny_chat",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text == choice.message.content
    assert finish == [choice.finish_reason]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_completion_streamed_equals_not_streamed(client):
    kw = dict(model="tiny_chat", prompt="The quick brown fox", temperature=0, max_tokens=20)
    full = client.completions.create(**kw)
    assert full.object == "text_completion"
    assert full.usage.completion_tokens == 20 or full.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    ids = httpx.post(
        str(client.base_url).replace("/v1/", "/tokenize"), json={"prompt": kw["prompt"]}
    )
    assert full.usage.prompt_tokens == ids.json()["count"]


def test_completion_token_ids_prompt_and_echo(client):
    out = client.completions.create(
        model="tiny_chat", prompt=[5, 6, 7, 8], max_tokens=4, temperature=0, echo=True
    )
    assert out.usage.prompt_tokens == 4
    assert len(out.choices[0].text) > 0


def test_stop_strings(client):
    base = client.chat.completions.create(model="tiny_chat", messages=MESSAGES, **GREEDY)
    text = base.choices[0].message.content
    assert len(text) >= 8
    stop = text[4:7]
    cut = text.index(stop)
    out = client.chat.completions.create(model="tiny_chat", messages=MESSAGES, stop=stop, **GREEDY)
    assert out.choices[0].message.content == text[:cut]
    assert out.choices[0].finish_reason == "stop"
    # A list of stops: the one that completes first wins; streamed gives the same text.
    stops = [text[-3:], stop]
    chunks = client.chat.completions.create(
        model="tiny_chat", messages=MESSAGES, stop=stops, stream=True, **GREEDY
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text[:cut]


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="tiny_chat", messages=MESSAGES, temperature=1.0, max_tokens=16)
    a = client.chat.completions.create(seed=7, **kw)
    b = client.chat.completions.create(seed=7, **kw)
    c = client.chat.completions.create(seed=8, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content
    # n > 1: choice i is sampled with seed + i.
    two = client.chat.completions.create(seed=7, n=2, **kw)
    texts = [ch.message.content for ch in two.choices]
    assert texts == [a.choices[0].message.content, c.choices[0].message.content]
    assert two.usage.completion_tokens == a.usage.completion_tokens + c.usage.completion_tokens
    assert two.usage.prompt_tokens == a.usage.prompt_tokens


def test_sampling_options_accepted(client):
    out = client.chat.completions.create(
        model="tiny_chat",
        messages=MESSAGES,
        max_completion_tokens=8,
        temperature=0.8,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 8
    assert out.choices[0].finish_reason == "length"


def test_n_choices_streamed(client):
    chunks = list(
        client.completions.create(
            model="tiny_chat", prompt="one two", n=3, max_tokens=6, seed=3, stream=True
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1, 2}


def test_logprobs(client):
    out = client.chat.completions.create(
        model="tiny_chat", messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.logprob <= 0
        assert item.top_logprobs[0].logprob >= item.logprob - 1e-5  # greedy takes the top
    text = client.completions.create(
        model="tiny_chat", prompt="Hello", max_tokens=5, temperature=0, logprobs=2
    )
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_tokenize_detokenize(server):
    r = httpx.post(f"{server.base}/tokenize", json={"prompt": "Hello world"})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    back = httpx.post(f"{server.base}/detokenize", json={"tokens": ids})
    assert back.json()["prompt"] == "Hello world"


def test_health(server):
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}
