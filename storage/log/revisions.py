"""Records changed after their append, all in one place: a server vector written into a record,
a vector taken out again (a deleted turn it carried), every vector replaced (a re-embedding).

Each change inside a live event's record is numbered as an OP_EMBED op, so the projections
replay it (storage/tenants/projection.py); a re-embedding rebuilds the vector index instead.
"""

from __future__ import annotations

from typing import Any

import lmdb
import msgspec
import numpy as np

from storage.errors import InvalidRequest
from storage.log import layout
from storage.log.layout import LIVE_BYTES
from storage.log.reader import LogReader
from storage.model import CHAIN_GAP_US, CHAIN_KIND, StoredEvent, StoredVector

Dbs = dict[str, Any]
WRITTEN_MEANWHILE = "the tenant was written while it was re-embedded; run it again"


def store_vectors(
    txn: lmdb.Transaction, dbs: Dbs, vectors: list[StoredVector], model: str
) -> list[StoredVector]:
    """Write server vectors into their events' records (each still live, still awaiting
    one, of the server-space tenant whose model is `model`), one OP_EMBED op each; the
    vectors written."""
    r = LogReader(txn, dbs)
    if r.meta_int(layout.SPACE) != layout.SPACE_SERVER or r.meta_str(layout.MODEL) != model:
        return []
    written: list[StoredVector] = []
    grown = 0
    for item in vectors:
        raw_id = layout.id_bytes(item.event_id)
        key = layout.unembedded_key(item.seq, raw_id)
        if txn.get(key, db=dbs["unembedded"]) is None:
            continue  # deleted, or given its vector by another path meanwhile
        raw = r.raw_record(raw_id)
        txn.delete(key, db=dbs["unembedded"])
        if raw is None:
            continue
        ev = layout.decode_event(raw)
        if ev.seq != item.seq or ev.embedding is not None:
            continue
        record = msgspec.structs.replace(ev, embedding=item.vector, embedding_model=model)
        grown += _rewrite(txn, dbs, raw_id, record) - len(raw)
        written.append(item)
    if grown:
        _put_meta_int(txn, dbs, LIVE_BYTES, (r.meta_int(LIVE_BYTES) or 0) + grown)
    return written


def clear_vector(txn: lmdb.Transaction, dbs: Dbs, ev: StoredEvent) -> None:
    """Take a server vector out of a live event's record and list the event for the
    embedder again (its vector carried a deleted turn's, docs/recall.md)."""
    raw_id = layout.id_bytes(ev.event_id)
    raw = LogReader(txn, dbs).raw_record(raw_id)
    if raw is None:
        return
    record = msgspec.structs.replace(ev, embedding=None, embedding_model=None)
    shrunk = len(raw) - _rewrite(txn, dbs, raw_id, record)
    txn.put(layout.unembedded_key(ev.seq, raw_id), b"", db=dbs["unembedded"])
    live = LogReader(txn, dbs).meta_int(LIVE_BYTES) or 0
    _put_meta_int(txn, dbs, LIVE_BYTES, max(0, live - shrunk))


def unchain(txn: lmdb.Transaction, dbs: Dbs, deleted: StoredEvent) -> None:
    """A deleted turn of a server-space tenant: the later turns of its chain (up to the
    first CHAIN_GAP_US break) lose their vectors, each of which carried a share of its
    vector, and are embedded again without it (docs/recall.md, "Deletes, purges")."""
    r = LogReader(txn, dbs)
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
            clear_vector(txn, dbs, ev)


def replace_vectors(
    txn: lmdb.Transaction,
    dbs: Dbs,
    given: dict[str, np.ndarray],
    model: str,
    dim: int,
    last: int,
) -> None:
    """A re-embedding's switch (storage/tenants/reembed.py): every record gets its vector from
    `given` (none for an event not in it), the tenant becomes server-space with this model and
    dimension, and the saved graph is declared to cover op `last`. InvalidRequest if the log
    was written past `last` meanwhile. No op is numbered: the graph is rebuilt, not replayed."""
    r = LogReader(txn, dbs)
    if r.last_seq() != last:
        raise InvalidRequest(WRITTEN_MEANWHILE)
    live = r.meta_int(LIVE_BYTES) or 0
    for key, raw in list(txn.cursor(db=dbs["records"]).iternext(keys=True, values=True)):
        whole = layout.decode_event(raw)
        vector = given.get(whole.event_id)
        if vector is None and whole.embedding is None:
            continue
        # An event without text keeps no vector of the old model: the space is one model's.
        record = msgspec.structs.replace(
            whole,
            embedding=None if vector is None else vector.astype(float).tolist(),
            embedding_model=None if vector is None else model,
        )
        encoded = layout.encode_event(record)
        txn.put(key, encoded, db=dbs["records"])
        live += len(encoded) - len(raw)
    txn.drop(dbs["unembedded"], delete=False)
    _put_meta_int(txn, dbs, LIVE_BYTES, live)
    _put_meta_int(txn, dbs, layout.SPACE, layout.SPACE_SERVER)
    _put_meta_int(txn, dbs, layout.DIM, dim)
    _put_meta_int(txn, dbs, layout.VECTOR_SEQ, last)
    txn.put(layout.meta_key(layout.MODEL), model.encode(), db=dbs["meta"])


def _rewrite(txn: lmdb.Transaction, dbs: Dbs, raw_id: bytes, record: StoredEvent) -> int:
    """Put a live event's changed record in place, numbered as the next OP_EMBED; its size."""
    encoded = layout.encode_event(record)
    txn.put(layout.record_key(record.seq), encoded, db=dbs["records"])
    seq = LogReader(txn, dbs).last_seq() + 1
    txn.put(layout.op_key(seq), layout.op_value(layout.OP_EMBED, raw_id), db=dbs["ops"])
    return len(encoded)


def _put_meta_int(txn: lmdb.Transaction, dbs: Dbs, name: str, value: int) -> None:
    """Store an integer meta value inside a write transaction (as EventLog.put_meta_int)."""
    txn.put(layout.meta_key(name), layout.u64(value), db=dbs["meta"])
