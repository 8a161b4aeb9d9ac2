"""A server started with --api-key, --max-num-seqs 1 and --max-waiting 2: the key is
enforced on /v1/*, /tokenize and /detokenize (not on /health), and requests beyond the waiting
queue get 503 while the admitted ones finish."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]


def test_api_key_is_enforced(limited_server):
    s = limited_server
    good = s.client()
    assert good.chat.completions.create(model="tiny_chat", messages=MSG, max_tokens=3).choices
    for key in ("wrong-key", ""):
        from openai import OpenAI

        bad = OpenAI(base_url=s.v1, api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.status_code == 401
    r = httpx.post(f"{s.v1}/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{s.base}/health").status_code == 200
    # Tokenizing costs the server work: keyed too.
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [5]})):
        assert httpx.post(f"{s.base}{path}", json=body, timeout=30).status_code == 401
        keyed = httpx.post(
            f"{s.base}{path}", json=body, headers={"Authorization": "Bearer sk-test-key"}
        )
        assert keyed.status_code == 200, keyed.text
    # The page's preflight must pass without the key (CORS).
    pre = httpx.options(
        f"{s.v1}/chat/completions",
        headers={
            "Origin": "http://127.0.0.1:1",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert pre.status_code == 200


def test_full_waiting_queue_answers_503(limited_server):
    s = limited_server
    headers = {"Authorization": f"Bearer {s.api_key}"}
    body = {"model": "tiny_chat", "prompt": "Hello", "max_tokens": 300, "ignore_eos": True}

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=600, headers=headers) as http:
            return await asyncio.gather(
                *(http.post(f"{s.v1}/completions", json=body) for _ in range(6))
            )

    responses = asyncio.run(fire())
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 503 in codes, codes
    assert set(codes) <= {200, 503}
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "queue_full"
        else:
            assert r.json()["usage"]["completion_tokens"] == 300
    # Capacity comes back once the queue drains.
    ok = httpx.post(
        f"{s.v1}/completions", json={**body, "max_tokens": 2}, headers=headers, timeout=120
    )
    assert ok.status_code == 200


def test_request_larger_than_the_queue_is_a_400_not_a_503(limited_server):
    """n = 3 on a queue of two could never be admitted: "retry later" (503) would be a lie."""
    s = limited_server
    headers = {"Authorization": f"Bearer {s.api_key}"}
    body = {"model": "tiny_chat", "messages": MSG, "max_tokens": 2, "n": 3}
    r = httpx.post(f"{s.v1}/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n"
    text = {"model": "tiny_chat", "prompt": ["a", "b", "c"], "max_tokens": 2}
    r = httpx.post(f"{s.v1}/completions", json=text, headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt"
    ok = httpx.post(f"{s.v1}/chat/completions", json={**body, "n": 2}, headers=headers, timeout=60)
    assert ok.status_code == 200, ok.text
