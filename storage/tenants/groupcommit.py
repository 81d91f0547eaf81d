"""The group commit: what a tenant's writer does with one batch of jobs.

Appends and deletes share one durable LMDB transaction, in the order they came: each append held
to its quota (learned before the transaction) and to the tenant's memory budget, an atomic one
in a nested transaction that is undone whole if one event cannot be written. Server vectors ride
an append-only group's transaction (one fsync for both); beside a delete, or with no write to
carry them, they commit alone after it. Then the indexes are fed (storage/tenants/projection.py),
the appends answered, the vectors landed, and calls run alone between groups (a cascading delete,
an import's batch, a purge's swap).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import lmdb

from storage.log import layout, revisions
from storage.log.appender import Appender
from storage.log.reader import LogReader
from storage.model import PlacedEvent, ServerSpace, StoredEvent, StoredVector
from storage.read.cascade import derived_closure
from storage.tenants.jobs import AnyJob, CallJob, VectorJob, WriteJob
from storage.tenants.projection import Projected, catch_up, project_appends, project_vectors

log = logging.getLogger("memspine.tenant")
# A write of server vectors waits this long on the writer for an append to share its commit,
# when appends are flowing (one committed within FLOWING_SECS): one fsync for both instead of
# one each (bench/RESULTS.md, issue 18's append p99). Otherwise it commits at once.
RIDE_SECS = 0.02
FLOWING_SECS = 0.1


class Committer(Projected, Protocol):
    """What the group commit uses of an open tenant (storage/tenants/tenant.py)."""

    tenant_id: str
    root: Path
    space: int | None  # who makes the tenant's vectors (layout.SPACE_*), None while nobody
    offer: Callable[[], ServerSpace | None] | None  # the server's embedder, asked per group
    measure_memory: Callable[[Any], int] | None  # what the tenant holds in memory
    on_unembedded: Callable[[Any], None] | None  # told when events await server vectors
    deletes: int  # delete groups committed: a vector job made before one is stale
    appended_at: float  # monotonic time of the last group with appends

    def mark_before_delete(self, event_ids: Iterable[str]) -> None:
        """Make the pending-purge marker durable before a delete of a live event commits."""


class Written(NamedTuple):
    """What one group's transaction did."""

    start: int  # the last op before the group
    records: list[StoredEvent]  # the records appended, in op order
    space: int | None  # the tenant's vector space after it
    unembedded: int  # events it listed for the embedder
    vectors_start: int  # the last op before the vectors it carried
    vectors: list[list[StoredVector]]  # what each carried vector job wrote


def vector_linger(t: Committer) -> float:
    """How long a vector job may wait for an append to share its commit (RIDE_SECS)."""
    return RIDE_SECS if time.monotonic() - t.appended_at < FLOWING_SECS else 0.0


def commit_batch(t: Committer, jobs: list[AnyJob]) -> None:
    """Commit the batch's writes as one group (its vector writes in the same transaction
    when the writes are appends only), then the other vector writes, then its calls."""
    writes: list[WriteJob[Any]] = []
    vectors: list[VectorJob] = []
    calls: list[CallJob[Any]] = []
    for job in jobs:
        if isinstance(job, VectorJob):
            vectors.append(job)
        elif isinstance(job, CallJob):
            calls.append(job)
        else:
            writes.append(job)
    # Beside a delete a vector write goes after it, alone, and finds itself stale (its
    # chain may carry a deleted turn): as if it had come after the delete.
    ride = bool(writes) and not any(job.deletes for job in writes)
    if writes:
        commit_writes(t, writes, vectors if ride else [])
    if vectors and not ride:
        write_vectors(t, vectors)
    for call in calls:
        call.run()


def commit_writes(t: Committer, jobs: list[WriteJob[Any]], carried: list[VectorJob]) -> None:
    """One durable LMDB transaction for every job (and the vector writes it carries, after
    them), then the index projections, then the answers."""
    carried = _fresh(t, carried)
    deletes = [e for job in jobs for e in job.deleted_ids()]
    if any(job.deletes for job in jobs):
        t.mark_before_delete(deletes)
    for job in jobs:
        job.begin()
    offer = None if t.offer is None or t.space is not None else t.offer()
    memory = 0
    if t.measure_memory is not None and any(job.needs_memory() for job in jobs):
        memory = t.measure_memory(t)
    kw_seq = t.keyword.committed_seq  # what the durable keyword index covers
    try:
        done = t.log.write(lambda txn: _write(t, txn, jobs, carried, offer, memory, kw_seq))
    except Exception as exc:
        if not carried:
            raise
        # Vectors never cost the appends beside them: these are committed again alone, and
        # the vectors' writer gets the refusal (DiskFull: it keeps them and tries again).
        for vector_job in carried:
            vector_job.fail(exc)
        commit_writes(t, jobs, [])
        return
    _after_writes(t, jobs, done)
    if carried:
        land_vectors(t, carried, done.vectors_start, done.vectors)


def _write(
    t: Committer,
    txn: lmdb.Transaction,
    jobs: list[WriteJob[Any]],
    carried: list[VectorJob],
    offer: ServerSpace | None,
    memory: int,
    kw_seq: int,
) -> Written:
    """The group's transaction; runs again from the start if the map had to grow, with a
    fresh appender."""
    appender = Appender(t.log, txn, offer)
    appender.memory = memory
    start = appender.last
    for job in jobs:
        job.write(appender)
    appender.finish()
    # After every append: the appender numbers ops itself, the vectors take the next.
    vectors_start, stored = _store_in(t, txn, carried)
    # Watermarks ride along with the batch: no extra fsync, and a stale one only replays more.
    t.log.put_meta_int(txn, layout.KEYWORD_SEQ, kw_seq)
    return Written(
        start, appender.written, appender.space, appender.unembedded, vectors_start, stored
    )


