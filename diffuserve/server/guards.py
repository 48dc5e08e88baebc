"""What every HTTP request passes before the application reads its body: the API key, then the body size.

An ASGI middleware, so that both checks happen before FastAPI parses anything: a request without the key is a
401 whatever its body (never a 400 that reveals the schema to an unauthenticated client), and a body over
`max_request_bytes` is a 413, refused from its Content-Length when it declares one and, when it does not (chunked
uploads), as soon as the bytes received pass the limit, so an oversized body is never held in memory.

Public paths (no key): /health, /version, /metrics and the docs; everything else needs
`Authorization: Bearer <key>` when a key is configured. Keys are compared as SHA-256 digests in constant time,
as vLLM does. Knows nothing of the OpenAI protocol beyond its error shape.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diffuserve.server.errors import APIError, APIErrorHTTP, body_too_large

PUBLIC_PATHS = frozenset(
    {"/health", "/version", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)

BYTES_PER_TOKEN = 64
"""Generous bytes of JSON per prompt token for the default body limit: real text averages 3-5 characters per
token, and a JSON-escaped non-ASCII character takes 6 bytes."""

BODY_OVERHEAD = 1 << 20
"""Bytes allowed on top of the prompt: the rest of the JSON (messages' framing, sampling fields, stop strings)."""


def default_max_request_bytes(max_model_len: int) -> int:
    """A body limit that any prompt fitting the context passes: max_model_len x 64 bytes + 1 MiB."""
    return max_model_len * BYTES_PER_TOKEN + BODY_OVERHEAD


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def invalid_api_key() -> APIError:
    return APIError(
        401,
        "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


class RequestGuard:
    """ASGI middleware: the API key (when set) on non-public paths, then the body size limit."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_request_bytes: int) -> None:
        self.app = app
        self.expected = digest(api_key) if api_key is not None else None
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if not self._authorized(scope["path"], headers):
            await invalid_api_key().response()(scope, receive, send)
            return
        declared = _content_length(headers)
        if declared is not None and declared > self.max_request_bytes:
            await body_too_large(declared, self.max_request_bytes).response()(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _authorized(self, path: str, headers: dict[str, str]) -> bool:
        if self.expected is None or path in PUBLIC_PATHS:
            return True
        scheme, _, key = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(digest(key.strip()), self.expected)

    def _limited(self, receive: Receive) -> Receive:
        """`receive` that counts body bytes and raises a 413 once they pass the limit (the route's body reader
        lets an HTTPException through to the error handlers)."""
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_request_bytes:
                    raise APIErrorHTTP(body_too_large(None, self.max_request_bytes))
            return message

        return limited


def _headers(scope: Scope) -> dict[str, str]:
    raw: list[tuple[bytes, bytes]] = scope.get("headers", [])
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}


def _content_length(headers: dict[str, Any]) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None
