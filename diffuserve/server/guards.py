"""What every HTTP request passes before the application reads its body: the API key, then the body size.

An ASGI middleware, so that both checks happen before FastAPI parses anything: a request without the key is a
401 whatever its body (never a 400 that reveals the schema to an unauthenticated client), and a body over
`max_request_bytes` is a 413, refused from its Content-Length when it declares one and, when it does not (chunked
uploads), as soon as the bytes received pass the limit, so an oversized body is never held in memory.

Public paths (no key): /health, /version, /metrics and the docs; everything else needs
`Authorization: Bearer <key>` when a key is configured. Keys are compared as SHA-256 digests in constant time,
as vLLM does. A browser cannot send that header on its own, so the web console signs in once and holds a session
cookie instead (`Credentials`): an HMAC of the key, HttpOnly and SameSite=Strict, accepted from pages of this
server's own origin only (a request carrying another `Origin` is refused, so no other site, not even another
port of the same host, can use it). The console's own paths (the page, its sign-in, its assets) are left to the
console, which checks the same credentials and answers a browser with its sign-in page rather than JSON.
Knows nothing of the OpenAI protocol beyond its error shape.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diffuserve.server.errors import APIError, APIErrorHTTP, body_too_large

PUBLIC_PATHS = frozenset(
    {"/health", "/version", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
CONSOLE_PATHS = frozenset({"/", "/console/sign-in"})
CONSOLE_PREFIX = "/console/assets/"
"""The console's paths that check credentials themselves (console.py), or need none (its static files)."""
SESSION_COOKIE = "diffuserve_session"
SESSION_CONTEXT = b"diffuserve web console session"

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


class Credentials:
    """What proves a request may use the API: the bearer key, or the console's session cookie."""

    def __init__(self, api_key: str | None) -> None:
        self.required = api_key is not None
        self.expected = digest(api_key) if api_key is not None else b""
        key = api_key.encode() if api_key is not None else b""
        self.session = hmac.new(key, SESSION_CONTEXT, hashlib.sha256).hexdigest()
        """The session cookie's value: derived from the key, so a new key ends every session."""

    def key_matches(self, key: str) -> bool:
        return hmac.compare_digest(digest(key.strip()), self.expected)

    def allow(self, headers: dict[str, str]) -> bool:
        """Whether the request carries the key (or no key is configured)."""
        if not self.required:
            return True
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.key_matches(key):
            return True
        return self._session_matches(headers) and _same_origin(headers)

    def set_cookie(self, secure: bool) -> str:
        """The Set-Cookie header value that starts a console session."""
        return f"{SESSION_COOKIE}={self.session}; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")

    def _session_matches(self, headers: dict[str, str]) -> bool:
        cookies = (part.strip().partition("=") for part in headers.get("cookie", "").split(";"))
        value = next((v for name, _, v in cookies if name == SESSION_COOKIE), None)
        return value is not None and hmac.compare_digest(value.encode(), self.session.encode())


def _same_origin(headers: dict[str, str]) -> bool:
    """No `Origin` (browsers omit it on same-origin GETs) or one naming this server's own host and port (a
    proxy that terminates TLS may change the scheme, never the host)."""
    origin = headers.get("origin")
    if origin is None:
        return True
    netloc = urlsplit(origin).netloc
    return bool(netloc) and netloc == headers.get("host")


def invalid_api_key() -> APIError:
    return APIError(
        401,
        "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


class RequestGuard:
    """ASGI middleware: the API key (when set) on non-public paths, then the body size limit."""

    def __init__(self, app: ASGIApp, credentials: Credentials, max_request_bytes: int) -> None:
        self.app = app
        self.credentials = credentials
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        if not self._authorized(scope, headers):
            await invalid_api_key().response()(scope, receive, send)
            return
        declared = _content_length(headers)
        if declared is not None and declared > self.max_request_bytes:
            await body_too_large(declared, self.max_request_bytes).response()(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _authorized(self, scope: Scope, headers: dict[str, str]) -> bool:
        path = scope["path"]
        if path in PUBLIC_PATHS or path in CONSOLE_PATHS or path.startswith(CONSOLE_PREFIX):
            return True
        return self.credentials.allow(headers)

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


def request_headers(scope: Scope) -> dict[str, str]:
    raw: list[tuple[bytes, bytes]] = scope.get("headers", [])
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}


def _content_length(headers: dict[str, Any]) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None
