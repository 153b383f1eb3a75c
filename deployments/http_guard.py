"""ASGI middleware in front of the OpenAI routes: the API key and the request body size.

Both are checked before a byte of the body is parsed: an unauthenticated client cannot make the
replica read a large body, and a large body is refused by its Content-Length or, when it is sent
chunked (no length), as soon as what arrived passes the limit. Answers use the OpenAI error body.
The settings come from a callable because the replica decides them after the app was built
(Serve freezes the FastAPI app when the deployment class is decorated).
"""
from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from deployments.openai_api import error_body


@dataclass(frozen=True, slots=True)
class GuardSettings:
    api_key: str | None  # None: /v1/* is open
    max_request_bytes: int


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a chunked body grows past the limit. An HTTPException, so that
    FastAPI's body reading passes it on (it turns other errors into 400) to the app's handler."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than max_request_bytes={limit} bytes; send a smaller body")


class RequestGuard:
    """``app.add_middleware(RequestGuard, settings=callable returning GuardSettings or None)``."""

    def __init__(self, app: ASGIApp, settings: Callable[[], GuardSettings | None]):
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.settings() if scope["type"] == "http" else None
        if settings is None:
            return await self.app(scope, receive, send)
        if settings.api_key is not None and _route_path(scope).startswith("/v1/") and not _authorized(
                scope, settings.api_key):
            return await _reply(send, 401, "authorization: missing or wrong API key; send the header "
                                           "'Authorization: Bearer <key>'", "authentication_error",
                                "invalid_api_key", {"www-authenticate": "Bearer"})
        limit = settings.max_request_bytes
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await _reply(send, 413, f"request body of {length} bytes (Content-Length) is larger than "
                                           f"max_request_bytes={limit} bytes; send a smaller body",
                                "invalid_request_error", "request_too_large")
        total = 0

        async def counted_receive():
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted_receive, send)


def _route_path(scope: Scope) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def bearer_matches(authorization: str | None, api_key: str) -> bool:
    """Whether an ``Authorization`` value (HTTP header or gRPC metadata) is ``Bearer <api_key>``.
    Constant-time comparison, so response timing does not reveal how much of a guess matched."""
    scheme, _, token = (authorization or "").partition(" ")
    ok = hmac.compare_digest(token.strip().encode(), api_key.encode())
    return ok and scheme.lower() == "bearer"


def _authorized(scope: Scope, api_key: str) -> bool:
    return bearer_matches(_header(scope, b"authorization"), api_key)


async def _reply(send: Send, status: int, message: str, type_: str, code: str, headers: dict | None = None) -> None:
    param = "authorization" if status == 401 else None
    body = json.dumps(error_body(message, type_, param, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
