"""The answers of the API as typed values (msgspec Structs), decoded straight from the JSON.

Fields the server leaves out read as None, an empty list or False; fields a newer server adds
are ignored, so a client keeps working against a server that says more.
"""

from __future__ import annotations

from typing import Any

import msgspec

Properties = dict[str, Any]


class Health(msgspec.Struct, frozen=True):
    """GET /health."""

    service: str
    status: str
    version: str


class KeySpace(msgspec.Struct, frozen=True):
    """The calling key's tenant's vector space, as whoami shows it (docs/api.md)."""

    made_by: str  # "server", "client", or "none" while no event has a vector
    model: str | None = None
    dim: int | None = None
    server_embeds: bool = False  # the server makes its vectors: recall by text is hybrid
    unembedded: int = 0  # events awaiting their server vector


class WhoAmI(msgspec.Struct, frozen=True):
    """GET /v1/whoami: the calling key and its tenant's vector space; in local mode key_id is
    "local"."""

    tenant_id: str
    key_id: str
    scopes: list[str]
    expires_at: int | None = None
    requests_per_minute: int | None = None  # the key's own rate; None: the server's default
    vector_space: KeySpace | None = None


class Appended(msgspec.Struct, frozen=True):
    """An append's answer: the id, ids that named no event, and whether it was a replay.

    `idempotency_key` is the key the append was sent with (the client makes one when none is
    given): sending the same event with it again, even from another process, stores nothing.
    """

    event_id: str
    unlinked: list[str] = []
    replayed: bool = False
    idempotency_key: str | None = None


class BatchAppended(msgspec.Struct, frozen=True):
    """A batch's answer: the events' ids in the order sent, the ids their links named that named
    no event, and the positions of the events that were replays.

    `idempotency_keys` are the keys the events were sent with, in order (the client makes one
    for each event that has none): sending the batch, or any of its events alone, again with
    them stores nothing.
    """

    event_ids: list[str]
    unlinked: list[str] = []
    replayed: list[int] = []
    idempotency_keys: list[str] = []


class Event(msgspec.Struct, frozen=True):
    """An event as GET returns it; listings leave out `embedding`, `current` and `superseded_by`."""

    event_id: str
    kind: str
    ts: int
    text: str | None = None
    properties: Properties = {}
    embedding: list[float] | None = None
    embedding_model: str | None = None
    supersedes: list[str] = []
    valid_from: int | None = None
    valid_until: int | None = None
    current: bool | None = None
    superseded_by: list[str] | None = None
    subjects: list[str] = []


class EventPage(msgspec.Struct, frozen=True):
    """One page of a listing, newest first, and the cursor of the next (None on the last)."""

    events: list[Event]
    next_cursor: str | None = None


class Hit(msgspec.Struct, frozen=True):
    """One recall hit: ranked (score > 0) or reached by the walk (`via`, `hop`)."""

    event_id: str
    kind: str
    ts: int
    text: str | None
    properties: Properties
    score: float
    via: str | None = None
    hop: int | None = None
    replaces: list[str] = []
    keyword_rank: int | None = None
    vector_rank: int | None = None
    arm_ranks: dict[str, int] = {}  # with explain: the other arms that returned it, by name
    subjects: list[str] = []


class Walk(msgspec.Struct, frozen=True):
    """What the walk reached within hops, how many it returned, and the ids it left out."""

    reached: int
    returned: int
    omitted: list[str] = []


class Withheld(msgspec.Struct, frozen=True):
    """Events current state kept out of a recall, by reason."""

    superseded: int = 0
    expired: int = 0
    not_yet_valid: int = 0


class FocusPerson(msgspec.Struct, frozen=True):
    """A person a recall's text names, as the tenant holds them (`property` = `value`)."""

    property: str
    value: str


class FocusWindow(msgspec.Struct, frozen=True):
    """A time window a recall's text names: from_ <= ts < until, in µs."""

    from_: int = msgspec.field(name="from")
    until: int


class RecallFocus(msgspec.Struct, frozen=True):
    """With explain: the people and dates a recall's text names and whether it asks when."""

    people: list[FocusPerson] = []
    dates: list[FocusWindow] = []
    asks_when: bool = False


class RecallResult(msgspec.Struct, frozen=True):
    """POST /v1/memory/recall: ranked hits then walked ones; `walk` only when hops > 0,
    `focus` only with explain when the text named someone, a date, or asked when."""

    hits: list[Hit]
    walk: Walk | None = None
    withheld: Withheld | None = None
    focus: RecallFocus | None = None


class CypherResult(msgspec.Struct, frozen=True):
    """POST /v1/memory/cypher: the column names and one list per row."""

    columns: list[str]
    rows: list[list[Any]]


