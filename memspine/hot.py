"""The two hot routes, append and recall, served straight from ASGI ahead of Litestar's layers.

Under append load Litestar's per-request machinery (scope state, routing, guards, dependency
injection, response objects, the exception middleware) cost the event loop more than the
append itself (bench/RESULTS.md, Appends). These two routes do the same checks in the same
order, call the same answer functions as their Litestar handlers (which still document them in
/schema), and render errors through memspine/errors.py; every other request goes to Litestar.
The request observer (logs.py) wraps this, so ids, logs and metrics are unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from litestar.types import ASGIApp, HTTPResponseStartEvent, Receive, Scope, Send

from memspine.auth import Authenticator, bearer_token
from memspine.body import ClientGone, read_body
from memspine.engine import Engine
from memspine.errors import error_body, unexpected_error
from memspine.routes.memory import Answer, append_answer, recall_answer
from memspine.schemas import TIME_CHECK_HEADER
from memspine_admin.verifier import Principal
from storage.errors import InvalidRequest, MemspineError

TIME_CHECK = TIME_CHECK_HEADER.lower().encode()
JSON_HEADER = (b"content-type", b"application/json")


class HotRoute(NamedTuple):
    """One hot route: its template (what logs and metrics name), the key scope it needs, its work."""

    template: str
    scope: str
    answer: Callable[[Engine, Principal, dict[bytes, bytes], bytes], Awaitable[Answer]]


async def _append(
    engine: Engine, who: Principal, headers: dict[bytes, bytes], body: bytes
) -> Answer:
    key = headers.get(b"idempotency-key")
    return await append_answer(
        engine,
        who.tenant_id,
        body,
        key.decode("latin-1") if key is not None else None,
        _time_header(headers),
    )


async def _recall(
    engine: Engine, who: Principal, headers: dict[bytes, bytes], body: bytes
) -> Answer:
    return await recall_answer(engine, who.tenant_id, body, _time_header(headers))


def _time_header(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(TIME_CHECK)
    return value.decode("latin-1") if value is not None else None


ROUTES = {
    "/v1/memory/event": HotRoute("/v1/memory/event", "write", _append),
    "/v1/memory/recall": HotRoute("/v1/memory/recall", "read", _recall),
}


class HotRoutes:
    """ASGI: POST to a hot route is answered here, anything else goes to the inner app."""

    def __init__(self, inner: ASGIApp, engine: Engine, auth: Authenticator, max_body: int) -> None:
        self.inner = inner
        self.engine = engine
        self.auth = auth
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a hot route or pass the request on."""
        fields: dict[str, Any] = scope  # type: ignore[assignment]
        route = ROUTES.get(fields["path"]) if fields.get("method") == "POST" else None
        if route is None or scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        fields["path_template"] = route.template  # the request observer labels logs with it
        try:
            answer = await self._serve(route, fields, receive)
        except ClientGone:
            return
        except MemspineError as exc:
            answer = Answer(exc.status, error_body(exc.code, exc.detail), exc.headers)
        except Exception as exc:  # a bug or a failing disk: logged there, nothing leaks here
            error = unexpected_error(exc)
            answer = Answer(error.status, error_body(error.code, error.detail), error.headers)
        headers = [JSON_HEADER, (b"content-length", str(len(answer.body)).encode())]
        for name, value in (answer.headers or {}).items():
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": answer.status,
            "headers": headers,
        }
        await send(start)
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})

    async def _serve(self, route: HotRoute, scope: dict[str, Any], receive: Receive) -> Answer:
        """Authenticate, check the scope, the query and the body size, then do the route's work."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of repeated headers, as Litestar reads them
        auth = headers.get(b"authorization")
        who = await self.auth.authenticate_async(
            bearer_token(auth.decode("latin-1") if auth is not None else None)
        )
        who.require(route.scope)
        scope["state"]["principal"] = who
        if scope["query_string"]:
            _refuse_params(scope["query_string"])
        body = await read_body(receive, self.max_body, headers.get(b"content-length"))
        return await route.answer(self.engine, who, headers, body)


def _refuse_params(query_string: bytes) -> None:
    """The hot routes take no query parameters: 400 naming the first one."""
    for name, _value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        raise InvalidRequest(f"unknown query parameter '{name}'")
