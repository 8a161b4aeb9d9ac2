"""Server-sent events for streamed chat and text completions: one `data: {json}` chunk per
engine delta (with tools: text as `content`, each parsed call as a `tool_calls` delta), a
finish chunk per choice, an optional usage chunk, then `data: [DONE]`.
Closing the stream (client disconnect) closes the engine iterator, which aborts the request
and frees its KV blocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from xinfer.engine.async_engine import AsyncEngine
from xinfer.engine.request import RequestOutput
from xinfer.server.errors import as_api_error, error_body
from xinfer.server.protocol import usage
from xinfer.server.serving import Job, chat_logprobs, completion_logprobs, tool_call_delta
from xinfer.tool_parsers import StreamEvent


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


class _ChunkMaker:
    def __init__(self, engine: AsyncEngine, job: Job) -> None:
        self.engine, self.job = engine, job
        self.object = "chat.completion.chunk" if job.is_chat else "text_completion"
        self.offsets = [len(e) for e in job.echo] if job.echo else [0] * len(job.params)
        num = len(job.params)
        # Per choice: the tool-call parser following its text, and the calls it has sent.
        self.parsers = [job.tool_parser() for _ in range(num)] if job.tool_parser else None
        self.num_calls = [0] * num

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        j = self.job
        body = {"id": j.request_id, "object": self.object, "created": j.created, "model": j.model}
        return sse({**body, "choices": choices, **extra})

    def opening(self) -> list[bytes]:
        """Chat: the assistant role for every choice; text: the echoed prompts."""
        if self.job.is_chat:
            delta = {"role": "assistant", "content": ""}
            return [
                self.chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
                for i in range(len(self.job.params))
            ]
        if not self.job.echo:
            return []
        return [
            self.chunk([{"index": i, "text": t, "logprobs": None, "finish_reason": None}])
            for i, t in enumerate(self.job.echo)
        ]

    def delta(self, i: int, out: RequestOutput) -> list[bytes]:
        chunks = []
        if out.new_text or out.new_logprobs:
            lp = None
            if self.job.logprobs is not None:
                lp = (
                    chat_logprobs(self.engine, out.new_logprobs)
                    if self.job.is_chat
                    else completion_logprobs(self.engine, out.new_logprobs, self.offsets[i])
                )
            self.offsets[i] += len(out.new_text)
            if self.parsers is not None:
                chunks += self._tool_deltas(i, self.parsers[i].feed(out.new_text), lp)
            elif self.job.is_chat:
                choice = {"index": i, "delta": {"content": out.new_text}, "logprobs": lp}
                chunks.append(self.chunk([{**choice, "finish_reason": None}]))
            else:
                choice = {"index": i, "text": out.new_text, "logprobs": lp}
                chunks.append(self.chunk([{**choice, "finish_reason": None}]))
        if out.finished:
            reason = out.finish_reason
            if self.parsers is not None:
                chunks += self._tool_deltas(i, self.parsers[i].finish(), None)
                if self.num_calls[i] and reason == "stop":
                    reason = "tool_calls"
            if self.job.is_chat:
                choice = {"index": i, "delta": {}, "logprobs": None}
            else:
                choice = {"index": i, "text": "", "logprobs": None}
            chunks.append(self.chunk([{**choice, "finish_reason": reason}]))
        return chunks

    def _tool_deltas(self, i: int, events: list[StreamEvent], lp: Any) -> list[bytes]:
        """Chat deltas for what the tool-call parser let through: text as `content`, each
        complete call as one `tool_calls` entry (id, name and all its arguments)."""
        chunks = []
        for event in events:
            if event.call is not None:
                delta = tool_call_delta(event.call, self.num_calls[i])
                self.num_calls[i] += 1
            elif event.text:
                delta = {"content": event.text}
            else:
                continue
            choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}
            chunks.append(self.chunk([choice]))
            lp = None  # the logprobs of this engine delta go with its first chunk
        if not chunks and lp is not None:  # text held back, but its logprobs are due now
            choice = {"index": i, "delta": {}, "logprobs": lp, "finish_reason": None}
            chunks.append(self.chunk([choice]))
        return chunks


async def event_stream(
    engine: AsyncEngine,
    job: Job,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    first: tuple[int, RequestOutput] | None,
) -> AsyncIterator[bytes]:
    """The SSE body; `first` is the delta already awaited before the response started."""
    maker = _ChunkMaker(engine, job)
    num_completion = 0
    try:
        for chunk in maker.opening():
            yield chunk
        if first is not None:
            num_completion += len(first[1].new_token_ids)
            for chunk in maker.delta(*first):
                yield chunk
            async for i, out in outputs:
                num_completion += len(out.new_token_ids)
                for chunk in maker.delta(i, out):
                    yield chunk
        if job.include_usage:
            yield maker.chunk([], usage=usage(job.num_prompt_tokens, num_completion))
    except Exception as e:  # noqa: BLE001 - headers are sent: report it in the stream
        err = as_api_error(e)
        yield sse(error_body(err.status, err.message, err.param, err.code))
    finally:
        await outputs.aclose()  # aborts unfinished sub-requests at once
    yield sse("[DONE]")