class Deleted(msgspec.Struct, frozen=True):
    """A delete's answer; `purge_pending` (with `detail`) when a purge asked for must wait."""

    deleted: bool
    purged: bool
    deleted_ids: list[str] = []
    purge_pending: bool = False
    detail: str | None = None


class WouldDelete(msgspec.Struct, frozen=True):
    """A dry run's answer: what the delete would remove, the event first."""

    would_delete: list[str]


# -- export (docs/api.md, Export format) --------------------------------------------------------


class ExportHeader(msgspec.Struct, frozen=True, tag="header", tag_field="type"):
    """An export's first line: the tenant, its vector space, when it was taken, how many events."""

    format: str
    version: int
    tenant_id: str
    embedding_dim: int
    embedding_model: str | None
    exported_at: int
    events: int


class ExportLinks(msgspec.Struct, frozen=True):
    """An exported event's links to earlier events, each list in link order."""

    SOURCE_FROM: list[str] = []
    SUPERSEDES: list[str] = []


class ExportIdempotency(msgspec.Struct, frozen=True):
    """The record an Idempotency-Key left: the first body's SHA-256 (hex) and its unlinked ids."""

    body_hash: str
    unlinked: list[str] = []


class ExportEvent(msgspec.Struct, frozen=True, tag="event", tag_field="type"):
    """One live event of an export, every field the log keeps.

    `properties` are decoded (from `properties_text` when the line carries them so); the bytes
    as the client sent them are in the line itself (`export_lines`).
    """

    event_id: str
    kind: str
    ts: int
    text: str | None = None
    embedding: list[float] | None = None
    embedding_model: str | None = None
    supersedes: list[str] = []
    valid_from: int | None = None
    valid_until: int | None = None
    properties: Properties | None = None
    properties_text: str | None = None
    subjects: list[str] = []
    links: ExportLinks = ExportLinks()
    idempotency: ExportIdempotency | None = None


class ExportDeletedKey(msgspec.Struct, frozen=True, tag="idempotency", tag_field="type"):
    """The Idempotency-Key record of an event deleted since the append (ids and a hash only)."""

    event_id: str
    body_hash: str
    unlinked: list[str] = []


class ExportEnd(msgspec.Struct, frozen=True, tag="end", tag_field="type"):
    """An export's last line: the counts of event and idempotency lines, the SHA-256 of the rest."""

    events: int
    idempotency: int
    sha256: str


ExportLine = ExportHeader | ExportEvent | ExportDeletedKey | ExportEnd


# -- admin -------------------------------------------------------------------------------------


class Tenant(msgspec.Struct, frozen=True):
    """A tenant; `created_at` (µs) in listings, `node` in a cluster."""

    tenant_id: str
    name: str
    created_at: int | None = None
    node: str | None = None


class Limits(msgspec.Struct, frozen=True):
    """A tenant's limits: live events, their bytes, the memory it may hold open (None: no limit)."""

    max_events: int | None = None
    max_bytes: int | None = None
    max_memory: int | None = None


class KeyCounts(msgspec.Struct, frozen=True):
    """A tenant's keys by status."""

    active: int = 0
    revoked: int = 0
    expired: int = 0


class EventCounts(msgspec.Struct, frozen=True):
    """Live events, and deleted ones whose bytes await the next purge."""

    live: int
    deleted: int


class Bytes(msgspec.Struct, frozen=True):
    """The live events' bytes (what max_bytes counts) and the files on disk by part."""

    live: int
    log: int
    keyword: int
    vectors: int
    total: int


class VectorCounts(msgspec.Struct, frozen=True):
    """Vectors in the HNSW graph, and acknowledged ones not in it yet."""

    graph: int
    pending: int


class VectorSpace(msgspec.Struct, frozen=True):
    """The tenant's embedding dimension, model and metric (None before its first vector)."""

    dim: int | None = None
    model: str | None = None
    metric: str | None = None


class Usage(msgspec.Struct, frozen=True):
    """What a tenant uses, from counters and file sizes (docs/auth.md)."""

    open: bool | None
    events: EventCounts
    bytes: Bytes
    vectors: VectorCounts
    vector_space: VectorSpace
    last_write: int | None = None
    memory: int | None = None


class TenantShown(msgspec.Struct, frozen=True):
    """GET or PATCH /v1/admin/tenants/{id}: the tenant, its own limits (None: none of its own),
    the limits in force (its own, else the server's defaults), its keys and its usage."""

    tenant_id: str
    name: str
    created_at: int
    limits: Limits
    keys: KeyCounts
    usage: Usage
    max_events: int | None = None
    max_bytes: int | None = None
    max_memory: int | None = None
    node: str | None = None


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """A legal hold on a tenant (subject None) or on one data subject's events: while it stands
    no retention run, erasure or delete removes what it keeps."""

    hold_id: str
    tenant_id: str
    reason: str
    subject: str | None = None
    placed_at: int
    placed_by: str


