"""The hot routes, append (one event, and a batch) and recall, served straight from ASGI ahead
of Litestar's layers.

Under append load Litestar's per-request machinery (scope state, routing, guards, dependency
injection, response objects, the exception middleware) cost the event loop more than the
append itself (bench/RESULTS.md, Appends). These routes skip it and nothing else: they
run the same Operations through the same pipeline (memspine/pipeline.py) as their Litestar
handlers, which serve them when the app is built without hot routes. The request observer
(logs.py) wraps this, so ids, logs and metrics are unchanged.
"""

from __future__ import annotations

from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPResponseStartEvent, Receive, Scope, Send

from memspine.body import ClientGone
from memspine.pipeline import Operation, Services, serve
from memspine.routes.memory import APPEND, BATCH, RECALL

ROUTES: dict[str, Operation] = {APPEND.path: APPEND, BATCH.path: BATCH, RECALL.path: RECALL}
NO_PATH_PARAMS: dict[str, Any] = {}


class HotRoutes:
    """ASGI: POST to a hot route is answered here, anything else goes to the inner app."""

    def __init__(self, inner: ASGIApp, services: Services) -> None:
        self.inner = inner
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a hot route or pass the request on."""
        fields: dict[str, Any] = scope  # type: ignore[assignment]
        op = ROUTES.get(fields["path"]) if fields.get("method") == "POST" else None
        if op is None or scope["type"] != ScopeType.HTTP:
            await self.inner(scope, receive, send)
            return
        fields["path_template"] = op.path  # the request observer labels logs with it
        try:
            answer = await serve(op, self.services, fields, receive, NO_PATH_PARAMS)
        except ClientGone:
            return
        headers = [
            (b"content-type", answer.media_type.encode()),
            (b"content-length", str(len(answer.body)).encode()),
        ]
        for name, value in (answer.headers or {}).items():
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": answer.status,
            "headers": headers,
        }
        await send(start)
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})
