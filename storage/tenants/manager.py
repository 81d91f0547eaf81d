"""The tenant manager: opens tenants on demand, keeps them within a count cap and a memory budget,
and closes only idle ones."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from storage.errors import MemspineError, Unavailable
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.footprint import closed_tenant_bytes, give_back_memory, tenant_bytes
from storage.tenants.pool import WriterPool
from storage.tenants.standin import EmptyStandIn
from storage.tenants.tenant import LEDGER_DAYS, Tenant, TenantHooks

log = logging.getLogger("memspine.manager")

RETRY_AFTER_SECS = 1
BUSY = "every open tenant slot has a request in flight; retry shortly"
BUSY_MEMORY = "every tenant open within the memory budget has a request in flight; retry shortly"
OUT_OF_FDS = "the server is out of file descriptors; retry shortly"
SHUT = "the server is shutting down; retry shortly"
# Why a tenant was closed to make room, or a request refused: the count cap or the memory budget.
CAP = "tenant_cap"
MEMORY = "memory_budget"
REASONS = (CAP, MEMORY)
# A request that closes tenants to make room for its own gives their memory back at most this
# often: malloc_trim walks the whole heap (0.3 ms a call, and ten times that on a loaded machine,
# in every cold request; bench/RESULTS.md, "Cold tenants"). The server's heap trimmer
# (memspine/heap.py) returns what is left between; closes in the background always trim.
TRIM_EVERY_SECS = 0.5


def tenants_within(budget: int, embedding_dim: int = 384) -> int:
    """How many open tenants the memory budget holds when each is as small as a tenant can be
    (storage/tenants/footprint.py's estimate of one with no files), at least 1: the default cap
    on open tenants, so that the budget decides how many are open whatever their size."""
    # No vector file is there to stat under os.devnull: the estimate of a tenant with none.
    smallest = closed_tenant_bytes(Path(os.devnull), embedding_dim)
    return max(1, budget // smallest)


def _unavailable(detail: str) -> Unavailable:
    """A 503 that tells the client when to come back."""
    return Unavailable(detail, headers={"Retry-After": str(RETRY_AFTER_SECS)})


def _out_of_fds(exc: BaseException) -> bool:
    """Whether opening failed for lack of file descriptors (Tantivy and LMDB only say it in words)."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return "Too many open files" in str(exc) or "TooManyOpenFiles" in str(exc)


# Where a slot's bytes are counted: in the LRU (open or opening), or closing (detached, still
# holding its memory until its close ends), or nowhere (closed, or its open failed).
_LRU, _CLOSING, _GONE = "lru", "closing", "gone"


class _Slot:
    """One tenant's place in the LRU: the tenant once open, its requests in flight, its last use,
    its accounted bytes."""

    __slots__ = (
        "bytes",
        "detached",
        "in_flight",
        "last_used",
        "ready",
        "tenant",
        "tenant_id",
        "where",
    )

    def __init__(self, tenant_id: str, size: int = 0) -> None:
        self.tenant_id = tenant_id
        self.tenant: Tenant | None = None
        self.ready: Future[Tenant] = Future()
        # A running future cannot be cancelled: one waiter giving up (asyncio.wrap_future cancels
        # on task cancellation) must not cancel the open that every other waiter shares.
        self.ready.set_running_or_notify_cancel()
        self.in_flight = 1
        self.last_used = time.monotonic()
        self.detached = False
        self.bytes = size
        self.where = _LRU

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
        victims: list[_Slot] | None = None,
        gate: Future[None] | None = None,
        absent: bool = False,
        recount: bool = False,
    ) -> None:
        self._manager = manager
        self._slot = slot
        self._opener = opener  # this lease must open the tenant: open(), wait() or release() does
        self._victims = victims or []  # idle tenants to close first, to make room
        self._gate = gate  # this tenant's previous instance, still being closed or held exclusive
        self._released = False
        self.absent = absent  # a read of a tenant with no files: answered by the empty stand-in
        self._recount = recount  # a write's lease: the tenant may have grown by its release
        self.ready: Future[Tenant] = slot.ready

    @property
    def must_open(self) -> bool:
        """Whether open() still has to run (blocking) before ready resolves."""
        return self._opener

    def open(self) -> Tenant:
        """Blocking: close the victims, wait out this tenant's previous close, open it."""
        self._opener = False
        if self.absent:
            return self._manager._open_absent(self._slot.tenant_id)
        return self._manager._open(self._slot, self._victims, self._gate)

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
        if self.absent:
            self._manager._release_absent()
            return
        if self._opener:
            # The request was cancelled before it opened the tenant. Others may wait on the same
            # slot and victims may be detached: open anyway, still counted in flight meanwhile.
            self._opener = False
            threading.Thread(target=self._open_abandoned, name="tenant-open", daemon=True).start()
            return
        self._manager._release(self._slot, recount=self._recount)

    def _open_abandoned(self) -> None:
        """Run an open whose request went away, then release it."""
        try:
            self._manager._open(self._slot, self._victims, self._gate)
        except BaseException:  # already answered to every waiter through the slot's future
            pass
        finally:
            self._manager._release(self._slot)


