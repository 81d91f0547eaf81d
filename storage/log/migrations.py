"""Every change of the log's format, in one place: what brings a log made by an older version
to SCHEMA_VERSION, run by EventLog.open in the transaction that records the new version.

Each step takes a log of version n to n + 1 and is tested (to_2 and to_4 in
tests/storage/test_layout.py, to_3 in tests/storage/test_server_vectors.py, to_6 in
tests/storage/test_float32_records.py); a log several versions behind runs them in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb

from storage.log import layout
from storage.log.reader import LogReader

Step = Callable[[lmdb.Transaction, LogReader, dict[str, Any]], None]


def _put_int(txn: lmdb.Transaction, dbs: dict[str, Any], name: str, value: int) -> None:
    """An integer meta value, inside the migration's transaction."""
    txn.put(layout.meta_key(name), layout.u64(value), db=dbs["meta"])


def to_2(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 2 keeps the bytes of the live records in the meta: count them once."""
    cursor = txn.cursor(db=dbs["events"])
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
    cursor = txn.cursor(db=dbs["events"])
    return any(
        layout.decode_event(value).embedding is not None
        for value in cursor.iternext(keys=False, values=True)
    )


def to_4(txn: lmdb.Transaction, r: LogReader, dbs: dict[str, Any]) -> None:
    """Version 4 keeps each link's target kind in the link: every links_out value gets the
    kind of its target's record."""
    links, events = dbs["links_out"], dbs["events"]
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
    every record is rewritten (a float64 becomes the nearest float32), and the live bytes
    counted again. All in the one transaction of the open: a process killed meanwhile leaves
    the log of version 5 as it was, and its next open runs this again from the start."""
    events = dbs["events"]
    live = 0
    after = b""
    while True:  # a batch of records read, then rewritten, so no cursor walks what it changes
        cur = txn.cursor(db=events)
        if not cur.set_range(after):
            break
        batch = []
        for key, value in cur.iternext(keys=True, values=True):
            if key != after:
                batch.append((bytes(key), bytes(value)))
            if len(batch) == _BATCH:
                break
        if not batch:
            break
        for key, value in batch:
            encoded = layout.encode_event(layout.decode_event(value))
            txn.put(key, encoded, db=events)
            live += len(encoded)
        after = batch[-1][0]
    _put_int(txn, dbs, layout.LIVE_BYTES, live)


STEPS: dict[int, Step] = {
    2: to_2,
    3: to_3,
    4: to_4,
    5: to_5,
    6: to_6,
}  # the version each step makes -> the step


def migrate(txn: lmdb.Transaction, dbs: dict[str, Any], schema: int) -> None:
    """Bring a log of version `schema` to SCHEMA_VERSION inside txn (the caller commits it)."""
    for version in range(schema + 1, layout.SCHEMA_VERSION + 1):
        STEPS[version](txn, LogReader(txn, dbs), dbs)
    _put_int(txn, dbs, layout.SCHEMA, layout.SCHEMA_VERSION)
