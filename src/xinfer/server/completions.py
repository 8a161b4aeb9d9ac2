"""The two generation routes, POST /v1/chat/completions and POST /v1/completions, streamed
(SSE) or not. A client that goes away aborts its request: streamed, through the closed
event stream; not streamed, through a watcher polling `request.is_disconnected()`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from xinfer.engine.async_engine import AsyncEngine
from xinfer.server.errors import ApiError, as_api_error
from xinfer.server.protocol import ChatCompletionRequest, CompletionRequest
from xinfer.server.serving import Job, chat_job, completion_job, full_response, run_to_end
from xinfer.server.streaming import event_stream

_DISCONNECT_POLL_S = 0.25


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Await `work`; cancel it (which aborts its requests) if the client disconnects.
    Returns (is_disconnected, result)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return False, task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return True, None
    finally:
        if not task.done():  # this handler itself was cancelled
            task.cancel()


async def _first(outputs) -> Any:
    try:
        return await outputs.__anext__()
    except StopAsyncIteration:
        return None


async def _respond(request: Request, engine: AsyncEngine, job: Job) -> Response:
    if not job.is_stream:
        try:
            gone, choices = await _unless_disconnected(request, run_to_end(engine, job))
        except Exception as e:  # noqa: BLE001
            raise as_api_error(e) from None
        if gone:
            return Response(status_code=499)
        return JSONResponse(full_response(engine, job, choices))
    outputs = engine.generate_choices(job.prompts, job.params, job.request_id)
    try:
        # Errors before the first token (queue full, a rejected prompt) are HTTP errors.
        gone, first = await _unless_disconnected(request, _first(outputs))
    except BaseException as e:
        await outputs.aclose()
        if isinstance(e, Exception):
            raise as_api_error(e) from None
        raise
    if gone:
        await outputs.aclose()
        return Response(status_code=499)
    return StreamingResponse(
        event_stream(engine, job, outputs, first),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def serving_engine(request: Request) -> AsyncEngine:
    """The app's engine; 503 while the model is still loading (the port is open early)."""
    engine = request.app.state.engine
    if engine is None:
        raise ApiError(503, "the model is still loading; retry shortly.", code="model_loading")
    return engine


def build_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        state = request.app.state
        engine = serving_engine(request)
        try:  # tokenizing and the chat template run in a worker thread, not on the loop
            job = await run_in_threadpool(chat_job, engine, body, state.model_name)
        except Exception as e:  # noqa: BLE001
            raise as_api_error(e) from None
        return await _respond(request, engine, job)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        state = request.app.state
        engine = serving_engine(request)
        try:
            job = await run_in_threadpool(completion_job, engine, body, state.model_name)
        except Exception as e:  # noqa: BLE001
            raise as_api_error(e) from None
        return await _respond(request, engine, job)

    return router
