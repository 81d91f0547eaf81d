"""The /v1/admin routes: tenants, keys and the audit log, behind MEMSPINE_ADMIN_KEY."""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable
from typing import Annotated, Any

import anyio.to_thread
import msgspec

from memspine.engine import Engine
from memspine.pipeline import ADMIN, Call, Operation, Outcome, Query, Reply
from memspine.queryparams import int_range, text
from memspine.schemas import doc
from memspine_admin import keys
from memspine_admin.control import MAX_AUDIT_LIMIT, check_limits
from memspine_admin.plane import ControlPlane
from memspine_admin.records import (
    DEFAULT_SCOPES,
    LIMITS,
    MAX_NAME_BYTES,
    MAX_QUOTA,
    MAX_REQUESTS_PER_MINUTE,
    MAX_TTL_SECS,
    SCOPES,
    AuditEntry,
    HoldRecord,
    KeyCounts,
    KeyInfo,
    TenantRecord,
    now_us,
)
from memspine_admin.retention import MAX_DAYS, MAX_KINDS, typo_warnings
from storage import KIND_PATTERN, MAX_KIND_BYTES, Quota, RetentionView, TenantUsage
from storage.errors import InvalidRequest, NotFound

JSON = "application/json"
ACTOR = "admin-api"
DEFAULT_AUDIT_LIMIT = 100
_SEQ = struct.Struct(">Q")


# memspine_admin/records.check_name: 1-128 bytes, no control characters, no whitespace at
# either end (the document's pattern covers the control characters of Latin-1).
_EDGE, _INNER = r"[^\s\x00-\x1f\x7f-\x9f]", r"[^\x00-\x1f\x7f-\x9f]"
Name = Annotated[
    str,
    doc(
        f"1-{MAX_NAME_BYTES} bytes, no control characters, no whitespace at either end.",
        minLength=1,
        maxLength=MAX_NAME_BYTES,
        pattern=f"^{_EDGE}(?:{_INNER}*{_EDGE})?$",
    ),
]
Scopes = Annotated[
    list[Annotated[str, doc(enum=list(SCOPES))]],
    doc("Null or absent: read and write. Repeats count once.", minItems=1),
]
Ttl = Annotated[int, doc("Seconds until the key expires.", minimum=1, maximum=MAX_TTL_SECS)]
Rate = Annotated[
    int,
    doc(
        "Requests a minute this key may make (a token bucket in each server); null or absent: "
        "the server's default (MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE).",
        minimum=1,
        maximum=MAX_REQUESTS_PER_MINUTE,
    ),
]
Limit = Annotated[
    int,
    doc(
        "A positive whole number; null removes the tenant's own limit.",
        minimum=1,
        maximum=MAX_QUOTA,
    ),
]


ChosenId = Annotated[
    str,
    doc(
        "A UUIDv4 to give the tenant (a tenant moved here keeps its id); absent: a new one.",
        pattern="^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$",
    ),
]


class TenantIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/tenants."""

    name: Name
    tenant_id: ChosenId | None = None


class TenantCreated(msgspec.Struct):
    """The answer to a tenant creation: exactly these two fields."""

    tenant_id: str
    name: str


class KeyIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/keys."""

    tenant_id: str
    name: Name
    scopes: Scopes | None = None  # null or absent: read and write
    ttl_secs: Ttl | None = None
    requests_per_minute: Rate | None = None
    require_purpose: bool = False  # its reads need a Memspine-Purpose header (docs/audit.md)


class KeyIssued(msgspec.Struct):
    """A new key with its plaintext `api_key`: shown in this response and never again."""

    key_id: str
    api_key: str
    tenant_id: str
    name: str
    scopes: list[str]
    expires_at: int | None
    requests_per_minute: int | None
    require_purpose: bool = False


Days = Annotated[int, doc("Days the kind's events are kept.", minimum=1, maximum=MAX_DAYS)]
Windows = Annotated[
    dict[str, Days | None],
    doc(
        'Days an event of each kind is kept ("*": every kind not named); null removes a '
        "kind's window, a kind not given keeps its own. At most 64 kinds.",
        maxProperties=MAX_KINDS,
        propertyNames={"minLength": 1, "maxLength": MAX_KIND_BYTES, "pattern": KIND_PATTERN},
    ),
]


class TenantLimitsIn(msgspec.Struct, forbid_unknown_fields=True):
    """PATCH /v1/admin/tenants/{id}: a limit given is set (null removes it), one absent stays;
    so do the retention windows named."""

    max_events: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_bytes: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_memory: Limit | msgspec.UnsetType | None = msgspec.UNSET
    retention: Windows | msgspec.UnsetType | None = msgspec.UNSET  # null: none of its own


