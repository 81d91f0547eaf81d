"""The control database: tenants, API keys, the admin audit log and a generation counter (LMDB).

The embedded backend of memspine_admin/plane.py's ControlPlane; memspine_admin/control_pg.py
is the PostgreSQL one.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import lmdb
import msgspec
from argon2 import PasswordHasher

from memspine_admin import keys
from memspine_admin.issuing import KeyRequest
from memspine_admin.records import (
    DEFAULT_SCOPES,
    LIMITS,
    MAX_QUOTA,
    AuditEntry,
    HoldRecord,
    IssuedKey,
    KeyInfo,
    KeyRecord,
    ReadMark,
    TenantRecord,
    check_limit,
    check_name,
    check_tenant_id,
    now_us,
)
from memspine_admin.retention import (
    hold_audit,
    is_hold_id,
    merge_retention,
    new_hold,
    retention_audit,
)
from storage.errors import Conflict, InvalidRequest, LegalHold, NotFound
from storage.fsync import fsync_dir
from storage.tenants.directory import is_tenant_id

CONTROL_DIR = "_control"
SCHEMA_VERSION = 1
MAP_SIZE = 1 << 30  # sparse; every process must use the same value (see docs/admin.md)
MAX_AUDIT_LIMIT = 1000
NO_CONTROL_DB = "no control database: run memspine-admin init"

_U64 = struct.Struct(">Q")
_READ_MARKS = msgspec.msgpack.Decoder(list[ReadMark | None])
_READ_MARKS_ENC = msgspec.msgpack.Encoder()


class StoredTenant(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as the LMDB record holds it: TenantRecord's fields and its route (internal)."""

    tenant_id: str
    name: str
    created_at: int
    route: str | None = None  # None for a tenant made before routes, until its next key
    max_events: int | None = None
    max_bytes: int | None = None
    max_memory: int | None = None
    retention: dict[str, int] | None = None

    def tenant(self) -> TenantRecord:
        """What callers see."""
        return TenantRecord(
            tenant_id=self.tenant_id,
            name=self.name,
            created_at=self.created_at,
            max_events=self.max_events,
            max_bytes=self.max_bytes,
            max_memory=self.max_memory,
            retention=self.retention,
        )


def check_limits(limits: Mapping[str, object]) -> dict[str, int | None]:
    """The limits a change sets (records.LIMITS; None removes one), each checked."""
    unknown = sorted(set(limits) - set(LIMITS))
    if unknown:
        raise InvalidRequest(f"unknown limit {unknown[0]!r} (limits: {', '.join(LIMITS)})")
    if not limits:
        raise InvalidRequest(f"give at least one limit to set: {', '.join(LIMITS)}")
    return {name: check_limit(value, name, MAX_QUOTA) for name, value in limits.items()}


def control_path(data_dir: Path) -> Path:
    """Where the control database lives inside a data directory."""
    return Path(data_dir) / CONTROL_DIR


