"""One tenant: its event log, the two index projections and the single writer that feeds them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from storage import files
from storage.cypher import CypherResult, Limits
from storage.cypher import run as run_cypher
from storage.erasure.purge import PurgeGate, PurgeStats
from storage.erasure.swap import PENDING, StepHook, mark_pending, no_step, recover
from storage.errors import Conflict, DiskFull, MemspineError
from storage.index.keyword import KeywordDoc, KeywordIndex
from storage.log import layout
from storage.log.eventlog import EventLog, space_name
from storage.model import (
    CHAIN_KIND,
    NewEvent,
    PlacedEvent,
    Quota,
    QuotaSource,
    ServerSpace,
    StoredEvent,
    StoredVector,
    current_quota,
)
from storage.read.cascade import derived_closure, would_delete
from storage.read.current import EventState, Moment, event_state
from storage.read.listing import ListQuery, list_events
from storage.read.recall import Feedback, RecallQuery, RecallResult, recall, validate
from storage.tenants.indexes import open_keyword, open_vectors, raise_if_disk_full
from storage.tenants.usage import TenantUsage, VectorSpace, usage_of
from storage.tenants.writer import GroupWriter, Job

log = logging.getLogger("memspine.tenant")
T = TypeVar("T")
NOT_SAVED = "the server's disk is full: the vector index was not saved"
CHAIN_SCAN = 1000  # ops a chain's start is looked for before the first event to embed
IN_FLIGHT = "a request with this Idempotency-Key is still being processed; retry shortly"
# A write of server vectors waits this long on the writer for an append to share its commit,
# when appends are flowing (one committed within FLOWING_SECS): one fsync for both instead of
# one each (bench/RESULTS.md, issue 18's append p99). Otherwise it commits at once.
RIDE_SECS = 0.02
FLOWING_SECS = 0.1


class AppendJob(msgspec.Struct, frozen=True):
    """Events to append in one batch, held to a quota (or to what a QuotaSource gives when the
    group commit starts); atomic: all of them or none."""

    events: list[NewEvent]
    quota: Quota | QuotaSource | None = None
    atomic: bool = False


class DeleteJob(msgspec.Struct, frozen=True):
    """Event ids to delete."""

    event_ids: list[str]


class VectorJob(msgspec.Struct, frozen=True):
    """Server vectors to write into their records (storage/tenants/embedding.py), made when the
    tenant had counted `deletes` deletes."""

    vectors: list[StoredVector]
    model: str
    deletes: int


class CallJob:
    """Work to run on the writer thread between group commits (a purge's swap, a cascading delete)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class Tenant:
    """An open tenant; all writes go through its writer, reads through log readers and indexes."""

    def __init__(
        self,
        tenant_id: str,
        root: Path,
        embedding_dim: int,
        offer: Callable[[], ServerSpace | None] | None = None,
    ) -> None:
        self.tenant_id = tenant_id
        self.root = root
        # What the server's embedder offers the tenant while its vector space is nobody's yet
        # (asked at each group commit: an endpoint's dimension is learned after the start).
        self.offer = offer
        # Called on the writer thread after a commit that listed events for the embedder.
        self.on_unembedded: Callable[[Tenant], None] | None = None
        # Counts deletes: a batch of server vectors made before one may have chained on a turn
        # it deleted, and is made again (store_vectors).
        self.deletes = 0
        recover(root)  # finish or discard a purge a crash interrupted, before any store opens
        self.log = EventLog.open(root / files.LOG, embedding_dim=embedding_dim)
        try:
            self.dim = self.log.meta_int(layout.DIM) or embedding_dim
            self.keyword, self.keyword_seq = open_keyword(root, self.log)
            try:
                self.vectors, self.vector_seq = open_vectors(root, self.log, self.dim)
            except BaseException:
                self.keyword.close()
                raise
        except BaseException:
            self.log.close()  # a failed open leaks no file or thread
            raise
        with self.log.reader() as r:
            self.space = r.space()
        self._mark_if_tombstoned()
        self.vector_saved_seq = self.vector_seq
        self.catch_ups = 0  # catch_ups that read ops back from the log (open, deletes, repair)
        self.catch_up()
        self._in_flight_keys: set[str] = set()  # idempotency ids being written (409 for a twin)
        self._keys_lock = threading.Lock()
        self.on_batch: Callable[[int], None] | None = None
        # What the tenant holds in memory, for a quota's max_memory and its usage: set by the
        # manager that counts it (storage/tenants/footprint.py's tenant_bytes). A function of
        # the tenant, not a closure over it: a closed tenant is freed without a collection.
        self.measure_memory: Callable[[Tenant], int] | None = None
        self._purges = PurgeGate()
        self._appended_at = 0.0  # monotonic time of the last commit with appends (RIDE_SECS)
        self.writer = GroupWriter(tenant_id, self._commit_batch, self._observe_batch)

    @classmethod
    def open(
        cls,
        tenant_id: str,
        root: Path,
        *,
        embedding_dim: int = 384,
        offer: Callable[[], ServerSpace | None] | None = None,
    ) -> Tenant:
        """Open the tenant stored at root, creating it if needed, and bring its indexes up to
        date; offer: the server's embedder (docs/embeddings.md)."""
        try:
            return cls(tenant_id, root, embedding_dim, offer)
        except Exception as exc:  # creating the log's files on a full disk, say
            raise_if_disk_full(exc, root)
            raise

    # -- the pending-purge marker ------------------------------------------------

    def _mark_if_tombstoned(self) -> None:
        """On open: a tenant holding tombstones but no marker (written before markers lived here,
        or its marker lost) gets one, so the purger finds it once it is closed again."""
        if (self.root / PENDING).exists():
            return
        with self.log.reader() as r:
            tombstoned = r.tombstone_count() > 0
        if tombstoned:
            try:
                mark_pending(self.root)
            except OSError as exc:  # an open purger sweep still finds it by its tombstones
                log.warning("tenant %s: pending-purge marker not written (%s)", self.tenant_id, exc)

    def mark_before_delete(self, event_ids: Iterable[str]) -> None:
        """On the writer thread, before a delete's commit: make the pending-purge marker durable
        if any of these events is live, so no tombstone is ever on disk without it (a marker
        without tombstones is harmless: the next purge drops it). Markers are made and removed
        on this thread only, so no purge drops one between this and the commit."""
        if (self.root / PENDING).exists():
            return
        with self.log.reader() as r:
            live = any(r.exists(e) for e in event_ids)
        if live:
            mark_pending(self.root)

    # -- projections -----------------------------------------------------------

    def catch_up(self) -> None:
        """Apply every log operation past each index's watermark (replay on open, then per batch)."""
        docs: list[KeywordDoc] = []
        kw_deletes: list[str] = []
        labels: list[int] = []
        vectors: list[list[float]] = []
        vec_deletes: list[int] = []
        replaced: dict[int, list[float] | None] = {}  # label -> its vector now (OP_EMBED)
        start = min(self.keyword_seq, self.vector_seq)
        last = start
        with self.log.reader() as r:
            for seq, op, event_id in r.ops_after(start):
                last = seq
                if op == layout.OP_EMBED:
                    if seq > self.vector_seq:
                        changed = r.get(event_id)
                        if changed is not None:
                            replaced[changed.seq] = changed.embedding
                    continue
                if op == b"D":
                    if seq > self.keyword_seq:
                        kw_deletes.append(event_id)
                    tomb = r.tombstone(event_id)
                    if seq > self.vector_seq and tomb is not None:
                        vec_deletes.append(tomb.seq)
                    continue
                ev = r.get(event_id)
                if ev is None:
                    continue
                if seq > self.keyword_seq and ev.text:
                    docs.append(KeywordDoc(ev.event_id, ev.kind, ev.text, ev.filterable, ev.seq))
                if seq > self.vector_seq and ev.embedding is not None:
                    labels.append(seq)
                    vectors.append(ev.embedding)
        if last == start:
            return
        self.catch_ups += 1
        # Neither index makes the acknowledgement wait: the keyword index commits in the
        # background (a search waits for what was published before it), and vectors are
        # searched exactly from memory until the background insert places them in the graph.
        self.keyword.publish(docs, kw_deletes, last)
        # Vectors go to the index's exact tail now and into the graph in the background. A
        # vector the server wrote (or cleared) after the append replaces what the label had.
        self.vectors.add(labels, vectors)
        if replaced:
            self.vectors.delete(list(replaced))
            now = [(label, v) for label, v in replaced.items() if v is not None]
            self.vectors.add([label for label, _v in now], [v for _label, v in now])
        self.vectors.delete(vec_deletes)
        # Handed over, not yet durable: each index keeps what it was handed until it is (the
        # keyword fold retries a failed commit with it), and only the durable marks are
        # recorded in the log (keyword.committed_seq, vector_saved_seq), so a reopen replays.
        self.keyword_seq = self.vector_seq = last

    # -- reads ------------------------------------------------------------------

    def get(self, event_id: str) -> EventState | None:
        """One live event with its current state now; None for an unknown or deleted id."""
        with self.log.reader() as r:
            return event_state(r, event_id)

    def list_events(self, query: ListQuery) -> tuple[list[StoredEvent], str | None]:
        """One page of events newest first and the cursor of the next (None at the end)."""
        with self.log.reader() as r:
            moment = Moment(r, current=query.current, as_of=query.as_of)
            return list_events(r, query, keep=moment.visible)

    def recall(
        self, query: RecallQuery, *, embeddings: bool = True, feedback: Feedback | None = None
    ) -> RecallResult:
        """Fused keyword and vector recall with the bounded walk, over one snapshot; with
        embeddings=False the hits' events may lack their embeddings (read light); feedback for
        a query vector the server made (docs/recall.md)."""
        with self.log.reader() as r:
            validate(query, self.dim, r.meta_str(layout.MODEL))
            return recall(
                r, self.keyword, self.vectors, query, embeddings=embeddings, feedback=feedback
            )

    def cypher(
        self,
        query: str,
        params: dict[str, Any] | None,
        limits: Limits,
        *,
        encoded: bool = False,
        started: float | None = None,
        read: set[str] | None = None,
    ) -> CypherResult:
        """A read-only Cypher query over one snapshot within limits, its clock running from
        `started` (time.monotonic(); now by default); encoded: rows as their JSON; `read`
        gets the ids of the events the rows were built from."""
        with self.log.reader() as r:
            return run_cypher(
                r,
                query,
                params,
                timeout_ms=limits.timeout_ms,
                max_rows=limits.max_rows,
                max_bytes=limits.max_bytes,
                max_string=limits.max_string,
                max_list=limits.max_list,
                max_result_bytes=limits.max_result_bytes,
                encoded=encoded,
                started=started,
                read=read,
            )

    def would_delete(self, event_id: str, *, cascade: bool) -> list[str]:
        """The ids a delete (cascading or not) would remove, the event first; changes nothing."""
        with self.log.reader() as r:
            return would_delete(r, event_id, cascade=cascade)

    def awaiting_purge(self) -> bool:
        """Whether deleted events of this tenant await a purge (the log holds tombstones)."""
        return bool(self.log.tombstones())

    def map_size(self) -> int:
        """The LMDB map size of the tenant's log, in bytes."""
        return self.log.map_size()

    def vectors_pending(self) -> int:
        """Vectors acknowledged (searched exactly) but not yet in the HNSW graph."""
        return self.vectors.pending()

    def vector_space(self) -> tuple[VectorSpace, int]:
        """Who makes the tenant's vectors, their model and length; and how many events await
        their server vector."""
        with self.log.reader() as r:
            space = VectorSpace(
                dim=self.dim, model=r.meta_str(layout.MODEL), made_by=space_name(r.space())
            )
            return space, r.unembedded_count()

    def usage(self) -> TenantUsage:
        """What the tenant uses now: events, bytes by part, vectors, vector space, last write,
        memory (when measure_memory is set)."""
        memory = self.measure_memory(self) if self.measure_memory is not None else None
        with self.log.reader() as r:
            return usage_of(
                r,
                self.root,
                is_open=True,
                graph=len(self.vectors.live),
                pending=self.vectors.pending(),
                dim=self.dim,
                memory=memory,
            )

    def reads_start_at_once(self) -> bool:
        """Whether a read would start without waiting: the keyword index would not wait for its
        fold, and neither the log nor the vector index is held exclusive (a hint)."""
        locks = (self.log.lock, self.vectors.lock)
        return self.keyword.searches_at_once() and all(lock.uncontended() for lock in locks)

    def save_vectors(self) -> None:
        """Persist the vector index (tail included) and record the seq it covers."""
        if self.vector_saved_seq == self.vector_seq and self.vectors.path.exists():
            return  # nothing changed since the last save: a clean close stays fast
        seq = self.vector_seq
        try:
            self.vectors.save()
        except (OSError, ValueError) as exc:
            raise_if_disk_full(exc, self.root, NOT_SAVED)
            raise
        # Recorded only once the file and the watermark are both durable: a save or a meta write
        # that failed (a full disk) is tried again by the next save, and until then the log
        # replays what the saved file lacks.
        self.log.set_meta_int(layout.VECTOR_SEQ, seq)
        self.vector_saved_seq = seq

    # -- writes -----------------------------------------------------------------

    def submit_append(
        self,
        events: list[NewEvent],
        *,
        quota: Quota | QuotaSource | None = None,
        atomic: bool = False,
    ) -> Future[Any]:
        """Queue events for the next group commit; resolves to a list of results or errors,
        each event held to `quota` (its max_events and max_bytes, counted with every event
        committed before it; a QuotaSource is asked when the group commit starts, so a limit
        changed before then holds). With atomic, all of them are written or none: the future
        then resolves to the list of results, to the ItemRefused of the first that could not
        be, or to the error that kept the quota from being known.

        Conflict (409) at once if an event's Idempotency-Key (its event_id) is still being
        written by an earlier call: the twin would race it for the id, and be answered before
        the first is durable. Once that call is answered, a retry replays its result.
        """
        keys = {ev.event_id for ev in events if ev.event_id is not None}
        if keys:
            self._hold_keys(keys)
        try:
            future = self.writer.submit(AppendJob(events, quota, atomic))
        except BaseException:
            self._release_keys(keys)
            raise
        if keys:
            future.add_done_callback(lambda _done: self._release_keys(keys))
        return future

    def _hold_keys(self, keys: set[str]) -> None:
        """Mark idempotency keys in flight, or refuse them all if one of them already is."""
        with self._keys_lock:
            if not keys.isdisjoint(self._in_flight_keys):
                raise Conflict(IN_FLIGHT, headers={"Retry-After": "1"})
            self._in_flight_keys |= keys

    def _release_keys(self, keys: set[str]) -> None:
        """The call that held these keys is answered."""
        with self._keys_lock:
            self._in_flight_keys -= keys

    def submit_delete(self, event_ids: list[str]) -> Future[Any]:
        """Queue deletions; resolves to the list of ids actually deleted."""
        return self.writer.submit(DeleteJob(event_ids))

    def submit_delete_cascade(self, event_id: str) -> Future[list[str]]:
        """Delete the event and everything derived from it over SOURCE_FROM in one transaction on
        the writer, so an event derived meanwhile cannot escape; resolves to the ids deleted, the
        event first."""

        def run() -> list[str]:
            def apply(txn: Any) -> list[str]:
                return self.log.delete_in(txn, derived_closure(self.log.view(txn), event_id))

            self.mark_before_delete([event_id])  # the closure is empty unless the event is live
            deleted = self.log.write(apply)
            self.deletes += 1
            self.catch_up()
            if self.on_unembedded is not None:
                self.on_unembedded(self)
            return deleted

        return self.call(run)

    def submit_import(
        self,
        placed: list[PlacedEvent],
        idempotency: Sequence[tuple[str, bytes, list[str]]] = (),
        *,
        model: str | None = None,
        space: int | None = None,
        keep_before: int | None = None,
    ) -> Future[int]:
        """Write exported events as they were (ids, records, links in their order, idempotency
        records; storage/transfer/) in one transaction on the writer, then project them;
        resolves to how many were written. A merge keeps the events live at op keep_before; any
        line that cannot be written fails the whole batch (InvalidRequest naming the line)."""

        def run() -> int:
            # The keyword fold commits the previous batch while the caller reads this one; an
            # import that did not wait for it would queue the whole file's text in memory.
            self.keyword.flush()

            def apply(txn: Any) -> int:
                appender = self.log.appender(txn)
                if space is not None:
                    appender.claim_space(space, model)
                elif model is not None:
                    appender.claim_model(model)
                written = sum(appender.place(p, keep_before=keep_before) for p in placed)
                for event_id, body_hash, unlinked in idempotency:
                    appender.place_idempotency(event_id, body_hash, unlinked)
                return written

            written = self.log.write(apply)
            with self.log.reader() as r:
                self.space = r.space()
            self.catch_up()
            if self.on_unembedded is not None:
                self.on_unembedded(self)
            return written

        return self.call(run)

    # -- server vectors (storage/tenants/embedding.py) ------------------------------

    def unembedded_count(self) -> int:
        """How many events await their server vector."""
        with self.log.reader() as r:
            return r.unembedded_count()

    def awaiting_vectors(self, upto: int) -> bool:
        """Whether any event appended at op `upto` or before still awaits its server vector."""
        with self.log.reader() as r:
            first = r.unembedded(1)
            return bool(first) and first[0][0] <= upto

    def last_seq(self) -> int:
        """The newest op of the log (what a recall that waits for vectors waits up to)."""
        with self.log.reader() as r:
            return r.last_seq()

    def to_embed(self, limit: int) -> tuple[list[StoredEvent], StoredEvent | None, int, str | None]:
        """Up to limit events awaiting their server vector, oldest first (read light, text and
        all); the stored turn before the first of them that has a vector (the chain's start);
        the delete count and the tenant's model when read."""
        with self.log.reader() as r:
            events: list[StoredEvent] = []
            for _seq, event_id in r.unembedded(limit):
                ev = r.get_light(event_id)
                if ev is not None:
                    events.append(ev)
            before = None
            if events:
                before = r.chain_before(events[0].seq, CHAIN_KIND, CHAIN_SCAN)
            return events, before, self.deletes, r.meta_str(layout.MODEL)

    def store_vectors(
        self, vectors: list[StoredVector], model: str, deletes: int
    ) -> Future[int | None]:
        """Write server vectors into their records on the writer, then project them; resolves
        to how many were written, or None when an event was deleted since they were read (a
        chain may carry it: the caller makes them again). While appends are flowing the write
        waits up to RIDE_SECS to be committed in an append group's transaction."""
        flowing = time.monotonic() - self._appended_at < FLOWING_SECS
        return self.writer.submit(VectorJob(vectors, model, deletes), RIDE_SECS if flowing else 0)

    def _write_vectors(self, jobs: list[Job]) -> None:
        """Vector writes in a transaction of their own (no append group to carry them)."""
        fresh = [job for job in jobs if self._fresh(job)]
        if not fresh:
            return
        try:
            start, written = self.log.write(lambda txn: self._store_in(txn, fresh))
        except BaseException as exc:  # DiskFull: the worker keeps the vectors and tries again
            for job in fresh:
                job.future.set_exception(exc)
            return
        self._land_vectors(fresh, start, written)

    def _project_vectors(self, start: int, written: list[StoredVector]) -> bool:
        """Feed the vector index server vectors just written from memory, as catch_up would
        from the log; False if catch_up must (the indexes are behind start)."""
        # Their ops are the log's ops after start, one OP_EMBED each in the order written, and
        # each vector what catch_up would read back: reading 1.5 KB records back would hold the
        # writer (and appends queued behind it) for longer than the write itself.
        if not (start == self.keyword_seq == self.vector_seq):
            return False
        labels = [item.seq for item in written]
        last = start + len(written)
        self.keyword.publish([], [], last)
        self.vectors.delete(labels)
        self.vectors.add(labels, [item.vector for item in written])
        self.keyword_seq = self.vector_seq = last
        return True

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn on the writer thread, alone, between group commits; resolves to its result."""
        return self.writer.submit(CallJob(fn))

    def purge(self, step: StepHook = no_step) -> PurgeStats:
        """Rewrite this tenant's files so the bytes of every event deleted before this call leave
        the disk; concurrent callers share one purge (step: a hook called at each stage)."""
        return self._purges.run(self, step)

    def swap_keyword(self, index: KeywordIndex) -> None:
        """Put a new keyword index in place of the current one (a purge's rebuild, on the writer
        thread once the old one is closed, with the log held exclusive)."""
        self.keyword = index

    def _commit_batch(self, jobs: list[Job]) -> None:
        """Commit the batch's writes as one group (its vector writes in the same transaction
        when the writes are appends only), then the other vector writes, then its calls."""
        writes = [job for job in jobs if isinstance(job.payload, (AppendJob, DeleteJob))]
        vectors = [job for job in jobs if isinstance(job.payload, VectorJob)]
        # Beside a delete a vector write goes after it, alone, and finds itself stale (its
        # chain may carry a deleted turn): as if it had come after the delete.
        ride = bool(writes) and all(isinstance(job.payload, AppendJob) for job in writes)
        if writes:
            self._commit_writes(writes, vectors if ride else [])
        if vectors and not ride:
            self._write_vectors(vectors)
        for job in jobs:
            if isinstance(job.payload, CallJob):
                try:
                    job.future.set_result(job.payload.fn())
                except BaseException as exc:  # the caller gets it; the writer carries on
                    job.future.set_exception(exc)

    def _commit_writes(self, jobs: list[Job], carried: list[Job] | None = None) -> None:
        """One durable LMDB transaction for every job (and the vector writes it carries, after
        them), then the index projections, then the answers."""
        carried = [job for job in carried or [] if self._fresh(job)]
        kw_seq = self.keyword.committed_seq  # what the durable keyword index covers
        appends_only = all(isinstance(job.payload, AppendJob) for job in jobs)
        if not appends_only:
            self.mark_before_delete(
                e
                for job in jobs
                if isinstance(job.payload, DeleteJob)
                for e in job.payload.event_ids
            )

        # Outside the transaction: asking a control plane for a tenant's limits may take a
        # round trip, which must not hold the log's writer.
        quotas = [
            current_quota(job.payload.quota) if isinstance(job.payload, AppendJob) else None
            for job in jobs
        ]

        offer = None if self.offer is None or self.space is not None else self.offer()
        memory = 0
        measure = self.measure_memory
        if measure is not None and any(isinstance(q, Quota) and q.max_memory for q in quotas):
            memory = measure(self)

        def apply(txn: Any) -> tuple[list[Any], int, list[StoredEvent], int | None, int, Any]:
            # Runs again from the start if the map had to grow, with a fresh appender.
            appender = self.log.appender(txn, offer)
            appender.memory = memory
            start = appender.last
            results: list[Any] = []
            for job, quota in zip(jobs, quotas, strict=True):
                p = job.payload
                if isinstance(quota, MemspineError):  # its limits unknown: nothing written
                    assert isinstance(p, AppendJob)
                    results.append(quota if p.atomic else [quota] * len(p.events))
                elif isinstance(p, AppendJob) and p.atomic:
                    results.append(appender.append_atomic(p.events, quota))
                elif isinstance(p, AppendJob):
                    results.append(appender.append_all(p.events, quota))
                else:
                    results.append(appender.delete(p.event_ids))
            appender.finish()
            # After every append: the appender numbers ops itself, the vectors take the next.
            stored = self._store_in(txn, carried)
            # Watermarks ride along with the batch: no extra fsync, and a stale one only replays more.
            self.log.put_meta_int(txn, layout.KEYWORD_SEQ, kw_seq)
            return results, start, appender.written, appender.space, appender.unembedded, stored

        try:
            results, start, written, self.space, unembedded, stored = self.log.write(apply)
        except Exception as exc:
            if not carried:
                raise
            # Vectors never cost the appends beside them: these are committed again alone, and
            # the vectors' writer gets the refusal (DiskFull: it keeps them and tries again).
            for job in carried:
                job.future.set_exception(exc)
            self._commit_writes(jobs)
            return
        if any(isinstance(job.payload, AppendJob) for job in jobs):
            self._appended_at = time.monotonic()
        if not appends_only:
            self.deletes += 1
        if not (appends_only and self._project(start, written)):
            self.catch_up()
        # Before the answers: the backlog an append is held to counts it once it is answered.
        # Its failure must not fail a batch that is durable: the list is in the log regardless.
        if (unembedded or not appends_only) and self.on_unembedded is not None:
            try:
                self.on_unembedded(self)
            except Exception:
                log.exception("tenant %s: the embedder was not told of new work", self.tenant_id)
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)
        if carried:
            self._land_vectors(carried, *stored)

    def _fresh(self, job: Job) -> bool:
        """Whether a vector write may ride in this group; a stale one is answered None now."""
        assert isinstance(job.payload, VectorJob)
        if job.payload.deletes == self.deletes:
            return True
        job.future.set_result(None)
        return False

    def _store_in(self, txn: Any, carried: list[Job]) -> tuple[int, list[list[StoredVector]]]:
        """Write carried vector jobs in txn: the last op before them and what each wrote."""
        start = self.log.view(txn).last_seq()
        written = []
        for job in carried:
            assert isinstance(job.payload, VectorJob)
            written.append(self.log.store_vectors(txn, job.payload.vectors, job.payload.model))
        return start, written

    def _land_vectors(
        self, carried: list[Job], start: int, written: list[list[StoredVector]]
    ) -> None:
        """Project vectors committed with an append group (after its answers: appends do not
        wait for it) and answer their writes."""
        try:
            every = [item for items in written for item in items]
            if every and not self._project_vectors(start, every):
                self.catch_up()
        except Exception as exc:  # durable: the indexes' watermarks stay behind and replay them
            log.exception("tenant %s: server vectors not projected", self.tenant_id)
            for job in carried:
                job.future.set_exception(exc)
            return
        for job, items in zip(carried, written, strict=True):
            job.future.set_result(len(items))

    def _project(self, start: int, written: list[StoredEvent]) -> bool:
        """Feed both indexes an append-only batch's records from memory; False if catch_up must."""
        # Only when it is provably what catch_up would do, reading back no log: it would replay
        # exactly the ops after start, here these records, one op each, in order, and each still
        # the live record of its id (the batch deleted nothing and, ids being distinct,
        # overwrote nothing).
        if not (start == self.keyword_seq == self.vector_seq):
            return False
        if any(rec.seq != start + i for i, rec in enumerate(written, 1)):
            return False
        if len({rec.event_id for rec in written}) != len(written):
            return False
        if not written:
            return True  # no op written (replays, errors): catch_up would have nothing to do
        docs = [
            KeywordDoc(r.event_id, r.kind, r.text, r.filterable, r.seq) for r in written if r.text
        ]
        labels = [r.seq for r in written if r.embedding is not None]
        vectors = [r.embedding for r in written if r.embedding is not None]
        last = written[-1].seq
        # The same order as catch_up: a failure here leaves the watermarks behind, and the next
        # batch (then taking catch_up's path) replays what was not applied.
        # Every record is a new event (a replay writes none, and ids being distinct none was
        # overwritten): no document of the index has its id.
        self.keyword.publish(docs, [], last, new=True)
        self.vectors.add(labels, vectors)
        self.keyword_seq = self.vector_seq = last
        return True

    def _observe_batch(self, size: int) -> None:
        """Forward a batch size to whoever measures them."""
        if self.on_batch is not None:
            self.on_batch(size)

    # -- lifecycle --------------------------------------------------------------

    def close(self) -> None:
        """Drain the writer, save both indexes with their watermarks and close the log."""
        self.writer.stop()
        self.keyword.close()  # a last commit that fails leaves committed_seq behind: no loss
        try:
            self.save_vectors()
        except DiskFull:  # the saved watermark stays behind: the next open replays the rest
            log.error("tenant vector index not saved: the disk is full")
        self.vectors.close()
        committed = self.keyword.committed_seq
        if self.log.meta_int(layout.KEYWORD_SEQ) != committed:  # a read-only visit writes nothing
            try:
                self.log.set_meta_int(layout.KEYWORD_SEQ, committed)
            except DiskFull:  # an older watermark only replays more on open
                log.error("tenant keyword watermark not saved: the disk is full")
        self.log.close()
