"""One tenant: its event log, the two index projections and the writer queue that feeds them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from storage import files
from storage.cypher import CypherResult, Limits
from storage.cypher import run as run_cypher
from storage.erasure.purge import PurgeGate, PurgeStats
from storage.erasure.swap import PENDING, StepHook, mark_pending, no_step, recover
from storage.errors import Conflict, DiskFull
from storage.index.background import shared_pool
from storage.index.keyword import KeywordIndex
from storage.log import layout
from storage.log.eventlog import EventLog
from storage.log.held import run_sweeps_on
from storage.log.layout import space_name
from storage.log.reader import LogReader
from storage.model import (
    AppendResult,
    NewEvent,
    PlacedEvent,
    Quota,
    QuotaSource,
    ServerSpace,
    StoredEvent,
    StoredVector,
)
from storage.read.cascade import would_delete
from storage.read.current import EventState, Moment, event_state
from storage.read.focus import embedded_question
from storage.read.listing import ListQuery, list_events
from storage.read.recall import Feedback, RecallQuery, RecallResult, recall, validate
from storage.tenants.chains import Key, chain_starts
from storage.tenants.groupcommit import (
    commit_batch,
    delete_cascade,
    delete_found,
    land_import,
    vector_linger,
)
from storage.tenants.indexes import open_keyword, open_vectors, raise_if_disk_full
from storage.tenants.jobs import (
    AnyJob,
    AppendJob,
    AppendOutcome,
    AtomicJob,
    CallJob,
    DeleteJob,
    VectorJob,
)
from storage.tenants.pool import WriterPool
from storage.tenants.projection import catch_up
from storage.tenants.usage import TenantUsage, VectorSpace, usage_of
from storage.tenants.writer import GroupWriter

log = logging.getLogger("memspine.tenant")
T = TypeVar("T")
LEDGER_DAYS = 30.0  # how long the erasure ledger keeps an id (MEMSPINE_ERASURE_LEDGER_DAYS)
NOT_SAVED = "the server's disk is full: the vector index was not saved"
CHAIN_SCAN = 1000  # ops a chain's start is looked for before the first event to embed
IN_FLIGHT = "a request with this Idempotency-Key is still being processed; retry shortly"


@dataclass(frozen=True)
class TenantHooks:
    """Whom an open tenant tells what, given when it opens. Each is a function of the tenant,
    not a closure over it: a closed tenant is freed without a collection."""

    # Called on the writer thread after a commit that listed events for the embedder.
    on_unembedded: Callable[[Tenant], None] | None = None
    on_batch: Callable[[int], None] | None = None  # the size of each group commit
    # What the tenant holds in memory, for a quota's max_memory and its usage
    # (storage/tenants/footprint.py's tenant_bytes, from the manager that counts it).
    measure_memory: Callable[[Tenant], int] | None = None


NO_HOOKS = TenantHooks()
# An open tenant's log lets its environment go when unused, swept on the shared upkeep pool.
run_sweeps_on(shared_pool)


class Tenant:
    """An open tenant; all writes go through its writer, reads through log readers and indexes."""

    def __init__(
        self,
        tenant_id: str,
        root: Path,
        embedding_dim: int,
        offer: Callable[[], ServerSpace | None] | None = None,
        hooks: TenantHooks = NO_HOOKS,
        writers: WriterPool | None = None,
    ) -> None:
        self.tenant_id = tenant_id
        self.root = root
        # What the server's embedder offers the tenant while its vector space is nobody's yet
        # (asked at each group commit: an endpoint's dimension is learned after the start).
        self.offer = offer
        self.on_unembedded = hooks.on_unembedded
        # Counts deletes: a batch of server vectors made before one may have chained on a turn
        # it deleted, and is made again (store_vectors).
        self.deletes = 0
        self.ledger_days = LEDGER_DAYS  # its purges drop older ledger entries (the manager's)
        # Finish or discard a purge a crash interrupted, before any store opens; the names in
        # the directory then answer what the open would otherwise stat for one by one.
        names = recover(root)
        self.log = EventLog.open(root / files.LOG, embedding_dim=embedding_dim)
        try:
            # One read snapshot for what the open needs of the log's meta (a cold open is
            # mostly such fixed costs: bench/RESULTS.md, "Cold tenants").
            with self.log.reader() as r:
                dim, keyword_seq, vector_seq = (
                    r.meta_int(layout.DIM),
                    r.meta_int(layout.KEYWORD_SEQ),
                    r.meta_int(layout.VECTOR_SEQ),
                )
                self.space = r.space()
                tombstoned = r.tombstone_count() > 0
            self.dim = dim or embedding_dim
            # What close compares its keyword watermark with while the log has not been written
            # since (a let-go environment is not opened again only to read it back).
            self._keyword_meta = (keyword_seq, self.log.writes)
            self.keyword, self.keyword_seq = open_keyword(root, keyword_seq or 0)
            try:
                self.vectors, self.vector_seq = open_vectors(root, vector_seq or 0, self.dim)
            except BaseException:
                self.keyword.close()
                raise
        except BaseException:
            self.log.close()  # a failed open leaks no file or thread
            raise
        if tombstoned and (names is None or PENDING not in names):
            self._mark_tombstoned()
        self.vector_saved_seq = self.vector_seq
        self.catch_ups = 0  # catch_ups that read ops back from the log (open, deletes, repair)
        self.catch_up()
        self._in_flight_keys: set[str] = set()  # idempotency ids being written (409 for a twin)
        self._keys_lock = threading.Lock()
        self.on_batch = hooks.on_batch
        self.measure_memory = hooks.measure_memory
        self._purges = PurgeGate()
        self.appended_at = 0.0  # monotonic time of the last commit with appends (RIDE_SECS)
        # Its queue on the writer pool (the manager's; the process's shared one by default).
        self.writer: GroupWriter[AnyJob] = GroupWriter(
            tenant_id, self._commit_batch, self._observe_batch, writers
        )

    @classmethod
    def open(
        cls,
        tenant_id: str,
        root: Path,
        *,
        embedding_dim: int = 384,
        offer: Callable[[], ServerSpace | None] | None = None,
        hooks: TenantHooks = NO_HOOKS,
        writers: WriterPool | None = None,
    ) -> Tenant:
        """Open the tenant stored at root, creating it if needed, and bring its indexes up to
        date; offer: the server's embedder (docs/embeddings.md); hooks: whom it tells what;
        writers: the pool that commits its writes (storage/tenants/pool.py)."""
        try:
            return cls(tenant_id, root, embedding_dim, offer, hooks, writers)
        except Exception as exc:  # creating the log's files on a full disk, say
            raise_if_disk_full(exc, root)
            raise

    # -- the pending-purge marker ------------------------------------------------

    def _mark_tombstoned(self) -> None:
        """On open: a tenant holding tombstones but no marker (written before markers lived here,
        or its marker lost) gets one, so the purger finds it once it is closed again."""
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
        """Hand both indexes every log op past their watermarks (storage/tenants/projection.py)."""
        catch_up(self)

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

    def embedded_question(self, query: RecallQuery) -> str:
        """The text of a recall a server that embeds makes its vector from (the text less the
        people it names in this tenant: storage/read/focus.py)."""
        assert query.text
        with self.log.reader() as r:
            return embedded_question(r, query.text, query.as_of)

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

    @contextmanager
    def snapshot(self) -> Iterator[LogReader]:
        """One read snapshot of the log for a long read (an export), the map grown first if it
        is over half full: writes go on meanwhile, with room for them without a resize."""
        self.log.grow_if_over_half()
        with self.log.reader() as r:
            yield r

    def deleted_after(self, after: int, upto: int) -> list[str]:
        """The ids deleted by the log's ops after op `after`, up to op `upto`, in order."""
        with self.log.reader() as r:
            return [
                event_id
                for seq, op, event_id in r.ops_after(after)
                if seq <= upto and op == layout.OP_DELETE
            ]

    def would_delete(self, event_id: str, *, cascade: bool) -> list[str]:
        """The ids a delete (cascading or not) would remove, the event first; changes nothing."""
        with self.log.reader() as r:
            return would_delete(r, event_id, cascade=cascade)

    def snapshot_read(self, fn: Callable[[LogReader], T]) -> T:
        """Run fn over one snapshot (a subject's reach, retention's due events: whole-log reads)."""
        with self.snapshot() as r:
            return fn(r)

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
                graph=self.vectors.graph_count(),
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

    @overload
    def submit_append(
        self,
        events: list[NewEvent],
        *,
        quota: Quota | QuotaSource | None = None,
        atomic: Literal[False] = False,
    ) -> Future[AppendOutcome]: ...

    @overload
    def submit_append(
        self,
        events: list[NewEvent],
        *,
        quota: Quota | QuotaSource | None = None,
        atomic: Literal[True],
    ) -> Future[list[AppendResult]]: ...

    def submit_append(
        self,
        events: list[NewEvent],
        *,
        quota: Quota | QuotaSource | None = None,
        atomic: bool = False,
    ) -> Future[AppendOutcome] | Future[list[AppendResult]]:
        """Queue events for the next group commit; resolves to a list of results or errors,
        each event held to `quota` (its max_events and max_bytes, counted with every event
        committed before it; a QuotaSource is asked when the group commit starts, so a limit
        changed before then holds). With atomic, all of them are written or none: the future
        then resolves to the list of results, or fails with the ItemRefused of the first that
        could not be, or with the error that kept the quota from being known.

        Conflict (409) at once if an event's Idempotency-Key (its event_id) is still being
        written by an earlier call: the twin would race it for the id, and be answered before
        the first is durable. Once that call is answered, a retry replays its result.
        """
        job = AtomicJob(events, quota) if atomic else AppendJob(events, quota)
        keys = {ev.event_id for ev in events if ev.event_id is not None}
        if keys:
            self._hold_keys(keys)
        try:
            self.writer.submit(job)
        except BaseException:
            self._release_keys(keys)
            raise
        if keys:
            job.future.add_done_callback(lambda _done: self._release_keys(keys))
        return job.future

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

    def submit_delete(self, event_ids: list[str]) -> Future[list[str]]:
        """Queue deletions; resolves to the list of ids actually deleted."""
        job = DeleteJob(event_ids)
        self.writer.submit(job)
        return job.future

    def submit_delete_cascade(self, event_id: str) -> Future[list[str]]:
        """Delete the event and everything derived from it over SOURCE_FROM in one transaction on
        the writer, so an event derived meanwhile cannot escape; resolves to the ids deleted, the
        event first."""
        return self.call(lambda: delete_cascade(self, event_id))

    def submit_delete_found(self, find: Callable[[LogReader], list[str]]) -> Future[list[str]]:
        """Delete what `find` names in the log as it is on the writer, in one transaction (an
        erasure by subject: storage/read/subjects.py); resolves to the ids deleted."""
        return self.call(lambda: delete_found(self, find))

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
        return self.call(
            lambda: land_import(
                self, placed, idempotency, model=model, space=space, keep_before=keep_before
            )
        )

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

    def to_embed(
        self, limit: int
    ) -> tuple[list[StoredEvent], dict[Key, StoredEvent], int, str | None]:
        """Up to limit events awaiting their server vector, oldest first (read light, text and
        all); per conversation, the stored turn before the first of them that has a vector (the
        chains' starts, storage/tenants/chains.py); the delete count and the tenant's model
        when read."""
        with self.log.reader() as r:
            events: list[StoredEvent] = []
            for _seq, event_id in r.unembedded(limit):
                ev = r.get_light(event_id)
                if ev is not None:
                    events.append(ev)
            before = chain_starts(r, events, CHAIN_SCAN)
            return events, before, self.deletes, r.meta_str(layout.MODEL)

    def store_vectors(
        self, vectors: list[StoredVector], model: str, deletes: int
    ) -> Future[int | None]:
        """Write server vectors into their records on the writer, then project them; resolves
        to how many were written, or None when an event was deleted since they were read (a
        chain may carry it: the caller makes them again). While appends are flowing the write
        waits up to RIDE_SECS to be committed in an append group's transaction."""
        job = VectorJob(vectors, model, deletes, vector_linger(self))
        self.writer.submit(job)
        return job.future

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn on a writer thread, alone, between the tenant's group commits; resolves to its
        result."""
        job = CallJob(fn)
        self.writer.submit(job)
        return job.future

    def purge(self, step: StepHook = no_step) -> PurgeStats:
        """Rewrite this tenant's files so the bytes of every event deleted before this call leave
        the disk; concurrent callers share one purge (step: a hook called at each stage)."""
        return self._purges.run(self, step)

    def swap_keyword(self, index: KeywordIndex) -> None:
        """Put a new keyword index in place of the current one (a purge's rebuild, on the writer
        thread once the old one is closed, with the log held exclusive)."""
        self.keyword = index

    def _commit_batch(self, jobs: list[AnyJob]) -> None:
        """Commit one batch of the writer's jobs (storage/tenants/groupcommit.py)."""
        commit_batch(self, jobs)

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
        saved, writes = self._keyword_meta
        if writes != self.log.writes:  # written since the open: the meta may have moved
            saved = self.log.meta_int(layout.KEYWORD_SEQ)
        if saved != committed:  # a read-only visit writes nothing
            try:
                self.log.set_meta_int(layout.KEYWORD_SEQ, committed)
            except DiskFull:  # an older watermark only replays more on open
                log.error("tenant keyword watermark not saved: the disk is full")
        self.log.close()