class HoldList(msgspec.Struct, frozen=True):
    """GET /v1/admin/tenants/{id}/holds: the holds standing, oldest first."""

    holds: list[Hold]


class TenantRetention(msgspec.Struct, frozen=True, kw_only=True):
    """GET /v1/memory/retention: the tenant's own windows (None: none of its own), the
    retention in force with what comes due and the last run, and the legal holds standing."""

    tenant_id: str
    retention: dict[str, int] | None
    retention_state: dict[str, Any]
    holds: list[Hold]


class HoldLifted(msgspec.Struct, frozen=True):
    """A hold lifted: what it kept may be deleted again."""

    hold_id: str
    tenant_id: str
    lifted: bool


class TenantList(msgspec.Struct, frozen=True):
    """GET /v1/admin/tenants."""

    tenants: list[Tenant]


class TenantDeleted(msgspec.Struct, frozen=True):
    """A deleted tenant: the keys revoked, and whether its directory was erased."""

    tenant_id: str
    deleted: bool
    revoked_keys: list[str]
    erased: bool


class IssuedKey(msgspec.Struct, frozen=True):
    """A new key; `api_key` is its secret, shown in this answer and never again."""

    key_id: str
    api_key: str
    tenant_id: str
    name: str
    scopes: list[str]
    expires_at: int | None = None
    requests_per_minute: int | None = None
    require_purpose: bool = False


class Key(msgspec.Struct, frozen=True):
    """A key as listings show it: no secret; `status` is active, expired or revoked."""

    key_id: str
    prefix: str
    tenant_id: str
    name: str
    scopes: list[str]
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    status: str = "active"
    requests_per_minute: int | None = None
    require_purpose: bool = False


class KeyList(msgspec.Struct, frozen=True):
    """GET /v1/admin/keys."""

    keys: list[Key]


class AuditEntry(msgspec.Struct, frozen=True):
    """One admin action: who, what, when, on which tenant or key; never a secret."""

    seq: int
    ts: int
    actor: str
    action: str
    tenant_id: str | None = None
    key_id: str | None = None
    detail: dict[str, Any] = {}


class Read(msgspec.Struct, frozen=True):
    """One read of events: when (µs), which key, through which door and route or tool, its
    request id, its purpose, the ids of the events it returned (docs/audit.md)."""

    ts: int
    key_id: str
    door: str
    route: str
    request_id: str
    purpose: str | None
    event_ids: list[str]


class ReadsPage(msgspec.Struct, frozen=True):
    """One page of read records, oldest first, and the cursor of the next (None on the last)."""

    reads: list[Read]
    next_cursor: str | None = None


class AuditPage(msgspec.Struct, frozen=True):
    """One page of the audit log, oldest first, and the cursor of the next (None on the last)."""

    entries: list[AuditEntry]
    next_cursor: str | None = None


class SubjectEvent(msgspec.Struct, frozen=True):
    """One event an erasure by subject reaches, and why: subject, derived, identifier."""

    event_id: str
    kind: str
    ts: int
    reasons: list[str]


class SignedReceipt(msgspec.Struct, frozen=True):
    """A receipt (an erasure's or a retention run's) as the server signed it (docs/erasure.md, "The receipt"); check the
    file's bytes with `memspine-admin receipt verify`."""

    receipt: dict[str, Any]
    algorithm: str
    public_key: str
    signature: str


class SubjectErasure(msgspec.Struct, frozen=True):
    """POST /v1/memory/subjects/{subject}/erase: a dry run's `subject`, `events` and `count`,
    or a real run's `receipt_id`, `receipt` and `deleted_ids`."""

    subject: str | None = None
    events: list[SubjectEvent] = []
    count: int = 0
    receipt_id: str | None = None
    receipt: SignedReceipt | None = None
    deleted_ids: list[str] = []


class ReceiptList(msgspec.Struct, frozen=True):
    """The tenant's receipts (erasures and retention runs, each named by its `type`), newest
    first, without their signatures."""

    receipts: list[dict[str, Any]]


class ReceiptKey(msgspec.Struct, frozen=True):
    """The public key that signs receipts."""

    algorithm: str
    public_key: str
    key_id: str


class SubjectErasures(msgspec.Struct, frozen=True):
    """The admin erasure across tenants: a real run's receipts or a dry run's lists."""

    receipts: list[SubjectErasure] = []
    dry_runs: list[SubjectErasure] = []
    tenants: list[str] = []
