"""The blocking clients: `Memspine` for one tenant's key, `MemspineAdmin` for the admin key."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import msgspec

from memspine.client import models as m
from memspine.client import paging, routes
from memspine.client.export import ExportCheck, broken_off
from memspine.client.retry import Attempts, Retry
from memspine.client.routes import Call, Limit, Scalar

T = TypeVar("T")


class _Client:
    """One key against one server over an httpx connection pool; sends Calls with retries.

    `retry` says how often and how long to retry (memspine/client/retry.py; `NEVER` sends
    once), `time_check=False` sends times before 2000 as they are (docs/api.md),
    `transport` replaces httpx's (an in-process app, a proxy).
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retry: Retry | None = None,
        time_check: bool = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry if retry is not None else Retry()
        self._http = httpx.Client(
            base_url=self.url,
            headers=routes.session_headers(api_key, time_check=time_check, extra=headers),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def send(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        """Send a call, again while memspine/client/retry.py allows; its successful answer
        (with `stream`, its body still to read: the caller closes it)."""
        attempts = Attempts.of(self.retry, call)
        while True:
            try:
                response = self._http.send(call.request(self._http), stream=stream)
                if response.is_error:
                    response.read()  # its error body (read already unless streamed), then closed
            except httpx.TransportError as exc:
                wait = attempts.failed(exc)
            else:
                answered = attempts.answered(response)
                if answered is None:
                    return response
                wait = answered
            time.sleep(wait)

    def _run(self, call: Call[T]) -> T:
        return call.result(self.send(call))


class Memspine(_Client):
    """A tenant's memory through one API key (in local mode, the tenant id).

    Every method is one route of docs/api.md and returns its answer as a Struct of
    memspine/client/models.py; an error answer raises its class of memspine/client/errors.py.
    """

    def health(self) -> m.Health:
        """The server's name, status and version."""
        return self._run(routes.health())

    def whoami(self) -> m.WhoAmI:
        """This key's tenant, key id, scopes and expiry."""
        return self._run(routes.whoami())

    def append(
        self,
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
    ) -> m.Appended:
        """Append one event, under `idempotency_key` or a new one, so a retry never stores twice."""
        body = routes.event(
            kind,
            text,
            ts=ts,
            embedding=embedding,
            embedding_model=embedding_model,
            properties=properties,
            source_event_ids=source_event_ids,
            supersedes=supersedes,
            valid_from=valid_from,
            valid_until=valid_until,
            idempotency_key=idempotency_key,
            subjects=subjects,
        )
        return self._run(routes.append(body))

    def append_batch(
        self, events: Sequence[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> m.BatchAppended:
        """Append up to 1,000 events (`memspine.client.event(...)` each) all or none, every one
        under an Idempotency-Key (its own, else `idempotency_key/<index>`, else a new one)."""
        return self._run(routes.append_batch(events, idempotency_key))

    def get(self, event_id: str) -> m.Event:
        """One event with its current state (NotFound if unknown, deleted or another tenant's)."""
        return self._run(routes.get(event_id))

    def list_events(
        self,
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
    ) -> m.EventPage:
        """One page of events, newest first; `filter` is equality on filterable properties."""
        return self._run(
            routes.list_events(
                kind=kind,
                since=since,
                until=until,
                limit=limit,
                cursor=cursor,
                filter=filter,
                current=current,
                as_of=as_of,
                subject=subject,
            )
        )

    def iter_events(
        self,
        *,
        kind: str | None = None,
        since: int | None = None,
        until: int | None = None,
        filter: Mapping[str, Scalar] | None = None,
        current: bool | None = None,
        as_of: int | None = None,
        page_size: int = 100,
    ) -> Iterator[m.Event]:
        """Every matching event, newest first, a page of `page_size` at a time."""
        pages = paging.event_pages(
            kind=kind,
            since=since,
            until=until,
            filter=filter,
            current=current,
            as_of=as_of,
            page_size=page_size,
        )
        while (call := pages.next()) is not None:
            yield from pages.take(self._run(call))

    def export_lines(self) -> Iterator[bytes]:
        """The tenant's export (docs/api.md, Export format) line by line as sent, newline
        included, the end line last; BrokenExport when what came is not a whole export."""
        check = ExportCheck()
        for chunk in self._export(check):
            yield from check.lines(chunk)
        check.finish()

    def iter_export(self) -> Iterator[m.ExportLine]:
        """The tenant's export as Structs: header, events in append order, deleted events'
        Idempotency-Key records, and the end once checked (BrokenExport if it does not match)."""
        check = ExportCheck()
        for chunk in self._export(check):
            yield from check.records(chunk)
        check.finish()

    def _export(self, check: ExportCheck) -> Iterator[bytes]:
        response = self.send(routes.export(), stream=True)
        try:
            yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise broken_off(check, exc) from exc
        finally:
            response.close()

    def recall(
        self,
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
    ) -> m.RecallResult:
        """Recall by words, by an embedding, or both (fused), with an optional walk of `hops`."""
        return self._run(
            routes.recall(
                text,
                embedding=embedding,
                embedding_model=embedding_model,
                kind=kind,
                k=k,
                hops=hops,
                filter=filter,
                current=current,
                as_of=as_of,
                explain=explain,
                wait_for_vectors=wait_for_vectors,
            )
        )

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> m.CypherResult:
        """A read-only Cypher query over the tenant."""
        return self._run(routes.cypher(query, params))

    def reads(self, **filters: Any) -> m.ReadsPage:
        """One page of the tenant's read records, for a key with the audit scope: `event_id`,
        `key_id`, `since`, `until`, `cursor`, `limit` as GET /v1/memory/audit/reads takes them."""
        return self._run(routes.reads(**filters))

    def delete(self, event_id: str, *, cascade: bool = False, purge: bool = False) -> m.Deleted:
        """Delete an event (with `cascade`, what derives from it too; with `purge`, wait until
        its bytes left the disk)."""
        return self._run(routes.delete(event_id, cascade=cascade, purge=purge))

    def would_delete(self, event_id: str, *, cascade: bool = False) -> m.WouldDelete:
        """What `delete` would remove, the event first; deletes nothing."""
        return self._run(routes.would_delete(event_id, cascade=cascade))

    def erase_subject(
        self,
        subject: str,
        *,
        dry_run: bool = True,
        identifiers: Sequence[str] | None = None,
        confirm_ids: Sequence[str] | None = None,
        cascade: str | None = None,
    ) -> m.SubjectErasure:
        """Erase everything about a subject (docs/erasure.md): a dry run unless dry_run=False,
        then one delete, one purge and a signed receipt."""
        call = routes.erase_subject(
            subject,
            dry_run=dry_run,
            identifiers=identifiers,
            confirm_ids=confirm_ids,
            cascade=cascade,
        )
        return self._run(call)

    def receipts(self) -> m.ReceiptList:
        """The tenant's receipts (erasures and retention runs), newest first."""
        return self._run(routes.list_receipts())

    def receipt(self, receipt_id: str) -> m.SignedReceipt:
        """One signed receipt."""
        return self._run(routes.get_receipt(receipt_id))

    def retention(self) -> m.TenantRetention:
        """The tenant's retention windows, what comes due, its last run and its legal holds."""
        return self._run(routes.tenant_retention())

    def receipt_key(self) -> m.ReceiptKey:
        """The public key that signs receipts."""
        return self._run(routes.receipt_key())


class MemspineAdmin(_Client):
    """The admin routes (tenants, keys, audit) through MEMSPINE_ADMIN_KEY."""

    def create_tenant(self, name: str, *, tenant_id: str | None = None) -> m.Tenant:
        """Create a tenant, under `tenant_id` (a UUIDv4) if given (Conflict if the name or id
        is in use)."""
        return self._run(routes.create_tenant(name, tenant_id))

    def get_tenant(self, tenant_id: str) -> m.TenantShown:
        """One tenant: its record, its own limits and those in force, its keys, its usage."""
        return self._run(routes.get_tenant(tenant_id))

    def set_tenant_limits(
        self,
        tenant_id: str,
        *,
        max_events: Limit = msgspec.UNSET,
        max_bytes: Limit = msgspec.UNSET,
        max_memory: Limit = msgspec.UNSET,
    ) -> m.TenantShown:
        """Set a tenant's own limits (None removes one; one not given stays); the tenant after."""
        return self._run(
            routes.set_tenant_limits(
                tenant_id, max_events=max_events, max_bytes=max_bytes, max_memory=max_memory
            )
        )

    def list_tenants(self) -> list[m.Tenant]:
        """Every tenant, oldest first."""
        return self._run(routes.list_tenants()).tenants

    def delete_tenant(self, tenant_id: str) -> m.TenantDeleted:
        """Delete a tenant: revoke its keys, then erase its directory."""
        return self._run(routes.delete_tenant(tenant_id))

    def place_hold(self, tenant_id: str, reason: str, subject: str | None = None) -> m.Hold:
        """Place a legal hold on a tenant, or on one data subject's events (docs/erasure.md)."""
        return self._run(routes.place_hold(tenant_id, reason, subject))

    def list_holds(self, tenant_id: str) -> m.HoldList:
        """The tenant's legal holds, oldest first."""
        return self._run(routes.list_holds(tenant_id))

    def lift_hold(self, tenant_id: str, hold_id: str) -> m.HoldLifted:
        """Lift a legal hold: retention, erasure and deletes reach what it kept again."""
        return self._run(routes.lift_hold(tenant_id, hold_id))

    def create_key(
        self,
        tenant_id: str,
        name: str,
        *,
        scopes: Sequence[str] | None = None,
        ttl_secs: int | None = None,
        requests_per_minute: int | None = None,
        require_purpose: bool | None = None,
    ) -> m.IssuedKey:
        """Issue a key (read and write unless `scopes` says; at most `requests_per_minute` if
        given, else the server's default); its secret is in this answer only."""
        return self._run(
            routes.create_key(
                tenant_id,
                name,
                scopes=scopes,
                ttl_secs=ttl_secs,
                requests_per_minute=requests_per_minute,
                require_purpose=require_purpose,
            )
        )

    def tenant_reads(self, tenant_id: str, **filters: Any) -> m.ReadsPage:
        """One page of a tenant's read records (the filters of `Memspine.reads`)."""
        return self._run(routes.reads(tenant_id=tenant_id, **filters))

    def list_keys(self, tenant_id: str | None = None) -> list[m.Key]:
        """Every key, or one tenant's; never a secret."""
        return self._run(routes.list_keys(tenant_id)).keys

    def revoke_key(self, key_id: str) -> m.Key:
        """Revoke a key (its id, or the smk_live_<id> prefix), effective on the next request."""
        return self._run(routes.revoke_key(key_id))

    def erase_subject_everywhere(
        self,
        subject: str,
        *,
        dry_run: bool = True,
        identifiers: Sequence[str] | None = None,
        confirm_ids: Sequence[str] | None = None,
        cascade: str | None = None,
    ) -> m.SubjectErasures:
        """Erase a subject in every tenant of the server (a dry run unless dry_run=False)."""
        call = routes.erase_subject_everywhere(
            subject,
            dry_run=dry_run,
            identifiers=identifiers,
            confirm_ids=confirm_ids,
            cascade=cascade,
        )
        return self._run(call)

    def audit(
        self, *, limit: int | None = None, cursor: str | None = None, tenant_id: str | None = None
    ) -> m.AuditPage:
        """One page of the admin audit log, oldest first."""
        return self._run(routes.audit(limit=limit, cursor=cursor, tenant_id=tenant_id))

    def iter_audit(
        self, *, tenant_id: str | None = None, page_size: int = 100
    ) -> Iterator[m.AuditEntry]:
        """Every audit entry, oldest first, a page at a time."""
        pages = paging.audit_pages(tenant_id=tenant_id, page_size=page_size)
        while (call := pages.next()) is not None:
            yield from pages.take(self._run(call))
