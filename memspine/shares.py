"""Fair shares of a bounded resource: at most `limit` holders, at most `per_owner` of them for one
owner (a tenant), and owners that wait take turns, so one owner's backlog never starves another."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

_NONE = object()  # no owner can take a slot (None is an owner like any other)


class _Waiter:
    """One caller waiting for a share: its loop, its future, and whether a share was handed to it."""

    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False


class FairShares:
    """Async admission to `limit` slots, `per_owner` at most for each owner, round-robin between
    the owners that wait (FIFO within one owner).

    Safe to use from several event loops and threads: a freed slot is handed to the next waiter
    under a lock and its loop is woken with call_soon_threadsafe.
    """

    def __init__(self, limit: int, per_owner: int) -> None:
        if limit < 1 or per_owner < 1:
            raise ValueError("limit and per_owner must be positive")
        self.limit = limit
        self.per_owner = min(per_owner, limit)
        self._lock = threading.Lock()
        self._held: dict[Hashable, int] = {}
        self._total = 0
        # Owners with waiters, in the order they get their next turn.
        self._waiting: OrderedDict[Hashable, deque[_Waiter]] = OrderedDict()

    def held(self, owner: Hashable) -> int:
        """Slots `owner` holds now."""
        return self._held.get(owner, 0)

    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        with self._lock:
            return sum(len(q) for q in self._waiting.values())

    async def acquire(self, owner: Hashable) -> None:
        """Take a slot for `owner`, waiting for its turn if the owner or the whole pool is full."""
        with self._lock:
            if owner not in self._waiting and self._free_for(owner):
                self._take(owner)
                return
            waiter = _Waiter(asyncio.get_running_loop())
            self._waiting.setdefault(owner, deque()).append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if not waiter.granted:
                    queue = self._waiting.get(owner)
                    if queue is not None:
                        queue.remove(waiter)
                        if not queue:
                            del self._waiting[owner]
                    raise
            self.release(owner)  # handed over as the caller went away: pass it on
            raise

    def release(self, owner: Hashable) -> None:
        """Give back a slot of `owner`; the next waiter in turn gets it."""
        with self._lock:
            held = self._held[owner] - 1
            if held:
                self._held[owner] = held
            else:
                del self._held[owner]
            self._total -= 1
            woken = self._hand_over()
        for waiter in woken:
            waiter.loop.call_soon_threadsafe(_wake, waiter.future)

    @asynccontextmanager
    async def slot(self, owner: Hashable) -> AsyncIterator[None]:
        """Hold a slot of `owner` for the length of the block."""
        await self.acquire(owner)
        try:
            yield
        finally:
            self.release(owner)

    def _free_for(self, owner: Hashable) -> bool:
        return self._total < self.limit and self._held.get(owner, 0) < self.per_owner

    def _take(self, owner: Hashable) -> None:
        self._held[owner] = self._held.get(owner, 0) + 1
        self._total += 1

    def _hand_over(self) -> list[_Waiter]:
        """Under the lock: give free slots to waiters, each owner in turn; the waiters to wake."""
        woken: list[_Waiter] = []
        while self._total < self.limit:
            owner = next((o for o in self._waiting if self._free_for(o)), _NONE)
            if owner is _NONE:
                break
            queue = self._waiting.pop(owner)
            waiter = queue.popleft()
            if queue:
                self._waiting[owner] = queue  # to the back: every other owner goes first
            waiter.granted = True
            self._take(owner)
            woken.append(waiter)
        return woken


def _wake(future: asyncio.Future[None]) -> None:
    """On the waiter's loop: let it go on (unless it was cancelled meanwhile)."""
    if not future.done():
        future.set_result(None)
