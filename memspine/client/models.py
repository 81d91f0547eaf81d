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


class WhoAmI(msgspec.Struct, frozen=True):
    """GET /v1/whoami: the calling key; in local mode key_id is "local"."""

    tenant_id: str
    key_id: str
    scopes: list[str]
    expires_at: int | None = None


class Appended(msgspec.Struct, frozen=True):
    """An append's answer: the id, ids that named no event, and whether it was a replay.

    `idempotency_key` is the key the append was sent with (the client makes one when none is
    given): sending the same event with it again, even from another process, stores nothing.
    """

    event_id: str
    unlinked: list[str] = []
    replayed: bool = False
    idempotency_key: str | None = None


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


class RecallResult(msgspec.Struct, frozen=True):
    """POST /v1/memory/recall: ranked hits then walked ones; `walk` only when hops > 0."""

    hits: list[Hit]
    walk: Walk | None = None
    withheld: Withheld | None = None


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


# -- admin -------------------------------------------------------------------------------------


class Tenant(msgspec.Struct, frozen=True):
    """A tenant; `created_at` (µs) in listings, `node` in a cluster."""

    tenant_id: str
    name: str
    created_at: int | None = None
    node: str | None = None


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


class AuditPage(msgspec.Struct, frozen=True):
    """One page of the audit log, oldest first, and the cursor of the next (None on the last)."""

    entries: list[AuditEntry]
    next_cursor: str | None = None
