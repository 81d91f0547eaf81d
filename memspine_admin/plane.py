"""The control plane's interface, and the choice between its two backends.

`ControlDB` (memspine_admin/control.py, LMDB in `DATA_DIR/_control`) is the embedded default;
`PgControl` (memspine_admin/control_pg.py) keeps the same records in PostgreSQL when
`MEMSPINE_CONTROL_URL` is set, so several nodes share one control plane. Both answer every
call alike (tests/test_control.py runs one suite over both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol

from argon2 import PasswordHasher

from memspine_admin.placement import NodeFigures
from memspine_admin.records import (
    AuditEntry,
    HoldRecord,
    IssuedKey,
    KeyInfo,
    KeyRecord,
    TenantRecord,
)


class ControlPlane(Protocol):
    """Tenants, keys, the audit log and the generation counter, wherever they are kept.

    Every change to tenants or keys moves the generation in the same transaction; readers
    that cache anything about a key (memspine/verifier.py) compare generations.
    """

    hasher: PasswordHasher
    now: Callable[[], int]

    def where(self) -> str:
        """Where the records live, for messages: a path, or a URL without its password."""
        ...

    def generation(self) -> int:
        """The counter bumped by every change to tenants or keys; cheap enough per request."""
        ...

    def create_tenant(self, name: str, *, actor: str, tenant_id: str | None = None) -> TenantRecord:
        """Create a tenant, with the id given (a UUIDv4) or a new one; Conflict (409) if a
        live tenant already has that name or that id."""
        ...

    def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        """The tenant with that id, or None."""
        ...

    def tenant_route(self, tenant_id: str) -> str | None:
        """The tenant's route (the start of its key ids), None if unknown or not given yet."""
        ...

    def list_tenants(self) -> list[TenantRecord]:
        """Every tenant, oldest first."""
        ...

    def delete_tenant(self, tenant_id: str, *, actor: str) -> list[str]:
        """Delete a tenant and revoke its keys in one transaction; return the revoked key ids."""
        ...

    def set_tenant_limits(
        self, tenant_id: str, limits: dict[str, int | None], *, actor: str
    ) -> TenantRecord:
        """Set or remove (None) a tenant's own limits (records.LIMITS); the limits not named
        stay; NotFound for an unknown tenant."""
        ...

    def set_retention(
        self, tenant_id: str, changes: Mapping[str, object] | None, *, actor: str
    ) -> TenantRecord:
        """Set (days) or remove (None) a tenant's retention windows by kind, the kinds not
        named staying (memspine_admin/retention.py checks them); NotFound for an unknown tenant."""
        ...

    def place_hold(
        self, tenant_id: str, reason: str, subject: str | None = None, *, actor: str
    ) -> HoldRecord:
        """Place a legal hold on a tenant, or on one subject's events of it (audited)."""
        ...

    def list_holds(self, tenant_id: str) -> list[HoldRecord]:
        """The tenant's holds, oldest first (none for an unknown tenant)."""
        ...

    def lift_hold(self, tenant_id: str, hold_id: str, *, actor: str) -> HoldRecord:
        """Lift a hold (audited); NotFound for an unknown hold."""
        ...

    def create_key(
        self,
        tenant_id: str,
        name: str,
        scopes: Iterable[str] = ...,
        ttl_secs: int | None = None,
        *,
        actor: str,
        requests_per_minute: int | None = None,
    ) -> IssuedKey:
        """Issue a key for a tenant, with its own requests per minute if given; the plaintext
        is in the result and nowhere else."""
        ...

    def get_key(self, key_id: str) -> KeyInfo | None:
        """The key with that id (no hash), or None."""
        ...

    def get_key_record(self, key_id: str) -> KeyRecord | None:
        """The stored record, hash included: for the verifier only, never for display."""
        ...

    def list_keys(self, tenant_id: str | None = None) -> list[KeyInfo]:
        """Every key, or one tenant's (NotFound if the tenant is unknown), oldest first."""
        ...

    def revoke_key(self, key_id: str, *, actor: str) -> KeyInfo:
        """Revoke a key; revoking twice changes nothing."""
        ...

    def update_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        """Replace a key's hash if it is still `old_hash`; no generation move, no audit entry."""
        ...

    def audit(
        self, after: int | None = None, limit: int = 100, *, tenant_id: str | None = None
    ) -> tuple[list[AuditEntry], int | None]:
        """Audit entries with seq > `after`, oldest first; the cursor is the last seq or None."""
        ...

    def close(self) -> None:
        """Release what the plane holds (environment, connections, threads)."""
        ...

    def __enter__(self) -> ControlPlane: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def control_exists(data_dir: Path, url: str | None) -> bool:
    """True once issued keys are in force: a PostgreSQL URL is set, or `init` made `_control`."""
    if url:
        return True
    from memspine_admin.control import ControlDB

    return ControlDB.exists(data_dir)


def init_control(data_dir: Path, url: str | None, *, actor: str) -> bool:
    """Create the control plane unless it exists (PostgreSQL: apply the migrations); True if
    this call created it."""
    if url:
        from memspine_admin.control_pg import PgControl

        return PgControl.init(url, actor=actor)
    from memspine_admin.control import ControlDB

    return ControlDB.init(data_dir, actor=actor)


def open_control(
    data_dir: Path,
    url: str | None = None,
    *,
    create: bool = False,
    actor: str = "system",
    hasher: PasswordHasher | None = None,
    clock: Callable[[], int] | None = None,
    node: str | None = None,
    watch: bool = False,
    node_url: str | None = None,
    figures: Callable[[], NodeFigures] | None = None,
) -> ControlPlane:
    """Open the control plane: PostgreSQL at `url` if given, else the LMDB one in `data_dir`.

    `node` registers this server as a node of the cluster (PostgreSQL only), reachable at
    `node_url` and reporting `figures` (memspine_admin/placement.py); `watch` keeps the
    generation current from a listening thread instead of one query per call (the server).
    A PostgreSQL plane is migrated on open whatever `create` says: its URL is the operator's
    choice of issued keys, as `memspine-admin init` is for LMDB.
    """
    if url:
        from memspine_admin.control_pg import PgControl

        return PgControl.open(
            url,
            actor=actor,
            hasher=hasher,
            clock=clock,
            node=node,
            watch=watch,
            node_url=node_url,
            figures=figures,
        )
    from memspine_admin.control import ControlDB

    return ControlDB.open(data_dir, create=create, actor=actor, hasher=hasher, clock=clock)