class ControlDB:
    """Tenants, keys, audit and generation in one LMDB environment; safe across processes.

    Open it once per process (LMDB's rule); the handle is safe to share between threads.
    """

    def __init__(
        self,
        env: lmdb.Environment,
        path: Path,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """Wrap an open environment; use ControlDB.open instead."""
        self.path = path
        self.hasher = hasher or keys.default_hasher()
        self.now: Callable[[], int] = clock or now_us
        self._env = env
        self._meta = env.open_db(b"meta", create=False)
        self._tenants = env.open_db(b"tenants", create=False)
        self._names = env.open_db(b"tenant_names", create=False)
        self._keys = env.open_db(b"keys", create=False)
        self._tenant_keys = env.open_db(b"tenant_keys", create=False)
        self._audit = env.open_db(b"audit", create=False)
        # Added after schema 1 shipped: made on first open, empty until tenants get routes.
        self._routes = env.open_db(b"tenant_routes")
        self._holds = env.open_db(b"holds")  # tenant_id/hold_id -> HoldRecord (made on first open)
        # Added with the read audit: each tenant's read chain marks (docs/audit.md).
        self._read_marks = env.open_db(b"read_marks")

    # -- lifecycle ---------------------------------------------------------------------------

    @staticmethod
    def exists(data_dir: Path) -> bool:
        """True if `memspine-admin init` has created the control database in `data_dir`."""
        return (control_path(data_dir) / "data.mdb").is_file()

    @classmethod
    def init(cls, data_dir: Path, *, actor: str) -> bool:
        """Create the control database unless it exists; True if this call created it."""
        data_dir = Path(data_dir)
        if cls.exists(data_dir):
            return False
        data_dir.mkdir(parents=True, exist_ok=True)
        # Build it under a temporary name and rename it into place, so no process ever
        # sees a half-made control database (the server decides its auth mode on exists()).
        tmp = data_dir / f".control-init-{uuid.uuid4().hex[:8]}"
        env = _open_env(tmp, create=True)
        try:
            with env.begin(write=True) as txn:
                for name in (
                    b"meta",
                    b"tenants",
                    b"tenant_names",
                    b"keys",
                    b"tenant_keys",
                    b"tenant_routes",
                    b"holds",
                ):
                    env.open_db(name, txn=txn)
                audit = env.open_db(b"audit", txn=txn)
                meta = env.open_db(b"meta", txn=txn)
                txn.put(b"schema", _U64.pack(SCHEMA_VERSION), db=meta)
                txn.put(b"generation", _U64.pack(1), db=meta)
                entry = AuditEntry(seq=1, ts=now_us(), actor=actor, action="control.init")
                txn.put(_U64.pack(1), msgspec.msgpack.encode(entry), db=audit)
            env.sync(True)
        finally:
            env.close()
        try:
            os.rename(tmp, control_path(data_dir))
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
            if cls.exists(data_dir):
                return False
            raise
        fsync_dir(data_dir)
        return True

    @classmethod
    def open(
        cls,
        data_dir: Path,
        *,
        create: bool = False,
        actor: str = "system",
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
    ) -> ControlDB:
        """Open the control database; create it if `create`, else raise Conflict if missing."""
        data_dir = Path(data_dir)
        if create:
            cls.init(data_dir, actor=actor)
        elif not cls.exists(data_dir):
            raise Conflict(NO_CONTROL_DB)
        path = control_path(data_dir)
        env = _open_env(path, create=False)
        env.reader_check()  # free reader slots left by a process that died mid-read
        db = cls(env, path, hasher=hasher, clock=clock)
        with db._env.begin(db=db._meta) as txn:
            raw = txn.get(b"schema")
        if raw is None or _U64.unpack(raw)[0] != SCHEMA_VERSION:
            db.close()
            raise Conflict("the control database has an unknown schema version")
        return db

    def close(self) -> None:
        """Close the environment."""
        self._env.close()

    def where(self) -> str:
        """The control database's directory."""
        return str(self.path)

    def __enter__(self) -> ControlDB:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- generation --------------------------------------------------------------------------

    def generation(self) -> int:
        """The counter bumped by every change to tenants or keys (one LMDB read)."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"generation")
        return _U64.unpack(raw)[0] if raw is not None else 0

    def _bump(self, txn: lmdb.Transaction) -> None:
        raw = txn.get(b"generation", db=self._meta)
        current = _U64.unpack(raw)[0] if raw is not None else 0
        txn.put(b"generation", _U64.pack(current + 1), db=self._meta)

    # -- read chain marks (docs/audit.md) ----------------------------------------------------

    def keep_read_mark(self, tenant_id: str, mark: ReadMark, *, cut: bool = False) -> None:
        """Record the head (or, with cut, the retention base) of a tenant's read chain."""
        with self._env.begin(write=True, db=self._read_marks) as txn:
            raw = txn.get(tenant_id.encode())
            marks: list[ReadMark | None] = (
                _READ_MARKS.decode(raw) if raw is not None else [None, None]
            )
            marks[1 if cut else 0] = mark
            txn.put(tenant_id.encode(), _READ_MARKS_ENC.encode(marks))

    def read_marks(self, tenant_id: str) -> tuple[ReadMark | None, ReadMark | None]:
        """The last head and the last cut recorded for a tenant's read chain (None: none)."""
        with self._env.begin(db=self._read_marks) as txn:
            raw = txn.get(tenant_id.encode())
        if raw is None:
            return None, None
        head, cut = _READ_MARKS.decode(raw)
        return head, cut

    # -- tenants -----------------------------------------------------------------------------

    def create_tenant(self, name: str, *, actor: str, tenant_id: str | None = None) -> TenantRecord:
        """Create a tenant, with the id given (a UUIDv4: a tenant moved here keeps its own) or
        a new one; Conflict (409) if a live tenant already has that name or that id."""
        name = check_name(name, "name")
        chosen = check_tenant_id(tenant_id) if tenant_id is not None else None
        with self._env.begin(write=True) as txn:
            existing = txn.get(name.encode(), db=self._names)
            if existing is not None:
                raise Conflict(f"a tenant named {name!r} already exists: {existing.decode()}")
            if chosen is not None and txn.get(chosen.encode(), db=self._tenants) is not None:
                raise Conflict(f"a tenant with id {chosen} already exists")
            tenant_id = chosen or str(uuid.uuid4())
            route = self._claim_route(txn, tenant_id)
            stored = StoredTenant(
                tenant_id=tenant_id, name=name, created_at=self.now(), route=route
            )
            tenant = stored.tenant()
            txn.put(name.encode(), tenant.tenant_id.encode(), db=self._names)
            txn.put(tenant.tenant_id.encode(), msgspec.msgpack.encode(stored), db=self._tenants)
            self._bump(txn)
            self._log(txn, actor, "tenant.create", tenant.tenant_id, None, {"name": name})
        return tenant

    def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        """The tenant with that id, or None."""
        if not is_tenant_id(tenant_id):
            return None
        stored = self._stored(tenant_id)
        return None if stored is None else stored.tenant()

    def tenant_route(self, tenant_id: str) -> str | None:
        """The tenant's route (the start of its key ids), None if unknown or not given yet."""
        stored = self._stored(tenant_id)
        return None if stored is None else stored.route

    def _stored(self, tenant_id: str) -> StoredTenant | None:
        if not is_tenant_id(tenant_id):
            return None
        with self._env.begin(db=self._tenants) as txn:
            raw = txn.get(tenant_id.encode())
        return None if raw is None else msgspec.msgpack.decode(raw, type=StoredTenant)

    def list_tenants(self) -> list[TenantRecord]:
        """Every tenant, oldest first."""
        with self._env.begin(db=self._tenants) as txn:
            tenants = [
                msgspec.msgpack.decode(v, type=StoredTenant).tenant() for _, v in txn.cursor()
            ]
        return sorted(tenants, key=lambda t: (t.created_at, t.tenant_id))

    def delete_tenant(self, tenant_id: str, *, actor: str) -> list[str]:
        """Delete a tenant and revoke its keys in one transaction; return the revoked key ids.

        The caller then erases the directory with `erase_tenant_dir` (after closing the tenant).
        """
        now = self.now()
        revoked: list[str] = []
        with self._env.begin(write=True) as txn:
            raw = txn.get(tenant_id.encode(), db=self._tenants) if is_tenant_id(tenant_id) else None
            if raw is None:
                raise NotFound("no tenant with that id")
            tenant = msgspec.msgpack.decode(raw, type=StoredTenant)
            held = self._holds_in(txn, tenant_id)
            if held:
                raise held_tenant(held[0])
            for record in self._tenant_key_records(txn, tenant_id):
                if record.revoked_at is None:
                    revoked_record = msgspec.structs.replace(record, revoked_at=now)
                    self._put_key(txn, revoked_record)
                    revoked.append(record.key_id)
            txn.delete(tenant_id.encode(), db=self._tenants)
            txn.delete(tenant.name.encode(), db=self._names)
            if tenant.route is not None:
                txn.delete(tenant.route.encode(), db=self._routes)
            txn.delete(tenant_id.encode(), db=self._read_marks)
            self._bump(txn)
            detail = {"name": tenant.name, "revoked_keys": revoked}
            self._log(txn, actor, "tenant.delete", tenant_id, None, detail)
        return revoked

    def set_tenant_limits(
        self, tenant_id: str, limits: dict[str, int | None], *, actor: str
    ) -> TenantRecord:
        """Set or remove (None) a tenant's own limits (records.LIMITS); the others stay."""
        changes = check_limits(limits)
        with self._env.begin(write=True) as txn:
            raw = txn.get(tenant_id.encode(), db=self._tenants) if is_tenant_id(tenant_id) else None
            if raw is None:
                raise NotFound("no tenant with that id")
            stored = msgspec.structs.replace(
                msgspec.msgpack.decode(raw, type=StoredTenant), **changes
            )
            txn.put(tenant_id.encode(), msgspec.msgpack.encode(stored), db=self._tenants)
            self._bump(txn)  # servers read a tenant's limits again on a new generation
            self._log(txn, actor, "tenant.limits", tenant_id, None, dict(changes))
        return stored.tenant()

    # -- retention and legal holds ------------------------------------------------------------

    def set_retention(
        self, tenant_id: str, changes: Mapping[str, object] | None, *, actor: str
    ) -> TenantRecord:
        """Set (days) or remove (None) a tenant's retention windows by kind; the others stay."""
        with self._env.begin(write=True) as txn:
            raw = txn.get(tenant_id.encode(), db=self._tenants) if is_tenant_id(tenant_id) else None
            if raw is None:
                raise NotFound("no tenant with that id")
            stored = msgspec.msgpack.decode(raw, type=StoredTenant)
            merged = merge_retention(stored.retention, changes)
            stored = msgspec.structs.replace(stored, retention=merged)
            txn.put(tenant_id.encode(), msgspec.msgpack.encode(stored), db=self._tenants)
            self._log(txn, actor, "tenant.retention", tenant_id, None, retention_audit(changes))
        return stored.tenant()

    def place_hold(
        self, tenant_id: str, reason: str, subject: str | None = None, *, actor: str
    ) -> HoldRecord:
        """Place a legal hold on a tenant, or on one subject's events of it."""
        hold = new_hold(tenant_id, reason, subject, actor=actor, now=self.now())
        with self._env.begin(write=True) as txn:
            if not is_tenant_id(tenant_id) or txn.get(tenant_id.encode(), db=self._tenants) is None:
                raise NotFound("no tenant with that id")
            txn.put(
                f"{tenant_id}/{hold.hold_id}".encode(), msgspec.msgpack.encode(hold), db=self._holds
            )
            self._log(txn, actor, "hold.place", tenant_id, None, hold_audit(hold))
        return hold

    def list_holds(self, tenant_id: str) -> list[HoldRecord]:
        """The tenant's holds, oldest first (none for an unknown tenant)."""
        if not is_tenant_id(tenant_id):
            return []
        with self._env.begin() as txn:
            return self._holds_in(txn, tenant_id)

    def lift_hold(self, tenant_id: str, hold_id: str, *, actor: str) -> HoldRecord:
        """Lift a hold: what it kept may be deleted again. NotFound for an unknown hold."""
        key = f"{tenant_id}/{hold_id}".encode()
        with self._env.begin(write=True) as txn:
            raw = txn.get(key, db=self._holds) if is_hold_id(hold_id) else None
            if raw is None or not is_tenant_id(tenant_id):
                raise NotFound("no hold with that id on this tenant")
            hold = msgspec.msgpack.decode(raw, type=HoldRecord)
            txn.delete(key, db=self._holds)
            self._log(txn, actor, "hold.lift", tenant_id, None, hold_audit(hold))
        return hold

    def _holds_in(self, txn: lmdb.Transaction, tenant_id: str) -> list[HoldRecord]:
        prefix = f"{tenant_id}/".encode()
        cursor = txn.cursor(db=self._holds)
        found = cursor.set_range(prefix)
        holds = []
        while found and bytes(cursor.key()).startswith(prefix):
            holds.append(msgspec.msgpack.decode(cursor.value(), type=HoldRecord))
            found = cursor.next()
        return sorted(holds, key=lambda h: (h.placed_at, h.hold_id))

    # -- keys --------------------------------------------------------------------------------

    def create_key(
        self,
        tenant_id: str,
        name: str,
        scopes: Iterable[str] = DEFAULT_SCOPES,
        ttl_secs: int | None = None,
        *,
        actor: str,
        requests_per_minute: int | None = None,
        require_purpose: bool = False,
    ) -> IssuedKey:
        """Issue a key for a tenant; the plaintext is in the result and nowhere else."""
        request = KeyRequest.check(name, scopes, ttl_secs, requests_per_minute, require_purpose)
        stored = self._stored(tenant_id)
        if stored is None:
            raise NotFound("no tenant with that id")  # before paying for argon2
        route = stored.route or self._give_route(tenant_id)
        draft = request.draft(tenant_id, route, self.hasher, self.now())
        with self._env.begin(write=True) as txn:
            raw = txn.get(tenant_id.encode(), db=self._tenants)
            if raw is None:
                raise NotFound("no tenant with that id")
            if msgspec.msgpack.decode(raw, type=StoredTenant).route != route:
                raise Conflict("the tenant changed while its key was made; try again")
            while txn.get(draft.key_id.encode(), db=self._keys) is not None:
                draft = draft.with_new_key_id()
            self._put_key(txn, draft.record())
            txn.put(f"{tenant_id}/{draft.key_id}".encode(), b"", db=self._tenant_keys)
            self._bump(txn)
            self._log(txn, actor, "key.create", tenant_id, draft.key_id, draft.audit_detail())
        return draft.issued()

    def get_key(self, key_id: str) -> KeyInfo | None:
        """The key with that id (no hash), or None."""
        record = self.get_key_record(key_id)
        return None if record is None else record.info()

    def get_key_record(self, key_id: str) -> KeyRecord | None:
        """The stored record, hash included: for the verifier only, never for display."""
        if not keys.is_key_id(key_id):
            return None
        with self._env.begin(db=self._keys) as txn:
            raw = txn.get(key_id.encode())
        return None if raw is None else msgspec.msgpack.decode(raw, type=KeyRecord)

    def list_keys(self, tenant_id: str | None = None) -> list[KeyInfo]:
        """Every key, or one tenant's (NotFound if the tenant is unknown), oldest first."""
        with self._env.begin() as txn:
            if tenant_id is None:
                records = [
                    msgspec.msgpack.decode(v, type=KeyRecord) for _, v in txn.cursor(db=self._keys)
                ]
            else:
                if (
                    not is_tenant_id(tenant_id)
                    or txn.get(tenant_id.encode(), db=self._tenants) is None
                ):
                    raise NotFound("no tenant with that id")
                records = list(self._tenant_key_records(txn, tenant_id))
        infos = [r.info() for r in records]
        return sorted(infos, key=lambda k: (k.created_at, k.key_id))

    def revoke_key(self, key_id: str, *, actor: str) -> KeyInfo:
        """Revoke a key (effective on the next request); revoking twice changes nothing."""
        if not keys.is_key_id(key_id):
            raise NotFound("no key with that id")
        with self._env.begin(write=True) as txn:
            raw = txn.get(key_id.encode(), db=self._keys)
            if raw is None:
                raise NotFound("no key with that id")
            record = msgspec.msgpack.decode(raw, type=KeyRecord)
            if record.revoked_at is not None:
                return record.info()
            record = msgspec.structs.replace(record, revoked_at=self.now())
            self._put_key(txn, record)
            self._bump(txn)
            self._log(txn, actor, "key.revoke", record.tenant_id, key_id, {"name": record.name})
        return record.info()

    def update_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        """Replace a key's hash if it is still `old_hash` (rehash after verify); True if done.

        Not an authorisation change, so neither the generation nor the audit log moves.
        """
        with self._env.begin(write=True) as txn:
            raw = txn.get(key_id.encode(), db=self._keys)
            if raw is None:
                return False
            record = msgspec.msgpack.decode(raw, type=KeyRecord)
            if record.secret_hash != old_hash or record.revoked_at is not None:
                return False
            self._put_key(txn, msgspec.structs.replace(record, secret_hash=new_hash))
        return True

    def _claim_route(self, txn: lmdb.Transaction, tenant_id: str) -> str:
        """A route no live tenant has, recorded for `tenant_id`."""
        route = keys.new_route()
        while txn.get(route.encode(), db=self._routes) is not None:
            route = keys.new_route()
        txn.put(route.encode(), tenant_id.encode(), db=self._routes)
        return route

    def _give_route(self, tenant_id: str) -> str:
        """Give a tenant made before routes existed its route (on its first key since)."""
        with self._env.begin(write=True) as txn:
            raw = txn.get(tenant_id.encode(), db=self._tenants)
            if raw is None:
                raise NotFound("no tenant with that id")
            stored = msgspec.msgpack.decode(raw, type=StoredTenant)
            if stored.route is not None:
                return stored.route
            route = self._claim_route(txn, tenant_id)
            stored = msgspec.structs.replace(stored, route=route)
            txn.put(tenant_id.encode(), msgspec.msgpack.encode(stored), db=self._tenants)
        return route

    def _put_key(self, txn: lmdb.Transaction, record: KeyRecord) -> None:
        txn.put(record.key_id.encode(), msgspec.msgpack.encode(record), db=self._keys)

    def _tenant_key_records(self, txn: lmdb.Transaction, tenant_id: str) -> Iterable[KeyRecord]:
        prefix = f"{tenant_id}/".encode()
        cursor = txn.cursor(db=self._tenant_keys)
        found = cursor.set_range(prefix)
        while found:
            index_key = bytes(cursor.key())
            if not index_key.startswith(prefix):
                break
            raw = txn.get(index_key[len(prefix) :], db=self._keys)
            if raw is not None:
                yield msgspec.msgpack.decode(raw, type=KeyRecord)
            found = cursor.next()

    # -- audit -------------------------------------------------------------------------------

    def _log(
        self,
        txn: lmdb.Transaction,
        actor: str,
        action: str,
        tenant_id: str | None,
        key_id: str | None,
        detail: dict[str, Any],
    ) -> None:
        cursor = txn.cursor(db=self._audit)
        seq = _U64.unpack(cursor.key())[0] + 1 if cursor.last() else 1
        entry = AuditEntry(
            seq=seq,
            ts=self.now(),
            actor=actor,
            action=action,
            tenant_id=tenant_id,
            key_id=key_id,
            detail=detail,
        )
        txn.put(_U64.pack(seq), msgspec.msgpack.encode(entry), db=self._audit)

    def audit(
        self, after: int | None = None, limit: int = 100, *, tenant_id: str | None = None
    ) -> tuple[list[AuditEntry], int | None]:
        """Audit entries with seq > `after`, oldest first; the cursor is the last seq or None."""
        check_audit_page(after, limit)
        entries: list[AuditEntry] = []
        more = False
        with self._env.begin(db=self._audit) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(_U64.pack(min((after or 0) + 1, 2**64 - 1)))
            while found:
                entry = msgspec.msgpack.decode(cursor.value(), type=AuditEntry)
                if tenant_id is None or entry.tenant_id == tenant_id:
                    if len(entries) == limit:
                        more = True
                        break
                    entries.append(entry)
                found = cursor.next()
        return entries, (entries[-1].seq if more else None)


def held_tenant(hold: HoldRecord) -> LegalHold:
    """The refusal of a tenant's deletion while a hold stands on it."""
    return LegalHold(
        f"the tenant is under legal hold {hold.hold_id}; lift the hold before deleting it",
        hold_id=hold.hold_id,
    )


def retention_in_copy(
    control_dir: Path,
) -> dict[str, tuple[dict[str, int] | None, list[HoldRecord]]]:
    """Each tenant's retention windows and legal holds as a copy of a control database (a
    backup's) holds them, read without writing to it: tenant id -> (windows, holds)."""
    env = lmdb.open(
        str(control_dir), subdir=True, readonly=True, lock=False, max_dbs=16, map_size=MAP_SIZE
    )
    try:
        with env.begin() as txn:
            tenants = env.open_db(b"tenants", txn=txn, create=False)
            found: dict[str, tuple[dict[str, int] | None, list[HoldRecord]]] = {
                key.decode(): (msgspec.msgpack.decode(raw, type=StoredTenant).retention, [])
                for key, raw in txn.cursor(db=tenants)
            }
            try:
                holds = env.open_db(b"holds", txn=txn, create=False)
            except lmdb.NotFoundError:  # a copy made before holds existed
                return found
            for _key, raw in txn.cursor(db=holds):
                hold = msgspec.msgpack.decode(raw, type=HoldRecord)
                if hold.tenant_id in found:
                    found[hold.tenant_id][1].append(hold)
        return found
    finally:
        env.close()


def check_audit_page(after: object, limit: object) -> None:
    """InvalidRequest unless `limit` is 1..MAX_AUDIT_LIMIT and `after` None or a seq (>= 0)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_AUDIT_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_AUDIT_LIMIT}")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        raise InvalidRequest("after must be a non-negative integer")


def _open_env(path: Path, *, create: bool) -> lmdb.Environment:
    # sync/metasync: an admin change is durable once the call returns (the CLI exits right after).
    if create:
        path.mkdir(mode=0o700)
    return lmdb.open(
        str(path),
        subdir=True,
        create=create,
        map_size=MAP_SIZE,
        max_dbs=16,
        mode=0o600,
        sync=True,
        metasync=True,
        readahead=False,
        lock=True,
    )
