"""Retention runs: at each sweep of the background purger (memspine/purger.py), every tenant's
events past their kind's window are deleted through the API's delete path, in bounded batches,
then purged, and the run leaves a receipt (docs/erasure.md, "Retention and legal holds")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import anyio.to_thread
import msgspec

from memspine.engine import Engine
from memspine_admin.plane import ControlPlane
from memspine_admin.records import HoldRecord, TenantRecord, now_us
from storage import (
    JOURNAL,
    RUNS,
    Due,
    Journal,
    Outlook,
    Policy,
    RetentionView,
    RunReceipt,
    Tenant,
    due,
    last_receipt,
    outlook,
    outlook_of_files,
    tenant_dirs,
    view_of,
)
from storage.errors import LegalHold, Unavailable

log = logging.getLogger("memspine.retention")
# Events deleted per batch: one delete transaction on the tenant's writer, which takes the
# tenant's appends queued meanwhile before the next batch.
BATCH = 500


class TenantRetention(msgspec.Struct, frozen=True, kw_only=True):
    """GET /v1/memory/retention: the caller's tenant's own windows (null: none of its own),
    the retention in force with its outlook and last run, and the legal holds standing."""

    tenant_id: str
    retention: dict[str, int] | None
    retention_state: RetentionView
    holds: list[HoldRecord]


class Retention:
    """Carries out the tenants' retention windows; `clock` (µs) is the time runs and views go
    by (tests move it)."""

    def __init__(
        self,
        engine: Engine,
        control: Callable[[], ControlPlane | None],
        *,
        clock: Callable[[], int] = now_us,
        batch: int = BATCH,
    ) -> None:
        self.engine = engine
        self.control = control
        self.clock = clock
        self.batch = batch
        self.runs = 0  # runs that deleted something (for tests and metrics)

    def policy(self, record: TenantRecord | None) -> Policy:
        """The windows in force for a tenant: its own, the server's default for the rest."""
        own = None if record is None else record.retention
        return Policy.of(own, self.engine.settings.retention_days)

    def holds(self, tenant_id: str) -> list[HoldRecord]:
        """Blocking: the tenant's legal holds (none without a control plane)."""
        control = self.control()
        return [] if control is None else control.list_holds(tenant_id)

    def _due_tenants(self) -> list[tuple[str, Policy]]:
        """Blocking: the tenants stored here that have a window in force."""
        control = self.control()
        data_dir = self.engine.settings.data_dir
        if control is None:  # local mode: every tenant directory, under the server's default
            policy = self.policy(None)
            if not policy.windows or not data_dir.is_dir():
                return []
            return [(name, policy) for name in tenant_dirs(data_dir)]
        found = []
        for record in control.list_tenants():
            policy, root = self.policy(record), data_dir / record.tenant_id
            # A tenant with no directory here stored nothing here (or is another node's); one
            # whose windows were removed during an interrupted run still has that run finished.
            if (policy.windows and root.is_dir()) or (root / RUNS / JOURNAL).exists():
                found.append((record.tenant_id, policy))
        return found

    async def sweep(self) -> list[RunReceipt]:
        """One run for every tenant with a window in force; the receipts of those that deleted."""
        done = []
        for tenant_id, policy in await anyio.to_thread.run_sync(self._due_tenants):
            try:
                receipt = await self.run(tenant_id, policy)
            except Unavailable:
                log.info("tenant %s: retention postponed, every tenant slot is busy", tenant_id)
                continue
            except Exception:
                log.exception(
                    "tenant %s: retention run failed; the next sweep resumes it", tenant_id
                )
                continue
            if receipt is not None:
                done.append(receipt)
        return done

    async def run(self, tenant_id: str, policy: Policy) -> RunReceipt | None:
        """Delete the tenant's due events that no hold keeps, batch by batch, then purge; None
        if nothing was due (and no interrupted run was left to finish)."""
        now = self.clock()
        holds = await anyio.to_thread.run_sync(self.holds, tenant_id)
        root = self.engine.manager.path_of(tenant_id)
        journal = await anyio.to_thread.run_sync(Journal.find, root)
        resume: dict[str, int] = {}
        held: set[str] = set()  # a batch resumes at its last ts: one held there is seen again
        while True:
            batch = await self.engine.read(tenant_id, self._select(policy, now, holds, resume))
            held.update(batch.held_ids)
            resume = batch.resume
            if not batch.event_ids:
                break
            if journal is None:
                journal = await anyio.to_thread.run_sync(Journal.begin, root, now)
            await anyio.to_thread.run_sync(journal.intend, batch.event_ids)
            try:
                await self.engine.delete(tenant_id, batch.event_ids)
            except LegalHold:
                break  # placed since the holds were read: the next sweep reads them again
            await asyncio.sleep(0)  # the loop's other work between batches
        if journal is None:
            return None
        return await self._finish(tenant_id, policy, journal, len(held))

    def _select(
        self, policy: Policy, now: int, holds: list[HoldRecord], resume: dict[str, int]
    ) -> Callable[[Tenant], Due]:
        """The read that selects one batch of due events."""
        return lambda t: t.snapshot_read(lambda r: due(r, policy, now, self.batch, holds, resume))

    async def _finish(
        self, tenant_id: str, policy: Policy, journal: Journal, held: int
    ) -> RunReceipt:
        """Purge what the run deleted and leave its receipt."""
        pending = False
        try:
            await self.engine.purge(tenant_id)
        except Exception as exc:  # the marker stays: the purger's own sweep retries it
            log.warning("tenant %s: retention's purge is pending: %s", tenant_id, exc)
            pending = True
        journaled = list(journal.ids)
        gone = await self.engine.read(
            tenant_id,
            lambda t: t.snapshot_read(lambda r: [e for e in journaled if not r.exists(e)]),
        )
        # Every event the run deleted was deleted before this purge, so a purge that ran purged
        # them all, whether it or an earlier sweep (after a restart, say) rewrote the files.
        purged = 0 if pending else len(gone)
        receipt = RunReceipt(
            receipt_id=journal.run_id,
            tenant_id=tenant_id,
            started_at=journal.started_at,
            finished_at=self.clock(),
            windows=dict(policy.windows),
            deleted=len(gone),
            deleted_ids=gone,
            held=held,
            purged=purged,
            purge_pending=pending,
        )
        await anyio.to_thread.run_sync(journal.finish, receipt)
        self.runs += 1
        log.info(
            "tenant %s: retention deleted %d events (%d held), purged %d",
            tenant_id,
            receipt.deleted,
            held,
            purged,
        )
        return receipt

    def view(self, record: TenantRecord) -> RetentionView:
        """Blocking: the tenant's retention as shown, read from the open tenant or its files
        (kept closed meanwhile; it is not opened for this)."""
        return self._view(record.tenant_id, self.policy(record))

    def shown(self, tenant_id: str) -> TenantRetention:
        """Blocking: a tenant's own windows, its retention as shown and its holds, as the
        tenant's keys see them (GET /v1/memory/retention; no control plane: the server's
        default windows and no hold)."""
        control = self.control()
        record = None if control is None else control.get_tenant(tenant_id)
        return TenantRetention(
            tenant_id=tenant_id,
            retention=None if record is None else record.retention,
            retention_state=self._view(tenant_id, self.policy(record)),
            holds=[] if control is None else control.list_holds(tenant_id),
        )

    def _view(self, tenant_id: str, policy: Policy) -> RetentionView:
        now = self.clock()
        root = self.engine.manager.path_of(tenant_id)
        seen: Outlook | None
        with self.engine.manager.inspect(tenant_id) as tenant:
            if tenant is not None:
                seen = tenant.snapshot_read(lambda r: outlook(r, policy, now))
            else:
                seen = outlook_of_files(root, policy, now)
        return view_of(policy, seen, last_receipt(root))
