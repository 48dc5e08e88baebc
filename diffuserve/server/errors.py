"""Errors as the OpenAI API returns them: `{"error": {"message", "type", "param", "code"}}`, for every failure.

Owns the `APIError` exception the handlers raise and the translation of FastAPI's own failures (malformed JSON,
schema violations, unknown routes) into that shape, with 400 for bad input (OpenAI and vLLM use 400 where
FastAPI would say 422). Unexpected exceptions are logged with their traceback and answered with a 500 that
carries no internals. Knows nothing of the engine; the typed request errors it maps come from `diffuserve.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from diffuserve.errors import RequestError
from diffuserve.server.response_models import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1
"""Seconds a client told 429 (waiting queue full) should wait before retrying."""


class APIError(Exception):
    """An error answered to the client as-is (status, OpenAI error body, optional headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    @property
    def info(self) -> ErrorInfo:
        return ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.info).model_dump(), self.status, headers=self.headers)


class APIErrorHTTP(HTTPException):
    """An APIError raised where only an HTTPException passes through: FastAPI lets HTTPExceptions from reading
    the body reach the handlers but turns any other exception there into a bare 400."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.status, error.message, error.headers)
        self.error = error


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


ENGINE_PROMPT_FIELDS = ("prompt", "prompt_token_ids")
"""The engine's names for a request's prompt (text, token ids): on the wire, `prompt` or `messages`."""


def from_value_error(error: ValueError, prompt_param: str = "prompt") -> APIError:
    """The engine's and SamplingParams' ValueErrors start with the field name ("max_tokens: got 0, ...");
    a typed `RequestError` carries its field and OpenAI code itself (an error about the prompt names the
    request's `prompt_param`)."""
    if isinstance(error, RequestError):
        if error.param in ENGINE_PROMPT_FIELDS:
            message = str(error).split(": ", 1)[1]
            return bad_request(f"{prompt_param}: {message}", prompt_param, error.code)
        return bad_request(str(error), error.param, error.code)
    message = str(error)
    head = message.split(":", 1)[0]
    return bad_request(message, param=head if head.isidentifier() else None)


def queue_full(max_waiting_requests: int) -> APIError:
    return APIError(
        429,
        f"the server's waiting queue is full ({max_waiting_requests} requests); retry later",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def body_too_large(num_bytes: int | None, limit: int) -> APIError:
    size = f"has {num_bytes} bytes" if num_bytes is not None else "is larger"
    return APIError(
        413,
        f"the request body {size}, more than this server accepts ({limit} bytes, "
        "--max-request-bytes); send a shorter prompt or raise the flag",
        code="request_too_large",
    )


def invalid_body(detail: str) -> APIError:
    """A body the JSON parser could not even read (e.g. bytes that are not UTF-8 text)."""
    return bad_request(
        f"the request body is not valid JSON: {detail} (send UTF-8 encoded JSON)", None, code="invalid_json"
    )


def engine_unavailable(reason: str) -> APIError:
    return APIError(503, f"the engine is not running: {reason}", type="server_error", code="engine_unavailable")


def engine_failed(message: str) -> APIError:
    return APIError(500, f"generation failed inside the engine: {message}", type="server_error", code="engine_error")


def _param(loc: list[Any]) -> str | None:
    """pydantic's error location as a field path: ["body", "messages", 0, "content", "str"] -> messages[0].content
    (union-branch tags such as "str" or "list[int]" dropped)."""
    path = ""
    for part in loc[1:] if loc[:1] == ["body"] else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _BRANCH_TAGS:
            path += f".{part}" if path else part
    return path or None


_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    """The most specific pydantic error as "field: problem (got value)", its field path, and an error code."""
    first = max(errors, key=lambda e: len(e.get("loc", ())))  # the deepest: a union's branches nest deeper
    kind, param = first.get("type", ""), _param(list(first.get("loc", ())))
    if kind == "json_invalid":
        return (
            f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
            None,
            "invalid_json",
        )
    if param is None:
        return (
            "the request body must be a JSON object (sent with Content-Type: application/json)",
            None,
            "invalid_json",
        )
    # A union field fails once per accepted form: report them together, and count the other fields apart.
    same = [e for e in errors if _param(list(e.get("loc", ()))) == param]
    problem = " or ".join(dict.fromkeys(e["msg"] for e in same))
    got = f" (got {first['input']!r:.80})" if "input" in first and kind != "missing" else ""
    others = len({_param(list(e.get("loc", ()))) for e in errors}) - 1
    more = f"; and problems with {others} more field(s)" if others else ""
    if kind == "missing":
        code = "missing_required_parameter"
    else:
        code = "invalid_type" if all(e["type"].endswith("_type") for e in same) else "invalid_value"
    return f"{param}: {problem}{got}{more}", param, code


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(list(exc.errors()))
        return bad_request(message, param, code).response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, APIErrorHTTP):
            return exc.error.response()
        if exc.status_code == 400:  # FastAPI's only own 400: a body its JSON parser failed to read
            return invalid_body(str(exc.detail)).response()
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The HTTP boundary: log the traceback for operators, tell the client only that it was our fault.
        logger.exception("unhandled error serving %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", type="server_error", code="internal_error").response()
