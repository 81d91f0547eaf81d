"""MCP over Streamable HTTP at /mcp in the Litestar app, with the keys and scopes of /v1/memory.

Every request is checked before the SDK sees it: Host and Origin in memspine/edge.py, as for
every route; here the method (POST, and OPTIONS for a browser's CORS preflight; GET and
DELETE are 405), the body, read whole under the size limit and the body deadline, and the
key (401 with `WWW-Authenticate: Bearer`). The session manager runs stateless with JSON
answers, so each POST stands alone and carries its own key; tools act for that key's
principal only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from mcp.server import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers

from memspine.allowance import Allowance
from memspine.auth import Authenticator
from memspine.body import ClientGone, read_body
from memspine.config import Settings
from memspine.edge import origin_allowed, send_error
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from memspine.pipeline import bearer_token
from memspine.verifier import Principal
from storage.errors import MemspineError, MethodNotAllowed, Unauthorized

PRINCIPAL_KEY = "memspine.principal"  # where the checked principal rides in the ASGI scope
QUOTA_KEY = "memspine.quota"  # and its tenant's quota
ALLOW = "POST, OPTIONS"
NO_STREAM = (
    "/mcp takes POST only: the endpoint is stateless and answers every request in its own "
    "response, so there is no event stream to GET and no session to DELETE"
)
# What a browser page of an allowed origin may send and read (the MCP transport's headers).
CORS_HEADERS = (
    "authorization, content-type, accept, mcp-protocol-version, mcp-session-id, last-event-id, "
    "x-request-id"
)
CORS_EXPOSED = "mcp-session-id, mcp-protocol-version, www-authenticate, retry-after, x-request-id"
_TOKEN_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*\Z")


def _cors(headers: Headers, settings: Settings) -> dict[str, str]:
    """The headers that let a page of an allowed origin read an answer; none for other callers."""
    origin = headers.get("origin")
    allowed = settings.mcp_allowed_origins
    if origin is None or not origin_allowed(origin, headers.get("host"), settings.host, allowed):
        return {}
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": CORS_EXPOSED,
        "Vary": "Origin",
    }


def _preflight_headers(headers: Headers, settings: Settings) -> dict[str, str]:
    """The answer to a browser's preflight: POST with the transport's headers, cached 10 minutes."""
    cors = _cors(headers, settings)
    if not cors:
        return {"Allow": ALLOW}
    asked = headers.get("access-control-request-headers", "").strip()
    return {
        "Allow": ALLOW,
        "Access-Control-Allow-Origin": cors["Access-Control-Allow-Origin"],
        "Access-Control-Allow-Methods": ALLOW,
        "Access-Control-Allow-Headers": asked if _TOKEN_LIST.match(asked) else CORS_HEADERS,
        "Access-Control-Max-Age": "600",
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }


async def _refuse(send: Any, exc: MemspineError, headers: dict[str, str] | None = None) -> None:
    """Answer in the API's shape without involving the SDK."""
    if headers:
        exc.headers = {**exc.headers, **headers}
    await send_error(send, exc)


def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """The principal the endpoint checked for this request."""
    request = ctx.request
    principal = None if request is None else request.scope.get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):
        raise Unauthorized("invalid or expired api key")  # not reachable through the endpoint
    return principal


class McpEndpoint:
    """The /mcp mount: method, body and key checks in front of the SDK's session manager."""

    def __init__(
        self,
        engine: Engine,
        auth: Authenticator,
        settings: Settings,
        allowance: Allowance | None = None,
    ) -> None:
        self.auth = auth
        self.settings = settings
        self.allowance = allowance
        if settings.log_level != "DEBUG":
            # The SDK logs every stateless request at INFO ("Terminating session: None").
            logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

        def resolve(ctx: ServerRequestContext[Any, Any]) -> Caller:
            principal = _principal(ctx)
            quota = None if ctx.request is None else ctx.request.scope.get(QUOTA_KEY)
            return Caller(principal, EngineBackend(engine, principal, quota))

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
        """Method, size and key checks (memspine/edge.py checked Host and Origin), then the SDK
        with the body already read and the principal in scope."""
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})  # MCP is plain HTTP
            return
        headers = Headers(scope=scope)
        method = scope["method"]
        if method == "OPTIONS":
            await _empty(send, 204, _preflight_headers(headers, self.settings))
            return
        cors = _cors(headers, self.settings)
        if method != "POST":
            await _refuse(send, MethodNotAllowed(NO_STREAM), {"Allow": ALLOW, **cors})
            return
        try:  # the key first, as the other routes: a refused caller's body is never read
            principal = await self.auth.authenticate_async(
                bearer_token(headers.get("authorization"))
            )
            # The key's rate, as the pipeline checks it: one request of /mcp is one request.
            quota = self.allowance.admit(principal) if self.allowance is not None else None
            body = await read_body(
                receive, self.settings.max_body_bytes, headers.get("content-length")
            )
        except ClientGone:
            return
        except Unauthorized as exc:
            await _refuse(send, exc, {"WWW-Authenticate": 'Bearer realm="memspine"', **cors})
            return
        except MemspineError as exc:
            await _refuse(send, exc, cors)
            return
        await self.manager.handle_request(
            {**scope, PRINCIPAL_KEY: principal, QUOTA_KEY: quota},
            _replay(body, receive),
            _with_headers(send, cors),
        )


async def _empty(send: Any, status: int, headers: dict[str, str]) -> None:
    """An answer without a body."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _replay(body: bytes, receive: Any) -> Any:
    """A receive that hands the SDK the body read here, then waits on the client as before."""
    given = False

    async def replay() -> dict[str, Any]:
        nonlocal given
        if given:
            message: dict[str, Any] = await receive()
            return message
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _with_headers(send: Any, extra: dict[str, str]) -> Any:
    """A send that adds `extra` headers to the response start (CORS for a browser caller)."""
    if not extra:
        return send
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]

    async def send_with(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *raw]}
        await send(message)

    return send_with
