"""The /v1/memory operations: append, get, delete, list and recall (cypher has its own module).

Each is a typed function (engine, tenant, checked values -> Outcome) that the MCP backend
calls directly, and an Operation that serves it over HTTP through memspine/pipeline.py.
"""

from __future__ import annotations

from memspine.batch import MAX_BATCH, BatchCreated, BatchIn, batch_created, to_new_events
from memspine.engine import NO_EVENT, Engine
from memspine.pipeline import READ, WRITE, Call, Header, Operation, Outcome, Query, Reply, event_id
from memspine.queryparams import flag, int_range, list_query, text
from memspine.schemas import (
    KIND_SCHEMA,
    MAX_IDEMPOTENCY_KEY,
    SUBJECT_SCHEMA,
    TIME,
    TIME_CHECK_HEADER,
    DeleteDone,
    EventCreated,
    EventIn,
    EventOut,
    EventPage,
    RecallIn,
    RecallOut,
    WouldDelete,
    event_out,
    recall_out,
    time_check,
    to_new_event,
    to_recall_query,
)
from storage.errors import InvalidRequest, NotFound
from storage.model import MAX_TS, Quota, QuotaSource, check_kind, check_subject
from storage.read.listing import MAX_LIMIT, ListQuery

IDEMPOTENCY_KEY = b"idempotency-key"
REPLAYED = {"Idempotent-Replayed": "true"}
TIME_CHECK = TIME_CHECK_HEADER.lower().encode()


async def append_event(
    engine: Engine,
    tenant_id: str,
    body: EventIn,
    idempotency_key: str | None,
    *,
    check_times: bool = True,
    quota: Quota | QuotaSource | None = None,
) -> Outcome:
    """Append one event within the tenant's quota: 201 when new, 200 and Idempotent-Replayed
    when a replay."""
    new = to_new_event(
        body, tenant_id=tenant_id, idempotency_key=idempotency_key, check_times=check_times
    )
    result = await engine.append(tenant_id, new, quota)
    created = EventCreated(event_id=result.event_id, unlinked=result.unlinked)
    if result.replayed:
        return Outcome(200, created, REPLAYED)
    return Outcome(201, created)


async def append_events(
    engine: Engine,
    tenant_id: str,
    body: BatchIn,
    idempotency_key: str | None,
    *,
    check_times: bool = True,
    quota: Quota | QuotaSource | None = None,
) -> Outcome:
    """Append a batch, all of it or none, within the tenant's quota: 201 when any event is
    new, 200 and Idempotent-Replayed when every event was a replay."""
    new = to_new_events(
        body, tenant_id=tenant_id, idempotency_key=idempotency_key, check_times=check_times
    )
    created = batch_created(await engine.append_batch(tenant_id, new, quota))
    if len(created.replayed) == len(created.event_ids):
        return Outcome(200, created, REPLAYED)
    return Outcome(201, created)


async def get_event(engine: Engine, tenant_id: str, target: str) -> Outcome:
    """One live event with its current state."""
    found = await engine.get(tenant_id, event_id(target))
    return Outcome(
        200, event_out(found.event, current=found.current, superseded_by=found.superseded_by)
    )


async def delete_event(
    engine: Engine, tenant_id: str, target: str, *, cascade: bool, purge: bool, dry_run: bool
) -> Outcome:
    """Delete an event (and, with cascade, what derives from it), then purge if asked.

    200 `{"deleted", "purged", "deleted_ids"}`; when the purge asked for cannot run (a full
    disk), 202 with `"purge_pending": true` and a detail: the delete stands and the background
    purger finishes the erasure (docs/erasure.md). With dry_run, 200 `{"would_delete"}`.
    """
    target = event_id(target)
    if dry_run:
        return Outcome(
            200, WouldDelete(await engine.would_delete(tenant_id, target, cascade=cascade))
        )
    if cascade:
        deleted = await engine.delete_cascade(tenant_id, target)
    else:
        deleted = await engine.delete(tenant_id, [target])
    if not deleted:
        raise NotFound(NO_EVENT)
    pending = await engine.purge_after_delete(tenant_id) if purge else None
    if pending is not None:
        done = DeleteDone(
            deleted=True, purged=False, deleted_ids=deleted, purge_pending=True, detail=pending
        )
        return Outcome(202, done)
    return Outcome(200, DeleteDone(deleted=True, purged=purge, deleted_ids=deleted))


