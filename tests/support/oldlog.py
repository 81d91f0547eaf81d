"""A log as version 6 or 5 wrote it, made from one this code wrote: for the tests of the
migrations to versions 6 and 7 (storage/log/migrations.py, to_6 and to_7) and of reading older
records and layouts."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import msgspec

from storage.log import layout
from storage.model import StoredEvent
from tests.support.servers import REPO
from tests.support.wait import PATIENCE_SECS


def encode_v5(ev: StoredEvent) -> bytes:
    """The record version 5 wrote for ev: every field, the embedding a bin of little-endian
    float64s."""
    fields = msgspec.structs.asdict(ev)
    if ev.embedding is not None:
        fields["embedding"] = struct.pack(f"<{len(ev.embedding)}d", *ev.embedding)
    return msgspec.msgpack.encode(fields)


MAX_DBS = len(layout.DB_NAMES) + 2


def make_v6(path: Path, schema: int = 6) -> None:
    """Turn the (closed) log at path into one of version 6's layout: each record in the legacy
    database under its raw id, no "records" or "ids" (and the version `schema` recorded)."""
    env = lmdb.open(str(path), max_dbs=MAX_DBS, map_size=1 << 30)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        legacy = env.open_db(layout.LEGACY_EVENTS.encode(), txn=txn)
        records, ids = env.open_db(b"records", txn=txn), env.open_db(b"ids", txn=txn)
        for raw_id, key in txn.cursor(db=ids).iternext():
            txn.put(raw_id, txn.get(key, db=records), db=legacy)
        txn.drop(records, delete=True)
        txn.drop(ids, delete=True)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(schema), db=meta)
    env.close()


def make_v5(path: Path, events: list[StoredEvent]) -> None:
    """Turn the (closed) log at path into one of version 5 holding these events' records (each
    already in it, by id), the live bytes counted as version 5 kept them."""
    make_v6(path)
    env = lmdb.open(str(path), max_dbs=MAX_DBS, map_size=1 << 30)
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
    """Every record of the (closed) log at path as its bytes, by raw id (wherever its layout
    keeps them)."""
    env = lmdb.open(str(path), max_dbs=MAX_DBS, readonly=True, lock=False)
    out: dict[bytes, bytes] = {}
    try:
        with env.begin() as txn:
            try:
                db = env.open_db(layout.LEGACY_EVENTS.encode(), txn=txn, create=False)
                out.update((bytes(k), bytes(v)) for k, v in txn.cursor(db=db).iternext())
            except lmdb.NotFoundError:
                pass
            try:
                ids = env.open_db(b"ids", txn=txn, create=False)
                records = env.open_db(b"records", txn=txn, create=False)
            except lmdb.NotFoundError:
                return out
            for raw_id, key in txn.cursor(db=ids).iternext():
                out[bytes(raw_id)] = bytes(txn.get(key, db=records))
            return out
    finally:
        env.close()


def schema(path: Path) -> int | None:
    """The version the (closed) log at path records."""
    env = lmdb.open(str(path), max_dbs=MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(layout.meta_key(layout.SCHEMA), db=env.open_db(b"meta", txn=txn))
            return None if raw is None else layout.read_u64(raw)
    finally:
        env.close()


def kill_at_halfway(script: str, path: Path) -> None:
    """Run a migration script (python -c) on the log at path and kill -9 it once it prints
    "halfway" (the script sleeps there): the migration stopped between two batches."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"halfway\n"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=PATIENCE_SECS) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
