"""The single writer of a tenant: a thread that commits queued jobs in groups."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from storage.errors import MemspineError

log = logging.getLogger("memspine.writer")

MAX_BATCH = 512
_STOP = object()
R = TypeVar("R")
J = TypeVar("J", bound="Job[Any]")


class Job(Generic[R]):
    """One request's share of a batch: the future its caller awaits, resolved to an R."""

    __slots__ = ("due", "future")

    def __init__(self, linger: float = 0.0) -> None:
        # Until when the job may wait for other work to share its batch (GroupWriter.submit).
        self.due = time.monotonic() + linger if linger > 0 else 0.0
        self.future: Future[R] = Future()
        # Running from the start: a caller that gives up cannot cancel a job its batch will
        # commit, and set_result never meets a cancelled future (which would fail the batch).
        self.future.set_running_or_notify_cancel()

    def answer(self, result: R) -> None:
        """Resolve the caller's future."""
        self.future.set_result(result)

    def fail(self, exc: BaseException) -> None:
        """Fail the caller's future."""
        self.future.set_exception(exc)


class GroupWriter(Generic[J]):
    """Feeds queued jobs to commit_batch in groups, so fsync and index commits are paid once per group."""

    def __init__(
        self,
        name: str,
        commit_batch: Callable[[list[J]], None],
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commit_batch = commit_batch
        self._on_batch = on_batch
        self._thread = threading.Thread(target=self._run, name=f"writer-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: J) -> None:
        """Queue one job; its future resolves once its batch is durable and indexed. Its
        linger: how long it may wait, alone in the queue, for other work to share its commit."""
        self._queue.put(job)

    def stop(self) -> None:
        """Finish queued work and end the thread."""
        self._queue.put(_STOP)
        self._thread.join()
        # The callbacks are the owner's bound methods: dropped, a closed tenant is freed as soon
        # as its last reference goes (its vector graph with it), not at the next full collection.
        self._commit_batch = self._on_batch = None  # type: ignore[assignment]

    def _run(self) -> None:
        """Take whatever is queued (at least one job), commit it as one batch, repeat."""
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = self._drain(batch) or self._linger(batch)
            self._commit(batch)
            if stop:
                return

    def _linger(self, batch: list[J]) -> bool:
        """A batch of lingering jobs only waits for one that does not linger (an append for a
        server vector write, storage/tenants/groupcommit.py): one commit for both. Whether a
        stop came."""
        while len(batch) < MAX_BATCH and all(job.due for job in batch):
            wait = min(job.due for job in batch) - time.monotonic()
            if wait <= 0:
                return False
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)
            if self._drain(batch):
                return True
        return False

    def _drain(self, batch: list[J]) -> bool:
        """Add what is queued now to the batch (up to MAX_BATCH); whether a stop came."""
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)
        return False

    def _commit(self, batch: list[J]) -> None:
        """Commit one batch; a failure fails every job in it that has no answer yet."""
        try:
            self._commit_batch(batch)
        except BaseException as exc:  # answer every waiter, whatever went wrong
            if isinstance(exc, MemspineError):  # a refusal with its answer (DiskFull): no bug
                log.error("writer batch of %d refused: %s", len(batch), type(exc).__name__)
            else:
                log.exception("writer batch of %d failed", len(batch))
            for job in batch:
                if not job.future.done():
                    job.fail(exc)
        if self._on_batch is not None:
            self._on_batch(len(batch))
