"""The LMDB side of a purge: a logical copy of the log into a fresh environment, then the writes
made to the live log since that copy.

Why not `env.copy(compact=True)`: a compacting copy keeps each page's used bytes, and branch
pages keep a deleted key as a separator (a property value of a deleted event, say). Putting
every live pair into an empty environment in key order writes new pages holding live data only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lmdb

from storage import failpoints
from storage.log import layout
from storage.log.layout import DB_NAMES
from storage.log.reader import LogReader
from storage.model import StoredEvent

COPY_TXN_ENTRIES = 20_000

# Databases whose keys sync_delta knows how to attribute to one event; any other database a
# future schema adds is copied whole, which is always right and only slower.
PER_EVENT = frozenset(
    (
        "records",
        "ids",
        "ops",
        "by_ts",
        "by_kind",
        "by_prop",
        "links_out",
        "links_in",
        "idem",
        "tombstones",
        "erased",
    )
)


def rewrite(
    source: LogReader,
    dest: Path,
    map_size: int,
    taps: Mapping[str, Callable[[bytes], None]] | None = None,
) -> None:
    """Copy every database of the snapshot into a new environment at dest (durable on return);
    taps[name] sees each value copied from that database (to build an index on the way)."""
    dest.mkdir(parents=True)
    env = lmdb.open(
        str(dest),
        map_size=map_size,
        max_dbs=len(DB_NAMES) + 2,
        sync=False,  # one sync at the end instead of one per transaction
        metasync=False,
        readahead=False,
    )
    try:
        for name in DB_NAMES:
            target = env.open_db(name.encode())
            if name not in source.dbs:  # a later database an older log lacks: made empty
                continue
            items = source.txn.cursor(db=source.dbs[name]).iternext(keys=True, values=True)
            tap = (taps or {}).get(name)
            _append_all(env, target, items if tap is None else _tapped(items, tap))
        failpoints.hit("purge.copy")
        env.sync(True)
    finally:
        env.close()


def _tapped(
    items: Iterator[tuple[Any, Any]], tap: Callable[[bytes], None]
) -> Iterator[tuple[Any, Any]]:
    """The same pairs, each value shown to tap on the way."""
    for key, value in items:
        tap(value)
        yield key, value


def _append_all(env: lmdb.Environment, db: Any, items: Iterator[tuple[Any, Any]]) -> None:
    """Put sorted pairs at the end of db, in transactions of bounded size."""
    while True:
        n = 0
        with env.begin(write=True, db=db) as txn:
            cursor = txn.cursor(db=db)
            for key, value in items:
                cursor.put(key, value, append=True)
                n += 1
                if n == COPY_TXN_ENTRIES:
                    break
        if n < COPY_TXN_ENTRIES:
            return


def sync_delta(live: LogReader, copy: LogReader, since: int) -> set[str]:
    """Make a copy taken at op `since` equal to the live log, in the copy's write transaction;
    returns the ids the ops since touched.

    Every key a write changes belongs to an event the write names in `ops` or to one linked to
    it (a link adds a key under its target; a delete rewrites its sources' links), so syncing
    those events' keys, the new ops and the small meta database brings the copy up to date.
    """
    txn, dbs = copy.txn, copy.dbs
    changed = {event_id for _seq, _op, event_id in live.ops_after(since)}
    touched = set(changed)
    for event_id in changed:
        for view in (live, copy):
            for rel in layout.REL_CODES:
                touched.update(view.links_out(event_id, rel))
                touched.update(view.links_in(event_id, rel))
    for event_id in sorted(touched):
        _sync_event(live, txn, dbs, event_id)
    ops = live.txn.cursor(db=live.dbs["ops"])
    if ops.set_range(layout.op_key(since + 1)):
        for key, value in ops.iternext():
            txn.put(key, value, db=dbs["ops"])
    for name in DB_NAMES:
        if name not in PER_EVENT:
            _replace_db(live, txn, dbs, name)
    return changed


def _sync_event(live: LogReader, txn: lmdb.Transaction, dbs: dict[str, Any], event_id: str) -> None:
    """Replace every key owned by one event in the copy with the live log's keys."""
    raw_id = layout.id_bytes(event_id)
    before = LogReader(txn, dbs).raw_record(raw_id)
    if before is not None:
        for name, key in _owned_keys(layout.decode_light(before), raw_id):
            txn.delete(key, db=dbs[name])
    now = live.raw_record(raw_id)
    if now is not None:
        for name, key in _owned_keys(layout.decode_light(now), raw_id):
            value = live.txn.get(key, db=live.dbs[name])
            if value is not None:
                txn.put(key, value, db=dbs[name])
    for name in ("links_out", "links_in"):
        _replace_prefix(live, txn, dbs, name, raw_id)
    for name in ("idem", "tombstones", "erased"):
        value = live.txn.get(raw_id, db=live.dbs[name])
        if value is None:
            txn.delete(raw_id, db=dbs[name])
        else:
            txn.put(raw_id, value, db=dbs[name])


def _owned_keys(ev: StoredEvent, raw_id: bytes) -> list[tuple[str, bytes]]:
    """The keys an append writes for an event beside its links: its record and where it is,
    its op and its index keys."""
    seq = layout.record_key(ev.seq)
    owned = [("records", seq), ("ids", raw_id), ("ops", layout.op_key(ev.seq))]
    return [*owned, *layout.index_keys(ev, raw_id)]


def _replace_prefix(
    live: LogReader, txn: lmdb.Transaction, dbs: dict[str, Any], name: str, prefix: bytes
) -> None:
    """Make the copy's keys under prefix in one database equal the live log's."""
    cursor = txn.cursor(db=dbs[name])
    if cursor.set_range(prefix):
        while bytes(cursor.key()).startswith(prefix):
            if not cursor.delete():
                break
    source = live.txn.cursor(db=live.dbs[name])
    if source.set_range(prefix):
        for key, value in source.iternext():
            if not bytes(key).startswith(prefix):
                break
            txn.put(key, value, db=dbs[name])


def _replace_db(live: LogReader, txn: lmdb.Transaction, dbs: dict[str, Any], name: str) -> None:
    """Make one whole database of the copy equal the live log's."""
    txn.drop(dbs[name], delete=False)
    for key, value in live.txn.cursor(db=live.dbs[name]).iternext():
        txn.put(key, value, db=dbs[name])
