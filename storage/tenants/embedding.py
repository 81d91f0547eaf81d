"""The background embedder: one thread per server that gives server vectors to the events of
server-space tenants, a batch at a time, and holds appends back once too many await theirs.

Its work is in the logs, not in memory: each tenant lists the events that await a vector
(layout's "unembedded"), in append order, in the transaction that appends them. The worker
takes open tenants with work in turn, embeds a batch of their texts, and writes the vectors
into the records on the tenant's writer (storage/log/revisions.py), which feeds the vector index.
A restart or a tenant closed by the LRU loses nothing: the list is read again when the tenant
opens. An embedder that fails (an endpoint down) is retried with back-off; nothing is dropped.
A tenant with fewer than a write's worth listed waits a little (LINGER_SECS) for more, so an
endpoint gets fewer, larger batches; a recall that waits for vectors cuts that short (hurry).
A write refused for a full disk keeps the batch's vectors in memory and tries that write again
(0.5 s doubling to 2 s), asking the embedder nothing until it lands (docs/embeddings.md).
A batch whose call hung (the model's process killed past its deadline) is tried once more; if
it hangs again its tenant goes keyword-only until the server restarts: its events stay listed
in its log, its appends are never held back, and the worker asks nothing more for it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

import numpy as np

from storage.embedders.base import HUNG, Embedder, EmbedderError, QueryCache
from storage.errors import DiskFull
from storage.log import layout
from storage.model import (
    CHAIN_GAP_US,
    CHAIN_KIND,
    CHAIN_WEIGHT,
    ServerSpace,
    StoredEvent,
    StoredVector,
    conversation_of,
)
from storage.tenants.chains import Key, starts_of
from storage.tenants.tenant import Tenant

log = logging.getLogger("memspine.embedding")

# Texts per embed call: the call size bench/embed.py measures (the local embedder sorts a call by
# length and runs its batches on a thread per core; fewer, larger calls cost less per text).
BATCH = 256
# Vectors per write on the tenant's writer: an append queued behind a write waits for this many
# record rewrites and one commit, not a whole batch's (bench/RESULTS.md, issue 18's append p99).
WRITE_CHUNK = 32
DEFAULT_MAX_PENDING = 10_000
# A tenant with fewer than a write's worth of events listed is embedded this long after its
# list was last taken (or first had work), not at once: at 200 appends/s the worker otherwise
# embeds and writes every 3-5 events (bench/RESULTS.md). Far inside the 5 s vector lag target.
LINGER_SECS = 0.15
# How long one embed call may take, going by the texts/s of the calls before it: a tenant whose
# text arrives while another's batch is being embedded waits for that call, so on a busy machine
# (fewer texts a second) the calls shrink, down to WRITE_CHUNK texts, rather than hold every other
# tenant's vectors for a whole BATCH (bench/embedder_flood.py).
CALL_SECS = 0.5
RETRY_FIRST_SECS = 0.5
RETRY_MAX_SECS = 30.0
NICENESS = 10  # added to the process's own
HANGS_BEFORE_KEYWORD_ONLY = 2  # a tenant's batch hung this many times in a row: keyword-only
# A write refused for a full disk is tried again soon and often (it costs one aborted LMDB
# transaction, the vectors are kept), as the keyword index retries its commits
# (storage/index/keyword.py): vectors land within seconds of space being freed.
DISK_RETRY_FIRST_SECS = 0.5
DISK_RETRY_MAX_SECS = 2.0
DISK_FULL = "disk_full"  # the failure reason of a write refused for a full disk
DISK_LOG_EVERY_SECS = 60.0  # a disk that stays full is logged again this often, not each try

# Blocking: the open tenant held as a request holds it, or None if it is not open now.
UseOpen = Callable[[str], AbstractContextManager[Tenant | None]]


class _Kept:
    """Vectors made for a batch whose write a full disk refused, kept to write again."""

    __slots__ = ("deletes", "items", "model", "tenant_id")

    def __init__(self, tenant_id: str, items: list[StoredVector], model: str, deletes: int) -> None:
        self.tenant_id = tenant_id
        self.items = items
        self.model = model
        self.deletes = deletes  # the tenant's delete count when they were made


class EmbeddingWorker:
    """Embeds what open server-space tenants list, oldest first, tenant after tenant."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        default_dim: int,
        max_pending: int = DEFAULT_MAX_PENDING,
        batch: int = BATCH,
        write_chunk: int = WRITE_CHUNK,
        linger: float = LINGER_SECS,
    ) -> None:
        self.embedder = embedder
        self.default_dim = default_dim  # MEMSPINE_EMBEDDING_DIM: what new tenants get
        self.max_pending = max_pending
        self.batch = batch
        self.write_chunk = max(1, write_chunk)
        self.linger = linger  # LINGER_SECS: how long a small backlog waits for more
        self.use_open: UseOpen | None = None  # set by the TenantManager that owns the tenants
        self._cond = threading.Condition()
        self._pending: dict[str, int] = {}  # open tenant -> events it lists (read after a batch)
        self._queue: OrderedDict[str, None] = OrderedDict()  # tenants with work, in turn
        self._since: dict[str, float] = {}  # tenant with work -> when its linger started
        self._hurried: set[str] = set()  # tenants a recall waits for: no linger
        self._noticed: dict[str, int] = {}  # open tenant -> lists taken in (see notice)
        self._stopping = False
        self._retry_at = 0.0  # monotonic time before which a failed embedder is not asked
        self._delay = RETRY_FIRST_SECS
        self.failures_by: dict[str, int] = {}  # embedder calls that failed, by reason
        self.embedded = 0  # vectors written
        self.last_error: str | None = None  # reason of the last failure, None once one succeeds
        self._kept: _Kept | None = None  # a batch a full disk refused: written before any other
        self._hangs: dict[str, int] = {}  # tenant -> its batches that hung in a row
        self.keyword_only: set[str] = set()  # tenants whose batches hung twice: not embedded
        self._disk_failures = 0  # writes refused in a row for a full disk
        self._disk_logged = 0.0  # monotonic time the full disk was last logged
        self._thread: threading.Thread | None = None
        self._written = 0  # changes to what tenants await: vectors written, lists read again
        self._rate: float | None = None  # texts a second of recent embed calls (worker thread)

    # -- what tenants are offered -------------------------------------------------

    def offer(self) -> ServerSpace | None:
        """The space a tenant with none yet gets when its first event to get a vector is
        text-only: the embedder's model and the dimension new tenants have. None while the
        embedder's own dimension is unknown (an endpoint not asked yet) or differs: tenants
        then stay client-space (docs/embeddings.md)."""
        dim = self.embedder.dim
        if dim is None or dim != self.default_dim:
            return None
        return ServerSpace(model=self.embedder.name, dim=dim)

    def serves(self, tenant: Tenant) -> bool:
        """Whether this embedder makes the tenant's vectors (server-space, its model, its length)."""
        if tenant.space != layout.SPACE_SERVER:
            return False
        with tenant.log.reader() as r:
            model = r.meta_str(layout.MODEL)
        return model == self.embedder.name and self.embedder.dim in (None, tenant.dim)

    def cached_query(self, text: str) -> np.ndarray | None:
        """A query's vector if the embedder's LRU has it (cheap enough for the event loop)."""
        queries = getattr(self.embedder, "queries", None)
        return queries.peek(text) if isinstance(queries, QueryCache) else None

    # -- tenants coming and going (the manager's hooks) ----------------------------------

    def opened(self, tenant: Tenant) -> None:
        """A tenant opened (told of its new work by `notice`, its on_unembedded hook): its list
        is read, and it gets its turn if it has work."""
        self.notice(tenant)

    def closing(self, tenant: Tenant) -> None:
        """A tenant closes: its work stays in its log for the next open."""
        with self._cond:
            self._forget(tenant.tenant_id)
            self._noticed.pop(tenant.tenant_id, None)
            if self._kept is not None and self._kept.tenant_id == tenant.tenant_id:
                self._kept = None  # made again from the log when the tenant next opens
            self._cond.notify_all()

    def notice(self, tenant: Tenant) -> None:
        """A tenant's list may have changed (an append, a delete, an import, an open)."""
        tenant_id = tenant.tenant_id
        while True:
            # The count is read outside the lock (a log read), so two notices may read it in one
            # order and take it in in the other: the worker's, read just before an append
            # committed, would forget the tenant after the append's own notice listed it, and
            # the new event would wait for the tenant's next change. A notice that another took
            # in meanwhile reads the count again.
            with self._cond:
                seen = self._noticed.get(tenant_id, 0)
            count = tenant.unembedded_count()
            with self._cond:
                if self._noticed.get(tenant_id, 0) == seen:
                    self._noticed[tenant_id] = seen + 1
                    self._take_in(tenant_id, count)
                    return

    def _take_in(self, tenant_id: str, count: int) -> None:
        """A tenant's list holds `count` events now (under _cond)."""
        if count and tenant_id not in self.keyword_only:
            self._pending[tenant_id] = count
            if tenant_id not in self._queue:
                self._since[tenant_id] = time.monotonic()
            self._queue.setdefault(tenant_id, None)
        else:
            self._forget(tenant_id)
        self._written += 1
        self._cond.notify_all()

    def hurry(self, tenant_id: str) -> None:
        """A recall waits for the tenant's vectors: its next batch is taken without a linger."""
        with self._cond:
            if tenant_id in self._queue:
                self._hurried.add(tenant_id)
                self._cond.notify_all()

    def _forget(self, tenant_id: str) -> None:
        """The tenant has no work now, or is closed (under _cond)."""
        self._pending.pop(tenant_id, None)
        self._queue.pop(tenant_id, None)
        self._since.pop(tenant_id, None)
        self._hurried.discard(tenant_id)

    # -- figures and back-pressure --------------------------------------------------------

    def pending(self) -> int:
        """Events of open tenants awaiting their server vector (memspine_embeddings_pending)."""
        with self._cond:
            return sum(self._pending.values())

    def has_room(self, tenant_id: str | None = None) -> bool:
        """Whether appends of `tenant_id` that list events for the embedder may go ahead: the
        backlog is under max_pending, or the tenant lists less than its share of it."""
        with self._cond:
            return self._room(tenant_id)

    def wait_for_room(self, timeout: float, tenant_id: str | None = None) -> bool:
        """Blocking: wait until has_room(tenant_id); False if it was not in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._room(tenant_id):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._cond.wait(left)
            return True

    def written(self) -> int:
        """A count that moves whenever vectors are written or a tenant's list is read again."""
        with self._cond:
            return self._written

    def wait_written(self, seen: int, timeout: float) -> bool:
        """Blocking: wait until written() moves past `seen`; False if it did not in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._written == seen:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._cond.wait(left)
            return True

    def _room(self, tenant_id: str | None) -> bool:
        """has_room under _cond. A tenant alone may fill the whole backlog; once it is full,
        each tenant's share is max_pending over the tenants with work (itself counted), so one
        tenant's flood holds back its own appends and never another's (docs/embeddings.md)."""
        if sum(self._pending.values()) < self.max_pending or tenant_id in self.keyword_only:
            return True
        if tenant_id is None:
            return False
        owners = len(self._pending) + (tenant_id not in self._pending)
        return self._pending.get(tenant_id, 0) < self.max_pending // owners

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._run, name="embedder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the batch under way and end the thread (work left stays in the logs)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _next(self) -> str | None:
        """The tenant whose turn it is (it goes to the back), waiting for one; None to stop."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                wait = self._retry_at - time.monotonic()
                if self._kept is not None and wait <= 0:  # its write first: nothing else fits
                    return self._kept.tenant_id
                if self._queue and wait <= 0:
                    now = time.monotonic()
                    tenant_id, at = self._ready(now)
                    if tenant_id is not None:
                        self._queue.move_to_end(tenant_id)
                        self._since[tenant_id] = now  # what comes next waits from here
                        self._hurried.discard(tenant_id)
                        return tenant_id
                    wait = at - now  # every tenant with work lingers: until the first is due
                self._cond.wait(wait if self._queue else None)

    def _ready(self, now: float) -> tuple[str | None, float]:
        """The first tenant in turn whose batch may be taken now (under _cond); else None and
        when the first will be."""
        soonest = math.inf
        for tenant_id in self._queue:
            at = 0.0
            small = self._pending.get(tenant_id, 0) < self.write_chunk
            if self.linger > 0 and small and tenant_id not in self._hurried:
                at = self._since.get(tenant_id, 0.0) + self.linger
            if at <= now:
                return tenant_id, now
            soonest = min(soonest, at)
        return None, soonest

    def _learn_dim(self) -> None:
        """An endpoint tells its dimension with its first answer: ask it once before any
        tenant is offered its space (retried with back-off while it fails)."""
        while self.embedder.dim is None:
            with self._cond:
                if self._stopping:
                    return
            try:
                self.embedder.embed(["memspine asks the embedder its dimension"])
            except EmbedderError as exc:
                self._failed(exc.reason, exc.retry_after)
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._stopping, max(0.0, self._retry_at - time.monotonic())
                    )

    def _run(self) -> None:
        """Take tenants in turn and embed a batch of each, until stopped."""
        # Background work, niced as the vector inserter is (storage/index/vectors.py): when the
        # cores are busy, the threads that answer requests get them first. Threads the embedder
        # starts from here (the local model's pool) inherit it.
        with contextlib.suppress(OSError, AttributeError):
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + NICENESS)
        self._learn_dim()
        while (tenant_id := self._next()) is not None:
            try:
                self._work_on(tenant_id)
            except DiskFull:
                self._disk_full()
            except EmbedderError as exc:
                if exc.reason == HUNG:
                    self._hung(tenant_id)
                self._failed(exc.reason, exc.retry_after)
            except Exception as exc:
                log.exception("server vectors not made for a tenant; retrying")
                self._failed(type(exc).__name__, None)
            else:
                with self._cond:
                    self._delay = RETRY_FIRST_SECS
                    self.last_error = None
                    self._hangs.pop(tenant_id, None)

    def _hung(self, tenant_id: str) -> None:
        """A batch of the tenant hung the model: it stays listed and is tried once more; hung
        again, the tenant goes keyword-only (memspine_embeddings_keyword_only_tenants)."""
        with self._cond:
            hangs = self._hangs[tenant_id] = self._hangs.get(tenant_id, 0) + 1
            if hangs < HANGS_BEFORE_KEYWORD_ONLY:
                return
            self._hangs.pop(tenant_id, None)
            self.keyword_only.add(tenant_id)
            self._forget(tenant_id)
            self._cond.notify_all()
        log.warning(
            "tenant %s: a batch of its texts hung the embedder %d times; its events are found "
            "by keyword only until the server restarts (memspine-admin reembed makes vectors)",
            tenant_id,
            hangs,
        )

    def _failed(self, reason: str, retry_after: float | None) -> None:
        """Back off before asking the embedder again; the work stays listed."""
        with self._cond:
            self.failures_by[reason] = self.failures_by.get(reason, 0) + 1
            self.last_error = reason
            wait = retry_after if retry_after is not None else self._delay
            self._delay = min(RETRY_MAX_SECS, self._delay * 2)
            self._retry_at = time.monotonic() + min(wait, RETRY_MAX_SECS)
        log.warning(
            "the embedder failed (%s); server vectors wait, retried in %.1f s", reason, wait
        )

    def _disk_full(self) -> None:
        """A write of vectors refused for a full disk: they are kept (the embedder is not asked
        again), the write is tried again soon, and the log says so once a minute."""
        now = time.monotonic()
        with self._cond:
            self.failures_by[DISK_FULL] = self.failures_by.get(DISK_FULL, 0) + 1
            self.last_error = DISK_FULL
            self._disk_failures += 1
            refused = self._disk_failures
            wait = min(DISK_RETRY_MAX_SECS, DISK_RETRY_FIRST_SECS * 2 ** (refused - 1))
            self._retry_at = now + wait
            say = refused == 1 or now - self._disk_logged >= DISK_LOG_EVERY_SECS
            if say:
                self._disk_logged = now
            pending = sum(self._pending.values())
        if say:
            log.warning(
                "the disk is full: server vectors not written (%d refused in a row, %d events "
                "wait for theirs); retrying every %.0f s, nothing is lost",
                refused,
                pending,
                DISK_RETRY_MAX_SECS,
            )

    def _work_on(self, tenant_id: str) -> None:
        """Embed one batch of one open tenant's list and write it."""
        assert self.use_open is not None
        with self.use_open(tenant_id) as tenant:
            if tenant is None:  # closed meanwhile: its work waits in its log
                with self._cond:
                    self._forget(tenant_id)
                return
            if not self.serves(tenant):
                self._shelve(tenant)
                return
            self._embed_batch(tenant)
            self.notice(tenant)

    def _shelve(self, tenant: Tenant) -> None:
        """A tenant this embedder cannot serve (its model or dimension is another's): its
        events stay listed for `memspine-admin reembed` or the embedder it was made with."""
        log.error(
            "tenant %s: its vectors come from another model or dimension than this server's "
            "embedder makes; run memspine-admin reembed",
            tenant.tenant_id,
        )
        with self._cond:
            self._queue.pop(tenant.tenant_id, None)

    def _embed_batch(self, tenant: Tenant) -> None:
        """Embed up to `batch` listed events (made again if a delete came meanwhile); DiskFull
        with the vectors kept if a full disk refused their write."""
        with self._cond:
            kept, self._kept = self._kept, None
        if kept is not None and kept.tenant_id == tenant.tenant_id and self._store(tenant, kept):
            return
        for _attempt in range(3):
            events, before, deletes, model = tenant.to_embed(self._call_size())
            if not events or model is None:
                return
            started = time.monotonic()
            own = self.embedder.embed([ev.text or "" for ev in events])
            self._learn_rate(len(events), time.monotonic() - started)
            if own.shape[1] != tenant.dim:  # an endpoint whose model changed its length
                self._shelve(tenant)
                return
            vectors = chain(events, own, before)
            items = [
                StoredVector(ev.event_id, ev.seq, v.astype(float).tolist())
                for ev, v in zip(events, vectors, strict=True)
            ]
            if self._store(tenant, _Kept(tenant.tenant_id, items, model, deletes)):
                return

    def _call_size(self) -> int:
        """Texts for the next embed call: BATCH, or what CALL_SECS holds at the recent rate."""
        if self._rate is None:
            return self.batch
        return max(min(self.write_chunk, self.batch), min(self.batch, int(self._rate * CALL_SECS)))

    def _learn_rate(self, texts: int, secs: float) -> None:
        """Fold one call's texts a second into the recent rate (half the weight to the newest)."""
        if secs <= 0 or texts < self.write_chunk:  # a small call says more of overhead than rate
            return
        rate = texts / secs
        self._rate = rate if self._rate is None else (self._rate + rate) / 2

    def _store(self, tenant: Tenant, batch: _Kept) -> bool:
        """Write a batch's vectors, WRITE_CHUNK at a time; False if a delete since they were
        made means making the rest again; DiskFull, with the rest kept, if the disk is full."""
        while batch.items:
            # One chunk per turn of the writer, the next asked for once it is written: an
            # append that arrives meanwhile is committed between two chunks, not after them all.
            chunk = batch.items[: self.write_chunk]
            try:
                written = tenant.store_vectors(chunk, batch.model, batch.deletes).result()
            except DiskFull:
                with self._cond:
                    self._kept = batch
                raise
            if written is None:
                return False
            del batch.items[: len(chunk)]
            with self._cond:
                self.embedded += written
                self._written += 1
                self._cond.notify_all()  # a recall waiting for these vectors (written())
        with self._cond:
            refused, self._disk_failures = self._disk_failures, 0
        if refused:
            log.warning(
                "server vectors written again (resumed) after %d writes refused for a full disk",
                refused,
            )
        return True


def chain(
    events: list[StoredEvent],
    own: np.ndarray,
    before: StoredEvent | Mapping[Key, StoredEvent] | None,
) -> np.ndarray:
    """The vectors to store for events in append order from their texts' vectors `own`: a turn
    carries the stored vector of the turn before it in its conversation within CHAIN_GAP_US
    (docs/recall.md); `before` holds each conversation's stored turn before these (one turn
    alone: its own conversation's)."""
    out = np.array(own, dtype=np.float32, copy=True)
    prev: dict[Key, tuple[int, np.ndarray]] = {
        key: (ev.ts, np.asarray(ev.embedding, dtype=np.float32))
        for key, ev in starts_of(before).items()
        if ev.embedding is not None
    }
    for i, ev in enumerate(events):
        if ev.kind != CHAIN_KIND:
            continue
        key = conversation_of(ev)
        p = prev.get(key)
        if p is not None and abs(ev.ts - p[0]) <= CHAIN_GAP_US:
            v = out[i] + np.float32(CHAIN_WEIGHT) * p[1]
            out[i] = v / np.linalg.norm(v)
        prev[key] = (ev.ts, out[i])
    return out
