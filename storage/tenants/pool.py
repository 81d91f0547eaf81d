"""The writers every open tenant shares: a few threads that commit tenants' queued jobs in
groups, serving the tenants with work in turn, one group of one tenant at a time per thread.

Each tenant has a queue (`TenantQueue`, the `GroupWriter` of storage/tenants/writer.py). A
thread takes the tenant at the front of the ready line, commits up to MAX_BATCH of its jobs as
one group, and puts it at the back of the line if more came meanwhile: a tenant that floods gets
one group per turn like every other, and a tenant is never committed by two threads at once, so
its jobs are committed in the order they came. A group of lingering jobs (a server vector write
waiting for an append to share its commit) waits off the line, on a timer, instead of holding a
thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, Protocol, TypeVar

from storage.errors import MemspineError, Unavailable

log = logging.getLogger("memspine.writer")

MAX_BATCH = 512  # jobs in one group commit
# A group commit spends most of its time waiting for fsync, which holds no core, and disks flush
# many files at once: with 32 tenants written at once, appends/s grew with the threads up to 32
# on 2 cores (bench/RESULTS.md, "The writer pool"). The pool starts them as work waits.
THREADS_PER_CORE = 16
MAX_DEFAULT_THREADS = 64
CLOSED = "the tenant is closing; retry shortly"

_IDLE, _READY, _RUNNING, _LINGER = range(4)  # where a tenant's queue is in its pool


class Queued(Protocol):
    """What the pool needs of a job (storage/tenants/writer.py's Job)."""

    due: float  # until when it may wait for other work to share its group; 0: it does not wait
    future: Future[Any]

    def fail(self, exc: BaseException) -> None:
        """Fail the caller's future."""


J = TypeVar("J", bound=Queued)


def default_threads() -> int:
    """THREADS_PER_CORE a core the process may run on, at most MAX_DEFAULT_THREADS."""  # 2: 32
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_THREADS, THREADS_PER_CORE * cores))


class TenantQueue(Generic[J]):
    """One tenant's jobs waiting for its pool, and the group commit they go to."""

    def __init__(
        self,
        name: str,
        commit_batch: Callable[[list[J]], None],
        on_batch: Callable[[int], None] | None = None,
        pool: WriterPool | None = None,
    ) -> None:
        self.name = name
        self.pool = pool if pool is not None else shared_pool()
        self._commit_batch = commit_batch
        self._on_batch = on_batch
        # Guarded by the pool's lock:
        self._jobs: deque[J] = deque()
        self._eager = 0  # queued jobs that do not linger
        self._state = _IDLE
        self._due = 0.0  # while lingering: when its group is due
        self._stopping = False
        self._drained = threading.Event()

    def submit(self, job: J) -> None:
        """Queue one job; its future resolves once its group is committed. Its due: how long
        it may wait, alone in the queue, for other work to share its commit."""
        self.pool.submit(self, job)

    def queued(self) -> int:
        """Jobs waiting for a thread (not those being committed)."""
        with self.pool.lock:
            return len(self._jobs)

    def stop(self) -> None:
        """Commit every job queued, refuse later ones, and wait for the last group to end."""
        self.pool.stop(self)
        self._drained.wait()
        # The callbacks are the owner's bound methods: dropped, a closed tenant is freed as soon
        # as its last reference goes (its vector graph with it), not at the next full collection.
        self._commit_batch = self._on_batch = None  # type: ignore[assignment]

    def commit(self, batch: list[J]) -> None:
        """Commit one group; a failure fails every job in it that has no answer yet."""
        try:
            self._commit_batch(batch)
        except BaseException as exc:  # answer every waiter, whatever went wrong
            if isinstance(exc, MemspineError):  # a refusal with its answer (DiskFull): no bug
                log.error("writer batch of %d refused: %s", len(batch), type(exc).__name__)
            else:
                log.exception("writer batch of %d failed", len(batch))
            for job in batch:
                if not job.future.done():
                    job.fail(exc)
        if self._on_batch is not None:
            try:
                self._on_batch(len(batch))
            except Exception:  # a metric: never the pool thread's end
                log.exception("the batch observer failed")

    def first_due(self) -> float:
        """When the first group would be due if nothing else came (every job in it lingers)."""
        return min(job.due for job in itertools.islice(self._jobs, MAX_BATCH))


