"""The FastAPI app: `build_app(async_engine, model_name, api_key)` wires the generation
routes, /v1/models, /tokenize, /detokenize, /health, /metrics, /v1/xinfer/stats (the chat
page's telemetry) and the chat page itself at /, bearer-key auth on /v1/*, /tokenize and
/detokenize, CORS for a page on another port, and OpenAI-style errors. Built before the model
loads, it answers 503 until `attach_engine`."""

from __future__ import annotations

import secrets
import time
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from xinfer.engine.async_engine import AsyncEngine
from xinfer.server.completions import build_router, serving_engine
from xinfer.server.errors import ApiError, error_response, install_error_handlers
from xinfer.server.metrics import ServerMetrics, expert_cache_counts
from xinfer.server.page import build_page_router
from xinfer.server.protocol import DetokenizeRequest, TokenizeRequest, check_fields, model_card
from xinfer.server.serving import chat_prompt_ids


def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise ApiError(404, f"The model '{name}' does not exist.", "model", "model_not_found")


def attach_engine(app: FastAPI, engine: AsyncEngine) -> None:
    """Make a loaded engine serve `app` (built before the model loaded: it answered 503)."""
    if engine.observer is None:
        engine.observer = app.state.metrics
    app.state.engine = engine


def build_app(engine: AsyncEngine | None, model_name: str, api_key: str | None = None) -> FastAPI:
    """The API app; with `engine` None it answers 503 ("loading") until `attach_engine`."""
    app = FastAPI(title="xinfer", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(model_name)
    app.state.engine, app.state.model_name, app.state.metrics = None, model_name, metrics
    if engine is not None:
        attach_engine(app, engine)
    created = int(time.time())
    install_error_handlers(app)
    app.include_router(build_router())
    app.include_router(build_page_router())

    app.add_middleware(_AuthAndCount, api_key=api_key, metrics=metrics)
    # Outermost, so that error answers (401 included) also carry CORS headers for the page.
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]
    )

    @app.get("/health")
    async def health() -> Response:
        engine = app.state.engine
        if engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if not engine.is_alive:
            return error_response(503, "the engine thread is not running", code="engine_dead")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        snapshot = await serving_engine(request).snapshot()
        return Response(metrics.render(snapshot), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        max_len = serving_engine(request).max_model_len
        return {"object": "list", "data": [model_card(model_name, max_len, created)]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request) -> dict[str, Any]:
        engine = serving_engine(request)
        _check_model(name, model_name)
        return model_card(model_name, engine.max_model_len, created)

    @app.get("/v1/xinfer/stats")
    async def stats(request: Request) -> dict[str, Any]:
        """A small JSON view of the engine for the chat page."""
        engine = serving_engine(request)
        snap = await engine.snapshot()
        counts = expert_cache_counts(snap.offload)
        hit_rate = None
        if counts and counts["hits"] + counts["misses"] > 0:
            hit_rate = counts["hits"] / (counts["hits"] + counts["misses"])
        return {
            "model": model_name,
            "max_model_len": engine.max_model_len,
            "num_running": snap.num_running,
            "num_waiting": snap.num_waiting,
            "kv_cache_usage": snap.kv_usage,
            "offload_enabled": counts is not None,
            "expert_cache": counts,
            "expert_cache_hit_rate": hit_rate,
            "kv_tokens": engine.kv_tokens,
            # hybrid models: sequences whose recurrent state fits (0: no recurrent state)
            "state_slots": engine.num_state_slots,
            "expert_slots_per_layer": snap.offload["slots_per_layer"] if snap.offload else None,
        }

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        engine = serving_engine(request)
        check_fields(body)
        _check_model(body.model, model_name)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "Send exactly one of 'prompt' or 'messages'.", "prompt")
        if body.messages is not None:
            work = partial(chat_prompt_ids, engine, body.messages, body.add_generation_prompt)
        else:
            if engine.tokenizer is None:
                raise ApiError(400, "This model has no tokenizer files.")
            work = partial(engine.tokenizer.encode, body.prompt, body.add_special_tokens)
        ids = await run_in_threadpool(work)  # a long text must not hold up other clients
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        engine = serving_engine(request)
        check_fields(body)
        _check_model(body.model, model_name)
        if engine.tokenizer is None:
            raise ApiError(400, "This model has no tokenizer files.")
        vocab = engine.engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"token ids must be in [0, {vocab}).", "tokens", "invalid_value")
        return {"prompt": await run_in_threadpool(engine.tokenizer.decode, body.tokens)}

    return app


class _AuthAndCount:
    """Pure ASGI middleware (keeps disconnect detection intact for streams): bearer-key
    check on /v1/* and a request counter by route and status."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics) -> None:
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self._is_denied(scope):
                response = error_response(
                    401,
                    "Missing or wrong API key; send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key",
                )
                await response(scope, receive, send_and_note)
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.http_requests.labels(path=route, status=str(status)).inc()

    def _is_denied(self, scope) -> bool:
        path = scope["path"]
        is_guarded = path.startswith("/v1/") or path in _GUARDED_PATHS
        if not self.api_key or not is_guarded or scope["method"] == "OPTIONS":
            return False
        headers = dict(scope.get("headers") or [])
        header = headers.get(b"authorization", b"").decode("latin-1")
        return not _is_authorized(header, self.api_key)


# Besides /v1/*: what costs the server work (tokenizing) is keyed too. /health, /metrics and
# the chat page's static files stay open.
_GUARDED_PATHS = frozenset({"/tokenize", "/detokenize"})


def _is_authorized(header: str | None, api_key: str) -> bool:
    if not header or not header.lower().startswith("bearer "):
        return False
    return secrets.compare_digest(header[7:].strip().encode(), api_key.encode())
