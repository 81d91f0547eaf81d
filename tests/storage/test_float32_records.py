"""Log format 6 (storage/log/layout.py): embeddings as float32s, so a record of 384 floats fits
inline in its LMDB page; a log of version 5 read as it is and migrated on open, also when the
migration was killed halfway; every float32 rendered as its shortest decimal (storage/floats.py)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import lmdb
import msgspec
import numpy as np
import pytest

from storage import files
from storage.errors import InvalidRequest
from storage.floats import shortest
from storage.log import layout
from storage.log.eventlog import EventLog, record_bytes, snapshot
from storage.model import FLOAT32_MAX, AppendResult, NewEvent, StoredEvent
from storage.tenants.tenant import Tenant
from storage.transfer import backup as bk
from tests.support.oldlog import kill_at_halfway, make_v5, records, schema

T0 = 1_800_000_000_000_000
WORDS = ["order", "parcel", "carrier", "signed", "delivered", "refund", "street", "case"]


def as_f4(values: list[float]) -> list[float]:
    """Each value as the float32 nearest it."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def printed(values: np.ndarray) -> list[float]:
    """Each float32 as numpy prints it, read back as a double."""
    return [float(str(v)) for v in values.astype(np.float32)]


# -- the shortest decimal ----------------------------------------------------------------------


def test_the_seed_vectors_print_as_they_were_sent() -> None:
    for sent in ([0.1, 0.2, 0.3, 0.4], [0.8, 0.2, 0.1, 0.0], [0.0, 0.1, 1.0, 0.0], [-0.0, 7e-8]):
        assert shortest(as_f4(sent)) == sent
        assert [v.hex() for v in shortest(as_f4(sent))] == [v.hex() for v in sent]  # -0.0 too


@pytest.mark.parametrize("seed", range(4))
def test_every_float32_prints_as_numpy_prints_it(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    edges = np.array([FLOAT32_MAX, -FLOAT32_MAX, 2.0**-149, 1.17549435e-38, 1e-45, 0.0, 1.0])
    for batch in (values, edges.astype(np.float32), values * np.float32(1e-30)):
        got = shortest(batch.astype(np.float64).tolist())
        assert got == printed(batch)
        assert (np.asarray(got, dtype=np.float32) == batch).all()  # the same float32s


def test_a_double_comes_back_as_its_float32s_shortest_decimal() -> None:
    sent = [0.123456789012, 1 / 3, 123456.789, -2.5e-7, 1e-300]
    assert shortest(sent) == [0.12345679, 0.33333334, 123456.79, -2.5e-7, 0.0]


# -- records inline ----------------------------------------------------------------------------


def bench_events(n: int, dim: int, seed: int = 3) -> list[NewEvent]:
    """Events of bench/disk.py's shape: 18 words of text, a random vector of dim floats."""
    rng, words = np.random.default_rng(seed), random.Random(seed)
    return [
        NewEvent(
            kind="turn",
            ts=T0 + i,
            text=" ".join(words.choice(WORDS) for _ in range(18)),
            embedding=rng.standard_normal(dim).tolist(),
        )
        for i in range(n)
    ]


def overflow_pages(path: Path) -> int:
    """The overflow pages of the (closed) log's records (in either layout)."""
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2, readonly=True, lock=False)
    pages = 0
    try:
        with env.begin() as txn:
            for name in (b"records", layout.LEGACY_EVENTS.encode()):
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.NotFoundError:
                    continue
                pages += int(txn.stat(db)["overflow_pages"])
            return pages
    finally:
        env.close()


def test_a_record_of_384_floats_fits_inline_and_one_of_version_5_did_not(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=384)
    sent = bench_events(300, 384)
    ids = [r.event_id for r in log.append_batch(sent) if isinstance(r, AppendResult)]
    with log.reader() as r:
        events = [r.get(e) for e in ids]
    log.close()
    assert len(ids) == 300 and overflow_pages(path) == 0
    make_v5(path, [ev for ev in events if ev is not None])
    assert overflow_pages(path) == 300  # a page of its own each: what version 6 saves
    EventLog.open(path, embedding_dim=384).close()
    assert overflow_pages(path) == 0


# -- a log of version 5 ------------------------------------------------------------------------


def written(tmp_path: Path, dim: int, n: int) -> tuple[Path, list[StoredEvent]]:
    """A closed log of n events of several shapes, turned into one of version 5 whose records
    hold the doubles sent (not their float32s); those events, as version 5 holds them."""
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=dim)
    sent = bench_events(n, dim)
    first = [r.event_id for r in log.append_batch(sent) if isinstance(r, AppendResult)]
    [linked] = log.append_batch(
        [
            NewEvent(
                kind="fact",
                ts=T0 + n,
                text="parcel is with the neighbour",
                embedding=[0.1] * dim,
                embedding_model="m1",
                properties_raw=b'{"site": "north", "n": 2}',
                source_ids=(first[0],),
                supersedes=(first[1],),
                valid_from=T0,
                subjects=("cust-1",),
            )
        ]
    )
    log.append_batch([NewEvent(kind="turn", ts=T0 + n + 1, text="no vector")])
    log.delete([first[2]])
    with log.reader() as r:
        stored = {e: r.get(e) for e in r.all_ids()}
    log.close()
    doubles = {e: ev.embedding for e, ev in zip(first, sent, strict=True)}
    v5 = [
        msgspec.structs.replace(ev, embedding=doubles.get(e, ev.embedding))
        for e, ev in stored.items()
        if ev is not None
    ]
    assert isinstance(linked, AppendResult) and len(v5) == n + 1
    make_v5(path, v5)
    return path, v5