class TenantShown(msgspec.Struct):
    """One tenant: its record, its own limits (null: none of its own, the server's default
    applies), the limits in force, its keys and what it uses; in a cluster, the node that
    holds it."""

    tenant_id: str
    name: str
    created_at: int
    max_events: int | None
    max_bytes: int | None
    max_memory: int | None
    limits: Quota  # in force: its own, else the server's default (null: none)
    keys: KeyCounts
    usage: TenantUsage
    retention: dict[str, int] | None  # its own windows (null: none of its own)
    retention_state: RetentionView | None  # null in a server without retention (the CLI's view)
    holds: list[HoldRecord]
    node: str | msgspec.UnsetType = msgspec.UNSET
    warnings: list[str] | msgspec.UnsetType = msgspec.UNSET  # a PATCH's windows that look mistyped


class TenantDeleted(msgspec.Struct):
    """A deleted tenant: how many keys were revoked and whether its directory was erased."""

    tenant_id: str
    deleted: bool
    revoked_keys: list[str]
    erased: bool


class TenantList(msgspec.Struct):
    """GET /v1/admin/tenants."""

    tenants: list[TenantRecord]


class KeyOut(msgspec.Struct):
    """A key as listings show it: no secret, no hash."""

    key_id: str
    prefix: str
    tenant_id: str
    name: str
    scopes: list[str]
    created_at: int
    expires_at: int | None
    revoked_at: int | None
    status: str
    requests_per_minute: int | None
    require_purpose: bool = False


class KeyList(msgspec.Struct):
    """GET /v1/admin/keys."""

    keys: list[KeyOut]


class AuditPage(msgspec.Struct):
    """GET /v1/admin/audit: one page and the cursor of the next (null on the last)."""

    entries: list[AuditEntry]
    next_cursor: str | None


def _key_out(info: KeyInfo, now: int) -> KeyOut:
    return KeyOut(
        key_id=info.key_id,
        prefix=f"smk_live_{info.key_id}",
        tenant_id=info.tenant_id,
        name=info.name,
        scopes=list(info.scopes),
        created_at=info.created_at,
        expires_at=info.expires_at,
        revoked_at=info.revoked_at,
        status=info.status(now),
        requests_per_minute=info.requests_per_minute,
        require_purpose=info.require_purpose,
    )


def encode_audit_cursor(seq: int) -> str:
    """An opaque, URL-safe cursor for the audit page after `seq`."""
    return base64.urlsafe_b64encode(_SEQ.pack(seq)).rstrip(b"=").decode()


def decode_audit_cursor(cursor: str) -> int:
    """The seq a cursor stands for; 400 if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        if len(raw) != _SEQ.size or encode_audit_cursor(_SEQ.unpack(raw)[0]) != cursor:
            raise ValueError(cursor)
    except (ValueError, binascii.Error):
        raise InvalidRequest(
            "cursor is not valid; pass next_cursor from a previous page unchanged"
        ) from None
    seq: int = _SEQ.unpack(raw)[0]
    return seq


def delete_tenant_everywhere(
    control: ControlPlane, engine: Engine, tenant_id: str
) -> TenantDeleted:
    """Revoke the tenant's keys and remove it, then close it in this server and erase its files."""
    revoked = control.delete_tenant(tenant_id, actor=ACTOR)
    erased = engine.erase_copy(tenant_id)  # no new request authenticates as the tenant now
    return TenantDeleted(tenant_id=tenant_id, deleted=True, revoked_keys=revoked, erased=erased)


def _control(call: Call) -> ControlPlane:
    assert call.control is not None  # the pipeline checked the admin key
    return call.control


async def _create_tenant(call: Call) -> Outcome:
    """Create a tenant; a name already in use is 409."""
    control, body = _control(call), call.body
    tenant = await anyio.to_thread.run_sync(
        lambda: control.create_tenant(body.name, actor=ACTOR, tenant_id=body.tenant_id)
    )
    return Outcome(201, TenantCreated(tenant_id=tenant.tenant_id, name=tenant.name))


async def _list_tenants(call: Call) -> Outcome:
    """Every tenant, oldest first."""
    tenants = await anyio.to_thread.run_sync(_control(call).list_tenants)
    return Outcome(200, TenantList(tenants))


