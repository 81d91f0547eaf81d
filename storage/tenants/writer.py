"""The writer of a tenant: its jobs, queued for the group commit on the shared writer pool."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from storage.tenants.pool import MAX_BATCH, TenantQueue

__all__ = ["MAX_BATCH", "GroupWriter", "Job"]

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


class GroupWriter(TenantQueue[J]):
    """Feeds a tenant's queued jobs to commit_batch in groups, so fsync and index commits are
    paid once per group, on a thread of `pool` (storage/tenants/pool.py; the process's shared
    pool by default): its jobs in the order they came, never two of its groups at once. A job's
    linger: how long it may wait, alone in the queue, for other work to share its commit."""
