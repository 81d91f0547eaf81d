"""Which keyword indexes keep their Tantivy index open: the few used lately, across all tenants.

An open Tantivy index runs a thread of its own (its directory polls meta.json every 500 ms for as
long as the index lives; tantivy-py makes its reader with that reload policy, and a manual one
set afterwards leaves the thread running) and maps each segment's files. Held by every open
tenant, that is a thread and a dozen mappings an open tenant, which bounds how many can be
open (bench/RESULTS.md, "Cold tenants"). So an open tenant's keyword index lets its Tantivy
index go once it has not been used for LINGER_SECS, or when more than HELD_MAX are held (the
least recently used first), and opens it again at its next search (0.5 ms on this machine):
the thread count follows the tenants in use, not the tenants open.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Protocol

from storage.index.background import Task, shared_pool

LINGER_SECS = 5.0
# Above the tenants a busy server uses within LINGER_SECS: at 64, 100 tenants in turn reopened an
# index on nearly every search (bench/RESULTS.md, "Read audit", 2.4x fewer recalls a second).
HELD_MAX = 256


class Holder(Protocol):
    """A keyword index as the registry sees it."""

    def release(self) -> bool:
        """Let the Tantivy index go if nothing needs it now; True if it went (or was not held)."""
        ...


class Held:
    """The keyword indexes holding their Tantivy index open, least recently used first."""

    def __init__(self, limit: int = HELD_MAX, linger: float = LINGER_SECS) -> None:
        self.limit = limit
        self.linger = linger
        self._lock = threading.Lock()
        self._used: OrderedDict[int, tuple[Holder, float]] = OrderedDict()  # id -> (it, last use)
        self._task: Task | None = None

    def __len__(self) -> int:
        return len(self._used)

    def touch(self, holder: Holder) -> None:
        """Note that holder used its Tantivy index now (callers may hold its own locks: releases
        run on the pool, never here); past the limit, the sweep lets the least recent go."""
        now = time.monotonic()
        with self._lock:
            self._used[id(holder)] = (holder, now)
            self._used.move_to_end(id(holder))
            over = len(self._used) > self.limit
            task, start = self._task, self._task is None
            if start:
                task = self._task = shared_pool().task(self._sweep, "keyword linger")
        if task is not None and (start or over):
            task.wake()

    def forget(self, holder: Holder) -> None:
        """Forget holder: it no longer holds its Tantivy index (closed)."""
        with self._lock:
            self._used.pop(id(holder), None)

    def _sweep(self) -> float | None:
        """A pool step: let go of those past the limit (least recent first) and those unused
        for linger seconds; come back while any is held."""
        now = time.monotonic()
        with self._lock:
            entries = list(self._used.values())
        over = max(0, len(entries) - self.limit)
        due = [h for i, (h, at) in enumerate(entries) if i < over or now - at >= self.linger]
        refused = False
        for holder in due:
            if holder.release():
                with self._lock:
                    entry = self._used.get(id(holder))
                    if entry is not None and entry[0] is holder and entry[1] <= now:
                        del self._used[id(holder)]  # not if it was used again meanwhile
            else:
                refused = True  # a fold under way: asked again shortly
        with self._lock:
            if not self._used:
                self._task = None  # the next touch starts another sweep
                return None
            oldest = next(iter(self._used.values()))[1]
        if refused:
            return self.linger / 4
        return max(0.05, oldest + self.linger - now)


_held = Held()


def held() -> Held:
    """The process's registry."""
    return _held


def _forget_after_fork() -> None:
    """A forked child holds none of the parent's indexes and has a pool of its own."""
    global _held
    _held = Held()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
