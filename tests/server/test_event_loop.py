"""Tokenizing and rendering the chat template never run on the event loop: while one request's
(deliberately blocked) tokenization is in progress, /health is answered. In-process, with a
fake engine whose tokenizer waits for the test's signal; on the loop it would wait in vain."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import pytest

from xinfer.errors import UserError
from xinfer.server.app import build_app

WAIT_S = 20  # how long the blocked tokenizer waits for the test to release it


class BlockingTokenizer:
    chat_template = "{{ messages }}"
    special_tokens = frozenset()

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.timed_out = False

    def _block(self) -> None:
        self.entered.set()
        if not self.release.wait(WAIT_S):
            self.timed_out = True  # the event loop was blocked: nobody could release us

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self._block()
        return [1, 2, 3]

    def encode_chat(self, messages, add_generation_prompt=True, **kw) -> list[int]:
        self._block()
        raise UserError("the template refused these messages")  # ends the request with a 400


def _fake_engine(tokenizer) -> SimpleNamespace:
    return SimpleNamespace(
        tokenizer=tokenizer,
        max_model_len=64,
        max_waiting=256,
        is_alive=True,
        observer=None,
        engine=SimpleNamespace(model_config=SimpleNamespace(vocab_size=100)),
    )


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/tokenize", {"prompt": "x" * 2_000_000}, 200),
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}, 400),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400),
    ],
)
def test_health_answers_while_a_request_tokenizes(path, body, status):
    tok = BlockingTokenizer()
    app = build_app(_fake_engine(tok), "m")

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            slow = asyncio.ensure_future(client.post(path, json=body, timeout=60))
            assert await asyncio.to_thread(tok.entered.wait, WAIT_S)
            health = await client.get("/health", timeout=WAIT_S)
            answered_while_blocked = not tok.release.is_set()
            tok.release.set()
            response = await slow
            assert health.status_code == 200 and answered_while_blocked
            assert response.status_code == status, response.text

    asyncio.run(scenario())
    assert not tok.timed_out
