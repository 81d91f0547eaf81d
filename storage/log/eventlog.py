"""The event log: one LMDB environment per tenant holding every record and secondary index, its
life (open, grow, reopen, close), its write transactions, deletes and read snapshots; appending
events is storage/log/appender.py's, changing records after their append revisions.py's."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from storage import failpoints
from storage.errors import DiskFull, InvalidRequest, MemspineError
from storage.fsync import fsync_dir, fsync_file
from storage.log import layout, revisions
from storage.log.appender import Appender, dedupe
from storage.log.held import held_logs
from storage.log.layout import (
    DB_NAMES,
    LAST_WRITE,
    LIVE_BYTES,
    SCHEMA_VERSION,
    SUPERSEDING,
    Tombstone,
)
from storage.log.migrations import MOVED, REWRITTEN, migrate, move_records, rewrite_records
from storage.log.reader import LogReader
from storage.model import CHAIN_KIND, AppendResult, NewEvent, Quota, ServerSpace
from storage.rwlock import RWLock
from storage.space import disk_full

_log = logging.getLogger("memspine.log")
INITIAL_MAP_SIZE = 32 << 20
DATA_FILE = "data.mdb"  # LMDB's file in the log's directory
COMPACTING = "compacting"  # where _compact makes its copy, inside the log's directory
T = TypeVar("T")

NOT_WRITTEN = "the server's disk is full: nothing was written; retry once space is freed"


class LogFormatError(RuntimeError):
    """The log was made in a format this code does not know (by a newer version)."""


class EventLog:
    """The durable log of one tenant; the only source of truth."""

    def __init__(self, path: Path, env: lmdb.Environment) -> None:
        self.path = path
        # None while let go (storage/log/held.py): opened again at the next use.
        self.env: lmdb.Environment | None = env
        self.lock = RWLock()
        self.dbs = _open_dbs(env)
        self.used_at = time.monotonic()  # the last use, for held.py's sweep
        self.writes = 0  # write transactions and file swaps since open: the meta may have moved
        self._map_size = INITIAL_MAP_SIZE  # the map's size while let go
        self._closed = False
        held_logs().add(self)

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
            log.close()
            raise LogFormatError(
                f"the event log is in format {schema}, newer than this version reads "
                f"({SCHEMA_VERSION}); open it with a newer memspine"
            )
        if schema is None or schema < SCHEMA_VERSION:  # new, or older: one write
            try:
                if schema is not None:
                    log._migrate_in_batches(schema)
                log.write(lambda txn: log._initialise(txn, embedding_dim))
            except BaseException:
                log.close()
                raise
            log.dbs.pop(layout.LEGACY_EVENTS, None)  # deleted by the migration to 7
            if schema is not None and schema < MOVED:
                try:
                    log._compact()
                except (OSError, lmdb.Error) as exc:  # a full disk, say: the log is whole
                    _log.warning("the migrated log was not compacted (%s)", exc)
                    shutil.rmtree(path / COMPACTING, ignore_errors=True)
        return log

    def _compact(self) -> None:
        """Replace the log's file with a compact copy of it (after the migration to 7: the
        pages the legacy records held are free, and the file would keep them until later
        writes take them, about as many bytes again as the records have)."""
        copy = self.path / COMPACTING
        shutil.rmtree(copy, ignore_errors=True)  # a copy a crash left
        copy.mkdir()
        with self.environment() as env:  # held shared: no let-go while it copies
            env.copy(str(copy), compact=True)
        fsync_file(copy / DATA_FILE)
        with self.files_replaced():
            os.replace(copy / DATA_FILE, self.path / DATA_FILE)
            fsync_dir(self.path)
        shutil.rmtree(copy, ignore_errors=True)

    def _migrate_in_batches(self, schema: int) -> None:
        """The steps of a migration that rewrite or move every record, each in transactions of
        a batch (before the one transaction of _initialise): records rewritten in the current
        encoding (older than 6), then moved under their seqs (older than 7)."""
        if schema < REWRITTEN:
            rewrite_records(self.write, self.dbs)
        if schema < MOVED - 1:  # the steps before 7 read the records where the legacy kept them
            self.write(lambda txn: migrate(txn, self.dbs, schema, MOVED - 1))
        if schema < MOVED:
            move_records(self.write, self.dbs)

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
            map_size = self._map_size
            if self.env is not None:
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
            map_size = self._map_size
            if self.env is not None:
                map_size = int(self.env.info()["map_size"])
                self.env.close()
                self.env = None
            self.writes += 1
            try:
                yield
            finally:
                if self.path.is_dir():
                    self._open_in_place(map_size)

    def _open_in_place(self, map_size: int) -> None:
        """Open the environment at this log's path again (the caller holds the lock exclusive)."""
        self.env = None
        env = _open_env(self.path, map_size)
        try:
            env.reader_check()
            self.dbs = _open_dbs(env)
        except BaseException:
            env.close()
            raise
        self.env = env
        held_logs().add(self)

    @contextmanager
    def environment(self) -> Iterator[lmdb.Environment]:
        """The environment, held shared (no resize, swap or let-go meanwhile); opened again
        first if it was let go."""
        self.used_at = time.monotonic()
        while True:
            with self.lock.shared():
                env = self.env
                if env is not None:
                    yield env
                    return
            self._open_again()

    def _env_now(self) -> lmdb.Environment:
        """The environment, opened again if it was let go (the caller holds the lock)."""
        if self.env is None:
            # Closed, or its directory gone (a swap that found none): never made anew here.
            if self._closed or not self.path.is_dir():
                raise lmdb.Error("the event log is closed")
            self._open_in_place(self._map_size)
        assert self.env is not None
        return self.env

    def _open_again(self) -> None:
        """Open the environment let go (storage/log/held.py), unless another thread did."""
        with self.lock.exclusive():
            self._env_now()

    def let_go(self) -> bool:
        """Close the environment if no transaction holds it now (never waits): an open tenant
        unused for a while holds no descriptor; its next use opens it again. True if it went
        or was not open."""
        if not self.lock.try_exclusive():
            return False
        try:
            if self.env is not None:
                try:
                    self._map_size = int(self.env.info()["map_size"])
                finally:
                    self.env.close()
                    self.env = None
        finally:
            self.lock.release_exclusive()
        return True

    def is_held(self) -> bool:
        """Whether the environment is open now (not let go, not closed)."""
        return self.env is not None

    def map_size(self) -> int:
        """The environment's map size in bytes (the shared lock keeps a resize out)."""
        with self.environment() as env:
            return int(env.info()["map_size"])

    def grow_if_over_half(self) -> None:
        """Double the map now if more than half of it is in use, before a long read: growing
        waits for every reader, so a write needing room while one is held would stall reads."""
        with self.environment() as env:
            info, page = env.info(), env.stat()["psize"]
            used = (info["last_pgno"] + 1) * page
        if used * 2 > info["map_size"]:
            with self.lock.exclusive():
                self._env_now().set_mapsize(max(int(info["map_size"]), used) * 2)

    def close(self) -> None:
        """Close the environment once no transaction is active."""
        with self.lock.exclusive():
            self._closed = True
            if self.env is not None:
                self.env.close()
                self.env = None
        held_logs().forget(self)

    @contextmanager
    def reader(self) -> Iterator[LogReader]:
        """A consistent read-only view of the log."""
        with self.environment() as env, env.begin(buffers=False) as txn:
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
                with self.environment() as env, env.begin(write=True) as txn:
                    self.writes += 1
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
            env = self._env_now()
            env.set_mapsize(env.info()["map_size"] * 2)

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
        for event_id in dedupe(event_ids):
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
        txn.delete(layout.record_key(ev.seq), db=d["records"])
        txn.delete(raw_id, db=d["ids"])
        txn.delete(layout.op_key(ev.seq), db=d["ops"])
        txn.put(layout.op_key(seq), layout.op_value(layout.OP_DELETE, raw_id), db=d["ops"])
        txn.delete(layout.unembedded_key(ev.seq, raw_id), db=d["unembedded"])
        if ev.kind == CHAIN_KIND and ev.embedding is not None:
            revisions.unchain(txn, self.dbs, ev)
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
        txn.put(raw_id, layout.u64(tomb.deleted_at), db=d["erased"])
        return len(raw)

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

    def record_erased(self, txn: lmdb.Transaction, ledger: Mapping[str, int]) -> None:
        """Put entries into the erasure ledger (id -> microseconds of its delete): a tenant
        made from a copy keeps the ledger of what it was made from."""
        for event_id, at in ledger.items():
            txn.put(layout.id_bytes(event_id), layout.u64(at), db=self.dbs["erased"])

    def prune_erased(self, txn: lmdb.Transaction, before: int) -> int:
        """Drop the ledger's entries of deletes older than `before` (µs); how many went."""
        cursor = txn.cursor(db=self.dbs["erased"])
        old = [
            bytes(k)
            for k, v in cursor.iternext(keys=True, values=True)
            if layout.read_u64(bytes(v)) < before
        ]
        for key in old:
            txn.delete(key, db=self.dbs["erased"])
        return len(old)

    def clear_tombstones(self, txn: lmdb.Transaction, event_ids: list[str]) -> None:
        """Forget tombstones once their bytes have left the disk."""
        for e in event_ids:
            txn.delete(layout.id_bytes(e), db=self.dbs["tombstones"])


