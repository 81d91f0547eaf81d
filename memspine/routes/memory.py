"""The /v1/memory routes: thin handlers that parse, make one engine call and render."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from memspine.auth import tenant_guard
from memspine.engine import NO_EVENT, Engine
from memspine.queryparams import check_params, one, parse_list_query
from memspine.schemas import (
    TIME_CHECK_HEADER,
    EventCreated,
    EventIn,
    RecallIn,
    decode_body,
    event_out,
    recall_out,
    time_check,
    to_new_event,
    to_recall_query,
)
from storage.errors import InvalidRequest, NotFound

JSON = "application/json"


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    """A JSON response encoded by msgspec (Raw properties pass through byte for byte)."""
    return Response(msgspec.json.encode(obj), status_code=status, media_type=JSON, headers=headers)


def _event_id(value: str) -> str:
    """A path id must be a UUID."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest("event id must be a UUID such as 009cfbc7-bc4d-48c4-9a4a-7ad5f4cc17da") from None


def _tenant(request: Request[Any, Any, Any]) -> str:
    return str(request.state.principal.tenant_id)


class Answer(NamedTuple):
    """A route's answer before it is sent: status, JSON body and extra headers."""

    status: int
    body: bytes
    headers: dict[str, str] | None = None


async def append_answer(
    engine: Engine, tenant_id: str, body: bytes, idempotency_key: str | None, time_header: str | None = None
) -> Answer:
    """Append one event from a request body: 201 when new, 200 and a header when a replay."""
    event_in, checked = decode_body(body, EventIn), time_check(time_header)
    new = to_new_event(event_in, tenant_id=tenant_id, idempotency_key=idempotency_key, check_times=checked)
    result = await engine.append(tenant_id, new)
    created = msgspec.json.encode(EventCreated(event_id=result.event_id, unlinked=result.unlinked))
    if result.replayed:
        return Answer(200, created, {"Idempotent-Replayed": "true"})
    return Answer(201, created)


async def recall_answer(engine: Engine, tenant_id: str, body: bytes, time_header: str | None = None) -> Answer:
    """Recall from a request body."""
    query = to_recall_query(decode_body(body, RecallIn), check_times=time_check(time_header))
    result = await engine.recall(tenant_id, query)
    return Answer(200, msgspec.json.encode(recall_out(result)))


def _send(answer: Answer) -> Response[bytes]:
    return Response(answer.body, status_code=answer.status, media_type=JSON, headers=answer.headers)


# POST /v1/memory/event and /v1/memory/recall are served by memspine/hot.py ahead of Litestar
# (same checks, same answer functions); these handlers document them in /schema and serve them
# when the app is built without hot routes.
@post("/v1/memory/event", guards=[tenant_guard], opt={"scope": "write"})
async def append_event(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Append one event; Idempotency-Key makes retries safe."""
    check_params(request, set())
    key, times = request.headers.get("idempotency-key"), request.headers.get(TIME_CHECK_HEADER)
    return _send(await append_answer(state.engine, _tenant(request), await request.body(), key, times))


@get("/v1/memory/event/{event_id:str}", guards=[tenant_guard], opt={"scope": "read"})
async def get_event(request: Request[Any, Any, Any], state: State, event_id: FromPath[str]) -> Response[bytes]:
    """One event by id."""
    check_params(request, set())
    engine: Engine = state.engine
    found = await engine.get(_tenant(request), _event_id(event_id))
    return _json(event_out(found.event, current=found.current, superseded_by=found.superseded_by))


@delete("/v1/memory/event/{event_id:str}", guards=[tenant_guard], opt={"scope": "write"}, status_code=200)
async def delete_event(request: Request[Any, Any, Any], state: State, event_id: FromPath[str]) -> Response[bytes]:
    """Delete one event (with ?cascade=derived, what derives from it too): unreadable at once,
    bytes gone at the next purge; ?dry_run=true only says what would go."""
    check_params(request, {"purge", "cascade", "dry_run"})
    purge, cascade, dry_run = _flag(request, "purge"), _cascade(request), _flag(request, "dry_run")
    engine: Engine = state.engine
    tenant_id, target = _tenant(request), _event_id(event_id)
    if dry_run:
        return _json({"would_delete": await engine.would_delete(tenant_id, target, cascade=cascade)})
    return _send(await delete_answer(engine, tenant_id, target, cascade=cascade, purge=purge))


async def delete_answer(
    engine: Engine, tenant_id: str, target: str, *, cascade: bool, purge: bool
) -> Answer:
    """Delete an event (and, with cascade, what derives from it), then purge if asked.

    200 `{"deleted", "purged", "deleted_ids"}`; when the purge asked for cannot run (a full
    disk), 202 with `"purge_pending": true` and a detail: the delete stands and the background
    purger finishes the erasure (docs/erasure.md).
    """
    if cascade:
        deleted = await engine.delete_cascade(tenant_id, target)
    else:
        deleted = await engine.delete(tenant_id, [target])
    if not deleted:
        raise NotFound(NO_EVENT)
    pending = await engine.purge_after_delete(tenant_id) if purge else None
    if pending is not None:
        body = {"deleted": True, "purged": False, "purge_pending": True, "deleted_ids": deleted}
        return Answer(202, msgspec.json.encode(body | {"detail": pending}))
    return Answer(200, msgspec.json.encode({"deleted": True, "purged": purge, "deleted_ids": deleted}))


def _cascade(request: Request[Any, Any, Any]) -> bool:
    """?cascade=derived follows SOURCE_FROM links into derived events; no other value exists yet."""
    value = one(request, "cascade")
    if value is None:
        return False
    if value == "derived":
        return True
    raise InvalidRequest("cascade must be derived (delete the event and every event derived from it)")


@get("/v1/memory/events", guards=[tenant_guard], opt={"scope": "read"})
async def list_events(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Events newest first, by kind, time range and properties."""
    query = parse_list_query(request)
    engine: Engine = state.engine
    events, cursor = await engine.list(_tenant(request), query)
    page = [event_out(e, with_embedding=False) for e in events]
    return _json({"events": page, "next_cursor": cursor})


@post("/v1/memory/recall", guards=[tenant_guard], opt={"scope": "read"})
async def recall_events(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Keyword and vector recall, fused, with an optional walk over SOURCE_FROM links."""
    check_params(request, set())
    times = request.headers.get(TIME_CHECK_HEADER)
    return _send(await recall_answer(state.engine, _tenant(request), await request.body(), times))


def _flag(request: Request[Any, Any, Any], name: str) -> bool:
    """A boolean query parameter: true/false/1/0."""
    value = one(request, name)
    if value is None:
        return False
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise InvalidRequest(f"{name} must be true or false")


ROUTES = [append_event, get_event, delete_event, list_events, recall_events]
