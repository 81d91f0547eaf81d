"""A small async client for the memspine HTTP API (httpx); errors come back as MemspineError."""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from memspine import __version__
from storage import errors

# The error code in a response body -> the class that carries it (the same codes as the server's).
ERROR_CLASSES: dict[str, type[errors.MemspineError]] = {
    cls.code: cls
    for cls in (
        errors.InvalidRequest,
        errors.Unauthorized,
        errors.Forbidden,
        errors.NotFound,
        errors.Conflict,
        errors.PayloadTooLarge,
        errors.IdempotencyMismatch,
        errors.EmbeddingMismatch,
        errors.Unavailable,
    )
}


class RemoteError(errors.MemspineError):
    """An error answer whose code this client does not know; keeps the server's status and code."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code


def error_from(response: httpx.Response) -> errors.MemspineError:
    """The MemspineError an error response stands for."""
    try:
        body = msgspec.json.decode(response.content)
        code, detail = str(body["error"]), str(body["detail"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return RemoteError(
            response.status_code, "internal", f"the server answered HTTP {response.status_code}"
        )
    cls = ERROR_CLASSES.get(code)
    if cls is None or cls.status != response.status_code:
        return RemoteError(response.status_code, code, detail)
    retry = response.headers.get("retry-after")
    return cls(detail, headers={"Retry-After": retry} if retry else None)


class MemspineClient:
    """One API key against one server; each method is one HTTP request and returns its JSON answer."""

    def __init__(self, url: str, api_key: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={
                "Authorization": f"Bearer {api_key}",
                "User-Agent": f"memspine-client/{__version__}",
            },
            timeout=timeout,
        )

    async def __aenter__(self) -> MemspineClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def _request(
        self, method: str, path: str, **kw: Any
    ) -> tuple[dict[str, Any], httpx.Response]:
        try:
            response = await self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise errors.Unavailable(
                f"cannot reach the memspine server at {self.url} ({type(exc).__name__})"
            ) from None
        if response.status_code >= 400:
            raise error_from(response)
        body: dict[str, Any] = msgspec.json.decode(response.content)
        return body, response

    async def health(self) -> dict[str, Any]:
        """GET /health."""
        return (await self._request("GET", "/health"))[0]

    async def whoami(self) -> dict[str, Any]:
        """GET /v1/whoami: tenant, key id, scopes and expiry of this key."""
        return (await self._request("GET", "/v1/whoami"))[0]

    async def append(
        self, body: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """POST /v1/memory/event; adds "replayed": true when the server says Idempotent-Replayed."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        out, response = await self._request(
            "POST", "/v1/memory/event", content=msgspec.json.encode(body), headers=_json(headers)
        )
        if response.headers.get("idempotent-replayed") == "true":
            out["replayed"] = True
        return out

    async def get(self, event_id: str) -> dict[str, Any]:
        """GET /v1/memory/event/{id}."""
        return (await self._request("GET", f"/v1/memory/event/{_id(event_id)}"))[0]

    async def list_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """GET /v1/memory/events (kind, since, until, limit, cursor, current, as_of, prop.NAME)."""
        query = {k: _param(v) for k, v in params.items() if v is not None}
        return (await self._request("GET", "/v1/memory/events", params=query))[0]

    async def recall(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/memory/recall."""
        payload = msgspec.json.encode(body)
        return (
            await self._request("POST", "/v1/memory/recall", content=payload, headers=_json({}))
        )[0]

    async def cypher(self, query: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /v1/memory/cypher."""
        body: dict[str, Any] = {"query": query}
        if params is not None:
            body["params"] = params
        payload = msgspec.json.encode(body)
        return (
            await self._request("POST", "/v1/memory/cypher", content=payload, headers=_json({}))
        )[0]

    async def delete(
        self, event_id: str, *, cascade: bool = False, dry_run: bool = False, purge: bool = False
    ) -> dict[str, Any]:
        """DELETE /v1/memory/event/{id}; cascade=derived and dry_run=true when asked."""
        query: dict[str, str] = {}
        if cascade:
            query["cascade"] = "derived"
        if dry_run:
            query["dry_run"] = "true"
        if purge:
            query["purge"] = "true"
        return (await self._request("DELETE", f"/v1/memory/event/{_id(event_id)}", params=query))[0]


def _json(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/json"}


def _id(event_id: str) -> str:
    """A path segment: a UUID as is, anything else quoted so it cannot change the route."""
    try:
        return str(uuid.UUID(event_id))
    except ValueError:
        return quote(event_id, safe="")


def _param(value: Any) -> str:
    """A query-string value: booleans as true/false, the rest as text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
