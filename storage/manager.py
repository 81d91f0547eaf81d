"""The tenant manager: opens tenants on demand and keeps at most N open, closing idle ones LRU-first."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from storage.errors import Unavailable
from storage.tenant import Tenant

log = logging.getLogger("memspine.manager")

RETRY_AFTER_SECS = 1


class _Slot:
    """One tenant's place in the manager: the open tenant (once ready), its users and its last use."""

    __slots__ = ("tenant", "in_flight", "last_used", "ready", "error")

    def __init__(self) -> None:
        self.tenant: Tenant | None = None
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.ready = threading.Event()
        self.error: BaseException | None = None


class TenantManager:
    """An LRU of open tenants with per-tenant request counts; only idle tenants are ever closed."""

    def __init__(
        self,
        data_dir: Path,
        *,
        embedding_dim: int = 384,
        max_open: int = 80,
        idle_secs: float = 3600.0,
    ) -> None:
        self.data_dir = data_dir
        self.embedding_dim = embedding_dim
        self.max_open = max_open
        self.idle_secs = idle_secs
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._lock = threading.Lock()
        self._closing: dict[str, threading.Event] = {}
        self.on_open: Callable[[Tenant], None] | None = None
        self.opens = 0
        self.evictions = 0
        self.rejections = 0

    def path_of(self, tenant_id: str) -> Path:
        """The directory of a tenant (the id was validated by the caller's auth)."""
        return self.data_dir / tenant_id

    @contextmanager
    def use(self, tenant_id: str) -> Iterator[Tenant]:
        """The open tenant for the length of one request; 503 Unavailable when every slot is busy."""
        slot = self._acquire(tenant_id)
        try:
            assert slot.tenant is not None
            yield slot.tenant
        finally:
            with self._lock:
                slot.in_flight -= 1
                slot.last_used = time.monotonic()

    def _acquire(self, tenant_id: str) -> _Slot:
        """Count a request against the tenant's slot, opening the tenant if needed."""
        while True:
            victim: tuple[str, _Slot] | None = None
            with self._lock:
                closing = self._closing.get(tenant_id)
                if closing is None:
                    slot = self._slots.get(tenant_id)
                    if slot is not None:
                        slot.in_flight += 1
                        self._slots.move_to_end(tenant_id)
                        opener = False
                    else:
                        if len(self._slots) >= self.max_open:
                            victim = self._pick_victim()
                        slot = _Slot()
                        slot.in_flight = 1
                        self._slots[tenant_id] = slot
                        opener = True
            if closing is not None:
                closing.wait()  # the same directory is being closed; reopen once it is
                continue
            break
        if victim is not None:
            self._close(*victim)
        if opener:
            self._open_into(tenant_id, slot)
        else:
            slot.ready.wait()
        if slot.error is not None:
            with self._lock:
                slot.in_flight -= 1
            raise slot.error
        return slot

    def _pick_victim(self) -> tuple[str, _Slot]:
        """Detach the least recently used idle tenant, or refuse with 503 (caller holds the lock)."""
        for tid, slot in self._slots.items():
            if slot.in_flight == 0 and slot.ready.is_set():
                del self._slots[tid]
                self._closing[tid] = threading.Event()
                self.evictions += 1
                return tid, slot
        self.rejections += 1
        raise Unavailable(
            "every open tenant slot is busy; retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECS)},
        )

    def _open_into(self, tenant_id: str, slot: _Slot) -> None:
        """Open the tenant for a new slot and wake whoever waits for it."""
        try:
            slot.tenant = Tenant.open(
                tenant_id, self.path_of(tenant_id), embedding_dim=self.embedding_dim
            )
            self.opens += 1
            if self.on_open is not None:
                self.on_open(slot.tenant)
        except BaseException as exc:
            slot.error = exc
            with self._lock:
                if self._slots.get(tenant_id) is slot:
                    del self._slots[tenant_id]
            log.exception("opening a tenant failed")
        finally:
            slot.ready.set()

    def _close(self, tenant_id: str, slot: _Slot) -> None:
        """Close a detached tenant, then let waiters for the same tenant reopen it."""
        try:
            if slot.tenant is not None:
                slot.tenant.close()
        finally:
            with self._lock:
                self._closing.pop(tenant_id).set()

    def close_idle(self, now: float | None = None) -> int:
        """Close tenants with no request for idle_secs; returns how many were closed."""
        now = time.monotonic() if now is None else now
        victims: list[tuple[str, _Slot]] = []
        with self._lock:
            for tid, slot in list(self._slots.items()):
                idle = slot.in_flight == 0 and slot.ready.is_set()
                if idle and now - slot.last_used >= self.idle_secs:
                    del self._slots[tid]
                    self._closing[tid] = threading.Event()
                    victims.append((tid, slot))
        for victim in victims:
            self._close(*victim)
        return len(victims)

    @contextmanager
    def exclusive(self, tenant_id: str) -> Iterator[None]:
        """Keep a tenant closed while the caller works on its files (tenant erasure)."""
        while True:
            with self._lock:
                slot = self._slots.get(tenant_id)
                closing = self._closing.get(tenant_id)
                if closing is None and (slot is None or (slot.in_flight == 0 and slot.ready.is_set())):
                    if slot is not None:
                        del self._slots[tenant_id]
                    gate = threading.Event()
                    self._closing[tenant_id] = gate
                    break
            time.sleep(0.01) if closing is None else closing.wait()
        try:
            if slot is not None and slot.tenant is not None:
                slot.tenant.close()
            yield
        finally:
            with self._lock:
                self._closing.pop(tenant_id).set()

    def open_count(self) -> int:
        """Tenants open (or opening) now."""
        with self._lock:
            return len(self._slots)

    def open_tenants(self) -> list[Tenant]:
        """The tenants open now (for the purger and metrics)."""
        with self._lock:
            return [s.tenant for s in self._slots.values() if s.tenant is not None]

    def close_all(self) -> None:
        """Close every open tenant (server shutdown); waits for nothing but each writer's queue."""
        with self._lock:
            slots = list(self._slots.items())
            self._slots.clear()
        for _tid, slot in slots:
            if slot.tenant is not None:
                slot.tenant.close()
