"""Every route the clients call, as a `Call`: method, path, query, body, headers, how its answer
decodes, and whether sending it twice is the same as once. The sync and async clients send
these and nothing else, so a route is described once for both."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from memspine import __version__
from memspine.client import models as m
from memspine.client.errors import UnexpectedAnswer

T = TypeVar("T")
Scalar = bool | int | float | str
IDEMPOTENCY_KEY = "Idempotency-Key"
TIME_CHECK = "Memspine-Time-Check"
_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    type: type[T]
    params: dict[str, str] | None = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    resend: bool = False  # the server takes a second copy as the same request
    on_conflict: bool = False  # a 409 means the same Idempotency-Key is still being written
    finish: Callable[[T, httpx.Response], T] | None = None

    def request_headers(self) -> dict[str, str]:
        """This call's own headers, with the body's type when it has one."""
        if self.body is None:
            return self.headers
        return {"Content-Type": "application/json", **self.headers}

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request, with the client's base URL and session headers."""
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            content=self.body,
            headers=self.request_headers(),
        )

    def result(self, response: httpx.Response) -> T:
        """The answer decoded into this call's type (UnexpectedAnswer if it is not that)."""
        try:
            value = msgspec.json.decode(response.content, type=self.type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UnexpectedAnswer(
                f"the answer to {self.method} {self.path} is not what the memspine API sends: {exc}",
                status=response.status_code,
                request_id=response.headers.get("x-request-id"),
            ) from None
        return self.finish(value, response) if self.finish is not None else value


def session_headers(
    token: str, *, time_check: bool = True, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The headers every request of a client carries: its key, a User-Agent, and
    `Memspine-Time-Check: off` when times before 2000 are meant (docs/api.md, Conventions)."""
    headers = {
        "Authorization": f"Bearer {token}",
        "User-Agent": f"memspine-client/{__version__}",
    }
    if not time_check:
        headers[TIME_CHECK] = "off"
    headers.update(extra or {})
    return headers


def _read(method: str, path: str, type_: type[T], **kw: Any) -> Call[T]:
    return Call(method, path, type_, resend=True, **kw)


def _json(value: Any) -> bytes:
    return _ENCODER.encode(value)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _scalar(value: Scalar) -> str:
    """A query-string value: booleans as true/false, numbers as JSON writes them."""
    if isinstance(value, bool):
        return _flag(value)
    return value if isinstance(value, str) else _json(value).decode()


def _vector(values: Sequence[float] | None) -> list[float] | None:
    """An embedding as a list (numpy arrays included, through their tolist)."""
    if values is None:
        return None
    tolist = getattr(values, "tolist", None)
    return list(tolist() if callable(tolist) else values)


def event_path(event_id: str) -> str:
    """/v1/memory/event/ID: a UUID as is, anything else quoted so it cannot leave the route."""
    try:
        segment = str(uuid.UUID(event_id))
    except ValueError:
        segment = quote(event_id, safe="")
    return f"/v1/memory/event/{segment}"


def _present(**fields: Any) -> dict[str, Any]:
    """The fields given: None is left out, so the server's default applies."""
    return {k: v for k, v in fields.items() if v is not None}


# -- tenant routes -----------------------------------------------------------------------------


def health() -> Call[m.Health]:
    """GET /health."""
    return _read("GET", "/health", m.Health)


def whoami() -> Call[m.WhoAmI]:
    """GET /v1/whoami."""
    return _read("GET", "/v1/whoami", m.WhoAmI)


def _appended(key: str) -> Callable[[m.Appended, httpx.Response], m.Appended]:
    def finish(value: m.Appended, response: httpx.Response) -> m.Appended:
        replayed = response.headers.get("idempotent-replayed") == "true"
        return msgspec.structs.replace(value, replayed=replayed, idempotency_key=key)

    return finish


def new_idempotency_key() -> str:
    """A fresh Idempotency-Key: random, so two appends of one body are two events."""
    return str(uuid.uuid4())


def event(
    kind: str,
    text: str | None = None,
    *,
    ts: int | None = None,
    embedding: Sequence[float] | None = None,
    embedding_model: str | None = None,
    properties: Mapping[str, Any] | None = None,
    source_event_ids: Sequence[str] | None = None,
    supersedes: Sequence[str] | None = None,
    valid_from: int | None = None,
    valid_until: int | None = None,
    idempotency_key: str | None = None,
    subjects: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One event's JSON object, as `append` and each event of `append_batch` send it:
    `source_event_ids` goes into properties, where the API reads it; in a batch, "$N" there or
    in `supersedes` names the batch's event N, and `idempotency_key` is the event's own."""
    props = dict(properties) if properties is not None else None
    if source_event_ids is not None:
        if props is not None and "source_event_ids" in props:
            raise ValueError("give source_event_ids as an argument or in properties, not both")
        props = {**(props or {}), "source_event_ids": list(source_event_ids)}
    return _present(
        kind=kind,
        ts=ts,
        text=text,
        embedding=_vector(embedding),
        embedding_model=embedding_model,
        properties=props,
        supersedes=list(supersedes) if supersedes is not None else None,
        valid_from=valid_from,
        valid_until=valid_until,
        idempotency_key=idempotency_key,
        subjects=list(subjects) if subjects is not None else None,
    )


def append(body: Mapping[str, Any], idempotency_key: str | None = None) -> Call[m.Appended]:
    """POST /v1/memory/event, always under an Idempotency-Key: the body's `idempotency_key`
    (sent as the header), else `idempotency_key`, else a new one."""
    fields = dict(body)
    own = fields.pop("idempotency_key", None)
    key = own if own is not None else idempotency_key
    key = key if key is not None else new_idempotency_key()
    return Call(
        "POST",
        "/v1/memory/event",
        m.Appended,
        body=_json(fields),
        headers={IDEMPOTENCY_KEY: key},
        resend=True,
        on_conflict=True,
        finish=_appended(key),
    )


BATCH_LIMIT = 1000  # events in one POST /v1/memory/events (docs/api.md)


def _batch_appended(
    keys: list[str],
) -> Callable[[m.BatchAppended, httpx.Response], m.BatchAppended]:
    def finish(value: m.BatchAppended, response: httpx.Response) -> m.BatchAppended:
        return msgspec.structs.replace(value, idempotency_keys=keys)

    return finish


def append_batch(
    events: Sequence[Mapping[str, Any]], idempotency_key: str | None = None
) -> Call[m.BatchAppended]:
    """POST /v1/memory/events: every event under an Idempotency-Key, so a resent batch replays
    whole: its own `idempotency_key`, else `<idempotency_key>/<index>` (the server's rule for
    the header, docs/api.md), else a new random one."""
    if not 1 <= len(events) <= BATCH_LIMIT:
        raise ValueError(f"a batch holds 1 to {BATCH_LIMIT} events, not {len(events)}")
    items: list[dict[str, Any]] = []
    keys: list[str] = []
    for i, given in enumerate(events):
        item = dict(given)
        key = item.get("idempotency_key")
        if key is None:
            key = new_idempotency_key() if idempotency_key is None else f"{idempotency_key}/{i}"
            if idempotency_key is None:
                item["idempotency_key"] = key
        if item.get("embedding") is not None:
            item["embedding"] = _vector(item["embedding"])
        items.append(item)
        keys.append(str(key))
    headers = {IDEMPOTENCY_KEY: idempotency_key} if idempotency_key is not None else {}
    return Call(
        "POST",
        "/v1/memory/events",
        m.BatchAppended,
        body=_json({"events": items}),
        headers=headers,
        resend=True,
        on_conflict=True,
        finish=_batch_appended(keys),
    )


def export() -> Call[m.ExportEnd]:
    """GET /v1/memory/export: NDJSON, read as a stream (memspine/client/export.py checks it);
    `type` is what its last line decodes to."""
    return _read("GET", "/v1/memory/export", m.ExportEnd)


def _erasure(
    dry_run: bool,
    identifiers: Sequence[str] | None,
    confirm_ids: Sequence[str] | None,
    cascade: str | None,
) -> bytes:
    return _json(
        _present(
            dry_run=dry_run,
            identifiers=list(identifiers) if identifiers is not None else None,
            confirm_ids=list(confirm_ids) if confirm_ids is not None else None,
            cascade=cascade,
        )
    )


def erase_subject(
    subject: str,
    *,
    dry_run: bool = True,
    identifiers: Sequence[str] | None = None,
    confirm_ids: Sequence[str] | None = None,
    cascade: str | None = None,
) -> Call[m.SubjectErasure]:
    """POST /v1/memory/subjects/{subject}/erase: a dry run unless dry_run=False (then never
    sent twice: a second run would find nothing and sign an empty receipt)."""
    path = f"/v1/memory/subjects/{_segment(subject)}/erase"
    body = _erasure(dry_run, identifiers, confirm_ids, cascade)
    if dry_run:
        return _read("POST", path, m.SubjectErasure, body=body)
    return Call("POST", path, m.SubjectErasure, body=body)


def export_subject(subject: str) -> Call[m.ExportEnd]:
    """GET /v1/memory/subjects/{subject}/export: NDJSON as the export's, read as a stream."""
    return _read("GET", f"/v1/memory/subjects/{_segment(subject)}/export", m.ExportEnd)


def list_receipts() -> Call[m.ReceiptList]:
    """GET /v1/memory/receipts."""
    return _read("GET", "/v1/memory/receipts", m.ReceiptList)


def get_receipt(receipt_id: str) -> Call[m.SignedReceipt]:
    """GET /v1/memory/receipts/{receipt_id}: the signed receipt."""
    return _read("GET", f"/v1/memory/receipts/{_segment(receipt_id)}", m.SignedReceipt)


def tenant_retention() -> Call[m.TenantRetention]:
    """GET /v1/memory/retention: the tenant's windows, what comes due, its last run, its holds."""
    return _read("GET", "/v1/memory/retention", m.TenantRetention)


def receipt_key() -> Call[m.ReceiptKey]:
    """GET /v1/receipts/key: the public key that signs receipts."""
    return _read("GET", "/v1/receipts/key", m.ReceiptKey)


def get(event_id: str) -> Call[m.Event]:
    """GET /v1/memory/event/{id}."""
    return _read("GET", event_path(event_id), m.Event)


def list_events(
    *,
    kind: str | None = None,
    since: int | None = None,
    until: int | None = None,
    limit: int | None = None,
    cursor: str | None = None,
    filter: Mapping[str, Scalar] | None = None,
    current: bool | None = None,
    as_of: int | None = None,
    subject: str | None = None,
) -> Call[m.EventPage]:
    """GET /v1/memory/events; `filter` becomes prop.NAME=VALUE parameters."""
    given = _present(
        kind=kind,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
        as_of=as_of,
        subject=subject,
    )
    params = {k: str(v) for k, v in given.items()}
    if current is not None:
        params["current"] = _flag(current)
    for name, value in (filter or {}).items():
        params[f"prop.{name}"] = _scalar(value)
    return _read("GET", "/v1/memory/events", m.EventPage, params=params)


def recall(
    text: str | None = None,
    *,
    embedding: Sequence[float] | None = None,
    embedding_model: str | None = None,
    kind: str | None = None,
    k: int | None = None,
    hops: int | None = None,
    filter: Mapping[str, Scalar] | None = None,
    current: bool | None = None,
    as_of: int | None = None,
    explain: bool | None = None,
    wait_for_vectors: bool | None = None,
) -> Call[m.RecallResult]:
    """POST /v1/memory/recall (a read: sending it twice is harmless)."""
    body = _present(
        text=text,
        embedding=_vector(embedding),
        embedding_model=embedding_model,
        kind=kind,
        k=k,
        hops=hops,
        filter=dict(filter) if filter is not None else None,
        current=current,
        as_of=as_of,
        explain=explain,
        wait_for_vectors=wait_for_vectors,
    )
    return _read("POST", "/v1/memory/recall", m.RecallResult, body=_json(body))


def cypher(query: str, params: Mapping[str, Any] | None = None) -> Call[m.CypherResult]:
    """POST /v1/memory/cypher (read-only queries only)."""
    body = _present(query=query, params=dict(params) if params is not None else None)
    return _read("POST", "/v1/memory/cypher", m.CypherResult, body=_json(body))


def reads(
    *,
    event_id: str | None = None,
    key_id: str | None = None,
    subject: str | None = None,
    since: int | None = None,
    until: int | None = None,
    cursor: str | None = None,
    limit: int | None = None,
    tenant_id: str | None = None,
) -> Call[m.ReadsPage]:
    """GET /v1/memory/audit/reads (an audit key), or with `tenant_id` the admin's
    GET /v1/admin/tenants/{id}/reads."""
    given = _present(
        event_id=event_id,
        key_id=key_id,
        subject=subject,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )
    params = {k: str(v) for k, v in given.items()}
    path = "/v1/memory/audit/reads" if tenant_id is None else f"{TENANTS}/{tenant_id}/reads"
    return _read("GET", path, m.ReadsPage, params=params)


def _delete_params(cascade: bool, purge: bool, dry_run: bool) -> dict[str, str]:
    params = {"cascade": "derived"} if cascade else {}
    if purge:
        params["purge"] = "true"
    if dry_run:
        params["dry_run"] = "true"
    return params


def delete(event_id: str, *, cascade: bool = False, purge: bool = False) -> Call[m.Deleted]:
    """DELETE /v1/memory/event/{id}; sent again only if it never left (a second copy of a
    delete that was served would be answered 404)."""
    params = _delete_params(cascade, purge, dry_run=False)
    return Call("DELETE", event_path(event_id), m.Deleted, params=params)


def would_delete(event_id: str, *, cascade: bool = False) -> Call[m.WouldDelete]:
    """DELETE /v1/memory/event/{id}?dry_run=true: what a delete would remove; changes nothing."""
    params = _delete_params(cascade, purge=False, dry_run=True)
    return _read("DELETE", event_path(event_id), m.WouldDelete, params=params)


# -- admin routes ------------------------------------------------------------------------------

TENANTS = "/v1/admin/tenants"
KEYS = "/v1/admin/keys"


def _segment(value: str) -> str:
    return quote(value, safe="")


def create_tenant(name: str, tenant_id: str | None = None) -> Call[m.Tenant]:
    """POST /v1/admin/tenants, under a chosen id if given (a tenant moved from another server
    keeps its own); not sent again once it may have arrived (it would be a 409)."""
    body = _present(name=name, tenant_id=tenant_id)
    return Call("POST", TENANTS, m.Tenant, body=_json(body))


def list_tenants() -> Call[m.TenantList]:
    """GET /v1/admin/tenants."""
    return _read("GET", TENANTS, m.TenantList)


def get_tenant(tenant_id: str) -> Call[m.TenantShown]:
    """GET /v1/admin/tenants/{id}: the record, limits, keys and usage."""
    return _read("GET", f"{TENANTS}/{_segment(tenant_id)}", m.TenantShown)


Limit = int | None | msgspec.UnsetType


def set_tenant_limits(
    tenant_id: str,
    *,
    max_events: Limit = msgspec.UNSET,
    max_bytes: Limit = msgspec.UNSET,
    max_memory: Limit = msgspec.UNSET,
) -> Call[m.TenantShown]:
    """PATCH /v1/admin/tenants/{id}: a limit given is set, None removes it, one left out stays;
    setting the same limits twice is the same as once, so it may be resent."""
    given = {"max_events": max_events, "max_bytes": max_bytes, "max_memory": max_memory}
    body = {k: v for k, v in given.items() if v is not msgspec.UNSET}
    return _read("PATCH", f"{TENANTS}/{_segment(tenant_id)}", m.TenantShown, body=_json(body))


def delete_tenant(tenant_id: str) -> Call[m.TenantDeleted]:
    """DELETE /v1/admin/tenants/{id}: revokes its keys and erases its directory."""
    return Call("DELETE", f"{TENANTS}/{_segment(tenant_id)}", m.TenantDeleted)


def place_hold(tenant_id: str, reason: str, subject: str | None = None) -> Call[m.Hold]:
    """POST /v1/admin/tenants/{id}/holds; never sent twice, which would place a second hold."""
    body = _present(reason=reason, subject=subject)
    return Call("POST", f"{TENANTS}/{_segment(tenant_id)}/holds", m.Hold, body=_json(body))


def list_holds(tenant_id: str) -> Call[m.HoldList]:
    """GET /v1/admin/tenants/{id}/holds, oldest first."""
    return _read("GET", f"{TENANTS}/{_segment(tenant_id)}/holds", m.HoldList)


def lift_hold(tenant_id: str, hold_id: str) -> Call[m.HoldLifted]:
    """DELETE /v1/admin/tenants/{id}/holds/{hold_id}."""
    path = f"{TENANTS}/{_segment(tenant_id)}/holds/{_segment(hold_id)}"
    return Call("DELETE", path, m.HoldLifted)


def create_key(
    tenant_id: str,
    name: str,
    *,
    scopes: Sequence[str] | None = None,
    ttl_secs: int | None = None,
    requests_per_minute: int | None = None,
    require_purpose: bool | None = None,
) -> Call[m.IssuedKey]:
    """POST /v1/admin/keys; never sent twice, which would issue a second key."""
    body = _present(
        tenant_id=tenant_id,
        name=name,
        scopes=list(scopes) if scopes is not None else None,
        ttl_secs=ttl_secs,
        requests_per_minute=requests_per_minute,
        require_purpose=require_purpose,
    )
    return Call("POST", KEYS, m.IssuedKey, body=_json(body))


def list_keys(tenant_id: str | None = None) -> Call[m.KeyList]:
    """GET /v1/admin/keys, every key or one tenant's."""
    params = _present(tenant_id=tenant_id)
    return _read("GET", KEYS, m.KeyList, params=params)


def revoke_key(key_id: str) -> Call[m.Key]:
    """DELETE /v1/admin/keys/{key_id}; revoking twice changes nothing, so it may be resent."""
    return _read("DELETE", f"{KEYS}/{_segment(key_id)}", m.Key)


def erase_subject_everywhere(
    subject: str,
    *,
    dry_run: bool = True,
    identifiers: Sequence[str] | None = None,
    confirm_ids: Sequence[str] | None = None,
    cascade: str | None = None,
) -> Call[m.SubjectErasures]:
    """POST /v1/admin/subjects/{subject}/erase: the erasure in every tenant of the server."""
    path = f"/v1/admin/subjects/{_segment(subject)}/erase"
    body = _erasure(dry_run, identifiers, confirm_ids, cascade)
    if dry_run:
        return _read("POST", path, m.SubjectErasures, body=body)
    return Call("POST", path, m.SubjectErasures, body=body)


def audit(
    *, limit: int | None = None, cursor: str | None = None, tenant_id: str | None = None
) -> Call[m.AuditPage]:
    """GET /v1/admin/audit, oldest first."""
    params = {
        k: str(v) for k, v in _present(limit=limit, cursor=cursor, tenant_id=tenant_id).items()
    }
    return _read("GET", "/v1/admin/audit", m.AuditPage, params=params)
