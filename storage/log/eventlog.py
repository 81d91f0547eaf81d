"""The event log: one LMDB environment per tenant holding every record and secondary index."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import msgspec

from storage import failpoints
from storage.errors import (
    DiskFull,
    EmbeddingMismatch,
    IdempotencyMismatch,
    InvalidRequest,
    MemspineError,
)
from storage.log import layout
from storage.log.layout import (
    DB_NAMES,
    LAST_WRITE,
    LIVE_BYTES,
    SCHEMA_VERSION,
    SUPERSEDING,
    IdempotencyRecord,
    Tombstone,
)
from storage.log.migrations import migrate
from storage.log.reader import LogReader
from storage.model import (
    CHAIN_GAP_US,
    CHAIN_KIND,
    SOURCE_FROM,
    SUPERSEDES,
    AppendResult,
    ItemRefused,
    NewEvent,
    PlacedEvent,
    Quota,
    ServerSpace,
    StoredEvent,
    StoredVector,
)
from storage.rwlock import RWLock
from storage.space import disk_full

INITIAL_MAP_SIZE = 32 << 20
T = TypeVar("T")

NOT_WRITTEN = "the server's disk is full: nothing was written; retry once space is freed"


class LogFormatError(RuntimeError):
    """The log was made in a format this code does not know (by a newer version)."""


class EventLog:
    """The durable log of one tenant; the only source of truth."""

    def __init__(self, path: Path, env: lmdb.Environment) -> None:
        self.path = path
        self.env = env
        self.lock = RWLock()
        self.dbs = {name: env.open_db(name.encode()) for name in DB_NAMES}

    @classmethod
    def open(cls, path: Path, *, embedding_dim: int = 384) -> EventLog:
        """Open (creating if needed) the log at path; a new log records embedding_dim."""
        path.mkdir(parents=True, exist_ok=True)
        env = _open_env(path, INITIAL_MAP_SIZE)
        env.reader_check()  # clear slots left by a process that died holding a read transaction
        log = cls(path, env)
        with log.reader() as r:
            schema = r.meta_int(layout.SCHEMA)
        if schema is not None and schema > SCHEMA_VERSION:
            env.close()
            raise LogFormatError(
                f"the event log is in format {schema}, newer than this version reads "
                f"({SCHEMA_VERSION}); open it with a newer memspine"
            )
        if schema is None or schema < SCHEMA_VERSION:  # new, or older: one write
            try:
                log.write(lambda txn: log._initialise(txn, embedding_dim))
            except BaseException:
                env.close()
                raise
        return log

    def _initialise(self, txn: lmdb.Transaction, embedding_dim: int) -> None:
        """Record the schema, dimension and superseding flag (none yet) of a new log, or bring
        a log of an older schema to this one."""
        schema = self.view(txn).meta_int(layout.SCHEMA)
        if schema is None:
            self.put_meta_int(txn, layout.SCHEMA, SCHEMA_VERSION)
            self.put_meta_int(txn, layout.DIM, embedding_dim)
            self.put_meta_int(txn, SUPERSEDING, 0)
            self.put_meta_int(txn, LIVE_BYTES, 0)
        else:
            migrate(txn, self.dbs, schema)

    def reopen(self) -> None:
        """Close and reopen the environment, once no transaction is active: after MDB_PANIC
        LMDB refuses every transaction of the environment until it is opened again."""
        with self.lock.exclusive():
            try:
                map_size = int(self.env.info()["map_size"])
            except lmdb.Error:
                map_size = INITIAL_MAP_SIZE  # LMDB grows it back to the file's size on open
            self.env.close()
            self._open_in_place(map_size)

    @contextmanager
    def files_replaced(self) -> Iterator[None]:
        """Hold every reader and writer out, with the environment closed, while the caller puts
        new files in its place; then open what is there with the old map's size (its headroom:
        a copy is compact, and would grow again on its first writes)."""
        with self.lock.exclusive():
            map_size = int(self.env.info()["map_size"])
            self.env.close()
            try:
                yield
            finally:
                if self.path.is_dir():
                    self._open_in_place(map_size)

    def _open_in_place(self, map_size: int) -> None:
        """Open the environment at this log's path again (the caller holds the lock exclusive)."""
        self.env = _open_env(self.path, map_size)
        self.env.reader_check()
        self.dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}

    def map_size(self) -> int:
        """The environment's map size in bytes (the shared lock keeps a resize out)."""
        with self.lock.shared():
            return int(self.env.info()["map_size"])

    def grow_if_over_half(self) -> None:
        """Double the map now if more than half of it is in use, before a long read: growing
        waits for every reader, so a write needing room while one is held would stall reads."""
        with self.lock.shared():
            info, page = self.env.info(), self.env.stat()["psize"]
            used = (info["last_pgno"] + 1) * page
        if used * 2 > info["map_size"]:
            with self.lock.exclusive():
                self.env.set_mapsize(max(int(info["map_size"]), used) * 2)

    def close(self) -> None:
        """Close the environment once no transaction is active."""
        with self.lock.exclusive():
            self.env.close()

    @contextmanager
    def reader(self) -> Iterator[LogReader]:
        """A consistent read-only view of the log."""
        with self.lock.shared(), self.env.begin(buffers=False) as txn:
            yield LogReader(txn, self.dbs)

    def view(self, txn: lmdb.Transaction) -> LogReader:
        """A LogReader over a transaction already open (a write transaction sees its own writes)."""
        return LogReader(txn, self.dbs)

    # -- meta -----------------------------------------------------------------

    def meta_int(self, name: str) -> int | None:
        """An integer meta value, or None."""
        with self.reader() as r:
            return r.meta_int(name)

    def set_meta_int(self, name: str, value: int) -> None:
        """Store an integer meta value durably."""
        self.write(lambda txn: self.put_meta_int(txn, name, value))

    def put_meta_int(self, txn: lmdb.Transaction, name: str, value: int) -> None:
        """Store an integer meta value inside a write transaction."""
        txn.put(layout.meta_key(name), layout.u64(value), db=self.dbs["meta"])

    # -- writes ---------------------------------------------------------------

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run fn in one durable write transaction, growing the map instead of failing when full;
        DiskFull if the disk is (nothing was written: LMDB aborted the transaction)."""
        reopened = False
        while True:
            try:
                with self.lock.shared(), self.env.begin(write=True) as txn:
                    result = fn(txn)
                    failpoints.hit("log.commit")
                    return result  # the transaction commits here, as the block ends
            except lmdb.MapFullError:
                self._grow()
            except Exception as exc:
                if disk_full(exc, self.path):
                    raise DiskFull(NOT_WRITTEN) from exc
                if not isinstance(exc, lmdb.PanicError) or reopened:
                    raise
                # A failed meta page write leaves the environment refusing every transaction:
                # open it again and retry once.
                self.reopen()
                reopened = True

    def _grow(self) -> None:
        """Double the map size; LMDB allows this only with no transaction active."""
        with self.lock.exclusive():
            self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def append_batch(
        self, events: list[NewEvent], quota: Quota | None = None
    ) -> list[AppendResult | MemspineError]:
        """Append events in one transaction; each gets its result or its own error."""

        def apply(txn: lmdb.Transaction) -> list[AppendResult | MemspineError]:
            appender = self.appender(txn)
            results = appender.append_all(events, quota)
            appender.finish()
            return results

        return self.write(apply)

    def appender(self, txn: lmdb.Transaction, offer: ServerSpace | None = None) -> Appender:
        """An appender for many events inside the write transaction txn (offer: the server's
        embedder, for a tenant whose vector space is nobody's yet)."""
        return Appender(self, txn, offer)

    def store_vectors(
        self, txn: lmdb.Transaction, vectors: list[StoredVector], model: str
    ) -> list[StoredVector]:
        """Write server vectors into their events' records (each still live, still awaiting
        one, of the server-space tenant whose model is `model`), one OP_EMBED op each; the
        vectors written."""
        r, d = self.view(txn), self.dbs
        if r.meta_int(layout.SPACE) != layout.SPACE_SERVER or r.meta_str(layout.MODEL) != model:
            return []
        written: list[StoredVector] = []
        grown = 0
        for item in vectors:
            raw_id = layout.id_bytes(item.event_id)
            key = layout.unembedded_key(item.seq, raw_id)
            if txn.get(key, db=d["unembedded"]) is None:
                continue  # deleted, or given its vector by another path meanwhile
            raw = txn.get(raw_id, db=d["events"])
            txn.delete(key, db=d["unembedded"])
            if raw is None:
                continue
            ev = layout.decode_event(raw)
            if ev.seq != item.seq or ev.embedding is not None:
                continue
            record = msgspec.structs.replace(ev, embedding=item.vector, embedding_model=model)
            encoded = layout.encode_event(record)
            txn.put(raw_id, encoded, db=d["events"])
            seq = r.last_seq() + 1
            txn.put(layout.op_key(seq), layout.op_value(layout.OP_EMBED, raw_id), db=d["ops"])
            grown += len(encoded) - len(raw)
            written.append(item)
        if grown:
            live = r.meta_int(LIVE_BYTES) or 0
            self.put_meta_int(txn, LIVE_BYTES, live + grown)
        return written

    def clear_vector(self, txn: lmdb.Transaction, ev: StoredEvent) -> None:
        """Take a server vector out of a live event's record and list the event for the
        embedder again (its vector carried a deleted turn's, docs/recall.md)."""
        r, d = self.view(txn), self.dbs
        raw_id = layout.id_bytes(ev.event_id)
        raw = txn.get(raw_id, db=d["events"])
        if raw is None:
            return
        record = msgspec.structs.replace(ev, embedding=None, embedding_model=None)
        encoded = layout.encode_event(record)
        txn.put(raw_id, encoded, db=d["events"])
        txn.put(layout.unembedded_key(ev.seq, raw_id), b"", db=d["unembedded"])
        seq = r.last_seq() + 1
        txn.put(layout.op_key(seq), layout.op_value(layout.OP_EMBED, raw_id), db=d["ops"])
        live = r.meta_int(LIVE_BYTES) or 0
        self.put_meta_int(txn, LIVE_BYTES, max(0, live - (len(raw) - len(encoded))))

    def append_one(self, txn: lmdb.Transaction, ev: NewEvent) -> AppendResult | MemspineError:
        """Write one event and its index entries, or return why it cannot be written."""
        appender = Appender(self, txn)
        result = appender.append(ev)
        appender.finish()
        return result

    def delete(self, event_ids: list[str]) -> list[str]:
        """Delete events with their links and index entries, leaving tombstones; returns the ids deleted."""
        return self.write(lambda txn: self.delete_in(txn, event_ids))

    def delete_in(self, txn: lmdb.Transaction, event_ids: list[str]) -> list[str]:
        """Delete events inside a write transaction; returns the ids that existed."""
        deleted: list[str] = []
        freed = 0
        for event_id in _dedupe(event_ids):
            size = self._delete_one(txn, event_id)
            if size is not None:
                deleted.append(event_id)
                freed += size
        if deleted:  # a delete frees quota: the live bytes go down with the records
            live = self.view(txn).meta_int(LIVE_BYTES) or 0
            self.put_meta_int(txn, LIVE_BYTES, max(0, live - freed))
            self.put_meta_int(txn, LAST_WRITE, time.time_ns() // 1000)
        return deleted

    def _delete_one(self, txn: lmdb.Transaction, event_id: str) -> int | None:
        """Remove one event everywhere but the tombstone list; the bytes of its record, or None
        if it does not exist."""
        r = LogReader(txn, self.dbs)
        raw = r.record(event_id)
        if raw is None:
            return None
        ev = layout.decode_event(raw)
        d = self.dbs
        raw_id = layout.id_bytes(event_id)
        # Number the delete before dropping the append op: were the append the newest op, the
        # delete would reuse its seq and the projections (already past it) would never replay it.
        seq = r.last_seq() + 1
        txn.delete(raw_id, db=d["events"])
        txn.delete(layout.op_key(ev.seq), db=d["ops"])
        txn.put(layout.op_key(seq), layout.op_value(layout.OP_DELETE, raw_id), db=d["ops"])
        txn.delete(layout.unembedded_key(ev.seq, raw_id), db=d["unembedded"])
        if ev.kind == CHAIN_KIND and ev.embedding is not None:
            self._unchain(txn, ev)
        for name, key in layout.index_keys(ev):
            txn.delete(key, db=d[name])
        for rel in layout.REL_CODES:
            for target in r.links_out(event_id, rel):
                in_key = layout.link_in_key(layout.id_bytes(target), rel, ev.seq, raw_id)
                txn.delete(in_key, db=d["links_in"])
            _delete_prefix(txn, d["links_out"], layout.link_prefix(raw_id, rel))
            for source in r.links_in(event_id, rel):
                self._unlink_out(txn, r, source, rel, raw_id)
            _delete_prefix(txn, d["links_in"], layout.link_prefix(raw_id, rel))
        tomb = Tombstone(seq=ev.seq, deleted_at=time.time_ns() // 1000)
        txn.put(raw_id, layout.encode_tombstone(tomb), db=d["tombstones"])
        return len(raw)

    def _unchain(self, txn: lmdb.Transaction, deleted: StoredEvent) -> None:
        """A deleted turn of a server-space tenant: the later turns of its chain (up to the
        first CHAIN_GAP_US break) lose their vectors, each of which carried a share of its
        vector, and are embedded again without it (docs/recall.md, "Deletes, purges")."""
        r = self.view(txn)
        if r.meta_int(layout.SPACE) != layout.SPACE_SERVER:
            return
        before = deleted.ts
        for _seq, op, event_id in list(r.ops_after(deleted.seq)):
            if op != layout.OP_APPEND:
                continue
            ev = r.get(event_id)
            if ev is None or ev.kind != CHAIN_KIND:
                continue
            if ev.ts - before > CHAIN_GAP_US:
                return
            before = ev.ts
            if ev.embedding is not None:
                self.clear_vector(txn, ev)

    def _unlink_out(
        self, txn: lmdb.Transaction, r: LogReader, source: str, rel: str, raw_target: bytes
    ) -> None:
        """Drop raw_target from source's ordered out-links, keeping the order of the rest."""
        raw_source = layout.id_bytes(source)
        values = r.link_values(raw_source, rel)
        kept = [v for v in values if layout.link_target(v) != raw_target]
        _delete_prefix(txn, self.dbs["links_out"], layout.link_prefix(raw_source, rel))
        for i, value in enumerate(kept):
            txn.put(layout.link_out_key(raw_source, rel, i), value, db=self.dbs["links_out"])

    def tombstones(self) -> list[str]:
        """Ids deleted since the last purge."""
        with self.reader() as r:
            return r.tombstone_ids()

    def clear_tombstones(self, txn: lmdb.Transaction, event_ids: list[str]) -> None:
        """Forget tombstones once their bytes have left the disk."""
        for e in event_ids:
            txn.delete(layout.id_bytes(e), db=self.dbs["tombstones"])


class Appender:
    """Appends events in one write transaction, reading the tenant's meta once for all of them."""

    # It numbers ops itself from the last seq it read, so every other write to the ops of txn
    # must go through it (`delete`). `written` keeps every record it wrote, in seq order: what
    # the writer projects into the indexes without reading the log back. It keeps the tenant's
    # live events and bytes as it goes, so each append is held to a quota without a read, and
    # writes the bytes and the last write's time to the meta once, in `finish`.

    def __init__(
        self, log: EventLog, txn: lmdb.Transaction, offer: ServerSpace | None = None
    ) -> None:
        self.log = log
        self.txn = txn
        self.reader = LogReader(txn, log.dbs)
        self.dim = self.reader.meta_int(layout.DIM)
        self.model = self.reader.meta_str(layout.MODEL)
        self.space = self.reader.meta_int(layout.SPACE)
        self.offer = offer  # the server's embedder, for a tenant whose space is nobody's yet
        self.unembedded = 0  # events written here that await their server vector
        # Events listed before this transaction: their vectors are not in the live bytes yet,
        # but they count against max_bytes as if written (they will be, whatever the quota).
        self.listed = self.reader.unembedded_count()
        self.last = self.reader.last_seq()  # the newest op in txn
        self.events = self.reader.event_count()
        self.bytes = self.reader.meta_int(LIVE_BYTES) or 0
        self.written: list[StoredEvent] = []
        self._random = b""  # random bytes for ids, drawn from the OS a few dozen ids at a time
        self._unsaved = False  # events appended since the meta last had the live bytes
        # What the tenant held in memory when its group commit started (a quota's max_memory):
        # the indexes grow only once the commit is projected into them.
        self.memory = 0

    def finish(self) -> None:
        """Write the live bytes and the time of the last write to the meta, if events were
        appended since they were last written (call it before the transaction commits)."""
        if self._unsaved:
            self.log.put_meta_int(self.txn, LIVE_BYTES, self.bytes)
            self.log.put_meta_int(self.txn, LAST_WRITE, time.time_ns() // 1000)
            self._unsaved = False

    def delete(self, event_ids: list[str]) -> list[str]:
        """Delete events (EventLog.delete_in) in this appender's transaction."""
        self.finish()  # delete_in counts the freed bytes from the meta's figure
        deleted = self.log.delete_in(self.txn, event_ids)
        self.last = self.reader.last_seq()
        self.events = self.reader.event_count()
        self.bytes = self.reader.meta_int(LIVE_BYTES) or 0
        return deleted

    def append_all(
        self, events: list[NewEvent], quota: Quota | None = None
    ) -> list[AppendResult | MemspineError]:
        """Append each event in order; each gets its result or its own error."""
        return [self.append(ev, quota) for ev in events]

    def append_atomic(
        self, events: list[NewEvent], quota: Quota | None = None
    ) -> list[AppendResult] | ItemRefused:
        """Append every event in order, or none of them: the first that cannot be written
        (and why) undoes the others. Later events may link to earlier ones by id."""
        # A nested transaction: aborting it leaves txn as it was, with the other jobs of the
        # group commit in it; this appender's own counters move only once it commits.
        child = self.log.env.begin(write=True, parent=self.txn)
        results: list[AppendResult] = []
        try:
            sub = Appender(self.log, child, self.offer)
            sub._random = self._random
            sub.bytes = self.bytes  # the meta's figure lags until finish: carry this one's
            sub.memory = self.memory
            for i, ev in enumerate(events):
                result = sub.append(ev, quota)
                if isinstance(result, MemspineError):
                    child.abort()
                    return ItemRefused(i, result)
                results.append(result)
        except BaseException:
            child.abort()
            raise
        child.commit()
        self.last, self.model, self.events, self.bytes = sub.last, sub.model, sub.events, sub.bytes
        self.space, self.unembedded = sub.space, self.unembedded + sub.unembedded
        self._unsaved = self._unsaved or sub._unsaved
        self.written += sub.written
        self._random = sub._random
        return results

    def append(self, ev: NewEvent, quota: Quota | None = None) -> AppendResult | MemspineError:
        """Write one event and its index entries, or return why it cannot be written (an
        Idempotency-Key's other body, an embedding of another length or model, the quota)."""
        txn, d, r = self.txn, self.log.dbs, self.reader
        if ev.event_id is None:
            raw_id = self._random_id()
            event_id = layout.id_str(raw_id)
        else:
            event_id = ev.event_id
            raw_id = layout.id_bytes(event_id)
        if ev.event_id is not None and ev.body_hash is not None:
            prior = txn.get(raw_id, db=d["idem"])
            if prior is not None:
                rec = layout.decode_idempotency(prior)
                if rec.body_hash != ev.body_hash:
                    return IdempotencyMismatch(
                        "this Idempotency-Key was first used with a different body; "
                        "use a new key for a different event"
                    )
                return AppendResult(event_id=event_id, unlinked=rec.unlinked, replayed=True)
        problem = self._check_embedding(ev)
        if problem is not None:
            return problem
        awaits = self._awaits_vector(ev)
        if isinstance(awaits, MemspineError):
            return awaits
        seq = self.last + 1
        properties = msgspec.json.decode(ev.properties_raw) if ev.properties_raw else {}
        filterable = layout.filterable_properties(
            properties if isinstance(properties, dict) else {}
        )
        sources: list[str] = []
        supersedes: list[str] = []
        unlinked: list[str] = []
        if ev.source_ids or ev.supersedes:  # most events link nothing: skip four dedupes
            wanted_sources = _dedupe(ev.source_ids)
            wanted_supersedes = _dedupe(ev.supersedes)
            # An existence check, not r.get: decoding a whole record (embedding included) is
            # most of what a lookup costs and nothing here reads it.
            sources = [s for s in wanted_sources if r.exists(s)]
            supersedes = [s for s in wanted_supersedes if r.exists(s)]
            unlinked = [s for s in wanted_sources if s not in sources]
            unlinked += [s for s in wanted_supersedes if s not in supersedes and s not in unlinked]
        record = StoredEvent(
            event_id=event_id,
            seq=seq,
            kind=ev.kind,
            ts=ev.ts,
            text=ev.text,
            embedding=ev.embedding,
            embedding_model=ev.embedding_model,
            properties_raw=ev.properties_raw,
            filterable=filterable,
            supersedes=supersedes,
            valid_from=ev.valid_from,
            valid_until=ev.valid_until,
        )
        encoded = layout.encode_event(record)
        if quota is not None:
            # The vector the server will write into the record counts now, and so do those of
            # every event still awaiting its own: once acknowledged, an event is never refused
            # its vector, and max_bytes bounds what the tenant will store.
            promised = (self.listed + self.unembedded + bool(awaits)) * vector_bytes(self.dim or 0)
            size = len(encoded) + promised
            refused = quota.refusal(self.events + 1, self.bytes + size, self.memory)
            if refused is not None:
                return refused
        self._put(raw_id, record, sources, supersedes, encoded, awaits=awaits)
        if ev.event_id is not None and ev.body_hash is not None:
            idem = IdempotencyRecord(body_hash=ev.body_hash, unlinked=unlinked)
            txn.put(raw_id, layout.encode_idempotency(idem), db=d["idem"])
        return AppendResult(event_id=event_id, unlinked=unlinked)

    def _put(
        self,
        raw_id: bytes,
        record: StoredEvent,
        sources: list[str],
        supersedes: list[str],
        encoded: bytes | None = None,
        *,
        awaits: bool = False,
    ) -> None:
        """Write a numbered record, its op, its index keys and its links (targets that exist);
        awaits: the event is listed for the background embedder."""
        txn, d, seq = self.txn, self.log.dbs, record.seq
        if encoded is None:
            encoded = layout.encode_event(record)
        # Nothing can refuse the event from here on: the tenant's model and space are recorded
        # with it.
        if record.embedding_model is not None and self.model is None:
            txn.put(layout.meta_key(layout.MODEL), record.embedding_model.encode(), db=d["meta"])
            self.model = record.embedding_model
        if self.space is None and record.embedding is not None:
            self.log.put_meta_int(txn, layout.SPACE, layout.SPACE_CLIENT)
            self.space = layout.SPACE_CLIENT
        elif self.space is None and awaits:
            self._claim_server_space()
        if awaits:
            txn.put(layout.unembedded_key(seq, raw_id), b"", db=d["unembedded"])
            self.unembedded += 1
        txn.put(raw_id, encoded, db=d["events"])
        # MDB_APPEND refuses a seq that is not past every op: the transaction was written behind
        # this appender's back, and numbering on would overwrite or reorder ops.
        op = layout.op_value(layout.OP_APPEND, raw_id)
        if not txn.put(layout.op_key(seq), op, db=d["ops"], append=True):
            raise RuntimeError(f"op {seq} is not past the newest op: ops written outside it")
        self.last = seq
        self.events, self.bytes = self.events + 1, self.bytes + len(encoded)
        self._unsaved = True
        for name, key in layout.index_keys(record, raw_id):
            txn.put(key, b"", db=d[name])
        if supersedes:
            self.log.put_meta_int(txn, SUPERSEDING, 1)
        for rel, targets in ((SOURCE_FROM, sources), (SUPERSEDES, supersedes)):
            for i, target in enumerate(targets):
                raw_target = layout.id_bytes(target)
                value = layout.link_out_value(raw_target, self._kind(raw_target))
                txn.put(layout.link_out_key(raw_id, rel, i), value, db=d["links_out"])
                txn.put(layout.link_in_key(raw_target, rel, seq, raw_id), b"", db=d["links_in"])
        self.written.append(record)

    def _kind(self, raw_target: bytes) -> str:
        """The kind of a link's target, which the caller found live in this transaction."""
        raw = self.txn.get(raw_target, db=self.log.dbs["events"])
        if raw is None:
            raise RuntimeError("a link's target is not in the log")
        return layout.record_kind(raw)

    def place(self, placed: PlacedEvent, *, keep_before: int | None = None) -> bool:
        """Write an exported event as it was: its id, its record's fields, its links in their
        order (every target must exist) and its idempotency record. False (nothing written)
        when the id is live already and was so at op `keep_before` (a merge keeps it);
        InvalidRequest naming the line for anything else that cannot be written."""
        ev, line = placed.event, placed.line
        raw_id = layout.id_bytes(ev.event_id)
        held = self.txn.get(raw_id, db=self.log.dbs["events"])
        if held is not None:
            if keep_before is not None and layout.decode_light(held).seq <= keep_before:
                return False
            raise InvalidRequest(f"line {line}: event {ev.event_id} appears twice")
        for target in (*placed.sources, *placed.superseded):
            if not self.reader.exists(target):
                raise InvalidRequest(
                    f"line {line}: event {ev.event_id} links to {target}, "
                    "which is not an earlier event of the file or of the tenant"
                )
        problem = self._check_embedding(ev)
        if problem is not None:
            raise InvalidRequest(f"line {line}: {problem.detail}")
        awaits = self._awaits_vector(ev)
        if isinstance(awaits, MemspineError):
            raise InvalidRequest(f"line {line}: {awaits.detail}")
        properties = msgspec.json.decode(ev.properties_raw) if ev.properties_raw else {}
        filterable = layout.filterable_properties(
            properties if isinstance(properties, dict) else {}
        )
        record = msgspec.structs.replace(ev, seq=self.last + 1, filterable=filterable)
        self._put(raw_id, record, placed.sources, placed.superseded, awaits=awaits)
        if placed.body_hash is not None:
            self.place_idempotency(ev.event_id, placed.body_hash, placed.unlinked)
        return True

    def place_idempotency(self, event_id: str, body_hash: bytes, unlinked: list[str]) -> None:
        """Write the Idempotency-Key record of an event (one deleted since keeps its record, so
        a retry of its append still replays rather than stores it again)."""
        idem = IdempotencyRecord(body_hash=body_hash, unlinked=unlinked)
        self.txn.put(
            layout.id_bytes(event_id), layout.encode_idempotency(idem), db=self.log.dbs["idem"]
        )

    def claim_model(self, model: str) -> None:
        """Record the tenant's embedding model as an export names it; InvalidRequest if the
        tenant already has another."""
        if self.model is None:
            self.txn.put(layout.meta_key(layout.MODEL), model.encode(), db=self.log.dbs["meta"])
            self.model = model
        elif self.model != model:
            raise InvalidRequest(
                f"this tenant's embeddings come from '{self.model}', the file's from '{model}'"
            )

    def claim_space(self, space: int, model: str | None) -> None:
        """Record the tenant's vector space as an export names it; InvalidRequest if the
        tenant already has another."""
        if self.space is None:
            self.log.put_meta_int(self.txn, layout.SPACE, space)
            self.space = space
        elif self.space != space:
            raise InvalidRequest(
                f"this tenant's vectors are made by the {space_name(self.space)}, "
                f"the file's by the {space_name(space)}"
            )
        if model is not None:
            self.claim_model(model)

    def _awaits_vector(self, ev: NewEvent | StoredEvent) -> bool | MemspineError:
        """Whether the event gets a server vector after its append; EmbeddingMismatch for a
        client vector in a server-space tenant that does not name the server's model."""
        if ev.embedding is not None:
            if self.space == layout.SPACE_SERVER and ev.embedding_model != self.model:
                return EmbeddingMismatch(
                    f"this tenant's vectors are made by the server with '{self.model}'; "
                    "send no embedding (the server makes it), or one with embedding_model "
                    f"'{self.model}'"
                )
            return False
        if not ev.text:
            return False
        if self.space == layout.SPACE_SERVER:
            return True
        offer = self.offer
        return (
            self.space is None
            and self.model is None
            and offer is not None
            and offer.dim == self.dim
        )

    def _claim_server_space(self) -> None:
        """Make the tenant server-space (its first event to get a vector is text-only and the
        server embeds): every earlier live event with text and no vector is listed too."""
        assert self.offer is not None
        txn, d = self.txn, self.log.dbs
        self.log.put_meta_int(txn, layout.SPACE, layout.SPACE_SERVER)
        txn.put(layout.meta_key(layout.MODEL), self.offer.model.encode(), db=d["meta"])
        self.space, self.model = layout.SPACE_SERVER, self.offer.model
        cursor = txn.cursor(db=d["events"])
        for raw_id, value in cursor.iternext(keys=True, values=True):
            ev = layout.decode_light(value)  # a log with no space yet holds no vector
            if ev.text:
                txn.put(layout.unembedded_key(ev.seq, bytes(raw_id)), b"", db=d["unembedded"])
                self.unembedded += 1

    def _random_id(self) -> bytes:
        """The 16 bytes of a random UUIDv4, as uuid.uuid4() makes them, without a syscall each."""
        if not self._random:
            self._random = os.urandom(16 * 32)
        raw = bytearray(self._random[:16])
        self._random = self._random[16:]
        raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
        return bytes(raw)

    def _check_embedding(self, ev: NewEvent | StoredEvent) -> MemspineError | None:
        """Refuse an embedding of the wrong length or from a model other than the tenant's."""
        if ev.embedding is not None:
            dim = self.dim
            if dim is not None and len(ev.embedding) != dim:
                return EmbeddingMismatch(
                    f"embedding has {len(ev.embedding)} values; this tenant's vectors have {dim}"
                )
        known = self.model
        if ev.embedding_model is not None and known is not None and known != ev.embedding_model:
            return EmbeddingMismatch(
                f"this tenant's embeddings come from '{known}'; "
                "vectors from another model cannot be mixed with them"
            )
        return None


def vector_bytes(dim: int) -> int:
    """What a vector of dim floats adds to a record (a msgpack bin of float64s and its header)."""
    return 8 * dim + (2 if 8 * dim < 256 else 3 if 8 * dim < 65536 else 5)


def space_name(space: int | None) -> str:
    """Who makes a tenant's vectors, as whoami and the usage name it."""
    return {layout.SPACE_SERVER: "server", layout.SPACE_CLIENT: "client"}.get(space or 0, "none")


def record_bytes(r: LogReader) -> int:
    """The bytes of every live event's record, counted by a scan (what LIVE_BYTES keeps)."""
    cursor = r.txn.cursor(db=r.dbs["events"])
    return sum(len(value) for value in cursor.iternext(keys=False, values=True))


@contextmanager
def read_only(path: Path) -> Iterator[LogReader]:
    """One read snapshot of the log at path without opening it for writes (a closed tenant's
    figures); FileNotFoundError if there is no log. The caller keeps this process from opening
    the same log meanwhile (LMDB allows one environment per file and process)."""
    if not (path / "data.mdb").is_file():
        raise FileNotFoundError(path)
    with snapshot(path) as reader:
        yield reader


@contextmanager
def snapshot(path: Path, *, lock: bool = True) -> Iterator[LogReader]:
    """One read transaction of the log at path from a process that does not write it (a backup
    or an export by the CLI while the server runs): the environment opened read-only for it.

    The reader slot it takes in the log's lock file keeps the writer from reusing the pages it
    reads, so the snapshot stays whole however long it is held; the writer never waits for it.
    lock=False: nobody writes the log (a backup's copy), and no lock file is made.
    """
    env = lmdb.open(
        str(path),
        readonly=True,
        create=False,
        max_dbs=len(DB_NAMES) + 1,
        max_readers=256,
        readahead=False,
        lock=lock,
    )
    try:
        with env.begin(buffers=False) as txn:
            dbs = {}
            for name in DB_NAMES:
                try:
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=False)
                except lmdb.NotFoundError:
                    if name not in layout.LATER_DBS:
                        raise
            yield LogReader(txn, dbs)
    finally:
        env.close()


def _open_env(path: Path, map_size: int) -> lmdb.Environment:
    """The log's LMDB environment, every commit synced."""
    return lmdb.open(
        str(path),
        map_size=map_size,
        max_dbs=len(DB_NAMES) + 1,
        max_readers=256,
        sync=True,
        metasync=True,
        readahead=False,
    )


def _dedupe(ids: Any) -> list[str]:
    """Ids in first-seen order without repeats."""
    return list(dict.fromkeys(ids))


def _delete_prefix(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    """Delete every key that starts with prefix."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break
