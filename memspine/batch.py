"""POST /v1/memory/events: a batch of events, validated as one-event appends are, its "$N"
links resolved, answered with every event's id in order."""

from __future__ import annotations

import re
import uuid
from typing import Annotated

import msgspec

from memspine.schemas import (
    MAX_IDEMPOTENCY_KEY,
    EventIn,
    check_idempotency_key,
    doc,
    to_new_event,
)
from storage.errors import InvalidRequest, MemspineError, QuotaExceeded
from storage.model import AppendResult, NewEvent

MAX_BATCH = 1000  # events in one POST /v1/memory/events
# "$N" in an event of a batch names the batch's event N, an earlier one (docs/api.md).
BATCH_REF = re.compile(r"^\$(0|[1-9][0-9]*)\Z")


IdempotencyKey = Annotated[
    str,
    doc(
        "Makes this event's retry safe, as the Idempotency-Key header does for one event.",
        pattern=f"^[\\x21-\\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}$",
    ),
]


class BatchItem(EventIn, forbid_unknown_fields=True):
    """One event of POST /v1/memory/events: an append body, and optionally its own key."""

    idempotency_key: IdempotencyKey | None = None


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/memory/events: events appended in order, all of them or none."""

    events: Annotated[
        list[BatchItem],
        doc(f"1 to {MAX_BATCH} events.", minItems=1, maxItems=MAX_BATCH),
    ]


class BatchCreated(msgspec.Struct, omit_defaults=True):
    """The answer to a batch: the events' ids in order, the ids their links named that named
    no event, and the positions of the events that were idempotent replays."""

    event_ids: list[str]
    unlinked: list[str] = []
    replayed: list[int] = []


def to_new_events(
    body: BatchIn, *, tenant_id: str, idempotency_key: str | None, check_times: bool = True
) -> list[NewEvent]:
    """Validate a batch, each event as to_new_event does, into NewEvents whose "$N" links name
    the batch's event N; the first event that fails refuses the batch (events[i] in the detail).

    An event without its own idempotency_key takes "<Idempotency-Key header>/<its index>" when
    the batch has the header, so a retried batch replays every event.
    """
    if not body.events:
        raise InvalidRequest("events must hold at least one event")
    if len(body.events) > MAX_BATCH:
        raise InvalidRequest(
            f"events may hold at most {MAX_BATCH} events; send more in several batches"
        )
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    events: list[NewEvent] = []
    for i, item in enumerate(body.events):
        try:
            key = item.idempotency_key
            if key is not None:
                check_idempotency_key(key, "idempotency_key")
            elif idempotency_key is not None:
                key = f"{idempotency_key}/{i}"
            new = to_new_event(
                item, tenant_id=tenant_id, idempotency_key=key, check_times=check_times
            )
            events.append(_resolve_refs(new, item, events))
        except InvalidRequest as exc:
            raise in_batch(i, exc) from None
    return events


def in_batch(index: int, error: MemspineError) -> MemspineError:
    """An event's error as the batch's: the same class, its index first, and what happened."""
    detail = f"events[{index}]: {error.detail}; the batch stored nothing"
    headers = error.headers or None
    if isinstance(error, QuotaExceeded):
        return QuotaExceeded(detail, limit=error.limit, headers=headers)
    return type(error)(detail, headers=headers)


def _resolve_refs(new: NewEvent, item: EventIn, earlier: list[NewEvent]) -> NewEvent:
    """The event with each "$N" of its source_event_ids and supersedes replaced by the id of
    the batch's event N (given one now if it has none yet); the stored properties then name
    the ids too."""
    if not any(r.startswith("$") for r in (*new.source_ids, *new.supersedes)):
        return new

    def resolve(ref: str, field: str) -> str:
        match = BATCH_REF.match(ref)
        if match is None:
            return ref  # not a reference: an id like any other (unlinked if it names nothing)
        digits = match.group(1)  # more digits than a batch's size can name: none of its events
        n = int(digits) if len(digits) <= len(str(MAX_BATCH)) else MAX_BATCH
        if n >= len(earlier):
            raise InvalidRequest(
                f"{field} names {ref}, which is not an earlier event of this batch "
                "($0 is the first; an event can link only to events before it)"
            )
        target = earlier[n]
        if target.event_id is None:
            target = msgspec.structs.replace(target, event_id=str(uuid.uuid4()))
            earlier[n] = target
        assert target.event_id is not None
        return target.event_id

    sources = tuple(resolve(r, "properties.source_event_ids") for r in new.source_ids)
    supersedes = tuple(resolve(r, "supersedes") for r in new.supersedes)
    properties_raw = new.properties_raw
    if sources != new.source_ids:
        assert item.properties is not msgspec.UNSET  # the sources came from it
        properties = msgspec.json.decode(bytes(item.properties))  # validated: a JSON object
        properties["source_event_ids"] = list(sources)
        properties_raw = msgspec.json.encode(properties)
    return msgspec.structs.replace(
        new, source_ids=sources, supersedes=supersedes, properties_raw=properties_raw
    )


def batch_created(results: list[AppendResult]) -> BatchCreated:
    """The answer to a stored batch, from each event's result in order."""
    unlinked = list(dict.fromkeys(u for r in results for u in r.unlinked))
    replayed = [i for i, r in enumerate(results) if r.replayed]
    return BatchCreated(
        event_ids=[r.event_id for r in results], unlinked=unlinked, replayed=replayed
    )
