"""What the MCP tools call: the HTTP API's operations as JSON in, JSON out.

Two implementations answer alike: `EngineBackend` (in the server, or embedded on a data
directory) calls the HTTP operations' own typed functions (memspine/routes/) with Python
values, and `RemoteBackend` (memspine/mcp/remote.py) makes the HTTP requests through
memspine.client. Either raises a `MemspineError` carrying the route's status, code and sentence.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from memspine.engine import Engine
from memspine.queryparams import list_query
from memspine.readaudit import Reader, check_purpose
from memspine.routes.cypher import cypher_query
from memspine.routes.memory import append_event, delete_event, get_event, list_page, recall_events
from memspine.routes.whoami import whoami_of
from memspine.schemas import CypherIn, RecallIn, convert_body, event_in, plain
from memspine.verifier import Principal
from storage import Quota, QuotaSource


class Backend(Protocol):
    """The operations behind the tools; every answer is the JSON object the HTTP route returns."""

    async def whoami(self) -> dict[str, Any]:
        """{"tenant_id", "key_id", "scopes", "expires_at"} of the caller."""
        ...

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """POST /v1/memory/event; the answer gains "replayed": true for an idempotent replay."""
        ...

    async def get(self, event_id: str, purpose: str | None = None) -> dict[str, Any]:
        """GET /v1/memory/event/{id} (each read with its purpose, if given: docs/audit.md)."""
        ...

    async def list_events(
        self, params: dict[str, Any], purpose: str | None = None
    ) -> dict[str, Any]:
        """GET /v1/memory/events with kind, since, until, limit, cursor."""
        ...

    async def recall(self, body: dict[str, Any], purpose: str | None = None) -> dict[str, Any]:
        """POST /v1/memory/recall."""
        ...

    async def cypher(
        self, query: str, params: dict[str, Any] | None, purpose: str | None = None
    ) -> dict[str, Any]:
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
        self,
        engine: Engine,
        principal: Principal,
        quota: Quota | QuotaSource | None = None,
        *,
        door: str = "mcp",
        request_id: str | None = None,
    ) -> None:
        """`quota`: what the tenant may store (memspine/allowance.py), None for no limit;
        `door` and `request_id` name the reads in the read audit (mcp over HTTP, or the
        embedded bridge, whose every call gets an id of its own)."""
        self.engine = engine
        self.principal = principal
        self.tenant_id = principal.tenant_id
        self.quota = quota
        self.door = door
        self.request_id = request_id

    def _reader(self, tool: str, purpose: str | None) -> Reader:
        """Who reads through this backend, for a tool; 400 for a purpose missing or malformed."""
        return Reader(
            key_id=self.principal.key_id,
            door=self.door,
            route=tool,
            request_id=self.request_id or uuid.uuid4().hex,
            purpose=check_purpose(purpose, self.principal),
        )

    async def whoami(self) -> dict[str, Any]:
        """The principal this backend acts for."""
        out: dict[str, Any] = plain(await whoami_of(self.engine, self.principal))
        return out

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """Validate the body as the route does (same hash for idempotency) and append it; a
        full tenant's append is refused first, as the route refuses it before its body."""
        self.engine.refuse_if_full(self.tenant_id, replay_key=idempotency_key)
        outcome = await append_event(
            self.engine, self.tenant_id, event_in(body), idempotency_key, quota=self.quota
        )
        out: dict[str, Any] = plain(outcome.value)
        if outcome.headers:  # Idempotent-Replayed
            out["replayed"] = True
        return out

    async def get(self, event_id: str, purpose: str | None = None) -> dict[str, Any]:
        """One live event with its current state."""
        reader = self._reader("memory_get", purpose)
        outcome = await get_event(self.engine, self.tenant_id, event_id, reader)
        out: dict[str, Any] = plain(outcome.value)
        return out

    async def list_events(
        self, params: dict[str, Any], purpose: str | None = None
    ) -> dict[str, Any]:
        """One page newest first."""
        reader = self._reader("memory_list", purpose)
        query = list_query(**params)
        outcome = await list_page(self.engine, self.tenant_id, query, reader)
        out: dict[str, Any] = plain(outcome.value)
        return out

    async def recall(self, body: dict[str, Any], purpose: str | None = None) -> dict[str, Any]:
        """Fused recall with the optional walk."""
        reader = self._reader("memory_recall", purpose)
        outcome = await recall_events(
            self.engine, self.tenant_id, convert_body(body, RecallIn), reader
        )
        out: dict[str, Any] = plain(outcome.value)
        return out

    async def cypher(
        self, query: str, params: dict[str, Any] | None, purpose: str | None = None
    ) -> dict[str, Any]:
        """A read-only query, under the route's length limit."""
        reader = self._reader("memory_cypher", purpose)
        body = CypherIn(query=query, params=params)
        outcome = await cypher_query(self.engine, self.tenant_id, body, reader)
        out: dict[str, Any] = plain(outcome.value)
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
