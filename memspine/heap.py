"""The heap trimmer: freed C heap memory goes back to the OS once a burst of work leaves it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from storage import available, free_bytes, trim

log = logging.getLogger("memspine.heap")

# Free bytes in the heap above which a trim is worth its walk over the arenas.
TRIM_ABOVE_BYTES = 16 << 20
# How often the trimmer looks: freed memory is returned within this long of a burst's end.
TRIM_EVERY_SECS = 2.0


class HeapTrimmer:
    """Every TRIM_EVERY_SECS, trims the heap in a thread when more than TRIM_ABOVE_BYTES are free
    and the heap changed since the last trim.

    A large append or a big recall answer frees its buffers, but glibc keeps what lies below
    the top of each arena: without a trim the server's resident memory after a burst of large
    bodies stays where the burst took it (bench/noisy_neighbour.py's bulk scenario).
    """

    def __init__(self, every_secs: float = TRIM_EVERY_SECS) -> None:
        self.every_secs = every_secs
        self.trims = 0
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self._after_last = -1  # the free figure the last trim left

    def start(self) -> None:
        """Begin looking (call from the running event loop); nothing to do off glibc."""
        if self._task is None and available():
            self._task = asyncio.create_task(self._run(), name="heap-trimmer")

    async def stop(self) -> None:
        """Stop looking."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def check(self) -> bool:
        """Trim if enough is free and anything was allocated or freed since the last trim; True
        if a trim ran (one at a time)."""
        free = free_bytes()
        if free < TRIM_ABOVE_BYTES or free == self._after_last:
            return False  # nothing worth it, or an idle heap whose free pages are gone already
        if not self._lock.acquire(blocking=False):
            return False
        try:
            trim()
            self.trims += 1
            self._after_last = free_bytes()  # a trim leaves the free figure as it was
            return True
        finally:
            self._lock.release()

    async def _run(self) -> None:
        """Sleep, look, repeat; the walk over the arenas runs off the event loop."""
        while True:
            await asyncio.sleep(self.every_secs)
            try:
                await asyncio.to_thread(self.check)
            except Exception:
                log.exception("heap trim failed")
