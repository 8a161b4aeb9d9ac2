"""`serve(config, args)`: builds the Engine and its AsyncEngine thread, then runs uvicorn for
the API on --host:--port and, with --ui-server, a second uvicorn server on port + 1 for the
chat page, both in one asyncio loop; Ctrl-C / SIGTERM stop both."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import signal
from importlib import resources
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from xinfer import envs
from xinfer.config import EngineConfig
from xinfer.engine.async_engine import AsyncEngine
from xinfer.server.app import build_app

logger = logging.getLogger("xinfer")


def page_html(api_port: int, api_base: str | None = None) -> str:
    """The chat page with its config injected (where the API is)."""
    html = (resources.files("xinfer.server") / "ui" / "index.html").read_text(encoding="utf-8")
    config = {"apiPort": api_port, "apiBase": api_base}
    tag = f"<script>window.XINFER_CONFIG = {json.dumps(config)};</script>"
    return html.replace("<!--XINFER_CONFIG-->", tag, 1)


def build_ui_app(api_port: int, api_base: str | None = None) -> FastAPI:
    app = FastAPI(title="xinfer chat", docs_url=None, redoc_url=None, openapi_url=None)
    html = page_html(api_port, api_base)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return html

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        return Response(status_code=204)

    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    """uvicorn.Server without its own signal handling: `serve` stops all servers at once."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def run_servers(servers: list[uvicorn.Server]) -> None:
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_all)
    tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    try:
        # One server failing to start (port taken) stops the others too.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop_all()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def serve(config: EngineConfig, args: argparse.Namespace) -> None:
    from xinfer.engine.engine import Engine

    api_key = getattr(args, "api_key", None) or envs.XINFER_API_KEY()
    host, port = args.host, args.port
    model_name = getattr(args, "served_model_name", None) or Path(config.model).name
    if not is_loopback(host) and not api_key:
        logger.warning(
            "listening on %s without an API key: anyone who can reach this port can use the "
            "model; pass --api-key KEY (or set XINFER_API_KEY) or --host 127.0.0.1",
            host,
        )
    engine = Engine(config, show_progress=True)
    async_engine = AsyncEngine(engine, config.scheduler.max_waiting).start()
    app = build_app(async_engine, model_name, api_key)
    log_level = logging.getLevelName(logging.getLogger().level).lower()
    uv_level = log_level if log_level in ("debug", "info", "warning", "error") else "info"
    servers: list[uvicorn.Server] = [
        _Server(uvicorn.Config(app, host=host, port=port, log_level=uv_level, access_log=False))
    ]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    logger.info("serving %s: OpenAI API on http://%s:%d/v1", model_name, shown, port)
    if getattr(args, "ui_server", False):
        ui = build_ui_app(port)
        servers.append(
            _Server(
                uvicorn.Config(ui, host=host, port=port + 1, log_level=uv_level, access_log=False)
            )
        )
        logger.info("chat page on http://%s:%d/", shown, port + 1)
    try:
        asyncio.run(run_servers(servers))
    finally:
        async_engine.stop()
