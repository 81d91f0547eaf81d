"""The jobs a tenant's writer runs, each with its typed answer: appends (each event its own
outcome, or all of them or none), deletes, server vectors and calls."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from storage.errors import MemspineError
from storage.log.appender import Appender
from storage.model import (
    AppendResult,
    NewEvent,
    Quota,
    QuotaSource,
    StoredVector,
    current_quota,
)
from storage.tenants.writer import Job

T = TypeVar("T")
R = TypeVar("R")
AppendOutcome = list[AppendResult | MemspineError]  # an append's answer, event by event


class WriteJob(Job[R]):
    """A job of a group's one LMDB transaction: begun outside it, written inside it (again from
    the start if the map had to grow), answered once the group is durable and projected."""

    __slots__ = ("_outcome",)
    deletes = False  # whether the job deletes (a group with a delete is projected by catch_up)

    def __init__(self) -> None:
        super().__init__()
        self._outcome: R | BaseException | None = None

    def begin(self) -> None:
        """Outside the transaction: learn what the write needs (an append's quota)."""

    def needs_memory(self) -> bool:
        """Whether the write is held to the tenant's memory (a quota's max_memory)."""
        return False

    def deleted_ids(self) -> Iterable[str]:
        """The ids this job deletes (none for an append)."""
        return ()

    def write(self, appender: Appender) -> None:
        """Inside the transaction: write, keeping the outcome for settle."""
        raise NotImplementedError

    def settle(self) -> None:
        """Answer the caller with the outcome written."""
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            self.fail(outcome)
        else:
            self.answer(outcome)  # type: ignore[arg-type]  # write() set an R


class _Appends(WriteJob[R]):
    """Events to append, held to a quota, or to what a QuotaSource gives when the group
    commit begins (a limit changed while the job was queued holds)."""

    __slots__ = ("events", "limit", "quota")

    def __init__(self, events: list[NewEvent], quota: Quota | QuotaSource | None) -> None:
        super().__init__()
        self.events = events
        self.quota = quota
        self.limit: Quota | MemspineError | None = None

    def begin(self) -> None:
        """Learn the quota in force now."""
        # Outside the transaction: asking a control plane for a tenant's limits may take a
        # round trip, which must not hold the log's writer.
        self.limit = current_quota(self.quota)

    def needs_memory(self) -> bool:
        """Whether the quota limits the tenant's memory."""
        return isinstance(self.limit, Quota) and bool(self.limit.max_memory)


class AppendJob(_Appends[AppendOutcome]):
    """Events appended in order, each answered with its result or its own error."""

    __slots__ = ()

    def write(self, appender: Appender) -> None:
        """Append each event; the quota's error for each when it could not be learned."""
        limit = self.limit
        if isinstance(limit, MemspineError):  # its limits unknown: nothing written
            self._outcome = [limit] * len(self.events)
        else:
            self._outcome = appender.append_all(self.events, limit)


class AtomicJob(_Appends[list[AppendResult]]):
    """Events appended all or none (later ones may link to earlier ones by id); fails with
    ItemRefused naming the first that could not be written, or with the error that kept the
    quota from being known."""

    __slots__ = ()

    def write(self, appender: Appender) -> None:
        """Append all the events in a nested transaction, or none."""
        limit = self.limit
        if isinstance(limit, MemspineError):  # its limits unknown: nothing written
            self._outcome = limit
        else:
            self._outcome = appender.append_atomic(self.events, limit)


class DeleteJob(WriteJob[list[str]]):
    """Event ids to delete; answered with the ids that were live."""

    __slots__ = ("event_ids",)
    deletes = True

    def __init__(self, event_ids: list[str]) -> None:
        super().__init__()
        self.event_ids = event_ids

    def deleted_ids(self) -> Iterable[str]:
        """The ids to delete."""
        return self.event_ids

    def write(self, appender: Appender) -> None:
        """Delete the events (tombstones, links, index keys)."""
        self._outcome = appender.delete(self.event_ids)


class VectorJob(Job[int | None]):
    """Server vectors to write into their records (storage/tenants/embedding.py), made when the
    tenant had counted `deletes` deletes; answered with how many were written, or None when
    stale (a delete came since: a chain may carry a deleted turn, and they are made again)."""

    __slots__ = ("deletes", "model", "vectors")

    def __init__(
        self, vectors: list[StoredVector], model: str, deletes: int, linger: float = 0.0
    ) -> None:
        super().__init__(linger)
        self.vectors = vectors
        self.model = model
        self.deletes = deletes


class CallJob(Job[T]):
    """Work run on the writer thread between group commits (a purge's swap, a cascading
    delete, an import's batch); answered with what fn returns."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], T]) -> None:
        super().__init__()
        self.fn = fn

    def run(self) -> None:
        """Run fn; the caller gets its result or its error, and the writer carries on."""
        try:
            self.answer(self.fn())
        except BaseException as exc:
            self.fail(exc)


AnyJob = AppendJob | AtomicJob | DeleteJob | VectorJob | CallJob[Any]
