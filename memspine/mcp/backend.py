"""What the MCP tools call: the HTTP API's operations as JSON in, JSON out.

Two implementations answer alike: `EngineBackend` (in the server, or embedded on a data
directory) makes the same engine calls and validation as the HTTP routes, and
`memspine.client.MemspineClient` makes the HTTP requests themselves. Either raises a
`MemspineError` carrying the route's status, code and sentence.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

import msgspec

from memspine.engine import Engine
from memspine.routes.cypher import MAX_QUERY_CHARS
from memspine.routes.memory import delete_answer
from memspine.schemas import (
    EventCreated,
    EventIn,
    RecallIn,
    check_kind,
    check_time,
    decode_body,
    event_out,
    recall_out,
    to_new_event,
    to_recall_query,
)
from memspine_admin.verifier import Principal
from storage.errors import InvalidRequest
from storage.read.listing import ListQuery

MAX_TS = 2**62


class Backend(Protocol):
    """The operations behind the tools; every answer is the JSON object the HTTP route returns."""

    async def whoami(self) -> dict[str, Any]:
        """{"tenant_id", "key_id", "scopes", "expires_at"} of the caller."""
        ...

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """POST /v1/memory/event; the answer gains "replayed": true for an idempotent replay."""
        ...

    async def get(self, event_id: str) -> dict[str, Any]:
        """GET /v1/memory/event/{id}."""
        ...

    async def list_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """GET /v1/memory/events with kind, since, until, limit, cursor."""
        ...

    async def recall(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/memory/recall."""
        ...

    async def cypher(self, query: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """POST /v1/memory/cypher."""
        ...

    async def delete(
        self, event_id: str, *, cascade: bool, dry_run: bool, purge: bool = False
    ) -> dict[str, Any]:
        """DELETE /v1/memory/event/{id} with ?cascade=derived, ?dry_run=true and ?purge=true."""
        ...


def to_json(obj: Any) -> Any:
    """A route's answer as plain JSON values (Raw properties decoded), exactly as a client reads it."""
    return msgspec.json.decode(msgspec.json.encode(obj))


def event_uuid(value: str) -> str:
    """An event id must be a UUID (the same sentence as the HTTP route)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest(
            "event id must be a UUID such as 009cfbc7-bc4d-48c4-9a4a-7ad5f4cc17da"
        ) from None


def _bounded(params: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    """An optional integer list parameter within [lo, hi]."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be from {lo} to {hi}")
    return value


def list_query(params: dict[str, Any]) -> ListQuery:
    """The listing parameters the tools send, checked as the HTTP query string is."""
    kind = params.get("kind")
    if kind is not None:
        check_kind(kind)
    limit = _bounded(params, "limit", 1, 1000)
    return ListQuery(
        kind=kind,
        since=check_time(_bounded(params, "since", 0, MAX_TS), "since", zero=True),
        until=check_time(_bounded(params, "until", 0, MAX_TS), "until"),
        limit=100 if limit is None else limit,
        cursor=params.get("cursor"),
    )


class EngineBackend:
    """The tools' operations for one tenant, through the same engine calls as the HTTP routes."""

    def __init__(self, engine: Engine, principal: Principal) -> None:
        self.engine = engine
        self.principal = principal
        self.tenant_id = principal.tenant_id

    async def whoami(self) -> dict[str, Any]:
        """The principal this backend acts for."""
        p = self.principal
        return {
            "tenant_id": p.tenant_id,
            "key_id": p.key_id,
            "scopes": list(p.scopes),
            "expires_at": p.expires_at,
        }

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """Validate the body as the route does (same hash for idempotency) and append it."""
        event_in = decode_body(msgspec.json.encode(body), EventIn)
        new = to_new_event(event_in, tenant_id=self.tenant_id, idempotency_key=idempotency_key)
        result = await self.engine.append(self.tenant_id, new)
        out: dict[str, Any] = to_json(
            EventCreated(event_id=result.event_id, unlinked=result.unlinked)
        )
        if result.replayed:
            out["replayed"] = True
        return out

    async def get(self, event_id: str) -> dict[str, Any]:
        """One live event with its current state."""
        found = await self.engine.get(self.tenant_id, event_uuid(event_id))
        ev = event_out(found.event, current=found.current, superseded_by=found.superseded_by)
        return dict(to_json(ev))

    async def list_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """One page newest first."""
        events, cursor = await self.engine.list(self.tenant_id, list_query(params))
        page = [event_out(e, with_embedding=False) for e in events]
        return {"events": to_json(page), "next_cursor": cursor}

    async def recall(self, body: dict[str, Any]) -> dict[str, Any]:
        """Fused recall with the optional walk."""
        query = to_recall_query(decode_body(msgspec.json.encode(body), RecallIn))
        return dict(to_json(recall_out(await self.engine.recall(self.tenant_id, query))))

    async def cypher(self, query: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """A read-only query, under the route's length limit."""
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidRequest(f"query may be at most {MAX_QUERY_CHARS} characters")
        return dict(to_json(await self.engine.cypher(self.tenant_id, query, params)))

    async def delete(
        self, event_id: str, *, cascade: bool, dry_run: bool, purge: bool = False
    ) -> dict[str, Any]:
        """Delete one event (with cascade, what derives from it too), or say what that would delete."""
        target = event_uuid(event_id)
        if dry_run:
            would = await self.engine.would_delete(self.tenant_id, target, cascade=cascade)
            return {"would_delete": would}
        answer = await delete_answer(
            self.engine, self.tenant_id, target, cascade=cascade, purge=purge
        )
        return dict(msgspec.json.decode(answer.body))