@dataclass(frozen=True)
class ManagerStats:
    """Counters since start, and the tenants open now with their accounted bytes."""

    open: int
    opens: int
    evictions: int
    idle_closes: int
    rejections: int
    open_bytes: int = 0
    budget: int | None = None
    evictions_by: dict[str, int] = field(default_factory=dict)
    rejections_by: dict[str, int] = field(default_factory=dict)


class TenantManager:
    """An LRU of open tenants with per-tenant requests in flight; only idle tenants are closed.

    Two limits hold: at most max_open tenants (file descriptors), and at most max_open_bytes of
    their estimated memory (None: no budget). Either one closes least recently used idle tenants
    to make room, and refuses with 503 when the room is held by requests in flight.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        embedding_dim: int = 384,
        max_open: int = 80,
        idle_secs: float = 3600.0,
        max_open_bytes: int | None = None,
        embedding: EmbeddingWorker | None = None,
        on_open: Callable[[Tenant, float], None] | None = None,
        on_batch: Callable[[int], None] | None = None,
        admit: Callable[[str], None] | None = None,
        ledger_days: float = LEDGER_DAYS,
        writer_threads: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        # The threads that commit every open tenant's writes (None: sized to the cores).
        self.writers = WriterPool(writer_threads)
        self.ledger_days = ledger_days  # each tenant's purges prune its erasure ledger to it
        # The background embedder: told of each tenant opened and closed, it offers new
        # tenants its space and holds open ones (use_open) while it writes their vectors.
        self.embedding = embedding
        if embedding is not None:
            embedding.use_open = self.use_open
        self.embedding_dim = embedding_dim
        self.max_open = max_open
        self.max_open_bytes = max_open_bytes
        self.idle_secs = idle_secs
        self._slots: OrderedDict[str, _Slot] = OrderedDict()  # least recently used first
        self._closing: dict[str, Future[None]] = {}  # tenant id -> done when its files are free
        self._outside = 0  # tenants closing by idleness or held exclusive: they still hold fds
        self._lru_bytes = 0  # accounted bytes of the slots in the LRU
        self._closing_bytes = 0  # accounted bytes of detached tenants not yet closed
        self._trimmed_at = 0.0  # when a request's closes last gave memory back
        self._cond = threading.Condition(threading.Lock())
        self._shut = False
        self._stop = threading.Event()
        self._idle_closer: threading.Thread | None = None
        self._enforcing = False  # a background eviction to get back under the budget is running
        self._absent_in_flight = 0  # reads of tenants that do not exist, answered by:
        self._standin = EmptyStandIn(embedding_dim)
        self.on_open = on_open  # told of each tenant opened: (tenant, seconds to open)
        self.hooks = _tenant_hooks(embedding, on_batch)
        # Asked right before a tenant's files are opened; raises to refuse (a tenant erased
        # while a request that authenticated earlier waited must not come back as empty files).
        self.admit = admit
        self.opens = self.idle_closes = 0
        self.evictions_by = dict.fromkeys(REASONS, 0)
        self.rejections_by = dict.fromkeys(REASONS, 0)

    @property
    def evictions(self) -> int:
        """Idle tenants closed to make room, for either limit."""
        return sum(self.evictions_by.values())

    @property
    def rejections(self) -> int:
        """Requests refused with 503 because the room was held by requests in flight."""
        return sum(self.rejections_by.values())

    def path_of(self, tenant_id: str) -> Path:
        """The directory of a tenant (the id was validated by the caller's auth)."""
        return self.data_dir / tenant_id

    # -- requests ---------------------------------------------------------------

    def lease(self, tenant_id: str, *, create: bool = True) -> Lease:
        """Count a request against the tenant without blocking; 503 Unavailable when no room is free.

        With create=False (a read) a tenant that has no directory is not created: the lease
        hands out an empty stand-in tenant instead, outside the LRU and the budget.
        """
        with self._cond:
            if self._shut:
                raise _unavailable(SHUT)
            slot = self._slots.get(tenant_id)
            if slot is not None:
                slot.in_flight += 1
                self._slots.move_to_end(tenant_id)
                return Lease(self, slot, recount=create)
            gate = self._closing.get(tenant_id)
            root = self.path_of(tenant_id)
            # A stat per open, not per request; a tenant being closed or held exclusive still
            # has its files and goes the usual way, behind its gate.
            if not create and gate is None and not root.exists():
                self._absent_in_flight += 1
                return Lease(self, _Slot(tenant_id), opener=True, absent=True)
            size = 0
            if self.max_open_bytes is not None:
                size = closed_tenant_bytes(root, self.embedding_dim)
            victims = self._make_room(size)
            slot = _Slot(tenant_id, size)
            self._slots[tenant_id] = slot
            self._lru_bytes += size
            return Lease(self, slot, opener=True, victims=victims, gate=gate, recount=create)

    @contextmanager
    def use(self, tenant_id: str, *, create: bool = True) -> Iterator[Tenant]:
        """The open tenant for the length of one request (blocking; for threads and scripts)."""
        lease = self.lease(tenant_id, create=create)
        try:
            yield lease.wait()
        finally:
            lease.release()

    def _over_by(self, size: int) -> int:
        """Bytes the LRU would exceed the budget by with `size` more in it (caller holds the lock)."""
        if self.max_open_bytes is None:
            return 0
        return self._lru_bytes + size - self.max_open_bytes

    def _make_room(self, size: int) -> list[_Slot]:
        """Detach least recently used idle tenants so one more of `size` bytes fits both limits,
        or refuse with 503 and detach nothing (caller holds the lock)."""
        need_slot = len(self._slots) + self._outside >= self.max_open
        over = self._over_by(size)
        if not need_slot and over <= 0:
            return []
        chosen: list[_Slot] = []
        freed = 0
        for slot in self._slots.values():
            if not (need_slot and not chosen) and freed >= over:
                break
            if slot.idle():
                chosen.append(slot)
                freed += slot.bytes
        # Short of room with every idle tenant counted: refuse if requests in flight hold the
        # rest. A tenant larger than the whole budget still opens once nothing else is open.
        short = freed < over and len(chosen) < len(self._slots)
        # Refused by both limits, the budget is named: the default cap follows from it.
        if need_slot and not chosen and not short:
            self.rejections_by[CAP] += 1
            raise _unavailable(BUSY)
        if short:
            self.rejections_by[MEMORY] += 1
            raise _unavailable(BUSY_MEMORY)
        for i, slot in enumerate(chosen):
            self._detach(slot)
            # The first victim is the slot the cap asked for; any more are for the bytes.
            self.evictions_by[CAP if need_slot and i == 0 else MEMORY] += 1
        return chosen

    def _detach(self, slot: _Slot) -> None:
        """Take a slot out of the LRU; its bytes count as closing until its close ends (caller
        holds the lock)."""
        del self._slots[slot.tenant_id]
        slot.detached = True
        self._closing[slot.tenant_id] = Future()
        self._lru_bytes -= slot.bytes
        self._closing_bytes += slot.bytes
        slot.where = _CLOSING

    def _account(self, slot: _Slot, size: int) -> None:
        """Set a slot's accounted bytes wherever it is counted (caller holds the lock)."""
        delta, slot.bytes = size - slot.bytes, size
        if slot.where == _LRU:
            self._lru_bytes += delta
        elif slot.where == _CLOSING:
            self._closing_bytes += delta

    def _forget(self, slot: _Slot) -> None:
        """A slot closed or never opened: its bytes count nowhere any more (caller holds the lock)."""
        if slot.where == _LRU:
            self._lru_bytes -= slot.bytes
        elif slot.where == _CLOSING:
            self._closing_bytes -= slot.bytes
        slot.where = _GONE

    def _open(self, slot: _Slot, victims: list[_Slot], gate: Future[None] | None) -> Tenant:
        """Make room, wait for the tenant's files to be free, open it and wake its waiters."""
        self._close_all(victims, outside=False, trim_every=TRIM_EVERY_SECS)
        try:
            if gate is not None:
                gate.result()
            if self.admit is not None:
                self.admit(slot.tenant_id)
            started = time.perf_counter()
            embedding = self.embedding
            tenant = Tenant.open(
                slot.tenant_id,
                self.path_of(slot.tenant_id),
                embedding_dim=self.embedding_dim,
                offer=None if embedding is None else embedding.offer,
                hooks=self.hooks,
                writers=self.writers,
            )
            tenant.ledger_days = self.ledger_days
            seconds = time.perf_counter() - started
        except BaseException as exc:
            raise self._open_failed(slot, exc) from None
        return self._opened(slot, tenant, seconds)

    def _open_failed(self, slot: _Slot, exc: BaseException) -> BaseException:
        """An open that failed: the slot goes, its waiters get the error (an out-of-fds one as
        503), and the caller raises what this returns."""
        with self._cond:
            if self._slots.get(slot.tenant_id) is slot:
                del self._slots[slot.tenant_id]
            self._forget(slot)
        if _out_of_fds(exc):
            log.error("opening a tenant failed: out of file descriptors")
            exc = _unavailable(OUT_OF_FDS)
        elif not isinstance(exc, MemspineError):  # refused by admit: an answer, not a failure
            log.exception("opening a tenant failed", exc_info=exc)
        slot.ready.set_exception(exc)
        return exc

    def _opened(self, slot: _Slot, tenant: Tenant, seconds: float) -> Tenant:
        """A tenant just opened: counted against the budget, announced, handed to its waiters."""
        size = tenant_bytes(tenant) if self.max_open_bytes is not None else 0
        if self.max_open_bytes is not None and size > self.max_open_bytes:
            # It opens only when nothing else is open, and closes again as soon as it is idle.
            log.warning(
                "a tenant alone is larger than the memory budget; raise MEMSPINE_MAX_OPEN_BYTES",
                extra={"tenant_bytes": size, "max_open_bytes": self.max_open_bytes},
            )
        with self._cond:
            slot.tenant = tenant
            self.opens += 1
            self._account(slot, size)
            over = self._over_by(0) > 0
        self._notify_open(tenant, seconds)
        if self.embedding is not None:
            try:
                self.embedding.opened(tenant)
            except Exception:  # its work stays listed in its log for the next open
                log.exception("the embedder could not read a tenant's work")
        slot.ready.set_result(tenant)
        if over:  # bigger than its files said: others make room once idle
            self._enforce_soon()
        return tenant

    def _notify_open(self, tenant: Tenant, seconds: float) -> None:
        """Tell the on_open hook (metrics); its failure never fails a request."""
        if self.on_open is None:
            return
        try:
            self.on_open(tenant, seconds)
        except Exception:
            log.exception("the on_open hook failed")

    def _release(self, slot: _Slot, *, recount: bool = False) -> None:
        """One request done with the slot; after a write its tenant's bytes are counted again
        (appends grow it; the count reads counters, a few microseconds)."""
        tenant = slot.tenant
        size = None
        if recount and tenant is not None and self.max_open_bytes is not None:
            size = tenant_bytes(tenant)
        with self._cond:
            slot.in_flight -= 1
            slot.last_used = time.monotonic()
            if size is not None and slot.where != _GONE:
                self._account(slot, size)
            if slot.detached and slot.in_flight == 0:
                self._cond.notify_all()
            # Over the budget, a closer is worth starting only if this release can have changed
            # what it finds: this tenant grew, or it became idle (and may go itself).
            changed = size is not None or slot.in_flight == 0
            over = changed and self._over_by(0) > 0 and not self._enforcing
        if over:
            self._enforce_soon()

    def _close_all(self, slots: list[_Slot], *, outside: bool, trim_every: float = 0.0) -> None:
        """Close detached tenants, let go of them (the list is emptied) and give their memory
        back, unless that was done less than trim_every seconds ago."""
        if not slots:
            return
        while slots:
            self._close(slots.pop(), outside=outside)
        now = time.monotonic()
        if now - self._trimmed_at >= trim_every:
            self._trimmed_at = now
            give_back_memory()

    def _close(self, slot: _Slot, *, outside: bool) -> None:
        """Close a detached tenant, then free its gate so the next open of it may proceed."""
        try:
            if slot.tenant is not None:
                self._closing_tenant(slot.tenant)
                slot.tenant.close()
        except Exception:
            log.exception("closing a tenant failed")
        finally:
            slot.tenant = None  # closed: nothing here may keep its memory alive
            with self._cond:
                gate = self._closing.pop(slot.tenant_id)
                self._forget(slot)
                if outside:
                    self._outside -= 1
                self._cond.notify_all()
            gate.set_result(None)

    # -- the memory budget ---------------------------------------------------------

    def _enforce_soon(self) -> None:
        """Close idle tenants in the background until the LRU is back within the budget."""
        with self._cond:
            if self._enforcing or self._shut:
                return
            self._enforcing = True
        threading.Thread(target=self._enforce, name="tenant-evict", daemon=True).start()

    def _enforce(self) -> None:
        """Detach least recently used idle tenants while over the budget, and close them."""
        try:
            while True:
                with self._cond:
                    victims: list[_Slot] = []
                    over = self._over_by(0)
                    for slot in list(self._slots.values()):
                        if over <= 0 or self._shut:
                            break
                        if slot.idle():
                            self._detach(slot)
                            self._outside += 1
                            self.evictions_by[MEMORY] += 1
                            victims.append(slot)
                            over -= slot.bytes
                    if not victims:
                        self._enforcing = False  # the rest is busy: the next release looks again
                        return
                self._close_all(victims, outside=True)
        except BaseException:
            with self._cond:
                self._enforcing = False
            log.exception("evicting tenants to the memory budget failed")

    def refresh(self) -> None:
        """Count every open tenant's bytes again (the background inserter grows graphs between
        requests); the idle closer and metrics call it."""
        if self.max_open_bytes is None:
            return
        with self._cond:
            slots = [s for s in self._slots.values() if s.tenant is not None]
        sizes = [(s, tenant_bytes(t)) for s in slots if (t := s.tenant) is not None]
        with self._cond:
            for slot, size in sizes:
                if slot.where != _GONE:
                    self._account(slot, size)
            over = self._over_by(0) > 0
        if over:
            self._enforce_soon()

    # -- reads of tenants that do not exist -----------------------------------------

    def _open_absent(self, tenant_id: str) -> Tenant:
        """Blocking: the empty stand-in for a tenant with no files, once admit allows it."""
        if self.admit is not None:
            self.admit(tenant_id)
        if self._shut:  # a lease close_all stopped waiting for
            raise _unavailable(SHUT)
        return self._standin.get()

    def _release_absent(self) -> None:
        """A read of a tenant that does not exist is done."""
        with self._cond:
            self._absent_in_flight -= 1
            self._cond.notify_all()

    # -- background and maintenance ----------------------------------------------

    def close_idle(self, now: float | None = None) -> int:
        """Close tenants without a request for idle_secs; returns how many were closed."""
        now = time.monotonic() if now is None else now
        victims: list[_Slot] = []
        with self._cond:
            for slot in list(self._slots.values()):
                if slot.idle() and now - slot.last_used >= self.idle_secs:
                    self._detach(slot)
                    self._outside += 1
                    self.idle_closes += 1
                    victims.append(slot)
        closed = len(victims)
        self._close_all(victims, outside=True)
        return closed

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
        """The idle closer's loop (it also recounts open tenants' bytes); ends at close_all."""
        while not self._stop.wait(period):
            try:
                self.close_idle()
                self.refresh()
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
            slot = self._slots.get(tenant_id)
            if slot is not None:
                self._detach(slot)  # registers a gate of its own: ours replaces it
            self._closing[tenant_id] = gate
            self._outside += 1
            if slot is not None:
                self._cond.wait_for(lambda: slot.in_flight == 0)
        try:
            if slot is not None and slot.tenant is not None:
                self._closing_tenant(slot.tenant)
                slot.tenant.close()
            if slot is not None:
                slot.tenant = None
                with self._cond:
                    self._forget(slot)
            yield
        finally:
            with self._cond:
                del self._closing[tenant_id]
                self._outside -= 1
                self._cond.notify_all()
            gate.set_result(None)

    def _closing_tenant(self, tenant: Tenant) -> None:
        """Tell the embedder a tenant closes (its work stays in the log)."""
        if self.embedding is not None:
            self.embedding.closing(tenant)

    @contextmanager
    def use_open(self, tenant_id: str) -> Iterator[Tenant | None]:
        """Blocking: the tenant held as a request holds it if it is open now, else None; never
        opens it, and leaves its place in the LRU as it was (background work is no use)."""
        with self._cond:
            slot = self._slots.get(tenant_id)
            if self._shut or slot is None or slot.tenant is None or slot.detached:
                slot = None
            else:
                slot.in_flight += 1
        if slot is None:
            yield None
            return
        try:
            assert slot.tenant is not None
            yield slot.tenant
        finally:
            self._release(slot)

    @contextmanager
    def inspect(self, tenant_id: str) -> Iterator[Tenant | None]:
        """Blocking: the tenant if it is open (held as a request is), else None while its files
        are kept closed for the caller to read them; it is never opened for this.

        A request that arrives meanwhile waits for the block to end, as behind a close, so the
        caller may open the log read-only without a second environment of it in this process.
        """
        gate: Future[None] | None = None
        lease: Lease | None = None
        with self._cond:
            while True:
                if self._shut:
                    raise _unavailable(SHUT)
                slot = self._slots.get(tenant_id)
                if slot is not None:
                    slot.in_flight += 1
                    self._slots.move_to_end(tenant_id)
                    lease = Lease(self, slot)
                    break
                prior = self._closing.get(tenant_id)
                if prior is None:
                    gate = Future()
                    self._closing[tenant_id] = gate
                    self._outside += 1
                    break
                # The lambda runs within this pass only: it is done with `prior` before the next.
                self._cond.wait_for(lambda: self._closing.get(tenant_id) is not prior)  # noqa: B023
        if lease is not None:
            try:
                yield lease.wait()
            finally:
                lease.release()
            return
        assert gate is not None
        try:
            yield None
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
                lambda: all(s.in_flight == 0 for s in slots) and self._absent_in_flight == 0,
                deadline - time.monotonic(),
            )
        for slot in slots:
            if slot.tenant is None:
                continue
            try:
                self._closing_tenant(slot.tenant)
                slot.tenant.close()
            except Exception:
                log.exception("closing a tenant failed")
        with self._cond:
            for slot in slots:
                self._forget(slot)
        self._standin.close()
        self.writers.close()

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
                open_bytes=self._lru_bytes + self._closing_bytes,
                budget=self.max_open_bytes,
                evictions_by=dict(self.evictions_by),
                rejections_by=dict(self.rejections_by),
            )

    def open_count(self) -> int:
        """Tenants open (or opening) now."""
        with self._cond:
            return len(self._slots)

    def open_tenant(self, tenant_id: str) -> Tenant | None:
        """The tenant if it is open now, without a lease (it may close at any moment: a reader
        of it must take an lmdb.Error as "not open"), None otherwise; never opens it."""
        with self._cond:
            slot = self._slots.get(tenant_id)
            return None if slot is None else slot.tenant

    def open_tenants(self) -> list[Tenant]:
        """The tenants open now (for the purger and metrics)."""
        with self._cond:
            return [s.tenant for s in self._slots.values() if s.tenant is not None]

    def open_bytes(self) -> dict[str, int]:
        """The accounted bytes of each open tenant."""
        with self._cond:
            return {s.tenant_id: s.bytes for s in self._slots.values() if s.tenant is not None}

    def map_sizes(self) -> dict[str, int]:
        """The LMDB map size of each open tenant, in bytes."""
        sizes: dict[str, int] = {}
        for tenant in self.open_tenants():
            # A tenant closed since the snapshot raises lmdb.Error and is simply left out.
            try:
                sizes[tenant.tenant_id] = tenant.map_size()
            except lmdb.Error:
                continue
        return sizes


def _tenant_hooks(
    embedding: EmbeddingWorker | None, on_batch: Callable[[int], None] | None
) -> TenantHooks:
    """What each tenant a manager opens tells: its new work to the embedder, its group
    commits' sizes, and its memory measured for quotas (storage/tenants/footprint.py)."""
    return TenantHooks(
        on_unembedded=None if embedding is None else embedding.notice,
        on_batch=on_batch,
        measure_memory=tenant_bytes,
    )
