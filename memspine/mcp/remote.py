"""The tools' operations through a running server (`memspine mcp --url`): memspine.client's
AsyncMemspine sends them, with its retries and Idempotency-Keys; each answer is the route's JSON
as the server sent it, and each refusal the server's status, code and sentence."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from memspine.client import APIError, AsyncMemspine, ConnectionFailed
from memspine.client import routes as r
from storage.errors import MemspineError, Unavailable

PURPOSE_HEADER = "Memspine-Purpose"  # memspine/readaudit.py; the bridge loads no server code


class Refused(MemspineError):
    """An error answer of the server, carried to the tools as it came."""

    def __init__(self, exc: APIError) -> None:
        retry = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
        super().__init__(exc.detail, headers=retry)
        self.status = exc.status
        self.code = exc.code


def _purposed(call: r.Call[Any], purpose: str | None) -> r.Call[Any]:
    """The call with the read's purpose as its Memspine-Purpose header (docs/audit.md)."""
    if purpose is None:
        return call
    return dataclasses.replace(call, headers={**call.headers, PURPOSE_HEADER: purpose})


class RemoteBackend:
    """The Backend of memspine/mcp/backend.py over HTTP."""

    def __init__(self, client: AsyncMemspine) -> None:
        self.client = client

    async def _send(self, call: r.Call[Any]) -> tuple[dict[str, Any], bool]:
        """The answer's JSON, and whether it was an idempotent replay."""
        try:
            response = await self.client.send(call)
        except APIError as exc:
            raise Refused(exc) from None
        except ConnectionFailed as exc:
            raise Unavailable(
                f"cannot reach the memspine server at {self.client.url}: {exc}"
            ) from None
        out: dict[str, Any] = msgspec.json.decode(response.content)
        return out, response.headers.get("idempotent-replayed") == "true"

    async def _json(self, call: r.Call[Any]) -> dict[str, Any]:
        return (await self._send(call))[0]

    async def whoami(self) -> dict[str, Any]:
        """GET /v1/whoami."""
        return await self._json(r.whoami())

    async def append(self, body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """POST /v1/memory/event under the model's key or a new one; "replayed" on a replay."""
        out, replayed = await self._send(r.append(body, idempotency_key))
        if replayed:
            out["replayed"] = True
        return out

    async def get(self, event_id: str, purpose: str | None = None) -> dict[str, Any]:
        """GET /v1/memory/event/{id}."""
        return await self._json(_purposed(r.get(event_id), purpose))

    async def list_events(
        self, params: dict[str, Any], purpose: str | None = None
    ) -> dict[str, Any]:
        """GET /v1/memory/events."""
        return await self._json(_purposed(r.list_events(**params), purpose))

    async def recall(self, body: dict[str, Any], purpose: str | None = None) -> dict[str, Any]:
        """POST /v1/memory/recall."""
        return await self._json(_purposed(r.recall(**body), purpose))

    async def cypher(
        self, query: str, params: dict[str, Any] | None, purpose: str | None = None
    ) -> dict[str, Any]:
        """POST /v1/memory/cypher."""
        return await self._json(_purposed(r.cypher(query, params), purpose))

    async def delete(
        self, event_id: str, *, cascade: bool, dry_run: bool, purge: bool = False
    ) -> dict[str, Any]:
        """DELETE /v1/memory/event/{id}, or its dry run."""
        if dry_run:
            return await self._json(r.would_delete(event_id, cascade=cascade))
        return await self._json(r.delete(event_id, cascade=cascade, purge=purge))
