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

    def try_acquire(self, owner: Hashable) -> bool:
        """Take a slot for `owner` if one is free for it now, without waiting."""
        with self._lock:
            if owner not in self._waiting and self._free_for(owner):
                self._take(owner)
                return True
            return False

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


# An owner whose recent use cost less than this (its queries' CPU time, decaying) is light.
LIGHT_SECS = 0.1
KNOWN_OWNERS = 10_000  # costs remembered, least recently used forgotten first (they are light)


class CostedShares:
    """FairShares of `limit` slots, `per_owner` each, plus one lane for light owners: an owner
    whose recent uses were short takes a free slot, or else waits for the lane, never behind
    the long uses of others. Two tenants running long queries in every slot keep a third
    tenant's trivial query waiting for the lane at most (other light uses), not for them.

    The cost of an owner is the CPU time of its last use (the caller measures it: wall time
    would count the others it ran beside), or half its previous cost if more: a tenant whose
    queries run long stays heavy for its next few, however short.
    """

    def __init__(self, limit: int, per_owner: int, *, light_secs: float = LIGHT_SECS) -> None:
        self.slots = FairShares(limit, per_owner)
        self.lane = FairShares(1, 1)
        self.light_secs = light_secs
        self._cost: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()
        self.lane_uses = 0  # uses that ran in the lane (the slots were full)

    def held(self, owner: Hashable) -> int:
        """Slots and lane `owner` holds now."""
        return self.slots.held(owner) + self.lane.held(owner)

    def light(self, owner: Hashable) -> bool:
        """Whether `owner`'s recent uses were short (an owner never seen is light)."""
        with self._lock:
            return self._cost.get(owner, 0.0) < self.light_secs

    async def acquire(self, owner: Hashable) -> FairShares:
        """A slot for `owner` (waiting its turn): the pool that granted it, to release to."""
        if self.light(owner) and not self.slots.held(owner):
            if self.slots.try_acquire(owner):
                return self.slots
            await self.lane.acquire(owner)
            with self._lock:
                self.lane_uses += 1
            return self.lane
        await self.slots.acquire(owner)
        return self.slots

    def release(self, pool: FairShares, owner: Hashable, secs: float) -> None:
        """Give back `owner`'s slot of `pool` after a use of `secs`, which sets its cost."""
        with self._lock:
            cost = max(secs, self._cost.pop(owner, 0.0) / 2)
            self._cost[owner] = cost
            while len(self._cost) > KNOWN_OWNERS:
                self._cost.popitem(last=False)
        pool.release(owner)
