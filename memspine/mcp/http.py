"""MCP over Streamable HTTP at /mcp in the Litestar app, with the keys and scopes of /v1/memory.

Every request is checked before the SDK sees it: a cross-origin browser request is 403, a
missing or bad key 401 with `WWW-Authenticate: Bearer`. The session manager runs stateless
with JSON answers, so each POST stands alone and carries its own key; tools act for that
key's principal only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import msgspec
from litestar import Litestar
from mcp.server import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers

from memspine.auth import Authenticator
from memspine.config import Settings, origin_key
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from memspine_admin.verifier import Principal
from storage.errors import TooManyRequests, Unauthorized

PRINCIPAL_KEY = "memspine.principal"  # where the checked principal rides in the ASGI scope
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
CROSS_ORIGIN = "cross-origin requests to /mcp are not allowed"


def _hostname(authority_or_url: str) -> str | None:
    """The lower-case host of a URL or a Host header value, None if it has none."""
    text = authority_or_url if "//" in authority_or_url else "//" + authority_or_url
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


def origin_allowed(
    origin: str | None, host: str | None, bind_host: str, listed: frozenset[str] = frozenset()
) -> bool:
    """No Origin (not a browser), a listed origin (MEMSPINE_MCP_ALLOWED_ORIGINS), a loopback
    origin, or the server's own host when not bound to loopback.

    Bound to loopback, only loopback origins pass: a page whose name was rebound to 127.0.0.1
    (DNS rebinding) sends its own name as both Origin and Host, so "same host" proves nothing there.
    """
    if origin is None:
        return True
    if listed and origin_key(origin) in listed:
        return True
    name = _hostname(origin)
    if name is None:
        return False  # "null" (sandboxed frames, file://) and junk
    if name in LOOPBACK:
        return True
    if bind_host in LOOPBACK:
        return False
    return host is not None and name == _hostname(host)


def _bearer(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def _refuse(send: Any, status: int, code: str, detail: str, headers: dict[str, str]) -> None:
    """Answer in the API's error shape without involving the SDK."""
    body = msgspec.json.encode({"error": code, "detail": detail})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """The principal the endpoint checked for this request."""
    request = ctx.request
    principal = None if request is None else request.scope.get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):
        raise Unauthorized("invalid or expired api key")  # not reachable through the endpoint
    return principal


class McpEndpoint:
    """The /mcp mount: origin and key checks in front of the SDK's Streamable HTTP session manager."""

    def __init__(self, engine: Engine, auth: Authenticator, settings: Settings) -> None:
        self.auth = auth
        self.settings = settings
        if settings.log_level != "DEBUG":
            # The SDK logs every stateless request at INFO ("Terminating session: None").
            logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

        def resolve(ctx: ServerRequestContext[Any, Any]) -> Caller:
            principal = _principal(ctx)
            return Caller(principal, EngineBackend(engine, principal))

        self.server = build_server(resolve)
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            stateless=True,
            max_request_body_size=settings.max_body_bytes,
        )

    @asynccontextmanager
    async def lifespan(self, _app: Litestar) -> AsyncIterator[None]:
        """Run the session manager's task group for the life of the app."""
        async with self.manager.run():
            yield

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Check origin, size and key, then hand the request to the SDK with the principal in scope."""
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})  # MCP is plain HTTP
            return
        headers = Headers(scope=scope)
        origin, host = headers.get("origin"), headers.get("host")
        if not origin_allowed(origin, host, self.settings.host, self.settings.mcp_allowed_origins):
            await _refuse(send, 403, "forbidden", CROSS_ORIGIN, {})
            return
        if not _length_ok(headers.get("content-length"), self.settings.max_body_bytes):
            detail = "the request body is larger than MEMSPINE_MAX_BODY_BYTES"
            await _refuse(send, 413, "payload_too_large", detail, {})
            return
        try:
            principal = await self.auth.authenticate_async(_bearer(headers))
        except Unauthorized as exc:
            auth_header = {"WWW-Authenticate": 'Bearer realm="memspine"'}
            await _refuse(send, 401, exc.code, exc.detail, auth_header)
            return
        except TooManyRequests as exc:  # the key id backs off after failed attempts
            await _refuse(send, exc.status, exc.code, exc.detail, exc.headers)
            return
        await self.manager.handle_request({**scope, PRINCIPAL_KEY: principal}, receive, send)


def _length_ok(value: str | None, limit: int) -> bool:
    """A declared body length within the limit (chunked bodies are bounded by the SDK)."""
    if value is None:
        return True
    try:
        return int(value) <= limit
    except ValueError:
        return False
