"""The single writer of a tenant: a thread that commits queued work in groups."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from storage.errors import MemspineError

log = logging.getLogger("memspine.writer")

MAX_BATCH = 512
_STOP = object()


class Job:
    """One request's share of a batch: its input and the future its caller awaits."""

    __slots__ = ("due", "future", "payload")

    def __init__(self, payload: Any, linger: float = 0.0) -> None:
        self.payload = payload
        # Until when the job may wait for other work to share its batch (GroupWriter.submit).
        self.due = time.monotonic() + linger if linger > 0 else 0.0
        self.future: Future[Any] = Future()
        # Running from the start: a caller that gives up cannot cancel a job its batch will
        # commit, and set_result never meets a cancelled future (which would fail the batch).
        self.future.set_running_or_notify_cancel()


class GroupWriter:
    """Feeds queued jobs to commit_batch in groups, so fsync and index commits are paid once per group."""

    def __init__(
        self,
        name: str,
        commit_batch: Callable[[list[Job]], None],
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commit_batch = commit_batch
        self._on_batch = on_batch
        self._thread = threading.Thread(target=self._run, name=f"writer-{name}", daemon=True)
        self._thread.start()

    def submit(self, payload: Any, linger: float = 0.0) -> Future[Any]:
        """Queue one job; its future resolves once its batch is durable and indexed. linger:
        how long it may wait, alone in the queue, for other work to share its batch's commit."""
        job = Job(payload, linger)
        self._queue.put(job)
        return job.future

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
            stop = self._drain(batch)
            # A batch of lingering jobs only waits for one that does not linger (an append
            # for a server vector write, storage/tenants/tenant.py): one commit for both.
            while not stop and len(batch) < MAX_BATCH and all(job.due for job in batch):
                wait = min(job.due for job in batch) - time.monotonic()
                if wait <= 0:
                    break
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
                stop = self._drain(batch)
            self._commit(batch)
            if stop:
                return

    def _drain(self, batch: list[Job]) -> bool:
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

    def _commit(self, batch: list[Job]) -> None:
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
                    job.future.set_exception(exc)
        if self._on_batch is not None:
            self._on_batch(len(batch))
