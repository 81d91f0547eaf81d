"""Every change of the log's format, in one place: what brings a log made by an older version
to SCHEMA_VERSION, run by EventLog.open in the transaction that records the new version.

Each step takes a log of version n to n + 1 (rewrite_records, before the step to 6, rewrites
records in transactions of their own, and move_records, before the step to 7, moves them so)
and is tested (to_2 and to_4 in tests/storage/test_layout.py, to_3 in
tests/storage/test_server_vectors.py, to_6 in tests/storage/test_float32_records.py, to_7 in
tests/storage/test_seq_records.py); a log several versions behind runs them in order. The steps
before 7 find the records where their versions kept them: in the legacy database by raw id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lmdb

from storage.log import layout
from storage.log.reader import LogReader

Step = Callable[[lmdb.Transaction, LogReader, dict[str, Any]], None]


def _put_int(txn: lmdb.Transaction, dbs: dict[str, Any], name: str, value: int) -> None:
    """An integer meta value, inside the migration's transaction."""
    txn.put(layout.meta_key(name), layout.u64(value), db=dbs["meta"])


_LEGACY = layout.LEGACY_EVENTS  # where the records of a log older than 7 are, by raw id


def to_2(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 2 keeps the bytes of the live records in the meta: count them once."""
    cursor = txn.cursor(db=dbs[_LEGACY])
    live = sum(len(value) for value in cursor.iternext(keys=False, values=True))
    _put_int(txn, dbs, layout.LIVE_BYTES, live)


def to_3(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 3 records who makes the tenant's vectors: a log that holds any vector (or named a
    model) was made by clients, so it stays client-space; one without is nobody's yet. Its
    "unembedded" database starts empty (LMDB made it when the log was opened)."""
    if r.meta_str(layout.MODEL) is not None or _holds_a_vector(txn, dbs):
        _put_int(txn, dbs, layout.SPACE, layout.SPACE_CLIENT)


def _holds_a_vector(txn: lmdb.Transaction, dbs: dict[str, Any]) -> bool:
    """Whether any live record carries an embedding (one scan, once in the log's life)."""
    cursor = txn.cursor(db=dbs[_LEGACY])
    return any(
        layout.decode_event(value).embedding is not None
        for value in cursor.iternext(keys=False, values=True)
    )


def to_4(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 4 keeps each link's target kind in the link: every links_out value gets the
    kind of its target's record."""
    links, events = dbs["links_out"], dbs[_LEGACY]
    after = b""
    while True:  # a batch of links read, then rewritten, so no cursor walks what it changes
        cur = txn.cursor(db=links)
        if not cur.set_range(after):
            return
        batch = []
        for key, value in cur.iternext(keys=True, values=True):
            if key == after:
                continue
            batch.append((bytes(key), bytes(value)))
            if len(batch) == _BATCH:
                break
        if not batch:
            return
        for key, value in batch:
            raw = txn.get(value, db=events)
            # a link to no live event (a delete leaves none) keeps its bare id: no kind
            if raw is not None:
                txn.put(key, layout.link_out_value(value, layout.record_kind(raw)), db=links)
        after = batch[-1][0]


_BATCH = 10_000  # links read per round of to_4


def to_5(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 5 adds a record's `subjects`: a record written before has none (the field's
    default when it is read), so no byte changes."""


def to_6(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 6 stores embeddings as float32s and leaves default fields out of a record:
    every record of an older encoding is rewritten (a float64 becomes the nearest float32;
    rewrite_records did it already when the log was opened), and the live bytes counted again."""
    after: bytes | None = b""
    while after is not None:
        after = rewrite_batch(txn, dbs, after)
    cursor = txn.cursor(db=dbs[_LEGACY])
    live = sum(len(value) for value in cursor.iternext(keys=False, values=True))
    _put_int(txn, dbs, layout.LIVE_BYTES, live)


# Records a transaction of rewrite_records rewrites: its dirty pages stay few (a one-transaction
# rewrite of a large log held them all in memory), and the pages each batch frees are reused by
# the next, so the file grows by about one batch instead of by the whole log's new records.
REWRITE_BATCH = 2_000
REWRITTEN = 6  # the version whose records rewrite_records brings an older log's to


def rewrite_records(write: Callable[[Callable[[lmdb.Transaction], Any]], Any], dbs: Any) -> None:
    """Before the migration to 6 (EventLog.open, for a log older than 6): every record of an
    older encoding rewritten in the current one, a batch a transaction. Either encoding decodes,
    and a record rewritten again comes out the same: a process killed meanwhile leaves a log
    that reads as before, and its next open goes on from where it stopped."""
    after: bytes | None = b""
    while after is not None:
        after = write(functools.partial(rewrite_batch, dbs=dbs, after=after, limit=REWRITE_BATCH))


def rewrite_batch(
    txn: lmdb.Transaction, dbs: dict[str, Any], after: bytes, limit: int = _BATCH
) -> bytes | None:
    """Rewrite the next `limit` records past the key `after` (b"": from the first) that are not
    in the current encoding; the last key read, or None at the end."""
    events = dbs[_LEGACY]
    cur = txn.cursor(db=events)
    if not cur.set_range(after):
        return None
    batch = []  # read, then rewritten, so no cursor walks what it changes
    for key, value in cur.iternext(keys=True, values=True):
        if key != after:
            batch.append((bytes(key), bytes(value)))
        if len(batch) == limit:
            break
    for key, value in batch:
        encoded = layout.encode_event(layout.decode_event(value))
        if encoded != value:
            txn.put(key, encoded, db=events)
    return batch[-1][0] if batch else None


def to_7(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 7 keys records by their append seq ("records", found through "ids"): every
    record left in the legacy database is moved (move_records did most of them already, a batch
    a transaction), and the legacy database is deleted."""
    after = move_batch(txn, dbs, None, _BATCH)
    while after is not None:
        after = move_batch(txn, dbs, after, _BATCH)
    legacy = dbs[_LEGACY]
    # A record no append op names (none should be) is moved by the seq it holds.
    for key, value in list(txn.cursor(db=legacy).iternext(keys=True, values=True)):
        seq = layout.decode_light(value).seq
        txn.put(layout.record_key(seq), value, db=dbs["records"])
        txn.put(key, layout.record_key(seq), db=dbs["ids"])
    txn.drop(legacy, delete=True)


MOVED = 7  # the version whose layout move_records brings an older log's records to


def move_records(write: Callable[[Callable[[lmdb.Transaction], Any]], Any], dbs: Any) -> None:
    """Before the migration to 7 (EventLog.open, for a log of version 6): the records moved
    from the legacy database into "records" under their seqs, in append order, a batch a
    transaction. Readers look in both (storage/log/reader.py), so a process killed meanwhile
    leaves a log that reads as before, and its next open goes on from where it stopped."""
    after = write(functools.partial(move_batch, dbs=dbs, after=None, limit=REWRITE_BATCH))
    while after is not None:
        after = write(functools.partial(move_batch, dbs=dbs, after=after, limit=REWRITE_BATCH))


def move_batch(
    txn: lmdb.Transaction, dbs: dict[str, Any], after: bytes | None, limit: int
) -> bytes | None:
    """Move the records of the next `limit` append ops past the op key `after` (None: past the
    last record moved); the last op key read, or None at the end. A record's key is its append
    op's key and ops are read in order, so each put goes at the end of "records" (MDB_APPEND:
    its pages fill)."""
    records, ids, legacy = dbs["records"], dbs["ids"], dbs[_LEGACY]
    if after is None:
        last = txn.cursor(db=records)
        after = bytes(last.key()) if last.last() else b""
    ops = txn.cursor(db=dbs["ops"])
    if not ops.set_range(after):
        return None
    batch = []  # read, then moved, so no cursor walks what it changes
    read = 0
    for key, value in ops.iternext(keys=True, values=True):
        if key == after:
            continue
        read += 1
        after = bytes(key)
        op, raw_id = layout.read_op(bytes(value))
        if op == layout.OP_APPEND:
            batch.append((after, raw_id))
        if read == limit:
            break
    if not read:
        return None
    for key, raw_id in batch:
        raw = txn.get(raw_id, db=legacy)
        if raw is None:  # moved already, or no record (to_7 moves any left by their seq)
            continue
        if not txn.put(key, raw, db=records, append=True):
            txn.put(key, raw, db=records)
        txn.put(raw_id, key, db=ids)
        txn.delete(raw_id, db=legacy)
    return after


STEPS: dict[int, Step] = {
    2: to_2,
    3: to_3,
    4: to_4,
    5: to_5,
    6: to_6,
    7: to_7,
}  # the version each step makes -> the step


def migrate(
    txn: lmdb.Transaction, dbs: dict[str, Any], schema: int, to: int = layout.SCHEMA_VERSION
) -> None:
    """Bring a log of version `schema` to version `to` inside txn (the caller commits it)."""
    for version in range(schema + 1, to + 1):
        STEPS[version](txn, LogReader(txn, dbs), dbs)
    _put_int(txn, dbs, layout.SCHEMA, to)
