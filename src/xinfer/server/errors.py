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


# pydantic names the member of a union (str | list[...]) in an error's location; such a
# name is no field of the request: the client never wrote it.
_MEMBER_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
# What each union field takes, for an error that fits none of its members.
_UNION_SHAPES = {
    "content": "a string or a list of content parts",
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "tool_choice": "'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
    '{"name": ...}}',
    "arguments": "a JSON string or an object",
    "schema": "a JSON schema object or a boolean",
}


def _is_member_name(part) -> bool:
    return isinstance(part, str) and ("[" in part or part in _MEMBER_NAMES or part[:1].isupper())


def _is_type_mismatch(error: dict) -> bool:
    kind = error.get("type", "")
    return kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "int_from_float")


def _body_loc(error: dict) -> list:
    loc = list(error.get("loc", ()))
    return loc[1:] if loc[:1] == ["body"] else loc


def _param_path(loc: list) -> str | None:
    """pydantic's loc ('messages', 0, 'content') as the server writes it: messages[0].content
    (union member names such as 'list[ContentPart]' left out)."""
    path = ""
    for part in loc:
        if _is_member_name(part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def _union_message(errors: list[dict], loc: list, at: int) -> tuple[str, str | None]:
    """One sentence for a value that matched no member of a union field (loc[:at]): the
    error of the member the value went furthest into, or else what the field takes."""
    field = loc[:at]
    tried = [
        (e, _body_loc(e))
        for e in errors
        if _body_loc(e)[:at] == field
        and len(_body_loc(e)) > at
        and _is_member_name(_body_loc(e)[at])
    ]
    further = [(e, where) for e, where in tried if len(where) - at >= 3 or not _is_type_mismatch(e)]
    if further:
        error, where = max(further, key=lambda item: len(item[1]))
        param = _param_path(where)
        return f"'{param}': {error.get('msg', 'invalid value')}", param
    param = _param_path(field)
    shape = _UNION_SHAPES.get(next((p for p in reversed(field) if isinstance(p, str)), ""))
    if shape is None:
        return f"'{param}': {errors[0].get('msg', 'invalid value')}", param
    return f"'{param}' must be {shape}.", param


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is invalid", None
    first = errors[0]
    loc = _body_loc(first)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error") or first.get("msg")
        where = f" (at character {loc[0]})" if loc and isinstance(loc[0], int) else ""
        return f"the request body is not valid JSON: {detail}{where}.", None
    if not loc and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return (
            "the request body must be a JSON object, sent with 'Content-Type: application/json'.",
            None,
        )
    at = next((i for i, part in enumerate(loc) if _is_member_name(part)), None)
    if at is not None and at > 0:
        return _union_message(errors, loc, at)
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
        if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "error parsing the body"
            return error_response(400, "the request body is not valid UTF-8.", code="invalid_value")
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _other(_: Request, exc: Exception) -> JSONResponse:
        err = as_api_error(exc)
        return error_response(err.status, err.message, err.param, err.code)
