"""OpenAI-style error bodies ({"error": {"message", "type", "param", "code"}}) and the
exception handlers that turn every failure (validation, user mistakes, a full queue, an
engine fault, an unknown route) into one of them, so that the server keeps serving."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from xinfer.engine.async_engine import EngineError, EngineStopped, QueueFullError
from xinfer.errors import UserError

logger = logging.getLogger("xinfer.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    500: "internal_server_error",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None):
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def as_api_error(e: Exception) -> ApiError:
    """Map an exception raised while generating to the HTTP error the client sees."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UserError):
        message = str(e)
        code = "context_length_exceeded" if "max-model-len" in message else None
        return ApiError(400, message, code=code)
    if isinstance(e, QueueFullError):
        return ApiError(503, str(e), code="queue_full")
    if isinstance(e, EngineStopped):  # a shutdown's grace period ended: retry elsewhere
        return ApiError(503, str(e), code="shutting_down")
    if isinstance(e, EngineError):
        return ApiError(500, str(e), code="engine_error")
    logger.exception("unexpected error", exc_info=e)
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")


def _param_path(loc: list) -> str | None:
    """pydantic's loc ('messages', 0, 'content') as the server writes it: messages[0].content."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is invalid", None
    first = errors[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    param = _param_path(loc)
    where = f"'{param}': " if param else ""
    return f"{where}{first.get('msg', 'invalid value')}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        message = exc.detail if isinstance(exc.detail, str) else phrase
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _other(_: Request, exc: Exception) -> JSONResponse:
        err = as_api_error(exc)
        return error_response(err.status, err.message, err.param, err.code)
