"""A writer-preferring read-write lock for the few moments a tenant must be exclusive."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    """Many readers or one exclusive holder; a waiting exclusive holder blocks new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock shared (an LMDB transaction, a search)."""
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    def uncontended(self) -> bool:
        """Whether a shared hold would start at once: no exclusive holder or waiter (a hint)."""
        return not (self._writer or self._waiting_writers)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone (map resize, file swap, close)."""
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    def try_exclusive(self) -> bool:
        """Take the lock alone if nobody holds it or waits for it now, never waiting; True if
        taken (then release_exclusive ends the hold)."""
        with self._cond:
            if self._writer or self._readers or self._waiting_writers:
                return False
            self._writer = True
            return True

    def release_exclusive(self) -> None:
        """End a hold try_exclusive took."""
        with self._cond:
            self._writer = False
            self._cond.notify_all()