def test_a_log_of_version_5_is_read_as_it_is_and_migrated_on_open(tmp_path: Path) -> None:
    path, v5 = written(tmp_path, 8, 40)
    before = records(path)
    with snapshot(path) as r:  # not migrated: the doubles as version 5 stored them
        for ev in v5:
            got = r.get(ev.event_id)
            assert got == ev
            assert got is not None and got.embedding == ev.embedding
    assert records(path) == before and schema(path) == 5
    log = EventLog.open(path, embedding_dim=8)
    with log.reader() as r:
        assert r.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
        for ev in v5:
            want = (
                ev
                if ev.embedding is None
                else msgspec.structs.replace(ev, embedding=as_f4(ev.embedding))
            )
            assert r.get(ev.event_id) == want
            raw = msgspec.msgpack.decode(r.record(ev.event_id) or b"")
            assert isinstance(raw.get("embedding"), msgspec.msgpack.Ext | None)
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r) < sum(map(len, before.values()))
    # it goes on as a log of this version: an append counts its bytes from the new total
    log.append_batch([NewEvent(kind="turn", ts=T0 + 99, text="after", embedding=[0.5] * 8)])
    with log.reader() as r:
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    EventLog.open(path, embedding_dim=8).close()  # a second open changes nothing
    assert schema(path) == layout.SCHEMA_VERSION


# The child opens a log of version 5 and stops for good halfway through its migration (the
# 600th record rewritten, two transactions of 250 committed), saying so; the test kills it there.
KILLED = """
import sys, time
from pathlib import Path
from storage.log import layout, migrations
from storage.log.eventlog import EventLog

migrations.REWRITE_BATCH = 250
encode, done = layout.encode_event, [0]
def slow(ev):
    done[0] += 1
    if done[0] == 600:
        print("halfway", flush=True)
        time.sleep(600)
    return encode(ev)
layout.encode_event = slow
EventLog.open(Path(sys.argv[1]), embedding_dim=384)
print("finished", flush=True)
"""


def test_a_migration_killed_halfway_reads_as_before_and_goes_on(tmp_path: Path) -> None:
    path, v5 = written(tmp_path, 384, 1200)
    before = records(path)
    kill_at_halfway(KILLED, path)
    # Two batches committed, the third not: every record reads as before, to float32 precision.
    after = records(path)
    rewritten = {k for k, v in after.items() if v != before[k]}
    assert schema(path) == 5 and len(rewritten) == 500 and after.keys() == before.keys()
    with snapshot(path) as r:
        for ev in v5:
            got = r.get(ev.event_id)
            if layout.id_bytes(ev.event_id) in rewritten and ev.embedding is not None:
                assert got == msgspec.structs.replace(ev, embedding=as_f4(ev.embedding))
            else:
                assert got == ev
    log = EventLog.open(path, embedding_dim=384)
    with log.reader() as r:
        assert r.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
        for ev in v5:
            got = r.get(ev.event_id)
            assert got is not None
            assert got.embedding == (None if ev.embedding is None else as_f4(ev.embedding))
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    assert overflow_pages(path) == 0


def set_schema(path: Path, version: int) -> None:
    """Record another format version in the (closed) log at path, as a newer memspine would."""
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(version), db=meta)
    env.close()


def test_a_log_or_a_backup_of_a_newer_format_is_refused_not_misread(tmp_path: Path) -> None:
    data = tmp_path / "data"
    t = Tenant.open("acme", data / "acme", embedding_dim=4)
    t.submit_append([NewEvent(kind="turn", ts=T0, text="hi", embedding=[0.1] * 4)]).result()
    t.close()
    log = data / "acme" / files.LOG
    with snapshot(log) as r:  # this version's log: read
        assert r.count() == 1
    bk.backup(data, tmp_path / "bk")
    set_schema(tmp_path / "bk" / "tenants" / "acme" / files.LOG, layout.SCHEMA_VERSION + 1)
    with pytest.raises(InvalidRequest, match="newer than this version of memspine reads"):
        bk.restore(tmp_path / "bk", tmp_path / "new", default_dim=4)
    assert not (tmp_path / "new").exists()
    set_schema(log, layout.SCHEMA_VERSION + 1)
    with (
        pytest.raises(InvalidRequest, match=f"in format {layout.SCHEMA_VERSION + 1}"),
        snapshot(log),
    ):
        pass
