"""The /mcp mount, with the MCP SDK loaded on the first /mcp request instead of at start.

Importing the SDK is the largest part of the server's start (bench/RESULTS.md, "Start"), and
a server whose clients speak plain HTTP never needs it. The first /mcp request imports it in
a worker thread (the event loop keeps serving meanwhile), then the endpoint of
memspine/mcp/http.py answers that request and every later one.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from litestar import Litestar
from litestar.handlers import asgi
from litestar.handlers.asgi_handlers import ASGIRouteHandler

from memspine.allowance import Allowance
from memspine.auth import Authenticator
from memspine.config import Settings
from memspine.engine import Engine
from memspine.errors import error_body

if TYPE_CHECKING:
    from memspine.mcp.http import McpEndpoint

log = logging.getLogger("memspine.mcp")

PATH = "/mcp"
NOT_STARTED = "the MCP endpoint is not available: the server is starting or stopping"
FAILED = "the server failed to handle this request"


class LazyMcp:
    """/mcp: loads memspine.mcp.http (and with it the SDK) when the first request comes."""

    def __init__(
        self,
        engine: Engine,
        auth: Authenticator,
        settings: Settings,
        allowance: Allowance | None = None,
    ) -> None:
        self._args = (engine, auth, settings, allowance)
        self._endpoint: McpEndpoint | None = None
        self._failed = False
        # Made in the lifespan: anyio's events belong to the running loop.
        self._wanted: anyio.Event | None = None  # a first request came (or the app stops)
        self._stop: anyio.Event | None = None
        self._ready: anyio.Event | None = None  # the endpoint is up, or will not come up

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        """For the life of the app, a task that brings the endpoint up once it is first wanted.

        The endpoint's own lifespan (the SDK's task group) is entered and left in that task,
        as anyio requires of a task group.
        """
        self._wanted, self._stop, self._ready = anyio.Event(), anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve_when_wanted, app, self._wanted, self._stop, self._ready)
            try:
                yield
            finally:
                self._stop.set()
                self._wanted.set()

    async def _serve_when_wanted(
        self, app: Litestar, wanted: anyio.Event, stop: anyio.Event, ready: anyio.Event
    ) -> None:
        await wanted.wait()
        try:
            if stop.is_set():
                return
            module = await anyio.to_thread.run_sync(importlib.import_module, "memspine.mcp.http")
            endpoint: McpEndpoint = module.McpEndpoint(*self._args)  # on the loop: it makes locks
            async with endpoint.lifespan(app):
                self._endpoint = endpoint
                ready.set()
                await stop.wait()
        except Exception as exc:  # a broken install: /mcp answers 500, every other route works
            self._failed = True
            log.error("the MCP endpoint failed to start", exc_info=exc)
        finally:
            self._endpoint = None
            ready.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Hand the request to the endpoint, bringing it up first if this is the first one."""
        if self._endpoint is None and self._wanted is not None and self._ready is not None:
            self._wanted.set()
            await self._ready.wait()
        endpoint = self._endpoint
        if endpoint is None:
            await _refuse(scope, send, self._failed)
            return
        await endpoint(scope, receive, send)

    def route(self) -> ASGIRouteHandler:
        """The Litestar handler that mounts this at /mcp."""

        async def mcp_mount(scope: Any, receive: Any, send: Any) -> None:
            await self(scope, receive, send)

        handler: ASGIRouteHandler = asgi(PATH, is_mount=True, copy_scope=True)(mcp_mount)
        return handler


async def _refuse(scope: Any, send: Any, failed: bool) -> None:
    """500 if the endpoint failed to start, else 503 (starting or stopping), in the API's shape."""
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1011})
        return
    status, code, detail = (
        (500, "internal", FAILED) if failed else (503, "unavailable", NOT_STARTED)
    )
    body = error_body(code, detail)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
