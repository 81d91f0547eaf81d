"""POST /v1/memory/cypher: a read-only Cypher query over the caller's tenant."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from memspine.auth import tenant_guard
from memspine.engine import Engine
from memspine.queryparams import check_params
from memspine.schemas import CypherIn, decode_body
from storage.cypher import MAX_QUERY_CHARS
from storage.errors import InvalidRequest

__all__ = ["MAX_QUERY_CHARS", "ROUTES", "cypher_query"]


@post("/v1/memory/cypher", guards=[tenant_guard], opt={"scope": "read"}, status_code=200)
async def cypher_query(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Run one read-only query; the answer is {"columns": [...], "rows": [[...], ...]}."""
    check_params(request, set())
    body = decode_body(await request.body(), CypherIn)  # its nesting checked before decoding
    if len(body.query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"query may be at most {MAX_QUERY_CHARS} characters")
    engine: Engine = state.engine
    result = await engine.cypher(str(request.state.principal.tenant_id), body.query, body.params)
    return Response(msgspec.json.encode(result), media_type="application/json")


ROUTES = [cypher_query]