class WriterPool:
    """At most `threads` threads committing the groups of every tenant queue made on it, started
    one by one when a tenant waits in line and no thread is free, and kept until close."""

    def __init__(self, threads: int | None = None, name: str = "writer") -> None:
        self.size = threads if threads is not None else default_threads()
        if self.size < 1:
            raise ValueError("a writer pool needs at least one thread")
        self.name = name
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._ready: deque[TenantQueue[Any]] = deque()  # served front first, back after a turn
        self._lingering: list[tuple[float, int, TenantQueue[Any]]] = []  # a heap by due time
        self._order = itertools.count()  # ties in the heap, never compared queues
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a tenant in line
        self._closed = False
        self.groups = 0  # groups committed, for tests and metrics

    def threads(self) -> int:
        """Threads running now (started as work waits, ended by close)."""
        with self.lock:
            return sum(1 for t in self._threads if t.is_alive())

    def submit(self, queue: TenantQueue[Any], job: Queued) -> None:
        """Queue a tenant's job and put the tenant in line if it was not."""
        with self.lock:
            refused = queue._stopping or self._closed
            if not refused:
                queue._jobs.append(job)
                if not job.due:
                    queue._eager += 1
                if queue._state in (_IDLE, _LINGER):
                    self._schedule(queue, time.monotonic())
        if refused:  # a close already drained it: nothing would ever answer the job
            job.fail(Unavailable(CLOSED, headers={"Retry-After": "1"}))

    def stop(self, queue: TenantQueue[Any]) -> None:
        """Mark a tenant's queue closing: what it holds is committed at once, lingering or not;
        its drained event is set once nothing of it is queued or committing."""
        with self.lock:
            queue._stopping = True
            if queue._state == _LINGER:
                self._schedule(queue, time.monotonic())
            elif queue._state == _IDLE:
                queue._drained.set()

    def close(self) -> None:
        """End the threads once every queue in line is served (close the tenants first)."""
        with self.lock:
            self._closed = True
            threads, self._threads = self._threads, []
            self._cond.notify_all()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _start_if_short(self) -> None:
        """Start one more thread if more tenants wait in line than threads are free, or one is on
        the timer with no thread to wake it, up to the pool's size (under the lock): a pool
        nobody writes through costs no thread."""
        short = len(self._ready) > self._idle or (self._lingering and not self._threads)
        if short and len(self._threads) < self.size and not self._closed:
            name = f"{self.name}-{len(self._threads)}"
            thread = threading.Thread(target=self._run, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _schedule(self, queue: TenantQueue[Any], now: float) -> None:
        """Put a queue holding jobs in line, or on the timer while its group lingers (under the
        lock; the queue is not being committed)."""
        if queue._stopping or queue._eager or len(queue._jobs) >= MAX_BATCH:
            due = now
        else:
            due = queue.first_due()
        if due <= now or self._closed:
            queue._state = _READY
            self._ready.append(queue)
            self._cond.notify()
            self._start_if_short()
            return
        if queue._state == _LINGER and queue._due <= due:
            return  # already on the timer for an earlier time
        queue._state, queue._due = _LINGER, due
        earliest = not self._lingering or due < self._lingering[0][0]
        heapq.heappush(self._lingering, (due, next(self._order), queue))
        if earliest:  # the waiting threads' timeouts were for a later time
            self._cond.notify_all()
        self._start_if_short()

    def _next(self) -> TenantQueue[Any] | None:
        """The queue at the front of the line, once there is one (under the lock); None when
        the pool is closed and nothing is in line."""
        while True:
            now = time.monotonic()
            while self._lingering and (self._lingering[0][0] <= now or self._closed):
                due, _, queue = heapq.heappop(self._lingering)
                # An entry is stale once its queue went in line by a job that does not linger.
                if queue._state == _LINGER and queue._due == due:
                    queue._state = _READY
                    self._ready.append(queue)
            if self._ready:
                queue = self._ready.popleft()
                queue._state = _RUNNING
                self._start_if_short()  # timers may have put more in line than threads are free
                return queue
            if self._closed:
                return None
            timeout = self._lingering[0][0] - now if self._lingering else None
            self._idle += 1
            try:
                self._cond.wait(timeout)
            finally:
                self._idle -= 1

    def _take(self, queue: TenantQueue[Any]) -> list[Any]:
        """The queue's next group: up to MAX_BATCH jobs in the order they came (under the lock)."""
        jobs = queue._jobs
        batch = [jobs.popleft() for _ in range(min(len(jobs), MAX_BATCH))]
        queue._eager -= sum(1 for job in batch if not job.due)
        return batch

    def _done(self, queue: TenantQueue[Any]) -> None:
        """A group of the queue is committed: back in line behind the others if more came, else
        idle (under the lock)."""
        self.groups += 1
        if queue._jobs:
            self._schedule(queue, time.monotonic())
            return
        queue._state = _IDLE
        if queue._stopping:
            queue._drained.set()

    def _run(self) -> None:
        """One thread: take the next tenant in line, commit one group of it, repeat."""
        while True:
            with self.lock:
                queue = self._next()
                if queue is None:
                    return
                batch = self._take(queue)
            try:
                queue.commit(batch)
            finally:  # whatever happened, the tenant is served again (or closes)
                with self.lock:
                    self._done(queue)


_shared: WriterPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> WriterPool:
    """The process's pool for tenants opened without one (tools, tests, benches); its threads
    start with its first job."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WriterPool(name="writer")
        return _shared


def _forget_shared_in_child() -> None:
    """A forked child has none of its parent's threads: it makes its own pool when it writes."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_in_child)
