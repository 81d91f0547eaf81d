"""The tenant manager: opens tenants on demand, keeps at most N open and closes only idle ones."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import lmdb

from storage.errors import MemspineError, Unavailable
from storage.tenant import Tenant

log = logging.getLogger("memspine.manager")

RETRY_AFTER_SECS = 1
BUSY = "every open tenant slot has a request in flight; retry shortly"
OUT_OF_FDS = "the server is out of file descriptors; retry shortly"
SHUT = "the server is shutting down; retry shortly"


def _unavailable(detail: str) -> Unavailable:
    """A 503 that tells the client when to come back."""
    return Unavailable(detail, headers={"Retry-After": str(RETRY_AFTER_SECS)})


def _out_of_fds(exc: BaseException) -> bool:
    """Whether opening failed for lack of file descriptors (Tantivy and LMDB only say it in words)."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return "Too many open files" in str(exc) or "TooManyOpenFiles" in str(exc)


class _Slot:
    """One tenant's place in the LRU: the tenant once open, its requests in flight, its last use."""

    __slots__ = ("tenant_id", "tenant", "ready", "in_flight", "last_used", "detached")

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id
        self.tenant: Tenant | None = None
        self.ready: Future[Tenant] = Future()
        # A running future cannot be cancelled: one waiter giving up (asyncio.wrap_future cancels
        # on task cancellation) must not cancel the open that every other waiter shares.
        self.ready.set_running_or_notify_cancel()
        self.in_flight = 1
        self.last_used = time.monotonic()
        self.detached = False

    def idle(self) -> bool:
        """Open and with no request in flight: the only state in which it may be closed."""
        return self.in_flight == 0 and self.tenant is not None


class Lease:
    """One request's hold on a tenant, counted in flight from `TenantManager.lease` to `release`."""

    def __init__(
        self,
        manager: TenantManager,
        slot: _Slot,
        *,
        opener: bool = False,
        victim: _Slot | None = None,
        gate: Future[None] | None = None,
    ) -> None:
        self._manager = manager
        self._slot = slot
        self._opener = opener  # this lease must open the tenant: open(), wait() or release() does
        self._victim = victim  # an idle tenant to close first, to make room
        self._gate = gate  # this tenant's previous instance, still being closed or held exclusive
        self._released = False
        self.ready: Future[Tenant] = slot.ready

    @property
    def must_open(self) -> bool:
        """Whether open() still has to run (blocking) before ready resolves."""
        return self._opener

    def open(self) -> Tenant:
        """Blocking: close the victim, wait out this tenant's previous close, open it."""
        self._opener = False
        return self._manager._open(self._slot, self._victim, self._gate)

    def wait(self) -> Tenant:
        """Blocking: the open tenant, opening it if this lease is the opener."""
        if self._opener:
            return self.open()
        return self.ready.result()

    def release(self) -> None:
        """End the request's hold (idempotent); an open nobody ran finishes in the background."""
        if self._released:
            return
        self._released = True
        if self._opener:
            # The request was cancelled before it opened the tenant. Others may wait on the same
            # slot and a victim may be detached: open anyway, still counted in flight meanwhile.
            self._opener = False
            threading.Thread(target=self._open_abandoned, name="tenant-open", daemon=True).start()
            return
        self._manager._release(self._slot)

    def _open_abandoned(self) -> None:
        """Run an open whose request went away, then release it."""
        try:
            self._manager._open(self._slot, self._victim, self._gate)
        except BaseException:  # already answered to every waiter through the slot's future
            pass
        finally:
            self._manager._release(self._slot)


@dataclass(frozen=True)
class ManagerStats:
    """Counters since start and the number of tenants open now."""

    open: int
    opens: int
    evictions: int
    idle_closes: int
    rejections: int


