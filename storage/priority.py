"""Reads first: background work of the process steps aside, for a bounded time, while reads run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Experiment (issue 17): which parties wait, and for how long at most.
PARTIES = frozenset(os.environ.get("H17_GATE", "").split(","))
BOUND_SECS = float(os.environ.get("H17_GATE_MS", "3")) / 1000


class ReadGate:
    """Counts reads in flight; background parties wait, at most a bound, until none is."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._reads = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a read in flight for the duration of the block."""
        with self._cond:
            self._reads += 1
        try:
            yield
        finally:
            with self._cond:
                self._reads -= 1
                if not self._reads:
                    self._cond.notify_all()

    def step_aside(self, party: str, max_secs: float = BOUND_SECS) -> float:
        """Wait while reads are in flight, at most max_secs; the seconds waited."""
        if party not in PARTIES or not self._reads:
            return 0.0
        start = time.monotonic()
        deadline = start + max_secs
        with self._cond:
            while self._reads:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return time.monotonic() - start


READS = ReadGate()