async def recall_events(
    engine: Engine, tenant_id: str, body: RecallIn, *, check_times: bool = True
) -> Outcome:
    """Fused keyword and vector recall with the optional walk."""
    query = to_recall_query(body, check_times=check_times)
    wait = body.wait_for_vectors
    return Outcome(200, recall_out(await engine.recall(tenant_id, query, wait_for_vectors=wait)))


async def list_page(engine: Engine, tenant_id: str, query: ListQuery) -> Outcome:
    """One page of events newest first, without embeddings."""
    events, cursor = await engine.list(tenant_id, query)
    return Outcome(200, EventPage([event_out(e, with_embedding=False) for e in events], cursor))


def cascade_value(raw: str) -> bool:
    """?cascade=derived follows SOURCE_FROM links into derived events; no other value exists yet."""
    if raw == "derived":
        return True
    raise InvalidRequest(
        "cascade must be derived (delete the event and every event derived from it)"
    )


def _checked(call: Call) -> bool:
    return time_check(call.header(TIME_CHECK))


async def _append(call: Call) -> Outcome:
    engine, key = call.services.engine, call.header(IDEMPOTENCY_KEY)
    return await append_event(
        engine, call.tenant_id, call.body, key, check_times=_checked(call), quota=call.quota
    )


async def _append_batch(call: Call) -> Outcome:
    engine, key = call.services.engine, call.header(IDEMPOTENCY_KEY)
    return await append_events(
        engine, call.tenant_id, call.body, key, check_times=_checked(call), quota=call.quota
    )


async def _get(call: Call) -> Outcome:
    return await get_event(call.services.engine, call.tenant_id, call.path["event_id"])


async def _delete(call: Call) -> Outcome:
    q = call.query
    return await delete_event(
        call.services.engine,
        call.tenant_id,
        call.path["event_id"],
        cascade=q.get("cascade", False),
        purge=q.get("purge", False),
        dry_run=q.get("dry_run", False),
    )


async def _list(call: Call) -> Outcome:
    query = list_query(props=call.props, checked=_checked(call), **call.query)
    return await list_page(call.services.engine, call.tenant_id, query)


async def _recall(call: Call) -> Outcome:
    return await recall_events(
        call.services.engine, call.tenant_id, call.body, check_times=_checked(call)
    )


# The checked range (memspine/schemas.py); `Memspine-Time-Check: off` widens it to 0-2^62.
TIME_SCHEMA = {"type": "integer", **TIME}
SINCE_SCHEMA = {"type": "integer", "anyOf": [{"const": 0}, TIME]}
TIME_NOTE = (
    " Microseconds since the Unix epoch; from 2000-01-01 through 9999-12-31 unless the request "
    f"says `{TIME_CHECK_HEADER}: off` (0-2^62 then)."
)
IDEMPOTENCY = Header(
    "Idempotency-Key",
    {"type": "string", "pattern": f"^[\\x21-\\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}$"},
    "Makes a retry safe: the same key with the same body stores nothing new and answers 200 "
    "with the first answer and `Idempotent-Replayed: true`; another body is 422.",
)
FLAG_SCHEMA = {"type": "string", "enum": ["true", "false", "1", "0"]}
EVENT_PATH = "/v1/memory/event/{event_id:str}"

