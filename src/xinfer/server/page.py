"""The chat page and its vendored libraries (markdown, sanitizer, highlighting, LaTeX), served
by the API server itself at / (same origin) and, with --ui-server, by a second app on port + 1
that points the page at the API's port. Files come from the package; nothing from a CDN."""

from __future__ import annotations

import json
import mimetypes
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, Response

from xinfer.server.errors import install_error_handlers

_UI = resources.files("xinfer.server") / "ui"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".woff2": "font/woff2"}


def page_html(config: dict[str, Any]) -> str:
    """The chat page with its config (where the API is) injected."""
    html = (_UI / "index.html").read_text(encoding="utf-8")
    tag = f"<script>window.XINFER_CONFIG = {json.dumps(config)};</script>"
    return html.replace("<!--XINFER_CONFIG-->", tag, 1)


@cache
def _asset_names() -> frozenset[str]:
    """Every file under ui/ (relative paths): the only paths /ui/ serves."""
    names: set[str] = set()

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name != "index.html":
                names.add(prefix + child.name)

    walk(_UI, "")
    return frozenset(names)


def build_page_router(config: dict[str, Any] | None = None) -> APIRouter:
    """GET / (the page) and GET /ui/{file} (its vendored assets, cached by the browser)."""
    router = APIRouter()
    html = page_html(config or {"apiBase": ""})

    @router.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return html

    @router.get("/ui/{name:path}")
    async def asset(name: str) -> Response:
        if name not in _asset_names():
            return Response(status_code=404)
        suffix = name[name.rfind(".") :]
        media = _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
        headers = {"Cache-Control": "public, max-age=86400"}
        return Response((_UI / name).read_bytes(), media_type=media, headers=headers)

    @router.get("/favicon.ico")
    async def favicon() -> Response:
        return Response(status_code=204)

    return router


def build_ui_app(api_port: int, api_base: str | None = None) -> FastAPI:
    """The page alone on its own port (--ui-server), calling the API on `api_port`."""
    app = FastAPI(title="xinfer chat", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)  # a client sent here by mistake reads an OpenAI-style 404
    app.include_router(build_page_router({"apiPort": api_port, "apiBase": api_base}))
    return app
