"""The background purger: every MEMSPINE_PURGE_INTERVAL_SECS, carry out retention windows
(memspine/retention.py), then purge each tenant with deletions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import lmdb

from memspine.engine import Engine
from memspine.retention import Retention
from storage import PENDING, names_full_disk, pending_tenants, read_bytes
from storage.errors import Unavailable

log = logging.getLogger("memspine.purger")


class Purger:
    """Purges tenants one at a time in the background; a purge blocks its tenant only to swap."""

    def __init__(
        self, engine: Engine, interval_secs: float, retention: Retention | None = None
    ) -> None:
        self.engine = engine
        self.interval_secs = interval_secs
        self.retention = retention  # its runs come first in each sweep
        self.sweeps = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sweeping every interval (call from the running event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="purger")

    async def stop(self) -> None:
        """Stop sweeping; a purge under way finishes first (its thread cannot be interrupted)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        """Sleep, sweep, repeat; a failed sweep is logged and the next one comes anyway."""
        while True:
            await asyncio.sleep(self.interval_secs)
            try:
                await self.sweep()
            except Exception:
                log.exception("purge sweep failed")

    def candidates(self) -> list[str]:
        """Tenants that may hold deleted events: open ones with tombstones, marked ones on disk."""
        found = set(pending_tenants(self.engine.settings.data_dir))
        for tenant in self.engine.manager.open_tenants():
            try:
                if tenant.awaiting_purge():
                    found.add(tenant.tenant_id)
            except lmdb.Error:
                continue  # closed since the snapshot of open tenants
        return sorted(found)

    def _still_wanted(self, tenant_id: str) -> bool:
        """Whether a candidate is open or still marked: a tenant erased since the listing would
        otherwise be opened, and its directory made again, by the purge."""
        root = self.engine.manager.path_of(tenant_id)
        if (root / PENDING).exists():
            return True
        return any(t.tenant_id == tenant_id for t in self.engine.manager.open_tenants())

    async def sweep(self) -> list[str]:
        """Carry out the tenants' retention, then purge every candidate tenant in turn; returns
        the ids purged (a retention run purges its own tenant)."""
        if self.retention is not None:
            try:
                await self.retention.sweep()
            except Exception:
                log.exception("retention sweep failed; the purges go on")
        purged: list[str] = []
        for tenant_id in await asyncio.to_thread(self.candidates):
            if not self._still_wanted(tenant_id):
                continue
            try:
                await self.engine.purge(tenant_id)
            except Unavailable:
                log.info("tenant %s: purge postponed, every tenant slot is busy", tenant_id)
                continue
            except Exception as exc:
                # The marker stays with the tombstones, so the next sweep tries again.
                if names_full_disk(exc):
                    log.warning("tenant %s: purge postponed, the disk is full: %s", tenant_id, exc)
                else:
                    log.exception("tenant %s: purge failed; the next sweep retries", tenant_id)
                continue
            purged.append(tenant_id)
        await asyncio.to_thread(self.expire_reads)
        self.sweeps += 1
        return purged

    def expire_reads(self) -> int:
        """Drop read records past MEMSPINE_READ_AUDIT_DAYS (docs/audit.md); never raises."""
        engine = self.engine
        try:
            tenants = [
                e.name
                for e in os.scandir(engine.settings.data_dir)
                if e.is_dir() and read_bytes(Path(e.path))
            ]
            return engine.reads.expire(tenants, engine.settings.read_audit_days)
        except Exception:
            log.exception("read records not expired; the next sweep retries")
            return 0
