"""HTTP side of a measurement: token counting through POST /tokenize, and one streamed
greedy generation (chat with a tokenizer; text completion on token ids without one), timed
chunk by chunk. Logprobs are asked for (the sampled token's only: a log_softmax per step) so
that every token arrives in a chunk of its own, even one that ends mid-UTF-8 character, and
without a tokenizer the chunks carry the token ids."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamResult:
    text: str  # the generated text; without a tokenizer, the token ids joined by spaces
    t_send: float  # perf_counter seconds when the request was sent
    times: list[float] = field(default_factory=list)  # arrival of each content chunk
    counts: list[int] = field(default_factory=list)  # tokens in each content chunk
    completion_tokens: int | None = None  # from the usage chunk
    prompt_tokens: int | None = None
    finish_reason: str | None = None


def has_tokenizer(base: str) -> bool:
    r = httpx.post(f"{base}/tokenize", json={"prompt": "hello"}, timeout=60)
    return r.status_code == 200


def count_chat_tokens(base: str, content: str) -> int:
    """Prompt tokens of a one-message chat, chat template and generation prompt included."""
    body = {"messages": [{"role": "user", "content": content}], "add_generation_prompt": True}
    r = httpx.post(f"{base}/tokenize", json=body, timeout=120)
    r.raise_for_status()
    return int(r.json()["count"])


def request_body(prompt: str | list[int], max_tokens: int, ignore_eos: bool) -> tuple[str, dict]:
    """(path, body) of a greedy streamed request for a text (chat) or token-id prompt."""
    body: dict = {
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", {**body, "messages": messages, "logprobs": True}
    return "/v1/completions", {**body, "prompt": prompt, "logprobs": 0}


def _chunk_content(choice: dict) -> tuple[str, int]:
    """(text, number of tokens) of one streamed choice; a text chunk counts as one token
    unless logprobs say how many it carried."""
    lp = choice.get("logprobs") or {}
    if "delta" in choice:
        text = (choice.get("delta") or {}).get("content") or ""
        n = len(lp.get("content") or []) if lp else 0
        return text, n or (1 if text else 0)
    tokens = lp.get("tokens") if lp else None
    if tokens is not None and not choice.get("text"):
        return " ".join(tokens) + (" " if tokens else ""), len(tokens)
    text = choice.get("text") or ""
    return text, len(tokens) if tokens else (1 if text else 0)


def stream_generation(
    base: str,
    prompt: str | list[int],
    max_tokens: int,
    ignore_eos: bool = True,
    on_first_token=None,
) -> StreamResult:
    """`on_first_token()` is called once, when the first token arrives (concurrent runs)."""
    path, body = request_body(prompt, max_tokens, ignore_eos)
    parts: list[str] = []
    res = StreamResult("", time.perf_counter())
    timeout = httpx.Timeout(30.0, read=3600.0)
    with httpx.stream("POST", f"{base}{path}", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.read().decode()[:500]}")
        for line in r.iter_lines():
            now = time.perf_counter()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                res.completion_tokens = chunk["usage"].get("completion_tokens")
                res.prompt_tokens = chunk["usage"].get("prompt_tokens")
            for choice in chunk.get("choices") or []:
                text, n = _chunk_content(choice)
                if n:
                    parts.append(text)
                    res.times.append(now)
                    res.counts.append(n)
                    if on_first_token is not None and len(res.times) == 1:
                        on_first_token()
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
    res.text = "".join(parts)
    return res
