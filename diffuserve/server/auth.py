"""API-key authentication: `Authorization: Bearer <key>` on every route but the public ones.

A FastAPI dependency (declared on the protected routes, so /openapi.json documents the bearer scheme). Keys are
compared as SHA-256 digests in constant time, as vLLM does. Failures are 401 in the OpenAI error shape.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from diffuserve.server.errors import APIError

_bearer = HTTPBearer(auto_error=False, description="The server's --api-key (or DIFFUSERVE_API_KEY).")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def require_api_key(api_key: str | None) -> Callable[..., Awaitable[None]]:
    """The dependency for protected routes: a no-op without a key, else a Bearer check."""
    expected = _digest(api_key) if api_key is not None else None

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:  # noqa: B008
        if expected is None:
            return
        if credentials is None or not hmac.compare_digest(_digest(credentials.credentials), expected):
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return check
