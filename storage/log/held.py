"""Which event logs keep their LMDB environment open: those used lately, as many as the
descriptors allow, across all tenants.

An open environment holds three file descriptors (its data file twice, its lock file) and maps
its file. Held by every open tenant, descriptors would bound how many tenants can be open at
once (6,663 under a limit of 20,000: bench/RESULTS.md, "Many tenants open at once"). So an
open tenant's log lets its environment go once unused for LINGER_SECS, or when more than
`limit()` are held (least recently used first), and opens it again at its next use (a third of
a millisecond on this machine): descriptors follow the tenants in use, and the count of open
tenants follows from memory alone (docs/operations.md, "The default cap").
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Protocol

LINGER_SECS = 5.0
FDS_PER_LOG = 3  # LMDB's data file twice (reads, O_DSYNC meta writes) and its lock file
# Descriptors kept for everything else (sockets, the control database, Tantivy's writer locks
# and a commit's segment files, the read audit): the held logs get the rest of the soft limit,
# at most this share of it.
FD_SHARE = 0.5
MIN_HELD = 16


class Task(Protocol):
    """A pool's task (storage/index/background.py): wake() runs a step soon."""

    def wake(self) -> None:
        """Run a step soon."""
        ...


class Pool(Protocol):
    """A pool that runs a task's steps: each returns seconds until the next, or None."""

    def task(self, step: Callable[[], float | None], name: str) -> Task:
        """A task for this pool (idle until woken)."""
        ...


# Where sweeps run: the index layer's shared pool, named by the tenants layer (this layer may
# not import it). Without one no log lets go (a command-line tool's, say): as before.
_pool: Callable[[], Pool] | None = None


def run_sweeps_on(pool: Callable[[], Pool]) -> None:
    """Run the registry's sweeps on the pool this returns (asked at each sweep's start)."""
    global _pool
    _pool = pool


class Holder(Protocol):
    """An event log as the registry sees it."""

    used_at: float  # time.monotonic() of its last use

    def let_go(self) -> bool:
        """Close the environment if nothing uses it now; True if it went (or was not open)."""
        ...


def limit_from_fds() -> int:
    """How many environments may be held at once: FD_SHARE of the soft descriptor limit (as
    the server raised it at start), FDS_PER_LOG each; at least MIN_HELD."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_HELD, int(soft * FD_SHARE) // FDS_PER_LOG)


class HeldLogs:
    """The event logs holding their environment open."""

    def __init__(self, limit: int | None = None, linger: float = LINGER_SECS) -> None:
        self._limit = limit  # None: from the descriptor limit, read at the first add
        self.linger = linger
        self._lock = threading.Lock()
        self._held: dict[int, Holder] = {}
        self._task: Task | None = None

    def __len__(self) -> int:
        return len(self._held)

    @property
    def limit(self) -> int:
        """How many may be held at once."""
        if self._limit is None:
            self._limit = limit_from_fds()
        return self._limit

    def add(self, holder: Holder) -> None:
        """The holder opened its environment; past the limit the sweep lets the least recent go
        (on the pool: the caller may hold its own locks)."""
        with self._lock:
            self._held[id(holder)] = holder
            over = len(self._held) > self.limit
            task, start = self._task, self._task is None and _pool is not None
            if start and _pool is not None:
                task = self._task = _pool().task(self._sweep, "log linger")
        if task is not None and (start or over):
            task.wake()

    def forget(self, holder: Holder) -> None:
        """The holder closed its environment."""
        with self._lock:
            self._held.pop(id(holder), None)

    def _sweep(self) -> float | None:
        """A pool step: let go of those past the limit (least recently used first) and those
        unused for linger seconds; come back while any is held."""
        now = time.monotonic()
        with self._lock:
            held = sorted(self._held.values(), key=lambda h: h.used_at)
        # Past the limit, down to nine tenths of it: a sweep sorts every held log, and one a
        # new open would cost each open past the limit as much.
        over = len(held) - int(self.limit * 0.9) if len(held) > self.limit else 0
        refused = False
        for i, holder in enumerate(held):
            if i >= over and now - holder.used_at < self.linger:
                break  # the rest were used later
            if holder.let_go():
                self.forget(holder)
            else:
                refused = True  # in use: asked again shortly
        with self._lock:
            if not self._held:
                self._task = None  # the next add starts another sweep
                return None
            oldest = min(h.used_at for h in self._held.values())
        if refused:
            return self.linger / 4
        return max(0.05, oldest + self.linger - now)


_held = HeldLogs()


def held_logs() -> HeldLogs:
    """The process's registry."""
    return _held


def _forget_after_fork() -> None:
    """A forked child holds none of the parent's environments and has a pool of its own."""
    global _held
    _held = HeldLogs()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