def tenant_shown(
    record: TenantRecord,
    limits: Quota,
    keys: KeyCounts,
    usage: TenantUsage,
    retention: RetentionView | None = None,
    holds: list[HoldRecord] | None = None,
) -> TenantShown:
    """A tenant's record, its limits in force, its keys, its usage, its retention and holds, as
    GET and PATCH answer."""
    return TenantShown(
        tenant_id=record.tenant_id,
        name=record.name,
        created_at=record.created_at,
        max_events=record.max_events,
        max_bytes=record.max_bytes,
        max_memory=record.max_memory,
        limits=limits,
        keys=keys,
        usage=usage,
        retention=record.retention,
        retention_state=retention,
        holds=holds or [],
        node=record.node if record.node is not None else msgspec.UNSET,
    )


async def _show(call: Call, record: TenantRecord | None, named: Iterable[str] = ()) -> Outcome:
    if record is None:
        raise NotFound("no tenant with that id")
    services = call.services
    allowance = services.allowance
    limits = (
        allowance.effective(record)
        if allowance is not None
        else Quota(**{name: getattr(record, name) for name in LIMITS})
    )
    control = _control(call)
    keys = await anyio.to_thread.run_sync(control.list_keys, record.tenant_id)
    usage = await anyio.to_thread.run_sync(services.engine.usage_now, record.tenant_id)
    holds = await anyio.to_thread.run_sync(control.list_holds, record.tenant_id)
    retention = services.retention
    view = None if retention is None else await anyio.to_thread.run_sync(retention.view, record)
    shown = tenant_shown(record, limits, KeyCounts.of(keys, now_us()), usage, view, holds)
    warnings = typo_warnings(named, view.kinds if view is not None else [])
    if warnings:
        shown = msgspec.structs.replace(shown, warnings=warnings)
    return Outcome(200, shown)


async def _get_tenant(call: Call) -> Outcome:
    """One tenant with its limits and what it uses."""
    control = _control(call)
    record = await anyio.to_thread.run_sync(control.get_tenant, call.path["tenant_id"])
    return await _show(call, record)


async def _patch_tenant(call: Call) -> Outcome:
    """Set or remove a tenant's own limits; the answer is GET's (and {} changes nothing)."""
    control, body = _control(call), call.body
    tenant_id = call.path["tenant_id"]
    changes = {
        name: getattr(body, name) for name in LIMITS if getattr(body, name) is not msgspec.UNSET
    }
    windows = body.retention
    if not changes and windows is msgspec.UNSET:
        return await _get_tenant(call)
    if changes:
        check_limits(changes)  # before any write: a bad limit leaves the windows as they were
    record = None
    if windows is not msgspec.UNSET:
        record = await anyio.to_thread.run_sync(
            lambda: control.set_retention(tenant_id, windows, actor=ACTOR)
        )
    if changes:
        record = await anyio.to_thread.run_sync(
            lambda: control.set_tenant_limits(tenant_id, changes, actor=ACTOR)
        )
        if call.services.allowance is not None:  # in force for the tenant's next group commit
            await anyio.to_thread.run_sync(call.services.allowance.learn, record)
    given = windows if isinstance(windows, dict) else {}  # unset or null: no kind named
    named = [kind for kind, days in given.items() if days is not None]
    return await _show(call, record, named)


async def _delete_tenant(call: Call) -> Outcome:
    """Delete a tenant: revoke its keys, then erase its directory."""
    services = call.services
    result = await anyio.to_thread.run_sync(
        delete_tenant_everywhere,
        _control(call),
        services.engine,
        call.path["tenant_id"],
    )
    return Outcome(200, result)


async def _create_key(call: Call) -> Outcome:
    """Issue a key; the plaintext is in this response only."""
    control, body = _control(call), call.body
    issued = await anyio.to_thread.run_sync(
        lambda: control.create_key(
            body.tenant_id,
            body.name,
            DEFAULT_SCOPES if body.scopes is None else body.scopes,
            body.ttl_secs,
            actor=ACTOR,
            requests_per_minute=body.requests_per_minute,
            require_purpose=body.require_purpose,
        )
    )
    out = KeyIssued(
        key_id=issued.key_id,
        api_key=issued.api_key,
        tenant_id=issued.tenant_id,
        name=issued.name,
        scopes=list(issued.scopes),
        expires_at=issued.expires_at,
        requests_per_minute=issued.requests_per_minute,
        require_purpose=issued.require_purpose,
    )
    return Outcome(201, out)


async def _list_keys(call: Call) -> Outcome:
    """Every key, or one tenant's with ?tenant_id=; never a secret or a hash."""
    control = _control(call)
    infos = await anyio.to_thread.run_sync(control.list_keys, call.query.get("tenant_id"))
    now = control.now()
    return Outcome(200, KeyList([_key_out(info, now) for info in infos]))


