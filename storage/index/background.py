"""One bounded pool of niced worker threads that runs every open tenant's index upkeep in turn."""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("memspine.background")

# Upkeep is background work: the workers run niced so that, when the cores are busy, the threads
# that answer requests (the event loop, the writers) get the CPU first (Linux sets nice per
# thread; the threads Tantivy starts from a worker inherit it).
NICENESS = 10  # added to the process's own
MAX_WORKERS = 8

# A step runs one slice of an index's work and says when to run again: None once it has
# nothing left (until woken), 0.0 at once (after the tasks already waiting), else in so many
# seconds.
Step = Callable[[], float | None]

_IDLE, _READY, _TIMED, _RUNNING = range(4)


class Task:
    """One index's background work, run by the pool a slice (a step) at a time."""

    def __init__(self, pool: Pool, step: Step, name: str) -> None:
        self.pool = pool
        self.step = step
        self.name = name
        self.state = _IDLE
        self.again = False  # woken while running: run once more
        self.cancelled = False
        self.version = 0  # moves on each schedule: a timer of an older version is stale
        self.runner: int | None = None  # the worker running it

    def wake(self) -> None:
        """Run a step soon (at once if it was waiting for a timer)."""
        self.pool.wake(self)

    def cancel(self) -> None:
        """Run no more steps; returns once a running one has finished."""
        self.pool.cancel(self)


def default_workers() -> int:
    """The cores this process may run on, within [2, MAX_WORKERS]: a commit waiting on its
    fsync must not hold up every other tenant's upkeep."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(2, min(MAX_WORKERS, cores))


class Pool:
    """Worker threads, started on first use, shared by every task; ready tasks run in turn
    (round-robin: a task that wants more goes to the back), so one tenant's backlog cannot
    starve the others'."""

    def __init__(self, workers: int | None = None, niceness: int = NICENESS) -> None:
        self.size = workers or default_workers()
        self.niceness = niceness
        self._cond = threading.Condition()
        self._ready: deque[Task] = deque()
        self._timers: list[tuple[float, int, int, Task]] = []  # (due, order, version, task)
        self._order = 0
        self._threads: list[threading.Thread] = []

    def task(self, step: Step, name: str) -> Task:
        """A task for this pool (idle until woken)."""
        return Task(self, step, name)

    def threads(self) -> int:
        """Worker threads started (at most size)."""
        return len(self._threads)

    def wake(self, task: Task) -> None:
        """Queue task for a step unless it is queued already; a running one runs once more."""
        with self._cond:
            if task.cancelled:
                return
            if task.state == _RUNNING:
                task.again = True
                return
            if task.state == _READY:
                return
            task.version += 1  # a pending timer, if any, is now stale
            task.state = _READY
            self._ready.append(task)
            self._start_workers()
            self._cond.notify()

    def cancel(self, task: Task) -> None:
        """Take task out of the pool; waits for a running step (unless called from it)."""
        with self._cond:
            task.cancelled = True
            task.version += 1
            if task.state == _READY:
                self._ready.remove(task)
            if task.runner != threading.get_ident():
                while task.state == _RUNNING:
                    self._cond.wait()
            task.state = _IDLE

    def _start_workers(self) -> None:
        """Start the workers on first use (the caller holds _cond)."""
        while len(self._threads) < self.size:
            worker = threading.Thread(
                target=self._work, name=f"upkeep-{len(self._threads)}", daemon=True
            )
            self._threads.append(worker)
            worker.start()

    def _work(self) -> None:
        """A worker: run the next ready task's step, reschedule it as it says, forever."""
        with contextlib.suppress(OSError, AttributeError):  # not Linux: same priority as the rest
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + self.niceness)
        while True:
            task = self._next()
            try:
                after = task.step()
            except Exception:  # a task's bug must not take a worker of every tenant with it
                log.exception("background task %s failed", task.name)
                after = None
            self._done(task, after)

    def _next(self) -> Task:
        """Wait for a ready task (moving due timers to the ready queue) and mark it running."""
        with self._cond:
            while True:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _due, _order, version, task = heapq.heappop(self._timers)
                    if version == task.version and task.state == _TIMED:
                        task.state = _READY
                        self._ready.append(task)
                if self._ready:
                    task = self._ready.popleft()
                    task.state, task.again, task.runner = _RUNNING, False, threading.get_ident()
                    return task
                timeout = self._timers[0][0] - now if self._timers else None
                self._cond.wait(timeout)

    def _done(self, task: Task, after: float | None) -> None:
        """Reschedule a task after its step: again at the back, on a timer, or idle."""
        with self._cond:
            task.runner = None
            if task.cancelled:
                task.state = _IDLE
            elif task.again or (after is not None and after <= 0):
                task.state = _READY
                self._ready.append(task)
            elif after is None:
                task.state = _IDLE
            else:
                task.version += 1
                task.state = _TIMED
                self._order += 1
                heapq.heappush(
                    self._timers, (time.monotonic() + after, self._order, task.version, task)
                )
            self._cond.notify_all()  # a cancel may be waiting; a worker may take the next


_shared: Pool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> Pool:
    """The process's pool, made on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Pool()
        return _shared


def _forget_after_fork() -> None:
    """A forked child has none of the parent's threads: it makes its own pool."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