def _after_writes(t: Committer, jobs: list[WriteJob[Any]], done: Written) -> None:
    """A group is durable: project it, tell the embedder, answer every job."""
    t.space = done.space
    appends_only = not any(job.deletes for job in jobs)
    if not all(job.deletes for job in jobs):
        t.appended_at = time.monotonic()
    if not appends_only:
        t.deletes += 1
    if not (appends_only and project_appends(t, done.start, done.records)):
        catch_up(t)
    # Before the answers: the backlog an append is held to counts it once it is answered.
    # Its failure must not fail a batch that is durable: the list is in the log regardless.
    if done.unembedded or not appends_only:
        _tell_embedder(t)
    for job in jobs:
        job.settle()


def _tell_embedder(t: Committer) -> None:
    """Tell the embedder the tenant has work for it (a failure is logged: the list is durable)."""
    if t.on_unembedded is None:
        return
    try:
        t.on_unembedded(t)
    except Exception:
        log.exception("tenant %s: the embedder was not told of new work", t.tenant_id)


# -- server vectors (storage/tenants/embedding.py) --------------------------------------------


def write_vectors(t: Committer, jobs: list[VectorJob]) -> None:
    """Vector writes in a transaction of their own (no append group to carry them)."""
    fresh = _fresh(t, jobs)
    if not fresh:
        return
    try:
        start, written = t.log.write(lambda txn: _store_in(t, txn, fresh))
    except BaseException as exc:  # DiskFull: the worker keeps the vectors and tries again
        for job in fresh:
            job.fail(exc)
        return
    land_vectors(t, fresh, start, written)


def _fresh(t: Committer, jobs: list[VectorJob]) -> list[VectorJob]:
    """The vector jobs made since the last delete; a stale one is answered None now."""
    fresh = []
    for job in jobs:
        if job.deletes == t.deletes:
            fresh.append(job)
        else:
            job.answer(None)
    return fresh


def _store_in(
    t: Committer, txn: lmdb.Transaction, jobs: list[VectorJob]
) -> tuple[int, list[list[StoredVector]]]:
    """Write vector jobs in txn: the last op before them and what each wrote."""
    start = LogReader(txn, t.log.dbs).last_seq()
    written = [revisions.store_vectors(txn, t.log.dbs, job.vectors, job.model) for job in jobs]
    return start, written


def land_vectors(
    t: Committer, jobs: list[VectorJob], start: int, written: list[list[StoredVector]]
) -> None:
    """Project vectors just committed (after the appends' answers when they rode with them:
    appends do not wait for it) and answer their writes."""
    try:
        every = [item for items in written for item in items]
        if every and not project_vectors(t, start, every):
            catch_up(t)
    except Exception as exc:  # durable: the indexes' watermarks stay behind and replay them
        log.exception("tenant %s: server vectors not projected", t.tenant_id)
        for job in jobs:
            job.fail(exc)
        return
    for job, items in zip(jobs, written, strict=True):
        job.answer(len(items))


# -- work run as calls on the writer ------------------------------------------------------------


def delete_cascade(t: Committer, event_id: str) -> list[str]:
    """On the writer: delete the event and everything derived from it over SOURCE_FROM in one
    transaction; the ids deleted, the event first."""
    t.mark_before_delete([event_id])  # the closure is empty unless the event is live
    deleted = t.log.write(
        lambda txn: t.log.delete_in(txn, derived_closure(t.log.view(txn), event_id))
    )
    t.deletes += 1
    catch_up(t)
    if t.on_unembedded is not None:
        t.on_unembedded(t)
    return deleted


def delete_found(t: Committer, find: Callable[[LogReader], list[str]]) -> list[str]:
    """On the writer: delete what `find` names in the log as it is now (nothing is written
    before the delete: this runs alone on the writer), in one transaction; the ids deleted."""
    with t.log.reader() as r:
        ids = find(r)
    t.mark_before_delete(ids)
    deleted: list[str] = t.log.write(lambda txn: t.log.delete_in(txn, ids))
    t.deletes += 1
    catch_up(t)
    if t.on_unembedded is not None:
        t.on_unembedded(t)
    return deleted


# Keyword ops, and bytes of their text, an import may leave queued for the fold (a few batches).
IMPORT_BACKLOG = (5_000, 4 << 20)


def land_import(
    t: Committer,
    placed: list[PlacedEvent],
    idempotency: Sequence[tuple[str, bytes, list[str]]],
    *,
    model: str | None,
    space: int | None,
    keep_before: int | None,
) -> int:
    """On the writer: write exported events as they were (storage/transfer/) in one
    transaction, then project them; how many were written."""
    # The keyword fold commits what earlier batches published while the caller reads this
    # one, several batches to a commit; an import that never waited for it would queue the
    # whole file's text in memory, so past IMPORT_BACKLOG queued ops (or their text's bytes)
    # it waits.
    ops, size = t.keyword.backlog()
    if ops >= IMPORT_BACKLOG[0] or size >= IMPORT_BACKLOG[1]:
        t.keyword.flush()

    def apply(txn: lmdb.Transaction) -> int:
        appender = Appender(t.log, txn)
        if space is not None:
            appender.claim_space(space, model)
        elif model is not None:
            appender.claim_model(model)
        written = sum(appender.place(p, keep_before=keep_before) for p in placed)
        for event_id, body_hash, unlinked in idempotency:
            appender.place_idempotency(event_id, body_hash, unlinked)
        return written

    written = t.log.write(apply)
    with t.log.reader() as r:
        t.space = r.space()
    catch_up(t)
    if t.on_unembedded is not None:
        t.on_unembedded(t)
    return written
