"""A log as version 5 wrote it, made from one this code wrote: for the tests of the migration to
version 6 (storage/log/migrations.py, to_6) and of reading older records."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import msgspec

from storage.log import layout
from storage.model import StoredEvent


def encode_v5(ev: StoredEvent) -> bytes:
    """The record version 5 wrote for ev: every field, the embedding a bin of little-endian
    float64s."""
    fields = msgspec.structs.asdict(ev)
    if ev.embedding is not None:
        fields["embedding"] = struct.pack(f"<{len(ev.embedding)}d", *ev.embedding)
    return msgspec.msgpack.encode(fields)


def make_v5(path: Path, events: list[StoredEvent]) -> None:
    """Turn the (closed) log at path into one of version 5 holding these events' records (each
    already in it, by id), the live bytes counted as version 5 kept them."""
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 1, map_size=1 << 30)
    with env.begin(write=True) as txn:
        meta, records = env.open_db(b"meta", txn=txn), env.open_db(b"events", txn=txn)
        for ev in events:
            raw_id = layout.id_bytes(ev.event_id)
            assert txn.get(raw_id, db=records) is not None, ev.event_id
            txn.put(raw_id, encode_v5(ev), db=records)
        live = sum(len(v) for v in txn.cursor(db=records).iternext(keys=False, values=True))
        txn.put(layout.meta_key(layout.LIVE_BYTES), layout.u64(live), db=meta)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(5), db=meta)
    env.close()


def records(path: Path) -> dict[bytes, bytes]:
    """Every record of the (closed) log at path as its bytes, by raw id."""
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 1, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            db = env.open_db(b"events", txn=txn, create=False)
            return {bytes(k): bytes(v) for k, v in txn.cursor(db=db).iternext()}
    finally:
        env.close()


def schema(path: Path) -> int | None:
    """The version the (closed) log at path records."""
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 1, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(layout.meta_key(layout.SCHEMA), db=env.open_db(b"meta", txn=txn))
            return None if raw is None else layout.read_u64(raw)
    finally:
        env.close()