class TenantManager:
    """An LRU of open tenants with per-tenant requests in flight; only idle tenants are closed."""

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
        self._slots: OrderedDict[str, _Slot] = OrderedDict()  # least recently used first
        self._closing: dict[str, Future[None]] = {}  # tenant id -> done when its files are free
        self._outside = 0  # tenants closing by idleness or held exclusive: they still hold fds
        self._cond = threading.Condition(threading.Lock())
        self._shut = False
        self._stop = threading.Event()
        self._idle_closer: threading.Thread | None = None
        self.on_open: Callable[[Tenant, float], None] | None = None  # (tenant, seconds to open)
        # Asked right before a tenant's files are opened; raises to refuse (a tenant erased
        # while a request that authenticated earlier waited must not come back as empty files).
        self.admit: Callable[[str], None] | None = None
        self.opens = self.evictions = self.idle_closes = self.rejections = 0

    def path_of(self, tenant_id: str) -> Path:
        """The directory of a tenant (the id was validated by the caller's auth)."""
        return self.data_dir / tenant_id

    # -- requests ---------------------------------------------------------------

    def lease(self, tenant_id: str) -> Lease:
        """Count a request against the tenant without blocking; 503 Unavailable when no slot is free."""
        with self._cond:
            if self._shut:
                raise _unavailable(SHUT)
            slot = self._slots.get(tenant_id)
            if slot is not None:
                slot.in_flight += 1
                self._slots.move_to_end(tenant_id)
                return Lease(self, slot)
            victim = None
            if len(self._slots) + self._outside >= self.max_open:
                victim = self._detach_victim()
            slot = _Slot(tenant_id)
            self._slots[tenant_id] = slot
            gate = self._closing.get(tenant_id)
            return Lease(self, slot, opener=True, victim=victim, gate=gate)

    @contextmanager
    def use(self, tenant_id: str) -> Iterator[Tenant]:
        """The open tenant for the length of one request (blocking; for threads and scripts)."""
        lease = self.lease(tenant_id)
        try:
            yield lease.wait()
        finally:
            lease.release()

    def _detach_victim(self) -> _Slot:
        """Take the least recently used idle tenant out of the LRU, or refuse (caller holds the lock)."""
        for tenant_id, slot in self._slots.items():
            if slot.idle():
                del self._slots[tenant_id]  # iteration ends here
                slot.detached = True
                self._closing[tenant_id] = Future()
                self.evictions += 1
                return slot
        self.rejections += 1
        raise _unavailable(BUSY)

    def _open(self, slot: _Slot, victim: _Slot | None, gate: Future[None] | None) -> Tenant:
        """Make room, wait for the tenant's files to be free, open it and wake its waiters."""
        if victim is not None:
            self._close(victim, outside=False)
        try:
            if gate is not None:
                gate.result()
            if self.admit is not None:
                self.admit(slot.tenant_id)
            started = time.perf_counter()
            tenant = Tenant.open(
                slot.tenant_id, self.path_of(slot.tenant_id), embedding_dim=self.embedding_dim
            )
            seconds = time.perf_counter() - started
        except BaseException as exc:
            with self._cond:
                if self._slots.get(slot.tenant_id) is slot:
                    del self._slots[slot.tenant_id]
            if _out_of_fds(exc):
                log.error("opening a tenant failed: out of file descriptors")
                exc = _unavailable(OUT_OF_FDS)
            elif isinstance(exc, MemspineError):
                pass  # refused by admit: an answer for the client, not a failure
            else:
                log.exception("opening a tenant failed")
            slot.ready.set_exception(exc)
            raise exc from None
        with self._cond:
            slot.tenant = tenant
            self.opens += 1
        self._notify_open(tenant, seconds)
        slot.ready.set_result(tenant)
        return tenant

    def _notify_open(self, tenant: Tenant, seconds: float) -> None:
        """Tell the on_open hook (metrics); its failure never fails a request."""
        if self.on_open is None:
            return
        try:
            self.on_open(tenant, seconds)
        except Exception:
            log.exception("the on_open hook failed")

    def _release(self, slot: _Slot) -> None:
        """One request done with the slot."""
        with self._cond:
            slot.in_flight -= 1
            slot.last_used = time.monotonic()
            if slot.detached and slot.in_flight == 0:
                self._cond.notify_all()

    def _close(self, slot: _Slot, *, outside: bool) -> None:
        """Close a detached tenant, then free its gate so the next open of it may proceed."""
        try:
            if slot.tenant is not None:
                slot.tenant.close()
        except Exception:
            log.exception("closing a tenant failed")
        finally:
            with self._cond:
                gate = self._closing.pop(slot.tenant_id)
                if outside:
                    self._outside -= 1
                self._cond.notify_all()
            gate.set_result(None)

    # -- background and maintenance ----------------------------------------------

    def close_idle(self, now: float | None = None) -> int:
        """Close tenants without a request for idle_secs; returns how many were closed."""
        now = time.monotonic() if now is None else now
        victims: list[_Slot] = []
        with self._cond:
            for tenant_id, slot in list(self._slots.items()):
                if slot.idle() and now - slot.last_used >= self.idle_secs:
                    del self._slots[tenant_id]
                    slot.detached = True
                    self._closing[tenant_id] = Future()
                    self._outside += 1
                    self.idle_closes += 1
                    victims.append(slot)
        for slot in victims:
            self._close(slot, outside=True)
        return len(victims)

    def start_idle_closer(self, every: float | None = None) -> None:
        """Run close_idle in a background thread every `every` seconds (default idle_secs / 4)."""
        if self._idle_closer is not None:
            return
        period = every if every is not None else min(max(self.idle_secs / 4, 0.05), 30.0)
        self._idle_closer = threading.Thread(
            target=self._close_idle_forever, args=(period,), name="idle-closer", daemon=True
        )
        self._idle_closer.start()

    def _close_idle_forever(self, period: float) -> None:
        """The idle closer's loop; ends at close_all."""
        while not self._stop.wait(period):
            try:
                self.close_idle()
            except Exception:
                log.exception("closing idle tenants failed")

    @contextmanager
    def exclusive(self, tenant_id: str) -> Iterator[None]:
        """Keep a tenant closed while the caller works on its files (purge, erasure).

        Waits for the tenant's requests in flight; requests arriving meanwhile wait for the hold
        to end. Never call it while holding a lease on the same tenant.
        """
        gate: Future[None] = Future()
        with self._cond:
            while (prior := self._closing.get(tenant_id)) is not None:
                self._cond.wait_for(lambda: self._closing.get(tenant_id) is not prior)
            self._closing[tenant_id] = gate
            self._outside += 1
            slot = self._slots.pop(tenant_id, None)
            if slot is not None:
                slot.detached = True
                self._cond.wait_for(lambda: slot.in_flight == 0)
        try:
            if slot is not None and slot.tenant is not None:
                slot.tenant.close()
            yield
        finally:
            with self._cond:
                del self._closing[tenant_id]
                self._outside -= 1
                self._cond.notify_all()
            gate.set_result(None)

    def close_all(self, drain_secs: float = 10.0) -> None:
        """Refuse new requests, give those in flight drain_secs, close every tenant (shutdown)."""
        deadline = time.monotonic() + drain_secs
        self._stop.set()
        if self._idle_closer is not None:
            self._idle_closer.join()
        with self._cond:
            self._shut = True
            slots = list(self._slots.values())
            self._slots.clear()
            for slot in slots:
                slot.detached = True
            self._cond.wait_for(
                lambda: all(s.in_flight == 0 for s in slots), deadline - time.monotonic()
            )
        for slot in slots:
            if slot.tenant is None:
                continue
            try:
                slot.tenant.close()
            except Exception:
                log.exception("closing a tenant failed")

    # -- observation ------------------------------------------------------------

    def stats(self) -> ManagerStats:
        """A consistent snapshot of the counters."""
        with self._cond:
            return ManagerStats(
                open=sum(1 for s in self._slots.values() if s.tenant is not None),
                opens=self.opens,
                evictions=self.evictions,
                idle_closes=self.idle_closes,
                rejections=self.rejections,
            )

    def open_count(self) -> int:
        """Tenants open (or opening) now."""
        with self._cond:
            return len(self._slots)

    def open_tenants(self) -> list[Tenant]:
        """The tenants open now (for the purger and metrics)."""
        with self._cond:
            return [s.tenant for s in self._slots.values() if s.tenant is not None]

    def map_sizes(self) -> dict[str, int]:
        """The LMDB map size of each open tenant, in bytes."""
        sizes: dict[str, int] = {}
        for tenant in self.open_tenants():
            # The log's shared lock keeps a map resize (a remap) out; a tenant closed since the
            # snapshot raises lmdb.Error and is simply left out.
            try:
                with tenant.log.lock.shared():
                    sizes[tenant.tenant_id] = int(tenant.log.env.info()["map_size"])
            except lmdb.Error:
                continue
        return sizes
