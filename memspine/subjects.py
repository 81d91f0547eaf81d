"""Erasure and access by subject (docs/erasure.md, "Erasure by subject"): the dry run, the
real run (one delete, one purge, a scan, a signed receipt), and the access export.

Every door calls these: the HTTP operations (memspine/routes/subjects.py), the admin route
across tenants and the CLI through it. MCP has no erasure tool: an agent must not erase a person.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Literal

import anyio.to_thread
import msgspec

from memspine.engine import Engine
from memspine.pipeline import event_id
from memspine.schemas import doc
from storage import (
    DERIVED,
    IDENTIFIER,
    MAX_CONFIRM_IDS,
    MAX_IDENTIFIER_CHARS,
    MAX_IDENTIFIERS,
    MIN_IDENTIFIER_CHARS,
    SUBJECT,
    Hold,
    Reach,
    Reached,
    Tenant,
    check_identifiers,
    check_room,
    check_subject,
    doomed,
    full_disk_as,
    reach,
    reads_of_events,
    receipts,
    subject_lines,
    tenant_holding,
)
from storage.errors import InvalidRequest

STORES = ["events", "keyword", "vectors"]  # what one purge rewrites (docs/erasure.md)
NO_ROOM = (
    "the disk lacks the free space a purge of this tenant needs; nothing was erased, "
    "retry once space is freed"
)
PURGE_NO_ROOM = (
    "the events are deleted but the disk filled before their purge; the background purger "
    "finishes it once space is freed; send the request again then for its receipt"
)


Identifier = Annotated[
    str, doc(minLength=MIN_IDENTIFIER_CHARS, maxLength=MAX_IDENTIFIER_CHARS, pattern=r"\S.*\S.*\S")
]
Uuid = Annotated[str, doc(format="uuid")]


class EraseIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/memory/subjects/{subject}/erase."""

    dry_run: bool = True
    identifiers: (
        Annotated[
            list[Identifier], doc("Names, emails, numbers to search for.", maxItems=MAX_IDENTIFIERS)
        ]
        | None
    ) = None
    confirm_ids: (
        Annotated[list[Uuid], doc("Ids the dry run found by identifier.", maxItems=MAX_CONFIRM_IDS)]
        | None
    ) = None
    cascade: Literal["derived", "none"] = "derived"


class DryRun(msgspec.Struct):
    """What an erasure would reach; nothing changed."""

    subject: str
    events: list[Reached]
    count: int


class Erased(msgspec.Struct):
    """The real run's answer: the receipt (as stored, signed) and the ids deleted."""

    receipt_id: str
    receipt: receipts.Signed
    deleted_ids: list[str]


class Asker(msgspec.Struct, frozen=True):
    """Who asked: the key id ("admin" for the admin key) and the request's id."""

    key_id: str
    request_id: str | None = None


def to_reach(subject: str, body: EraseIn) -> Reach:
    """The request checked: 400 naming the field for a bad subject, identifier or id."""
    confirm = body.confirm_ids or []
    if len(confirm) > MAX_CONFIRM_IDS:
        raise InvalidRequest(f"confirm_ids may hold at most {MAX_CONFIRM_IDS} ids")
    for i, value in enumerate(confirm):
        try:
            event_id(value)
        except InvalidRequest:
            raise InvalidRequest(f"confirm_ids[{i}] is not an event id (a UUID)") from None
    return Reach(
        subject=check_subject(subject),
        identifiers=check_identifiers(body.identifiers),
        confirm_ids=tuple(event_id(v) for v in confirm),
        cascade=body.cascade == "derived",
    )


async def dry_run(engine: Engine, tenant_id: str, q: Reach) -> DryRun:
    """Every event the erasure would reach and why; an unknown subject reaches nothing."""
    found = await engine.read(
        tenant_id, lambda t: t.snapshot_read(lambda r: reach(r, q, t.keyword))
    )
    return DryRun(subject=q.subject, events=found, count=len(found))


