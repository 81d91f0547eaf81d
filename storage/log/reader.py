"""Read-only views over one read transaction of the event log."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, cast

import lmdb

from storage.log import layout
from storage.log.layout import IdempotencyRecord, Tombstone
from storage.model import FilterValue, StoredEvent

# by_prop keys read at a time while finding the shortest of several property lists
CHUNK = 256


class LogReader:
    """Lookups and scans over one consistent snapshot of the log."""

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, Any]) -> None:
        self.txn = txn
        self.dbs = dbs
        self._links_cursor: lmdb.Cursor | None = None
        self._get = cast("Callable[..., bytes | None]", txn.get)  # bytes: never buffers here
        # Records by seq, found through ids; a log of version 6 or older (a snapshot of one not
        # yet migrated, or one whose migration stopped halfway) keeps some or all of them in the
        # legacy database by raw id, looked in after ids.
        self._records = dbs.get("records")
        self._ids = dbs.get("ids")
        self._legacy = dbs.get(layout.LEGACY_EVENTS)

    def get(self, event_id: str) -> StoredEvent | None:
        """The live event with this id, or None (unknown, malformed or deleted)."""
        raw = self.record(event_id)
        return None if raw is None else layout.decode_event(raw)

    def get_light(self, event_id: str) -> StoredEvent | None:
        """As get, without the embedding (None): most of what decoding a record costs."""
        raw = self.record(event_id)
        return None if raw is None else layout.decode_light(raw)

    def get_light_raw(self, raw_id: bytes) -> StoredEvent | None:
        """As get_light, by the id's 16 bytes."""
        raw = self.raw_record(raw_id)
        return None if raw is None else layout.decode_light(raw)

    def record(self, event_id: str) -> bytes | None:
        """The stored record of the live event with this id, as it is on disk, or None."""
        try:
            raw_id = layout.id_bytes(event_id)
        except (ValueError, TypeError, AttributeError):
            return None
        return self.raw_record(raw_id)

    def exists(self, event_id: str) -> bool:
        """Whether a live event has this id (without decoding its record)."""
        try:
            raw_id = layout.id_bytes(event_id)
        except (ValueError, TypeError, AttributeError):
            return False
        return self.record_key(raw_id) is not None

    def _keys(self, db: str, prefix: bytes = b"", lo: bytes = b"") -> Iterator[bytes]:
        """Keys under prefix from prefix+lo upwards."""
        cur = self.txn.cursor(db=self.dbs[db])
        if not cur.set_range(prefix + lo):
            return
        for raw in cur.iternext(keys=True, values=False):
            key = _b(raw)
            if not key.startswith(prefix):
                return
            yield key

    def more_keys_than(self, n: int, db: str, prefix: bytes, below: bytes | None = None) -> bool:
        """Whether more than n keys of a database start with prefix (and sort below `below`),
        counted without decoding one."""
        cur = self.txn.cursor(db=self.dbs[db])
        if not cur.set_range(prefix):
            return False
        for i, raw in enumerate(cur.iternext(keys=True, values=False)):
            key = _b(raw)
            if not key.startswith(prefix) or (below is not None and key >= below):
                return False
            if i == n:  # this key is the n + 1st
                return True
        return False

    def ids_by_kind(self, kind: str, lo: int | None = None, hi: int | None = None) -> Iterator[str]:
        """Ids of one kind with lo <= ts < hi (None: unbounded), ascending by time."""
        return map(layout.id_str, self.raw_ids_by_kind(kind, lo, hi))

    def ids_by_property(self, name: str, value: FilterValue) -> Iterator[str]:
        """Ids whose filterable property name equals value (1 and 1.0 are equal)."""
        return map(layout.id_str, self.raw_ids_by_property(name, value))

    def ids_by_ts(self, lo: int | None, hi: int | None) -> Iterator[str]:
        """Ids with lo <= ts < hi, ascending by time."""
        return map(layout.id_str, self.raw_ids_by_ts(lo, hi))

    def record_values(self) -> Iterator[bytes]:
        """Every live event's record, in append order (one pass over the records; a log not
        yet migrated, its legacy records after, in id order)."""
        for db in (self._records, self._legacy):
            if db is not None:  # bytes: no transaction here hands out buffers
                yield from cast("Iterator[bytes]", self.txn.cursor(db=db).iternext(False, True))

    def live_light(self) -> Iterator[StoredEvent]:
        """Every live event without its embedding, in append order (one pass over the records)."""
        for value in self.record_values():
            yield layout.decode_light(value)

    def live_words(self, chunk: int) -> Iterator[list[tuple[str, str | None, bytes | None]]]:
        """Every live event's id, text and properties JSON, in append order, `chunk` at a time
        (layout.decode_words)."""
        values = self.record_values()
        while batch := list(islice(values, chunk)):
            yield layout.decode_words(batch)

    def all_ids(self) -> Iterator[str]:
        """Every live id, ascending by time."""
        return self.ids_by_ts(None, None)

    def links_out(self, event_id: str, rel: str) -> list[str]:
        """The events this one links to under rel, in link order."""
        return [layout.id_str(raw) for raw in self.raw_links_out(layout.id_bytes(event_id), rel)]

    def links_in(self, event_id: str, rel: str) -> list[str]:
        """The events that link to this one under rel, in append order."""
        return [layout.id_str(raw) for raw in self.raw_links_in(layout.id_bytes(event_id), rel)]

    # -- by raw id: the 16 bytes, for a reader that goes from key to key (Cypher) without the
    # -- text form of each id (converting one costs about as much as reading its record)

    def node(self, raw_id: bytes) -> Any:
        """The record of the live event with this raw id (layout.decode_record), or None."""
        raw = self.raw_record(raw_id)
        return None if raw is None else layout.decode_record(raw)

    def raw_record(self, raw_id: bytes) -> bytes | None:
        """The encoded record of the live event with this raw id, or None: a reader that may
        look at one field of it (decode_record, record_kind) decodes only what it needs."""
        get = self._get  # one a node: no cast() call
        if self._ids is not None:
            key = get(raw_id, db=self._ids)
            if key is not None:
                return get(key, db=self._records)
        return None if self._legacy is None else get(raw_id, db=self._legacy)

    def record_key(self, raw_id: bytes) -> bytes | None:
        """The records key (layout.record_key) of the live event with this raw id, or None;
        for a record still in the legacy database (a log not yet migrated), its raw id."""
        if self._ids is not None:
            key = self._get(raw_id, db=self._ids)
            if key is not None:
                return key
        if self._legacy is not None and self._get(raw_id, db=self._legacy) is not None:
            return raw_id
        return None

    def record_at(self, seq: int) -> bytes | None:
        """The encoded record of the live event appended as op seq, or None (a vector label is
        a seq: recall reads its candidates so, one lookup each)."""
        if self._records is not None:
            raw = self._get(layout.record_key(seq), db=self._records)
            if raw is not None:
                return raw
        # through its op: an id written again (its record is the later op's), or a record still
        # in the legacy database; for a deleted event, its op is gone too
        raw_id = self.raw_id_for_seq(seq)
        return None if raw_id is None else self.raw_record(raw_id)

    def light_at(self, seq: int) -> StoredEvent | None:
        """As record_at, the event without its embedding (layout.decode_light), or None."""
        raw = self.record_at(seq)
        return None if raw is None else layout.decode_light(raw)

    # layout.decode_record of a raw_record: the decoder itself, one C call per record
    decode_record = staticmethod(layout.decode_record)

    @staticmethod
    def record_kind(raw: bytes) -> str:
        """The kind of a raw_record, the rest left undecoded (layout.record_kind)."""
        return layout.record_kind(raw)

    def raw_ids_by_kind(
        self, kind: str, lo: int | None = None, hi: int | None = None
    ) -> Iterator[bytes]:
        """As ids_by_kind, raw ids."""
        prefix = layout.kind_prefix(kind)
        start = layout.ts_bytes(lo) if lo is not None else b""
        for key in self._keys("by_kind", prefix, start):
            if hi is not None and layout.read_ts(key[len(prefix) :]) >= hi:
                return
            yield key[-layout.ID_BYTES :]

    def times_by_kind(self, kind: str, lo: int | None, hi: int) -> Iterator[tuple[bytes, int]]:
        """(raw id, ts) of one kind's events with lo <= ts < hi, ascending by time (keys only)."""
        prefix = layout.kind_prefix(kind)
        start = layout.ts_bytes(lo) if lo is not None else b""
        for key in self._keys("by_kind", prefix, start):
            ts = layout.read_ts(key[len(prefix) :])
            if ts >= hi:
                return
            yield key[-layout.ID_BYTES :], ts

    def raw_ids_by_property(self, name: str, value: FilterValue) -> Iterator[bytes]:
        """As ids_by_property, raw ids (ascending by raw id)."""
        if not layout.is_filterable_value(value):
            return
        for key in self._keys("by_prop", layout.property_prefix(name, value)):
            yield key[-layout.ID_BYTES :]

    def raw_ids_by_properties(self, pairs: list[tuple[str, FilterValue]]) -> list[bytes]:
        """Raw ids of the events whose filterable properties equal every (name, value) pair,
        ascending by raw id. The list of the value with the fewest events is read whole and each
        of its ids looked up under the others: the lists are read side by side in CHUNK keys,
        and the first to end is the shortest, so a long list costs about as many keys as the
        shortest, not its own length."""
        if not pairs:
            return []
        if not all(layout.is_filterable_value(v) for _, v in pairs):
            return []
        prefixes = [layout.property_prefix(n, v) for n, v in pairs]
        if len(prefixes) == 1:
            return list(self.raw_ids_by_property(*pairs[0]))
        shortest, ids = self._shortest(prefixes)
        for i, prefix in enumerate(prefixes):
            if i != shortest and ids:
                # one cursor, the ids in ascending order: LMDB looks on the cursor's leaf page
                # first, where the next id's key usually is, so most probes skip the descent
                # (twice as fast as a get each: bench/RESULTS.md, "Cypher at 100,000 events")
                probe = self.txn.cursor(db=self.dbs["by_prop"]).set_key
                ids = [raw for raw in ids if probe(prefix + raw)]
        return ids

    def _shortest(self, prefixes: list[bytes]) -> tuple[int, list[bytes]]:
        """(position, raw ids) of the prefix with the fewest by_prop keys."""
        readers = [self._chunks(prefix) for prefix in prefixes]
        read: list[list[bytes]] = [[] for _ in prefixes]
        while True:
            for i, chunks in enumerate(readers):
                chunk, done = next(chunks)
                read[i].extend(chunk)
                if done:  # only the shortest list's keys are cut to their ids
                    return i, [key[-layout.ID_BYTES :] for key in read[i]]

    def _chunks(self, prefix: bytes) -> Iterator[tuple[list[bytes], bool]]:
        """by_prop keys under a prefix CHUNK at a time, and whether they were the last."""
        cur = self.txn.cursor(db=self.dbs["by_prop"])
        if not cur.set_range(prefix):
            yield [], True
            return
        keys = cur.iternext(keys=True, values=False)
        while True:
            # bytes already (no transaction here hands out buffers): no _b call per key
            chunk = cast(list[bytes], list(islice(keys, CHUNK)))
            if len(chunk) == CHUNK and chunk[-1].startswith(prefix):
                yield chunk, False
                continue
            yield [k for k in chunk if k.startswith(prefix)], True
            return

    def raw_ids_by_ts(self, lo: int | None, hi: int | None) -> Iterator[bytes]:
        """As ids_by_ts, raw ids."""
        start = layout.ts_bytes(lo) if lo is not None else b""
        for key in self._keys("by_ts", b"", start):
            if hi is not None and layout.read_ts(key) >= hi:
                return
            yield key[-layout.ID_BYTES :]

    def raw_links_out(self, raw_id: bytes, rel: str) -> list[bytes]:
        """As links_out, raw ids."""
        return [layout.link_target(value) for value in self.link_values(raw_id, rel)]

    def raw_links_out_of_kind(self, raw_id: bytes, rel: str, kind: str) -> list[bytes]:
        """As raw_links_out, only the targets of this kind: told by the link list (which holds
        each target's kind), no target's record read. The list walked here, not through
        link_values: an expansion reads one per source (bench/RESULTS.md, "Cypher at 100,000
        events")."""
        prefix, n = layout.link_prefix(raw_id, rel), layout.ID_BYTES
        cur = self._links_cursor or self._open_links_cursor()
        out: list[bytes] = []
        if not cur.set_range(prefix):
            return out
        tail, length = kind.encode(), len(prefix)
        # (key, value) pairs built in C, bytes (no transaction here hands out buffers)
        for key, value in cast("Iterator[tuple[bytes, bytes]]", cur.iternext()):
            if key[:length] != prefix:
                break
            if value[n:] == tail:
                out.append(value[:n])
            elif len(value) == n:  # no kind in it (a snapshot of a log of version 3): the record's
                raw = self.raw_record(value)
                if raw is not None and layout.record_kind(raw) == kind:
                    out.append(value)
        return out

    def _open_links_cursor(self) -> lmdb.Cursor:
        """The reader's one links_out cursor: opening one was much of a short list's cost
        (bench/RESULTS.md, "Cypher at 100,000 events")."""
        cur = self._links_cursor = self.txn.cursor(db=self.dbs["links_out"])
        return cur

    def link_values(self, raw_id: bytes, rel: str) -> list[bytes]:
        """The event's links_out values under rel (layout.link_out_value), in link order."""
        prefix = layout.link_prefix(raw_id, rel)
        cur = self._links_cursor or self._open_links_cursor()
        out: list[bytes] = []
        if cur.set_range(prefix):
            n = len(prefix)
            # (key, value) pairs built in C, bytes (no transaction here hands out buffers)
            for key, value in cast("Iterator[tuple[bytes, bytes]]", cur.iternext()):
                if key[:n] != prefix:
                    break
                out.append(value)
        return out

    def raw_links_in(self, raw_id: bytes, rel: str) -> list[bytes]:
        """As links_in, raw ids."""
        prefix = layout.link_prefix(raw_id, rel)
        return [key[-layout.ID_BYTES :] for key in self._keys("links_in", prefix)]

    def count(self) -> int:
        """Number of live events."""
        return self.event_count()

    def last_seq(self) -> int:
        """The highest operation number written (0 for an empty log)."""
        cur = self.txn.cursor(db=self.dbs["ops"])
        return layout.read_u64(_b(cur.key())) if cur.last() else 0

    def ops_after(self, seq: int) -> Iterator[tuple[int, bytes, str]]:
        """Operations (seq, b"A" or b"D", id) after seq, in order: what a projection replays."""
        cur = self.txn.cursor(db=self.dbs["ops"])
        if not cur.set_range(layout.op_key(seq + 1)):
            return
        for key, value in cur:
            op, raw_id = layout.read_op(_b(value))
            yield layout.read_u64(_b(key)), op, layout.id_str(raw_id)

    def id_for_seq(self, seq: int) -> str | None:
        """The live event appended as operation seq (vector labels are seqs)."""
        raw = self.raw_id_for_seq(seq)
        return None if raw is None else layout.id_str(raw)

    def raw_id_for_seq(self, seq: int) -> bytes | None:
        """As id_for_seq, the id's 16 bytes (what the events database is keyed by)."""
        value = self.txn.get(layout.op_key(seq), db=self.dbs["ops"])
        if value is None:
            return None
        op, raw_id = layout.read_op(_b(value))
        return raw_id if op == layout.OP_APPEND else None

    def space(self) -> int | None:
        """Who makes the tenant's vectors: layout.SPACE_SERVER, SPACE_CLIENT, or None (nobody yet)."""
        return self.meta_int(layout.SPACE)

    def unembedded_count(self) -> int:
        """How many events await their server vector."""
        db = self.dbs.get("unembedded")
        return 0 if db is None else int(self.txn.stat(db)["entries"])

    def erased(self) -> Iterator[tuple[str, int]]:
        """The erasure ledger: (id, microseconds of its delete) of every event deleted from
        this log and still kept there (docs/erasure.md, "The erasure ledger")."""
        db = self.dbs.get("erased")
        if db is None:  # a log of an older format, read as it is
            return
        for key, value in self.txn.cursor(db=db).iternext(keys=True, values=True):
            yield layout.id_str(bytes(key)), layout.read_u64(bytes(value))

    def erased_count(self) -> int:
        """How many ids the erasure ledger holds."""
        db = self.dbs.get("erased")
        return 0 if db is None else int(self.txn.stat(db)["entries"])

    def unembedded(self, limit: int) -> list[tuple[int, str]]:
        """Up to limit events awaiting their server vector, oldest first: (seq, id)."""
        db = self.dbs.get("unembedded")
        if db is None:
            return []
        out: list[tuple[int, str]] = []
        cur = self.txn.cursor(db=db)
        for raw in cur.iternext(keys=True, values=False):
            if len(out) >= limit:
                break
            seq, raw_id = layout.read_unembedded(_b(raw))
            out.append((seq, layout.id_str(raw_id)))
        return out

    def chain_before(self, seq: int, kind: str, scan: int) -> StoredEvent | None:
        """The latest live event of `kind` appended before op seq that has a vector, looking
        back at most `scan` ops (the chain of turns, docs/recall.md)."""
        cur = self.txn.cursor(db=self.dbs["ops"])
        if not cur.set_range(layout.op_key(seq)):
            if not cur.last():
                return None
        elif not cur.prev():
            return None
        for _ in range(scan):
            op, raw_id = layout.read_op(_b(cur.value()))
            if op == layout.OP_APPEND:
                light = self.get_light_raw(raw_id)
                if light is not None and light.kind == kind:
                    ev = self.get(light.event_id)
                    if ev is not None and ev.embedding is not None:
                        return ev
            if not cur.prev():
                return None
        return None

    def meta_int(self, name: str) -> int | None:
        """An integer meta value, or None."""
        raw = self.txn.get(layout.meta_key(name), db=self.dbs["meta"])
        return None if raw is None else layout.read_u64(_b(raw))

    def may_supersede(self) -> bool:
        """False when no event of this snapshot has ever superseded another (log meta flag)."""
        return self.meta_int(layout.SUPERSEDING) != 0  # absent (None): not known, so maybe

    def meta_str(self, name: str) -> str | None:
        """A string meta value, or None."""
        raw = self.txn.get(layout.meta_key(name), db=self.dbs["meta"])
        return None if raw is None else bytes(raw).decode()

    def pages(self) -> tuple[int, int]:
        """(pages in use by every database of the snapshot, the page size): what a logical
        copy of it holds, none of the freed pages."""
        psize = int(self.txn.stat(self.dbs["meta"])["psize"])
        pages = 0
        for db in self.dbs.values():
            st = self.txn.stat(db)
            pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages, psize

    def event_count(self) -> int:
        """How many live events the snapshot holds (LMDB counts each database's entries)."""
        return sum(
            int(self.txn.stat(db)["entries"]) for db in (self._ids, self._legacy) if db is not None
        )

    def tombstone_count(self) -> int:
        """How many deleted events await a purge."""
        return int(self.txn.stat(self.dbs["tombstones"])["entries"])

    def tombstone(self, event_id: str) -> Tombstone | None:
        """The tombstone of a deleted, not yet purged event."""
        raw = self.txn.get(layout.id_bytes(event_id), db=self.dbs["tombstones"])
        return None if raw is None else layout.decode_tombstone(raw)

    def tombstone_ids(self) -> list[str]:
        """Ids deleted and not yet purged."""
        return [layout.id_str(k) for k in self._keys("tombstones")]

    def idempotency(self, event_id: str) -> IdempotencyRecord | None:
        """The record an Idempotency-Key append left under this id (kept after a delete)."""
        raw = self.txn.get(layout.id_bytes(event_id), db=self.dbs["idem"])
        return None if raw is None else layout.decode_idempotency(raw)

    def idempotency_records(self) -> Iterator[tuple[str, IdempotencyRecord]]:
        """Every Idempotency-Key record, by id."""
        cur = self.txn.cursor(db=self.dbs["idem"])
        for key, value in cur.iternext(keys=True, values=True):
            yield layout.id_str(_b(key)), layout.decode_idempotency(_b(value))

    def newest_first(
        self, kind: str | None, since: int | None, before: bytes | None
    ) -> Iterator[StoredEvent]:
        """Events newest first, optionally of one kind, with ts >= since and (ts, id) key < before."""
        prefix = layout.kind_prefix(kind) if kind is not None else b""
        cur = self.txn.cursor(db=self.dbs["by_kind" if kind is not None else "by_ts"])
        upper = prefix + before if before is not None else _after_prefix(prefix)
        positioned = cur.set_range(upper) if upper else False
        ok = cur.prev() if positioned else cur.last()
        while ok:
            key = _b(cur.key())
            if not key.startswith(prefix):
                return
            ts = layout.read_ts(key[len(prefix) :])
            if since is not None and ts < since:
                return
            ev = self.get(layout.key_id(key))
            if ev is not None:
                yield ev
            ok = cur.prev()


def _b(value: bytes | memoryview) -> bytes:
    """LMDB values as bytes (transactions here never hand out buffers; this satisfies the types)."""
    return value if isinstance(value, bytes) else bytes(value)


def _after_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with prefix (b"" for no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b""
    p[-1] += 1
    return bytes(p)
