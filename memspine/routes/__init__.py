"""HTTP routes, one module per area, each a tuple of Operations (memspine/pipeline.py), and the
Litestar door: one generated handler per operation, a thin adapter onto pipeline.serve."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, route
from litestar.enums import HttpMethod
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream

from memspine.body import ClientGone
from memspine.pipeline import Operation, Services, error_answer, serve
from memspine.routes import (
    admin,
    audit,
    cypher,
    health,
    holds,
    memory,
    move,
    retention,
    subjects,
    transfer,
    whoami,
)
from memspine.segments import path_params
from storage.errors import InvalidRequest

GONE = "the client disconnected before its body arrived"

OPERATIONS: tuple[Operation, ...] = (
    *health.OPERATIONS,
    *memory.OPERATIONS,
    *transfer.OPERATIONS,
    *cypher.OPERATIONS,
    *whoami.OPERATIONS,
    *admin.OPERATIONS,
    *holds.OPERATIONS,
    *move.OPERATIONS,
    *audit.OPERATIONS,
    *subjects.OPERATIONS,
    *retention.OPERATIONS,
)


def litestar_handler(ops: dict[str, Operation], services: Services) -> HTTPRouteHandler:
    """One Litestar route for the operations of one path: routing (404, and 405 with an Allow
    that lists every method of the path) is Litestar's, everything else pipeline.serve's."""

    async def handle(request: Request[Any, Any, Any]) -> Response[bytes] | Stream:
        scope: dict[str, Any] = request.scope  # type: ignore[assignment]
        op = ops[request.method]
        try:
            params = path_params(op.path, scope, request.path_params)
            answer = await serve(op, services, scope, request.receive, params)
        except ClientGone:  # no one reads this; Litestar must still be handed an answer
            answer = error_answer(InvalidRequest(GONE))
        if answer.stream is not None:
            return Stream(
                answer.stream,
                status_code=answer.status,
                media_type=answer.media_type,
                headers=answer.headers,
            )
        return Response(
            answer.body,
            status_code=answer.status,
            media_type=answer.media_type,
            headers=answer.headers,
        )

    first = next(iter(ops.values()))
    handle.__doc__ = "; ".join(op.summary for op in ops.values())
    # The status here only satisfies Litestar's checks at startup; every answer sets its own.
    handler: HTTPRouteHandler = route(
        first.path,
        http_method=[HttpMethod(method) for method in ops],
        name="+".join(op.name for op in ops.values()),
        status_code=200,
        include_in_schema=False,
    )(handle)
    return handler


def head_handler(path: str) -> HTTPRouteHandler:
    """HEAD of a public GET route whose answer costs nothing: 200 and no body (a load
    balancer's or a person's `curl -I /health`)."""

    async def head() -> None:
        """200, no body."""

    handler: HTTPRouteHandler = route(
        path,
        http_method=[HttpMethod.HEAD],
        name=f"head {path}",
        media_type="text/plain",
        status_code=200,
        include_in_schema=False,
    )(head)
    return handler


# The paths that answer HEAD: their GET is public and says only that the server is up.
HEAD_PATHS = ("/", "/health")


def litestar_handlers(services: Services) -> list[HTTPRouteHandler]:
    """Every operation as a Litestar route, one handler per path, and HEAD of HEAD_PATHS."""
    by_path: dict[str, dict[str, Operation]] = {}
    for op in OPERATIONS:
        by_path.setdefault(op.path, {})[op.method] = op
    handlers = [litestar_handler(ops, services) for ops in by_path.values()]
    return handlers + [head_handler(path) for path in HEAD_PATHS]
