"""POST /v1/memory/cypher: a read-only Cypher query over the caller's tenant."""

from __future__ import annotations

from memspine.engine import Engine
from memspine.pipeline import READ, Call, Operation, Outcome, Reply
from memspine.readaudit import Reader
from memspine.routes.memory import PURPOSE
from memspine.schemas import CypherIn
from storage import MAX_QUERY_CHARS, CypherResult
from storage.errors import InvalidRequest

__all__ = ["CYPHER", "MAX_QUERY_CHARS", "OPERATIONS", "cypher_query"]


async def cypher_query(
    engine: Engine, tenant_id: str, body: CypherIn, reader: Reader | None
) -> Outcome:
    """Run one read-only query; the answer is {"columns": [...], "rows": [[...], ...]}; the
    events its rows were built from are recorded as read by `reader`."""
    if len(body.query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"query may be at most {MAX_QUERY_CHARS} characters")
    read: set[str] = set()
    result = await engine.cypher(tenant_id, body.query, body.params, read)
    if reader is not None:
        await engine.reads.record(tenant_id, reader, sorted(read))
    return Outcome(200, result)


async def _cypher(call: Call) -> Outcome:
    return await cypher_query(call.services.engine, call.tenant_id, call.body, call.reader)


CYPHER = Operation(
    "cypher",
    "POST",
    "/v1/memory/cypher",
    READ,
    _cypher,
    "A read-only openCypher query over the caller's tenant",
    body=CypherIn,
    replies={200: Reply(CypherResult, "Column names and one array per row.")},
    errors=(413,),
    headers=(PURPOSE,),
    audited=True,
    description="Bounded by MEMSPINE_CYPHER_TIMEOUT_MS and MEMSPINE_CYPHER_MAX_ROWS (docs/cypher.md).",
)

OPERATIONS = (CYPHER,)
