"""Failed attempts per key id: a few free, then waits that double up to a cap (429 meanwhile)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from storage.errors import TooManyRequests

FREE_FAILURES = 5
BASE_SECS = 1.0
MAX_BACKOFF_SECS = 60.0
# A key id without a failed attempt for this long starts again with its free failures.
FORGET_SECS = 900.0
MAX_KEY_IDS = 100_000


class _Failures:
    """One key id's failed attempts in a row, the last one's time, and when it may try again."""

    __slots__ = ("count", "last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.until = 0.0


class Backoff:
    """Counts failed attempts per key id (known or not, alike) and says how long one must wait.

    After `free` failures in a row each further failure doubles the wait, from `base_secs` up to
    `max_secs`; a success forgets the count. Thread-safe; bounded to `max_ids` key ids (least
    recently failed first out).
    """

    def __init__(
        self,
        free: int = FREE_FAILURES,
        max_secs: float = MAX_BACKOFF_SECS,
        *,
        base_secs: float = BASE_SECS,
        forget_secs: float = FORGET_SECS,
        max_ids: int = MAX_KEY_IDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` is in seconds (monotonic); tests may pass a fake one."""
        if free < 1 or max_secs <= 0 or base_secs <= 0 or max_ids < 1:
            raise ValueError("free, max_secs, base_secs and max_ids must be positive")
        self.free = free
        self.max_secs = max_secs
        self.base_secs = min(base_secs, max_secs)
        self.forget_secs = max(forget_secs, max_secs)
        self.max_ids = max_ids
        self._clock = clock
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, _Failures] = OrderedDict()

    def retry_after(self, key_id: str) -> float:
        """Seconds until `key_id` may be tried again (0 if it may now)."""
        with self._lock:
            failures = self._ids.get(key_id)
            return 0.0 if failures is None else max(0.0, failures.until - self._clock())

    def check(self, key_id: str) -> None:
        """Raise TooManyRequests with `Retry-After` while `key_id` is backing off."""
        wait = self.retry_after(key_id)
        if wait > 0:
            secs = max(1, math.ceil(wait))
            raise TooManyRequests(
                f"too many failed attempts with this key id; retry in {secs} s",
                headers={"Retry-After": str(secs)},
            )

    def failed(self, key_id: str) -> None:
        """Count a failed attempt; from the `free`-th in a row on, the key id must wait."""
        now = self._clock()
        with self._lock:
            failures = self._ids.pop(key_id, None)
            if failures is None or now - failures.last > self.forget_secs:
                failures = _Failures()
            self._ids[key_id] = failures  # to the end: the most recently failed
            failures.count += 1
            failures.last = now
            beyond = failures.count - self.free
            if beyond >= 0:
                wait = self.base_secs * 2.0 ** min(beyond, 32)
                failures.until = now + min(self.max_secs, wait)
            while len(self._ids) > self.max_ids:
                self._ids.popitem(last=False)

    def succeeded(self, key_id: str) -> None:
        """Forget the key id's failures: its secret was right."""
        with self._lock:
            self._ids.pop(key_id, None)

    def __len__(self) -> int:
        """Key ids with failures on record."""
        return len(self._ids)
