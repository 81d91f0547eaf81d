"""The read records: GET /v1/memory/audit/reads (an audit key, its own tenant) and
GET /v1/admin/tenants/{id}/reads (the admin key, any tenant), the same parameters and answer."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import msgspec

from memspine.pipeline import ADMIN, AUDIT, Call, Operation, Outcome, Query, Reply, event_id
from memspine.queryparams import int_range, text
from memspine_admin.records import check_tenant_id
from storage import MAX_TS, Reach, Read, check_subject, reach, records
from storage.errors import InvalidRequest, NotFound

MAX_LIMIT = 1000


class ReadsPage(msgspec.Struct):
    """One page of read records, oldest first, and the cursor of the next (null on the last)."""

    reads: list[Read]
    next_cursor: str | None


class ReadFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What a page of read records is limited to."""

    event_id: str | None = None
    event_ids: frozenset[str] | None = None  # a subject's events (and those derived from them)
    key_id: str | None = None
    since: int | None = None
    until: int | None = None
    after: int = 0
    limit: int = 100

    def matches(self, r: Read) -> bool:
        """Whether a record is one the filter asks for."""
        return (
            (self.event_id is None or self.event_id in r.event_ids)
            and (self.event_ids is None or not self.event_ids.isdisjoint(r.event_ids))
            and (self.key_id is None or r.key_id == self.key_id)
            and (self.since is None or r.ts >= self.since)
            and (self.until is None or r.ts < self.until)
        )


def _cursor(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 19:
        raise InvalidRequest("cursor must be the next_cursor of the previous page, unchanged")
    return int(raw)


def read_filter(query: dict[str, Any], subject_ids: frozenset[str] | None) -> ReadFilter:
    """The query parameters as a filter (a subject given as the ids of its events)."""
    return ReadFilter(
        event_ids=subject_ids,
        event_id=query.get("event_id"),
        key_id=query.get("key_id"),
        since=query.get("since"),
        until=query.get("until"),
        after=query.get("cursor", 0),
        limit=query.get("limit", 100),
    )


async def reads_page(call: Call, tenant_id: str) -> Outcome:
    """One page of a tenant's read records (read from its file, off the event loop)."""
    engine = call.services.engine
    subject_ids = None
    if "subject" in call.query:  # what an access export of the subject holds
        q = Reach(subject=check_subject(call.query["subject"]))
        found = await engine.read(tenant_id, lambda t: t.snapshot_read(lambda r: reach(r, q)))
        subject_ids = frozenset(f.event_id for f in found)
    wanted = read_filter(call.query, subject_ids)
    root = engine.manager.path_of(tenant_id)

    def page() -> ReadsPage:
        found: list[Read] = []
        last = 0
        for f in records(root, wanted.after, naming=wanted.event_id):
            if not wanted.matches(f.read):
                continue
            if len(found) == wanted.limit:
                return ReadsPage(found, str(last))
            found.append(f.read)
            last = f.seq
        return ReadsPage(found, None)

    return Outcome(200, await anyio.to_thread.run_sync(page))


async def _own(call: Call) -> Outcome:
    return await reads_page(call, call.tenant_id)


async def _any(call: Call) -> Outcome:
    tenant_id = check_tenant_id(call.path["tenant_id"])
    control = call.control
    if (
        control is not None
        and await anyio.to_thread.run_sync(control.get_tenant, tenant_id) is None
    ):
        raise NotFound("no tenant with that id")
    return await reads_page(call, tenant_id)


TIME = {"type": "integer", "minimum": 0, "maximum": MAX_TS}
QUERY = (
    Query(
        "event_id",
        event_id,
        {"type": "string", "format": "uuid"},
        "Reads that returned this event.",
    ),
    Query("key_id", text, {"type": "string"}, "Reads made with this key."),
    Query(
        "subject",
        text,
        {"type": "string", "minLength": 1, "maxLength": 128},
        "Reads of this data subject's events and of those derived from them.",
    ),
    Query("since", int_range("since", 0, MAX_TS), TIME, "ts >= since (µs since the epoch)."),
    Query("until", int_range("until", 0, MAX_TS), TIME, "ts < until (µs since the epoch)."),
    Query(
        "cursor",
        _cursor,
        {"type": "string", "pattern": "^[0-9]{1,19}$"},
        "next_cursor of the previous page, unchanged.",
    ),
    Query(
        "limit",
        int_range("limit", 1, MAX_LIMIT),
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 100},
        "Records on one page.",
    ),
)
REPLIES = {200: Reply(ReadsPage, "One page of read records, oldest first.")}
DESCRIPTION = "Who read which events, when, through which door and why (docs/audit.md)."

OPERATIONS = (
    Operation(
        "audit_reads",
        "GET",
        "/v1/memory/audit/reads",
        AUDIT,
        _own,
        "The caller's tenant's read records (an audit key)",
        query=QUERY,
        replies=REPLIES,
        description=DESCRIPTION,
        tag="audit",
    ),
    Operation(
        "admin_tenant_reads",
        "GET",
        "/v1/admin/tenants/{tenant_id:str}/reads",
        ADMIN,
        _any,
        "A tenant's read records",
        query=QUERY,
        replies=REPLIES,
        errors=(404,),
        description=DESCRIPTION,
        tag="admin",
    ),
)
