"""What the MCP tools call: the HTTP API's operations as JSON in, JSON out.

Two implementations answer alike: `EngineBackend` (in the server, or embedded on a data
directory) calls the HTTP operations' own typed functions (memspine/routes/) with Python
values, and `RemoteBackend` (memspine/mcp/remote.py) makes the HTTP requests through
memspine.client. Either raises a `MemspineError` carrying the route's status, code and sentence.
"""

from __future__ import annotations

from typing import Any, Protocol

from memspine.engine import Engine
from memspine.queryparams import list_query
from memspine.routes.cypher import cypher_query
from memspine.routes.memory import append_event, delete_event, get_event, list_page, recall_events
from memspine.routes.whoami import whoami_of
from memspine.schemas import CypherIn, RecallIn, convert_body, event_in, plain
from memspine.verifier import Principal
from storage.model import Quota, QuotaSource


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


class EngineBackend:
    """The tools' operations for one tenant, through the HTTP operations' functions."""

    def __init__(
        self, engine: Engine, principal: Principal, quota: Quota | QuotaSource | None = None
    ) -> None:
        """`quota`: what the tenant may store (memspine/allowance.py), None for no limit."""
        self.engine = engine
        self.principal = principal
        self.tenant_id = principal.tenant_id
        self.quota = quota

    async def whoami(self) -> dict[str, Any]:
        """The principal this backend acts for."""
        out: dict[str, Any] = plain(await whoami_of(self.engine, self.principal))
        return out

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """Validate the body as the route does (same hash for idempotency) and append it."""
        outcome = await append_event(
            self.engine, self.tenant_id, event_in(body), idempotency_key, quota=self.quota
        )
        out: dict[str, Any] = plain(outcome.value)
        if outcome.headers:  # Idempotent-Replayed
            out["replayed"] = True
        return out

    async def get(self, event_id: str) -> dict[str, Any]:
        """One live event with its current state."""
        out: dict[str, Any] = plain((await get_event(self.engine, self.tenant_id, event_id)).value)
        return out

    async def list_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """One page newest first."""
        query = list_query(**params)
        out: dict[str, Any] = plain((await list_page(self.engine, self.tenant_id, query)).value)
        return out

    async def recall(self, body: dict[str, Any]) -> dict[str, Any]:
        """Fused recall with the optional walk."""
        outcome = await recall_events(self.engine, self.tenant_id, convert_body(body, RecallIn))
        out: dict[str, Any] = plain(outcome.value)
        return out

    async def cypher(self, query: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """A read-only query, under the route's length limit."""
        body = CypherIn(query=query, params=params)
        out: dict[str, Any] = plain((await cypher_query(self.engine, self.tenant_id, body)).value)
        return out

    async def delete(
        self, event_id: str, *, cascade: bool, dry_run: bool, purge: bool = False
    ) -> dict[str, Any]:
        """Delete one event (with cascade, what derives from it too), or say what that would delete."""
        outcome = await delete_event(
            self.engine, self.tenant_id, event_id, cascade=cascade, purge=purge, dry_run=dry_run
        )
        out: dict[str, Any] = plain(outcome.value)
        return out
