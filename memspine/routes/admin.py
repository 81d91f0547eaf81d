"""The /v1/admin routes: tenants, keys and the audit log, behind MEMSPINE_ADMIN_KEY."""

from __future__ import annotations

import base64
import binascii
import struct
from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from memspine.auth import admin_guard
from memspine.engine import Engine
from memspine.queryparams import check_params, int_param, one
from memspine.schemas import decode_body
from memspine_admin import keys
from memspine_admin.control import MAX_AUDIT_LIMIT, ControlDB, erase_tenant_dir
from memspine_admin.records import SCOPES, AuditEntry, KeyInfo
from storage.errors import InvalidRequest

JSON = "application/json"
ACTOR = "admin-api"
DEFAULT_AUDIT_LIMIT = 100
_SEQ = struct.Struct(">Q")


class TenantIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/tenants."""

    name: str


class TenantCreated(msgspec.Struct):
    """The answer to a tenant creation, exactly the seed's two fields."""

    tenant_id: str
    name: str


class KeyIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/keys."""

    tenant_id: str
    name: str
    scopes: list[str] | None = None  # null or absent: read and write
    ttl_secs: int | None = None


class KeyIssued(msgspec.Struct):
    """A new key with its plaintext `api_key`: shown in this response and never again."""

    key_id: str
    api_key: str
    tenant_id: str
    name: str
    scopes: list[str]
    expires_at: int | None


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


def _json(obj: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(obj), status_code=status, media_type=JSON)


def _control(request: Request[Any, Any, Any]) -> ControlDB:
    control: ControlDB = request.state.control  # set by admin_guard
    return control


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


@post("/v1/admin/tenants", guards=[admin_guard], status_code=201)
async def create_tenant(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Create a tenant; a name already in use is 409."""
    check_params(request, set())
    body = decode_body(await request.body(), TenantIn)
    control = _control(request)
    tenant = await anyio.to_thread.run_sync(lambda: control.create_tenant(body.name, actor=ACTOR))
    return _json(TenantCreated(tenant_id=tenant.tenant_id, name=tenant.name), 201)


@get("/v1/admin/tenants", guards=[admin_guard])
async def list_tenants(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every tenant, oldest first."""
    check_params(request, set())
    tenants = await anyio.to_thread.run_sync(_control(request).list_tenants)
    return _json({"tenants": tenants})


def delete_tenant_everywhere(
    control: ControlDB, engine: Engine, data_dir: Path, tenant_id: str
) -> dict[str, Any]:
    """Revoke the tenant's keys and remove it, then close it in this server and erase its files."""
    revoked = control.delete_tenant(tenant_id, actor=ACTOR)
    # No new request authenticates as the tenant from here on; exclusive() waits for the
    # requests already in flight and keeps the tenant closed while its directory goes.
    with engine.manager.exclusive(tenant_id):
        erased = erase_tenant_dir(data_dir, tenant_id)
    return {"tenant_id": tenant_id, "deleted": True, "revoked_keys": revoked, "erased": erased}


@delete("/v1/admin/tenants/{tenant_id:str}", guards=[admin_guard], status_code=200)
async def delete_tenant(
    request: Request[Any, Any, Any], state: State, tenant_id: FromPath[str]
) -> Response[bytes]:
    """Delete a tenant: revoke its keys, then erase its directory."""
    check_params(request, set())
    control = _control(request)
    engine: Engine = state.engine
    data_dir: Path = state.settings.data_dir
    result = await anyio.to_thread.run_sync(
        delete_tenant_everywhere, control, engine, data_dir, tenant_id
    )
    return _json(result)


@post("/v1/admin/keys", guards=[admin_guard], status_code=201)
async def create_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Issue a key; the plaintext is in this response only."""
    check_params(request, set())
    body = decode_body(await request.body(), KeyIn)
    control = _control(request)
    issued = await anyio.to_thread.run_sync(
        lambda: control.create_key(
            body.tenant_id,
            body.name,
            SCOPES if body.scopes is None else body.scopes,
            body.ttl_secs,
            actor=ACTOR,
        )
    )
    out = KeyIssued(
        key_id=issued.key_id,
        api_key=issued.api_key,
        tenant_id=issued.tenant_id,
        name=issued.name,
        scopes=list(issued.scopes),
        expires_at=issued.expires_at,
    )
    return _json(out, 201)


@get("/v1/admin/keys", guards=[admin_guard])
async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every key, or one tenant's with ?tenant_id=; never a secret or a hash."""
    check_params(request, {"tenant_id"})
    tenant_id = one(request, "tenant_id")
    control = _control(request)
    infos = await anyio.to_thread.run_sync(control.list_keys, tenant_id)
    now = control.now()
    return _json({"keys": [_key_out(info, now) for info in infos]})


@delete("/v1/admin/keys/{key_id:str}", guards=[admin_guard], status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> Response[bytes]:
    """Revoke a key, effective on the next request; revoking twice changes nothing."""
    check_params(request, set())
    control = _control(request)
    bare = keys.key_id_from(key_id)  # the id, or smk_live_<id> as listings show it
    info = await anyio.to_thread.run_sync(lambda: control.revoke_key(bare, actor=ACTOR))
    return _json(_key_out(info, control.now()))


@get("/v1/admin/audit", guards=[admin_guard])
async def audit(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The admin audit log, oldest first, paged with limit and cursor, optionally by tenant."""
    check_params(request, {"limit", "cursor", "tenant_id"})
    limit = int_param(request, "limit", 1, MAX_AUDIT_LIMIT) or DEFAULT_AUDIT_LIMIT
    cursor = one(request, "cursor")
    after = decode_audit_cursor(cursor) if cursor is not None else None
    tenant_id = one(request, "tenant_id")
    control = _control(request)
    entries, last = await anyio.to_thread.run_sync(
        lambda: control.audit(after, limit, tenant_id=tenant_id)
    )
    page: list[AuditEntry] = entries
    next_cursor = encode_audit_cursor(last) if last is not None else None
    return _json({"entries": page, "next_cursor": next_cursor})


ROUTES = [create_tenant, list_tenants, delete_tenant, create_key, list_keys, revoke_key, audit]
