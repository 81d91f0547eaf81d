"""Log format 7 (storage/log/layout.py): records keyed by their append seq, put at the end of
their database so its pages fill, found by id through "ids"; a log of version 6 read as it is and
moved on open, also when the move was killed halfway."""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import numpy as np

from storage.log import layout
from storage.log.eventlog import EventLog, record_bytes, snapshot
from storage.model import SOURCE_FROM, SUPERSEDES, AppendResult, NewEvent, StoredEvent
from tests.support.oldlog import MAX_DBS, kill_at_halfway, make_v6, records, schema

T0 = 1_800_000_000_000_000
WORDS = ["order", "parcel", "carrier", "signed", "delivered", "refund", "street", "case"]


def turns(n: int, dim: int, seed: int = 7) -> list[NewEvent]:
    """Events of bench/disk.py's shape: 18 words of text, a random vector of dim floats."""
    rng, words = np.random.default_rng(seed), random.Random(seed)
    return [
        NewEvent(
            kind="turn",
            ts=T0 + i,
            text=" ".join(words.choice(WORDS) for _ in range(18)),
            embedding=rng.standard_normal(dim).astype(np.float32).tolist(),
        )
        for i in range(n)
    ]


def db_stat(path: Path, name: str) -> dict[str, int] | None:
    """LMDB's figures of one database of the (closed) log at path; None if it has none."""
    env = lmdb.open(str(path), max_dbs=MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            try:
                return dict(txn.stat(env.open_db(name.encode(), txn=txn, create=False)))
            except lmdb.NotFoundError:
                return None
    finally:
        env.close()


def seq_keys(path: Path) -> dict[int, int]:
    """Each record's key (as a seq) -> the seq its record holds, in the (closed) log at path."""
    env = lmdb.open(str(path), max_dbs=MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            db = env.open_db(b"records", txn=txn, create=False)
            return {layout.read_u64(k): layout.decode_light(v).seq for k, v in txn.cursor(db=db)}
    finally:
        env.close()


def test_records_go_at_the_end_and_fill_their_pages(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=384)
    ids: list[str] = []
    for lo in range(0, 600, 100):
        got = log.append_batch(turns(100, 384, seed=lo))
        ids += [r.event_id for r in got if isinstance(r, AppendResult)]
    log.delete(ids[:3])
    with log.reader() as r:
        assert r.count() == 597 and r.get(ids[3]) is not None and r.get(ids[0]) is None
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    stat = db_stat(path, "records")
    assert stat is not None and stat["entries"] == 597 and stat["overflow_pages"] == 0
    # two records of 384 floats a 4 KiB page, every page but the last full (random ids left
    # them two-thirds full: 0.66 pages a record, bench/RESULTS.md "Disk per event")
    assert stat["leaf_pages"] <= 600 / 2 + 2
    assert db_stat(path, "ids")["entries"] == 597  # type: ignore[index]
    assert db_stat(path, layout.LEGACY_EVENTS) is None
    assert all(key == seq for key, seq in seq_keys(path).items())


def test_an_id_written_twice_keeps_one_record(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    twice = "6f1c2a55-0d53-4c2e-9a3e-3a0b7d9e2f10"
    log.append_batch(
        [
            NewEvent(kind="turn", ts=T0, text="first", embedding=[1.0, 0, 0, 0], event_id=twice),
            NewEvent(
                kind="turn", ts=T0 + 1, text="second", embedding=[0, 1.0, 0, 0], event_id=twice
            ),
        ]
    )
    with log.reader() as r:
        assert r.count() == 1 and r.get(twice).text == "second"  # type: ignore[union-attr]
    log.delete([twice])
    log.close()
    assert db_stat(path, "records")["entries"] == 0  # type: ignore[index]
    assert db_stat(path, "ids")["entries"] == 0  # type: ignore[index]


def written(tmp_path: Path, dim: int, n: int) -> tuple[Path, dict[str, StoredEvent]]:
    """A closed log of n turns and a linked fact (some deleted, one without a vector), turned
    into one of version 6's layout; its live events by id."""
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=dim)
    first = [r.event_id for r in log.append_batch(turns(n, dim)) if isinstance(r, AppendResult)]
    log.append_batch(
        [
            NewEvent(
                kind="fact",
                ts=T0 + n,
                text="parcel is with the neighbour",
                embedding=[0.1] * dim,
                properties_raw=b'{"site": "north"}',
                source_ids=(first[0],),
                supersedes=(first[1],),
                subjects=("cust-1",),
            ),
            NewEvent(kind="turn", ts=T0 + n + 1, text="no vector"),
        ]
    )
    log.delete(first[2:5])
    with log.reader() as r:
        stored = {e: ev for e in r.all_ids() if (ev := r.get(e)) is not None}
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    make_v6(path)
    return path, stored


def test_a_log_of_version_6_is_read_as_it_is_and_moved_on_open(tmp_path: Path) -> None:
    path, stored = written(tmp_path, 8, 40)
    before = records(path)
    fact = next(e for e, ev in stored.items() if ev.kind == "fact")
    with snapshot(path) as r:  # not migrated: the records by id, where version 6 kept them
        assert r.count() == len(stored) == 39
        assert {e: r.get(e) for e in stored} == stored
        assert r.links_out(fact, SOURCE_FROM) and r.links_out(fact, SUPERSEDES)
    assert records(path) == before and schema(path) == 6
    log = EventLog.open(path, embedding_dim=8)
    with log.reader() as r:
        assert r.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION == 7
        assert {e: r.get(e) for e in stored} == stored
        assert list(r.ids_by_property(layout.SUBJECT, "cust-1")) == [fact]
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    assert layout.LEGACY_EVENTS not in log.dbs
    # it goes on as a log of this version: appends, deletes, the live bytes
    log.append_batch([NewEvent(kind="turn", ts=T0 + 99, text="after", embedding=[0.5] * 8)])
    log.delete([fact])
    with log.reader() as r:
        assert r.count() == 39 and r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    after = records(path)  # the records moved as they were, the deleted one gone
    gone = layout.id_bytes(fact)
    assert {k: after[k] for k in before if k != gone} == {
        k: v for k, v in before.items() if k != gone
    }
    assert gone not in after and len(after) == len(before)
    assert db_stat(path, layout.LEGACY_EVENTS) is None
    assert all(key == seq for key, seq in seq_keys(path).items())
    EventLog.open(path, embedding_dim=8).close()  # a second open changes nothing
    assert schema(path) == layout.SCHEMA_VERSION


# The child opens a log of version 6 and stops for good halfway through the move of its records
# (two batches of 250 committed, the third started), saying so; the test kills it there.
KILLED = """
import sys, time
from pathlib import Path
from storage.log import migrations
from storage.log.eventlog import EventLog

migrations.REWRITE_BATCH = 250
move, done = migrations.move_batch, [0]
def slow(*args, **kwargs):
    done[0] += 1
    if done[0] == 3:
        print("halfway", flush=True)
        time.sleep(600)
    return move(*args, **kwargs)
migrations.move_batch = slow
EventLog.open(Path(sys.argv[1]), embedding_dim=384)
print("finished", flush=True)
"""


def test_a_move_killed_halfway_reads_as_before_and_goes_on(tmp_path: Path) -> None:
    path, stored = written(tmp_path, 384, 1200)
    before = records(path)
    kill_at_halfway(KILLED, path)
    # Two batches moved, the third not: every record is where one layout or the other has it.
    assert records(path) == before and schema(path) == 6
    assert db_stat(path, "ids")["entries"] == 500  # type: ignore[index]
    assert db_stat(path, layout.LEGACY_EVENTS)["entries"] == len(stored) - 500  # type: ignore[index]
    with snapshot(path) as r:
        assert r.count() == len(stored)
        assert {e: r.get(e) for e in stored} == stored
    log = EventLog.open(path, embedding_dim=384)
    with log.reader() as r:
        assert r.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
        assert {e: r.get(e) for e in stored} == stored
        assert r.meta_int(layout.LIVE_BYTES) == record_bytes(r)
    log.close()
    assert records(path) == before
    assert db_stat(path, layout.LEGACY_EVENTS) is None
    assert all(key == seq for key, seq in seq_keys(path).items())
    # compacted after the move: the pages the legacy records held are not kept in the file
    # (two records a page, and the ids, links and lists: 2,300 bytes a record at most)
    assert (path / "data.mdb").stat().st_size < 2_300 * len(stored)
    assert not (path / "compacting").exists()