async def _revoke_key(call: Call) -> Outcome:
    """Revoke a key, effective on the next request; revoking twice changes nothing."""
    control = _control(call)
    bare = keys.key_id_from(call.path["key_id"])  # the id, or smk_live_<id> as listings show it
    info = await anyio.to_thread.run_sync(lambda: control.revoke_key(bare, actor=ACTOR))
    return Outcome(200, _key_out(info, control.now()))


async def _audit(call: Call) -> Outcome:
    """The admin audit log, oldest first, paged with limit and cursor, optionally by tenant."""
    q, control = call.query, _control(call)
    limit = q.get("limit") or DEFAULT_AUDIT_LIMIT
    cursor = q.get("cursor")
    after = decode_audit_cursor(cursor) if cursor is not None else None
    tenant_id = q.get("tenant_id")
    entries, last = await anyio.to_thread.run_sync(
        lambda: control.audit(after, limit, tenant_id=tenant_id)
    )
    next_cursor = encode_audit_cursor(last) if last is not None else None
    return Outcome(200, AuditPage(entries, next_cursor))


TENANT_ID = Query("tenant_id", text, {"type": "string"}, "Only this tenant's.")
TENANTS = "/v1/admin/tenants"
KEYS = "/v1/admin/keys"


def _admin(name: str, method: str, path: str, run: Any, summary: str, **more: Any) -> Operation:
    return Operation(name, method, path, ADMIN, run, summary, tag="admin", **more)


OPERATIONS = (
    _admin(
        "create_tenant",
        "POST",
        TENANTS,
        _create_tenant,
        "Create a tenant",
        body=TenantIn,
        replies={201: Reply(TenantCreated, "The new tenant.")},
        errors=(413,),
    ),
    _admin(
        "list_tenants",
        "GET",
        TENANTS,
        _list_tenants,
        "Every tenant, oldest first",
        replies={200: Reply(TenantList, "The tenants.")},
    ),
    _admin(
        "get_tenant",
        "GET",
        TENANTS + "/{tenant_id:str}",
        _get_tenant,
        "One tenant: its record, its limits and what it uses",
        replies={200: Reply(TenantShown, "The tenant, its limits in force and its usage.")},
    ),
    _admin(
        "set_tenant_limits",
        "PATCH",
        TENANTS + "/{tenant_id:str}",
        _patch_tenant,
        "Set or remove a tenant's own max_events, max_bytes, max_memory and retention windows",
        body=TenantLimitsIn,
        replies={200: Reply(TenantShown, "The tenant with its new limits, as GET shows it.")},
        errors=(413,),
    ),
    _admin(
        "delete_tenant",
        "DELETE",
        TENANTS + "/{tenant_id:str}",
        _delete_tenant,
        "Delete a tenant: revoke its keys, then erase its directory",
        replies={200: Reply(TenantDeleted, "Deleted.")},
    ),
    _admin(
        "create_key",
        "POST",
        KEYS,
        _create_key,
        "Issue a key; the plaintext api_key is in this answer only",
        body=KeyIn,
        replies={201: Reply(KeyIssued, "The new key, with its secret.")},
        errors=(413,),
    ),
    _admin(
        "list_keys",
        "GET",
        KEYS,
        _list_keys,
        "Every key, or one tenant's; never a secret or a hash",
        query=(TENANT_ID,),
        replies={200: Reply(KeyList, "The keys.")},
    ),
    _admin(
        "revoke_key",
        "DELETE",
        KEYS + "/{key_id:str}",
        _revoke_key,
        "Revoke a key, effective on the next request",
        replies={200: Reply(KeyOut, "The revoked key.")},
    ),
    _admin(
        "audit",
        "GET",
        "/v1/admin/audit",
        _audit,
        "The admin audit log, oldest first, paged",
        query=(
            Query(
                "limit",
                int_range("limit", 1, MAX_AUDIT_LIMIT),
                {"type": "integer", "minimum": 1, "maximum": MAX_AUDIT_LIMIT, "default": 100},
                "Entries on one page.",
            ),
            Query(
                "cursor",
                text,
                # encode_audit_cursor: 8 bytes in 11 characters, the last one's low bits zero
                {"type": "string", "pattern": "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$"},
                "next_cursor of the previous page, unchanged.",
            ),
            TENANT_ID,
        ),
        replies={200: Reply(AuditPage, "One page, and the cursor of the next (null on the last).")},
    ),
)