def record_bytes(r: LogReader) -> int:
    """The bytes of every live event's record, counted by a scan (what LIVE_BYTES keeps)."""
    return sum(len(value) for value in r.record_values())


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
        max_dbs=len(DB_NAMES) + 2,
        max_readers=256,
        readahead=False,
        lock=lock,
    )
    try:
        with env.begin(buffers=False) as txn:
            dbs = {}
            for name in (*DB_NAMES, layout.LEGACY_EVENTS):
                try:
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=False)
                except lmdb.NotFoundError:
                    if name not in layout.LATER_DBS and name != layout.LEGACY_EVENTS:
                        raise
            reader = LogReader(txn, dbs)
            schema = reader.meta_int(layout.SCHEMA)
            if schema is not None and schema > SCHEMA_VERSION:
                # its records may be in an encoding this code would misread (a backup or a
                # copy made by a newer memspine): refused, as EventLog.open refuses it
                raise InvalidRequest(
                    f"a tenant's event log is in format {schema}, newer than this version of "
                    f"memspine reads ({SCHEMA_VERSION}); use a newer memspine"
                )
            yield reader
    finally:
        env.close()


def _open_dbs(env: lmdb.Environment) -> dict[str, Any]:
    """The log's databases (made if missing), and the legacy records' of a log not yet
    migrated to 7 if it has them."""
    # In one write transaction: open_db without one begins and commits a transaction of its
    # own, and a cold open asks for every database.
    with env.begin(write=True) as txn:
        dbs = {name: env.open_db(name.encode(), txn=txn) for name in DB_NAMES}
        legacy = layout.LEGACY_EVENTS.encode()
        if txn.get(legacy) is not None:  # a named database is a key of the main one
            dbs[layout.LEGACY_EVENTS] = env.open_db(legacy, txn=txn, create=False)
    return dbs


def _open_env(path: Path, map_size: int) -> lmdb.Environment:
    """The log's LMDB environment, every commit synced."""
    return lmdb.open(
        str(path),
        map_size=map_size,
        max_dbs=len(DB_NAMES) + 2,
        max_readers=256,
        sync=True,
        metasync=True,
        readahead=False,
    )


def _delete_prefix(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    """Delete every key that starts with prefix."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break
