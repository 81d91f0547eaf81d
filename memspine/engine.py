"""The calls routes and MCP tools share: each takes a tenant id and runs the storage work off the event loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec

from memspine.batch import in_batch
from memspine.cluster import NodeGate
from memspine.config import Settings
from memspine.fullness import FullTenants
from memspine.purging import PurgeLine
from memspine.readaudit import ReadAudit
from memspine.shares import CostedShares, FairShares
from storage import (
    AppendResult,
    CypherResult,
    EmbeddingWorker,
    EventState,
    Hold,
    ItemRefused,
    Limits,
    ListQuery,
    NewEvent,
    PurgeStats,
    Quota,
    QuotaSource,
    RecallQuery,
    RecallResult,
    ServerVectors,
    StoredEvent,
    Tenant,
    TenantManager,
    TenantUsage,
    closed_tenant_bytes,
    closed_usage,
    erase_tenant_dir,
    make_embedder,
    names_full_disk,
    unheld,
)
from storage.errors import MemspineError, NotFound, QuotaExceeded, Unavailable

T = TypeVar("T")
log = logging.getLogger("memspine.engine")
NO_EVENT = "no event with that id"
PURGE_PENDING_ROOM = (
    "the purge needs free disk space for one more copy of this tenant's files; "
    "the background purger retries it until it succeeds"
)
PURGE_PENDING = "the purge could not run now; the background purger retries it until it succeeds"
READ_THREADS = 40  # as many as anyio's default pool, which reads used before
# Reads one tenant runs at once: its further reads wait in its own queue, so a tenant with
# many slow reads (Cypher up to its time bound) leaves the other threads to everyone else.
READ_THREADS_PER_TENANT = 8
EXPORTS_AT_ONCE = 4  # exports spooling at once, one per tenant (docs/security.md)
CYPHER_BUSY = "other Cypher queries kept this one waiting past its time limit; retry shortly"
WAITING_APPENDS = 256  # appends that may wait at once for room in the embedder's backlog
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[Any], Any], Any]


class ReadThreads:
    """Threads that run blocking reads for the event loop.

    anyio.to_thread.run_sync made a recall over HTTP measurably slower (its cancel scope,
    capacity limiter and worker bookkeeping on both sides of the hop, bench/RESULTS.md): here a read is a job on one queue, and its thread hands the outcome back with a single
    call_soon_threadsafe. As with run_sync, a cancelled caller still waits for its read to end.
    Each owner (a tenant) runs at most `per_owner` reads at once; owners that wait for a
    thread take turns (memspine/shares.py), so one owner's backlog never holds every thread.
    """

    def __init__(self, limit: int = READ_THREADS, per_owner: int = READ_THREADS_PER_TENANT) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads done with their job and about to take the next
        self._started = 0
        self._limit = limit
        self._shares = FairShares(limit, per_owner)

    async def run(self, fn: Callable[[Any], T], arg: Any, owner: Hashable = None) -> T:
        """fn(arg) on a read thread, once `owner` has a share of the threads free."""
        await self._shares.acquire(owner)
        try:
            return await self._run(fn, arg)
        finally:
            self._shares.release(owner)

    async def _run(self, fn: Callable[[Any], T], arg: Any) -> T:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._started < self._limit:
                self._started += 1
                threading.Thread(target=self._work, name="read", daemon=True).start()
        self._jobs.put((loop, done, fn, arg))
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            # The read goes on using the tenant the caller leases: release nothing before it ends.
            while not done.done():
                with suppress(asyncio.CancelledError):
                    await asyncio.wait([done])
            raise

    def _work(self) -> None:
        """A read thread: run jobs until told to stop (None)."""
        while (job := self._jobs.get()) is not None:
            loop, done, fn, arg = job
            try:
                outcome: tuple[Callable[[Any], object], Any] = (done.set_result, fn(arg))
            except BaseException as exc:  # the caller gets it, whatever it is
                outcome = (done.set_exception, exc)
            with self._lock:
                self._idle += 1
            with suppress(RuntimeError):  # the loop is closed: no one is waiting
                loop.call_soon_threadsafe(_settle, done, *outcome)
            del job, loop, done, fn, arg, outcome  # hold nothing while idle

    def close(self) -> None:
        """Stop the threads once they finish what is queued."""
        with self._lock:
            started, self._started, self._idle = self._started, 0, 0
        for _ in range(started):
            self._jobs.put(None)


def _settle(done: asyncio.Future[Any], setter: Callable[[Any], object], value: Any) -> None:
    """On the loop: hand a read's outcome to its caller (unless it is gone)."""
    if not done.cancelled():
        setter(value)