APPEND = Operation(
    "append_event",
    "POST",
    "/v1/memory/event",
    WRITE,
    _append,
    "Append one event",
    headers=(IDEMPOTENCY,),
    body=EventIn,
    replies={
        201: Reply(EventCreated, "The new event's id (and ids that named no event)."),
        200: Reply(
            EventCreated, "An idempotent replay: the first answer.", ("Idempotent-Replayed",)
        ),
    },
    errors=(409, 413, 422, 503),
    description="Durable and visible to every read route once answered (docs/api.md).",
    stores=True,
)
BATCH_IDEMPOTENCY = Header(
    "Idempotency-Key",
    IDEMPOTENCY.schema,
    "Makes a retried batch safe: an event without its own idempotency_key takes the key "
    "`<this key>/<its index>`, so the same batch again stores nothing new and answers 200 with "
    "the first ids and `Idempotent-Replayed: true`.",
)
BATCH = Operation(
    "append_events",
    "POST",
    "/v1/memory/events",
    WRITE,
    _append_batch,
    f"Append up to {MAX_BATCH} events at once, all or none",
    headers=(BATCH_IDEMPOTENCY,),
    body=BatchIn,
    replies={
        201: Reply(BatchCreated, "The events' ids in order (and ids that named no event)."),
        200: Reply(
            BatchCreated,
            "Every event was an idempotent replay: the first ids.",
            ("Idempotent-Replayed",),
        ),
    },
    errors=(409, 413, 422, 503),
    description="One group commit: durable and visible to every read route once answered, or "
    "nothing stored; an event may link to an earlier one of the batch as `$N` (docs/api.md). "
    "The body may be up to MEMSPINE_MAX_BATCH_BYTES.",
    body_limit="max_batch_bytes",
    stores=True,
    keys_in_body=True,
)
GET = Operation(
    "get_event",
    "GET",
    EVENT_PATH,
    READ,
    _get,
    "One event by id, with its current state",
    replies={200: Reply(EventOut, "The event.")},
    errors=(404,),
)
DELETE = Operation(
    "delete_event",
    "DELETE",
    EVENT_PATH,
    WRITE,
    _delete,
    "Delete one event (with cascade=derived, what derives from it too)",
    query=(
        Query("purge", flag("purge"), FLAG_SCHEMA, "Wait for the purge that erases its bytes."),
        Query(
            "cascade",
            cascade_value,
            {"type": "string", "enum": ["derived"]},
            "Also delete every event derived from it over SOURCE_FROM, transitively.",
        ),
        Query("dry_run", flag("dry_run"), FLAG_SCHEMA, "Delete nothing; say what would go."),
    ),
    replies={
        200: Reply((DeleteDone, WouldDelete), "Deleted (or, with dry_run, what would be)."),
        202: Reply(
            DeleteDone, "Deleted, but the purge asked for is pending (the detail says why)."
        ),
    },
    errors=(404, 409, 503),
    description="Unreadable at once; bytes leave the disk at the next purge (docs/erasure.md).",
)
LIST = Operation(
    "list_events",
    "GET",
    "/v1/memory/events",
    READ,
    _list,
    "Events newest first, by kind, time range and properties",
    query=(
        Query("kind", check_kind, {"type": "string", **KIND_SCHEMA}, "Only events of this kind."),
        Query("since", int_range("since", 0, MAX_TS), SINCE_SCHEMA, "ts >= since." + TIME_NOTE),
        Query("until", int_range("until", 0, MAX_TS), TIME_SCHEMA, "ts < until." + TIME_NOTE),
        Query(
            "limit",
            int_range("limit", 1, MAX_LIMIT),
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 100},
            "Events on one page.",
        ),
        Query(
            "cursor",
            text,
            {"type": "string", "pattern": "^[A-Za-z0-9_-]{32}$"},  # storage/listing.py's 24 bytes
            "next_cursor of the previous page, unchanged.",
        ),
        Query("current", flag("current"), FLAG_SCHEMA, "Only current events (default true)."),
        Query("as_of", int_range("as_of", 0, MAX_TS), TIME_SCHEMA, "Current as of." + TIME_NOTE),
        Query("subject", check_subject, SUBJECT_SCHEMA, "Only events about this subject."),
    ),
    props=True,
    replies={200: Reply(EventPage, "One page, and the cursor of the next (null on the last).")},
)
RECALL = Operation(
    "recall",
    "POST",
    "/v1/memory/recall",
    READ,
    _recall,
    "Keyword and vector recall, fused, with an optional walk over SOURCE_FROM links",
    body=RecallIn,
    replies={200: Reply(RecallOut, "Ranked hits, then walked ones.")},
    errors=(413, 422),
)

OPERATIONS = (APPEND, BATCH, GET, DELETE, LIST, RECALL)
