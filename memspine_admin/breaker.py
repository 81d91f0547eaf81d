"""A circuit breaker for the control plane: once PostgreSQL is found unreachable, requests are
answered 503 at once for a moment instead of each waiting for the pool's timeout, and one
request at a time (with a short timeout) tries again until it answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

OPEN_SECS = 1.0  # after a failure, calls are refused at once this long
PROBE_SECS = 1.0  # then one call tries, waiting at most this long for a connection


class Breaker:
    """Closed (calls go through), open (refused at once), or probing (one call tries)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._until = 0.0  # refused before this monotonic time; 0: closed
        self._broken = False  # a failure seen since the last success
        self.refused = 0  # calls answered at once because it was open

    def admit(self) -> float | None:
        """None: refuse this call now; else how long it may wait for a connection (0: the
        pool's own timeout, the breaker being closed)."""
        if not self._broken:
            return 0.0
        now = self.clock()
        with self._lock:
            if not self._broken:
                return 0.0
            if now < self._until:
                self.refused += 1
                return None
            self._until = now + OPEN_SECS + PROBE_SECS  # this call probes; the others wait
            return PROBE_SECS

    def failed(self) -> None:
        """The database could not be reached: open for OPEN_SECS."""
        with self._lock:
            self._broken = True
            self._until = self.clock() + OPEN_SECS

    def succeeded(self) -> None:
        """The database answered: closed."""
        if self._broken:
            with self._lock:
                self._broken = False
                self._until = 0.0