class VectorSpaceView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's vector space as whoami shows it (docs/embeddings.md)."""

    made_by: str  # "server", "client", or "none" while no event has a vector
    model: str | None
    dim: int | None
    server_embeds: bool  # this server makes its vectors (or would, for a text-only event)
    unembedded: int  # events awaiting their server vector


@dataclass(frozen=True)
class EngineHooks:
    """Whom the engine tells what, and whom it asks, given when it is built (memspine/app.py:
    the metrics, the keys' allowance, the control plane's admission and a node's gate)."""

    on_purge: Callable[[float], None] | None = None  # seconds of each purge (metrics)
    on_reject: Callable[[str], None] | None = None  # the limit of each refused write
    on_open: Callable[[Tenant, float], None] | None = None  # each tenant opened, and its time
    on_batch: Callable[[int], None] | None = None  # the size of each group commit
    # Asked right before a tenant's files are opened; raises to refuse (storage/tenants/manager.py).
    admit: Callable[[str], None] | None = None
    gate: NodeGate | None = None  # a cluster node's placement checks (memspine/cluster.py)
    holds: Callable[[str], Sequence[Hold]] | None = None  # a tenant's legal holds


class Engine:
    """The server's handle on every tenant: opening through the manager, blocking work in threads."""

    def __init__(self, settings: Settings, hooks: EngineHooks | None = None) -> None:
        hooks = hooks or EngineHooks()
        self.settings = settings
        self.embedding = make_worker(settings)
        self.vectors = ServerVectors(self.embedding)  # the server-embedding policy
        # Appends waiting for room in the embedder's backlog block threads of their own.
        self._waits = anyio.CapacityLimiter(WAITING_APPENDS)
        self.manager = TenantManager(
            settings.data_dir,
            embedding_dim=settings.embedding_dim,
            max_open=settings.max_open_tenants,
            idle_secs=settings.tenant_idle_secs,
            max_open_bytes=settings.max_open_bytes,
            embedding=self.embedding,
            on_open=hooks.on_open,
            on_batch=hooks.on_batch,
            admit=hooks.admit,
            ledger_days=settings.erasure_ledger_days,
            writer_threads=settings.writer_threads,
        )
        if self.embedding is not None:
            self.embedding.start()
        self.on_purge = hooks.on_purge
        self.on_reject = hooks.on_reject
        self.read_threads = ReadThreads()
        self.purges = PurgeLine()
        self.full = FullTenants(self.manager)  # tenants a quota refused a moment ago
        # Cypher is CPU work under the interpreter lock: each query running beside the others
        # slows every request of every tenant, so few run at once and one tenant runs one; a
        # tenant whose queries are short gets a lane beside them (memspine/shares.py).
        self.cypher_shares = CostedShares(settings.cypher_concurrency, per_owner=1)
        # An export holds a read thread while it spools the whole tenant: one per tenant at
        # once, a few in all, so one tenant's export loops leave the threads to others.
        self.export_shares = FairShares(EXPORTS_AT_ONCE, per_owner=1)
        self._leases = 0  # requests holding a tenant right now (this one included)
        self.gate = hooks.gate
        # A tenant's legal holds (the app reads them from the control plane): a delete of what
        # one keeps is refused. Sequence: a call may answer with a list or a tuple.
        self.holds = hooks.holds
        self._leases_lock = threading.Lock()  # tests may drive one engine from several loops
        self.reads = ReadAudit(settings.read_audit, self.manager.path_of)  # memspine/readaudit.py

    @asynccontextmanager
    async def tenant(self, tenant_id: str, *, create: bool = True) -> AsyncIterator[Tenant]:
        """The open tenant for the length of a request (opening it in a thread if needed); with
        create=False a tenant that does not exist is an empty one and stays uncreated."""
        gate = self.gate if create else None
        if gate is not None:  # a write: counted, so that a move's hold can wait it out
            gate.enter_write(tenant_id)
        try:
            # Never blocks: 503 at once when every slot is busy.
            lease = self.manager.lease(tenant_id, create=create)
        except BaseException:
            if gate is not None:
                gate.exit_write(tenant_id)
            raise
        with self._leases_lock:
            self._leases += 1
        try:
            if lease.must_open:
                tenant = await anyio.to_thread.run_sync(lease.open)
            elif lease.ready.done():
                tenant = lease.ready.result()
            else:  # another request is opening it; wait without holding a worker thread
                tenant = await asyncio.wrap_future(lease.ready)
            yield tenant
        finally:
            with self._leases_lock:
                self._leases -= 1
            lease.release()
            if gate is not None:
                gate.exit_write(tenant_id)

    async def read(self, tenant_id: str, fn: Callable[[Tenant], T], *, short: bool = False) -> T:
        """Run a blocking read against the tenant in a worker thread, or right here if it is a
        short one and nothing else is under way. A tenant that does not exist reads as an empty
        one and is not created (only a write creates it).

        The hop to a read thread and back is a sizeable share of a recall over HTTP in A/B runs
        (bench/RESULTS.md). It buys little while this is the only request: the read
        holds the GIL for most of its time anyway, and no other request waits for the loop. So
        a short read (bounded work: one event, a recall) runs on the loop when no other request
        holds a tenant, the keyword index has nothing to fold (a search would wait for a
        Tantivy commit) and neither the log nor the vector index is held exclusive (a purge's
        swap, a map resize, a graph resize or save: a read would wait, and the loop with it,
        holding back every tenant's requests). A request arriving meanwhile waits for it, as
        it would for the GIL.
        """
        async with self.tenant(tenant_id, create=False) as t:
            return await self._read_in(t, tenant_id, fn, short=short)

    async def _read_in(
        self, t: Tenant, tenant_id: str, fn: Callable[[Tenant], T], *, short: bool
    ) -> T:
        """Run fn against a tenant this request holds, here or on a read thread (read())."""
        if short and self._leases == 1 and t.reads_start_at_once():
            return fn(t)
        return await self.read_threads.run(fn, t, tenant_id)

    async def _room_for(self, t: Tenant, events: list[NewEvent]) -> None:
        """Back-pressure: hold appends that would list events for the embedder while its
        backlog is full (storage/tenants/serving.py); the wait blocks a thread, not the loop."""
        if self.vectors.must_wait(t, events):
            await anyio.to_thread.run_sync(
                self.vectors.wait_for_room, t.tenant_id, limiter=self._waits
            )

    async def append(
        self, tenant_id: str, event: NewEvent, quota: Quota | QuotaSource | None = None
    ) -> AppendResult:
        """Append one event through the tenant's group commit, within its quota; answers once
        it is durable and indexed."""
        async with self.tenant(tenant_id) as t:
            await self._room_for(t, [event])
            [result] = await asyncio.wrap_future(t.submit_append([event], quota=quota))
        if isinstance(result, MemspineError):
            raise self._refused(result, owner=(tenant_id, quota))
        return result

    async def append_batch(
        self, tenant_id: str, events: list[NewEvent], quota: Quota | QuotaSource | None = None
    ) -> list[AppendResult]:
        """Append events in order as one all-or-nothing job of the tenant's group commit,
        within its quota; an event that cannot be written refuses them all, its error naming
        its index (events[i])."""
        async with self.tenant(tenant_id) as t:
            await self._room_for(t, events)
            try:
                return await asyncio.wrap_future(t.submit_append(events, quota=quota, atomic=True))
            except ItemRefused as refused:
                raise self._refused(refused.error, refused.item, owner=(tenant_id, quota)) from None

    def _refused(
        self,
        error: MemspineError,
        index: int | None = None,
        *,
        owner: tuple[str, Quota | QuotaSource | None] | None = None,
    ) -> MemspineError:
        """A write's refusal as the caller sees it (counted when a limit refused it; a quota's
        refusal of `owner`'s (tenant, quota) append remembered, memspine/fullness.py)."""
        if isinstance(error, QuotaExceeded):
            if owner is not None:
                self.full.learn(owner[0], owner[1], error)
            if self.on_reject is not None:
                self.on_reject(error.limit)
        return error if index is None else in_batch(index, error)

    def refuse_if_full(
        self, tenant_id: str, *, batch: bool = False, replay_key: object = None
    ) -> None:
        """QuotaExceeded now if an append to tenant_id would be refused whatever its body (its
        quota refused one a moment ago and it still holds all it may): before the body is read
        or validated, as the writer would refuse it (a batch's first event). Every door that
        appends calls it (memspine/pipeline.py, memspine/mcp/backend.py); an append with an
        idempotency key (`replay_key` not None) may be a replay, answered as before, full or not."""
        if replay_key is not None:
            return
        error = self.full.refusal(tenant_id)
        if error is not None:
            raise self._refused(error, 0 if batch else None)

    def usage_now(self, tenant_id: str) -> TenantUsage:
        """Blocking: what a tenant uses; an open tenant answers from memory, a closed one from
        its files, kept closed meanwhile (it is not opened for this)."""
        with self.manager.inspect(tenant_id) as tenant:
            if tenant is not None:
                return tenant.usage()
            root = self.manager.path_of(tenant_id)
            usage = closed_usage(root)
        # What opening it would take, as the manager's memory budget guesses it.
        dim = usage.vector_space.dim or self.manager.embedding_dim
        return msgspec.structs.replace(usage, memory=closed_tenant_bytes(root, dim))

    async def get(self, tenant_id: str, event_id: str) -> EventState:
        """One live event with its current state; 404 for unknown, deleted or foreign ids alike."""
        state = await self.read(tenant_id, lambda t: t.get(event_id), short=True)
        if state is None:
            raise NotFound(NO_EVENT)
        return state

    async def delete(self, tenant_id: str, event_ids: list[str]) -> list[str]:
        """Delete events (tombstones, links and index entries in one transaction; the tenant makes
        its pending-purge marker durable before that commit); 409 legal_hold, nothing deleted, if
        a hold keeps one of them when the delete runs."""
        async with self.tenant(tenant_id) as t:
            if self.holds is None:
                return await asyncio.wrap_future(t.submit_delete(event_ids))
            find = unheld(self._holds_of(tenant_id), event_ids)
            return await asyncio.wrap_future(t.submit_delete_found(find))

    async def delete_cascade(self, tenant_id: str, event_id: str) -> list[str]:
        """Delete an event and everything derived from it over SOURCE_FROM, atomically; the ids
        deleted, the event first; 409 legal_hold as `delete`."""
        async with self.tenant(tenant_id) as t:
            if self.holds is None:
                return await asyncio.wrap_future(t.submit_delete_cascade(event_id))
            find = unheld(self._holds_of(tenant_id), [event_id], cascade=True)
            return await asyncio.wrap_future(t.submit_delete_found(find))

    def _holds_of(self, tenant_id: str) -> Callable[[], Sequence[Hold]]:
        """The read of a tenant's holds that a delete makes on the tenant's writer, as it runs
        (a hold placed while it waited in the queue stops it: storage/read/retention.py)."""
        holds = self.holds
        return lambda: () if holds is None else holds(tenant_id)

    async def would_delete(self, tenant_id: str, event_id: str, *, cascade: bool) -> list[str]:
        """The ids a delete would remove, the event first; 404 for an unknown id. Changes nothing."""
        ids = await self.read(tenant_id, lambda t: t.would_delete(event_id, cascade=cascade))
        if not ids:
            raise NotFound(NO_EVENT)
        return ids

    async def purge(self, tenant_id: str) -> PurgeStats:
        """Rewrite the tenant's files so its deleted events' bytes leave the disk (docs/erasure.md)."""
        async with self.tenant(tenant_id) as t:
            stats = await self.purges.run(tenant_id, t.purge)  # one at a time, niced
        if stats.purged and self.on_purge is not None:
            self.on_purge(stats.seconds)
        return stats

    async def purge_after_delete(self, tenant_id: str) -> str | None:
        """The purge a delete asked for: None once its bytes are gone, else why it is pending.

        Never raises for a failed purge: the delete has committed (a 503 or 500 would tell the
        caller nothing was done, and its retry would be a 404), and the tenant's pending-purge
        marker, made with the delete, keeps it in the background purger's list until it succeeds.
        """
        try:
            await self.purge(tenant_id)
        except Exception as exc:
            if names_full_disk(exc):
                log.warning("tenant %s: purge pending, the disk is full: %s", tenant_id, exc)
                return PURGE_PENDING_ROOM
            log.error(
                "tenant %s: purge pending after %s", tenant_id, type(exc).__name__, exc_info=exc
            )
            return PURGE_PENDING
        return None

    async def list(self, tenant_id: str, query: ListQuery) -> tuple[list[StoredEvent], str | None]:
        """One page of events newest first."""
        return await self.read(tenant_id, lambda t: t.list_events(query))

    async def recall(
        self, tenant_id: str, query: RecallQuery, *, wait_for_vectors: bool = False
    ) -> RecallResult:
        """Fused keyword and vector recall with the bounded walk. In a tenant whose vectors
        this server makes, a query with text and no embedding gets the embedder's vector of
        the text and both arms (docs/recall.md); wait_for_vectors first waits until every
        event acknowledged before the recall has its vector."""
        # Answers never show embeddings: hits keep the records ranking read without them.
        policy = self.vectors
        async with self.tenant(tenant_id, create=False) as t:
            short = not wait_for_vectors and policy.answers_at_once(t, query)
            return await self._read_in(
                t,
                tenant_id,
                lambda t: policy.recall(t, query, wait_for_vectors=wait_for_vectors),
                short=short,
            )

    async def vector_space(self, tenant_id: str) -> VectorSpaceView:
        """Who makes the tenant's vectors, their model and length, and whether this server's
        embedder makes them (or would, for the next event with text only)."""
        space, unembedded = await self.read(tenant_id, lambda t: t.vector_space(), short=True)
        w = self.embedding
        embeds = False
        if w is not None and space.made_by == "server":
            embeds = space.model == w.embedder.name
        elif w is not None and space.made_by == "none":
            offer = w.offer()
            embeds = offer is not None and offer.dim == space.dim
        return VectorSpaceView(
            made_by=space.made_by,
            model=space.model,
            dim=space.dim,
            server_embeds=embeds,
            unembedded=unembedded,
        )

    async def cypher(
        self,
        tenant_id: str,
        query: str,
        params: dict[str, Any] | None,
        read: set[str] | None = None,
    ) -> CypherResult:
        """A read-only Cypher query over one snapshot, bounded by the configured limits; its time
        counts from here, so a wait for a read thread is part of it (`read`: the raw ids of
        the events its rows were built from, for the read audit)."""
        started = time.monotonic()
        settings = self.settings
        limits = Limits(
            timeout_ms=settings.cypher_timeout_ms,
            max_rows=settings.cypher_max_rows,
            max_bytes=settings.cypher_max_bytes,
            max_string=settings.cypher_max_string_chars,
            max_list=settings.cypher_max_list_items,
            max_result_bytes=settings.cypher_max_result_bytes,
        )
        try:
            pool = await asyncio.wait_for(
                self.cypher_shares.acquire(tenant_id), settings.cypher_timeout_ms / 1000
            )
        except TimeoutError:
            raise Unavailable(CYPHER_BUSY, headers={"Retry-After": "1"}) from None
        spent = [0.0]  # the query's CPU time: its cost, whatever else shares the cores

        def run(t: Tenant) -> CypherResult:
            # encoded: the answer is encoded on the read thread, row by row, under the limits.
            start = time.thread_time()
            try:
                return t.cypher(query, params, limits, encoded=True, started=started, read=read)
            finally:
                spent[0] = time.thread_time() - start

        try:
            return await self.read(tenant_id, run)
        finally:
            self.cypher_shares.release(pool, tenant_id, spent[0])

    def erase_copy(self, tenant_id: str) -> bool:
        """Blocking: erase this node's directory of a tenant no key reaches any more; True if
        there was one. Requests already in flight end first, and the tenant stays closed while
        its directory goes; its read records go with it (docs/audit.md)."""
        self.reads.writer.forget(tenant_id)
        with self.manager.exclusive(tenant_id):
            return erase_tenant_dir(self.manager.data_dir, tenant_id)

    def close(self) -> None:
        """Stop the background embedder (its work stays in the logs), close every open tenant
        and stop the read threads."""
        if self.embedding is not None:
            self.embedding.stop()
        self.purges.close()  # a purge under way ends before its tenant closes
        self.manager.close_all()
        if self.embedding is not None:
            self.embedding.embedder.close()
        self.read_threads.close()
        self.reads.close()


def make_worker(settings: Settings) -> EmbeddingWorker | None:
    """The background embedder MEMSPINE_EMBEDDER names (None for none); loads no model yet."""
    embedder = make_embedder(
        settings.embedder,
        settings.embedder_url,
        settings.embedder_model,
        settings.embedder_api_key,
    )
    if embedder is None:
        return None
    return EmbeddingWorker(
        embedder,
        default_dim=settings.embedding_dim,
        max_pending=settings.embeddings_max_pending,
    )