async def erase(engine: Engine, tenant_id: str, q: Reach, asker: Asker) -> Erased:
    """Delete everything the request reaches in one write, purge once, scan, sign and keep
    the receipt. Before anything is deleted: confirm_ids must be identifier matches, no legal
    hold may keep any of the events (else 409 legal_hold), and the disk must hold a purge (else
    503); nothing is done then."""
    started = time.time_ns() // 1000
    found = await dry_run(engine, tenant_id, q)
    matched = {f.event_id for f in found.events if IDENTIFIER in f.reasons}
    for i, confirmed in enumerate(q.confirm_ids):
        if confirmed not in matched:
            raise InvalidRequest(
                f"confirm_ids[{i}] is not an event the identifiers found; confirm only ids "
                "the dry run listed with the reason identifier"
            )
    hold_reader = engine.holds

    def holds() -> Sequence[Hold]:  # read on the writer as the delete runs, not when asked
        return () if hold_reader is None else hold_reader(tenant_id)

    async with engine.tenant(tenant_id) as t:
        with full_disk_as(NO_ROOM):
            await anyio.to_thread.run_sync(check_room, t)
        deleted = await asyncio.wrap_future(t.submit_delete_found(lambda r: doomed(r, q, holds())))
    with full_disk_as(PURGE_NO_ROOM):
        await engine.purge(tenant_id)
    scanned = await engine.read(tenant_id, lambda t: _scan(t, q, deleted))
    receipt = receipts.Receipt(
        receipt_id=uuid.uuid4().hex,
        request_id=asker.request_id or "",
        tenant_id=tenant_id,
        subject_sha256=receipts.digest(q.subject),
        identifiers_sha256=[receipts.digest(i) for i in q.identifiers],
        key_id=asker.key_id,
        started_at=started,
        completed_at=time.time_ns() // 1000,
        event_ids=deleted,
        counts=_counts(found.events, deleted),
        stores_purged=STORES if deleted else [],
        scan_identifiers=scanned[0],
        scan_event_ids=scanned[1],
        clean=not any(f.found_in for f in (*scanned[0], *scanned[1])),
        copies_before=receipts.copies_before(engine.settings.data_dir, tenant_id, started),
    )
    data_dir = engine.settings.data_dir
    signed = await anyio.to_thread.run_sync(receipts.sign, data_dir, receipt)
    await anyio.to_thread.run_sync(receipts.store, data_dir, signed)
    return Erased(receipt_id=receipt.receipt_id, receipt=signed, deleted_ids=deleted)


def _scan(
    t: Tenant, q: Reach, deleted: list[str]
) -> tuple[list[receipts.Found], list[receipts.Found]]:
    """Where the tenant's files still hold each identifier, and each erased event's id."""
    needles = [*q.identifiers, *deleted]
    in_files, in_log = t.snapshot_read(lambda r: tenant_holding(t.root, r, needles, deleted))
    idents = [receipts.Found(receipts.digest(i), in_files.get(i, [])) for i in q.identifiers]
    ids = [
        receipts.Found(e, sorted({*in_files.get(e, []), *(f"log:{d}" for d in in_log[e])}))
        for e in deleted
    ]
    return idents, ids


def _counts(found: list[Reached], deleted: list[str]) -> dict[str, int]:
    """The deleted events by their first reason (subject, then identifier, then derived);
    one tagged or derived meanwhile (not in the dry run) counts as the delete found it."""
    why = {f.event_id: f.reasons for f in found}
    counts = {SUBJECT: 0, IDENTIFIER: 0, DERIVED: 0}
    for e in deleted:
        reasons = why.get(e, [DERIVED])
        first = next(r for r in (SUBJECT, IDENTIFIER, DERIVED) if r in reasons or r == DERIVED)
        counts[first] += 1
    return counts


# -- the access export ------------------------------------------------------------------------


def read_records(root: Path) -> Callable[[set[str]], Iterator[bytes]]:
    """The recorded reads of a tenant's events (docs/audit.md), as export lines
    `{"type": "read", "seq", "ts", "key_id", "door", "route", "request_id", "purpose",
    "event_ids"}`, each naming only the subject's events it read."""

    def of(event_ids: set[str]) -> Iterator[bytes]:
        for found in reads_of_events(root, sorted(event_ids)):
            read = msgspec.structs.asdict(found.read)
            read["event_ids"] = [e for e in found.read.event_ids if e in event_ids]
            yield msgspec.json.encode({"type": "read", "seq": found.seq, **read}) + b"\n"

    return of


def access_lines(
    t: Tenant, tenant_id: str, subject: str, exported: list[str] | None = None
) -> list[bytes]:
    """The access export of one subject, from one snapshot (400 for a subject that cannot be
    one); the ids of its events go to `exported` if given (the read audit's record)."""
    subject = check_subject(subject)
    reads = read_records(t.root)
    return t.snapshot_read(
        lambda r: list(
            subject_lines(r, tenant_id, subject, default_dim=t.dim, reads=reads, exported=exported)
        )
    )
