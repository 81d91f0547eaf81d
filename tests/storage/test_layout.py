"""The event log's format has one definition (storage/log/layout.py) and a version: a change to its
bytes without a bump of SCHEMA_VERSION fails here, and a log of a newer version is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lmdb
import msgspec
import pytest

from storage.log import layout
from storage.log.eventlog import EventLog, LogFormatError, snapshot
from storage.log.layout import IdempotencyRecord, Tombstone
from storage.model import SOURCE_FROM, SUPERSEDES, NewEvent, StoredEvent
from tests.support.oldlog import make_v6

# The fingerprint of each version's format (fingerprint() below). A new format gets a new
# version, and its fingerprint is added here; a recorded one is never edited.
RECORDED = {
    1: "49ff625c7290d189b16ace7148b01b1a0089e944568fed4ed9a7363791ecef59",
    2: "0f9ff70254260522fb9a681f47be9a29199b67782d8f98a38c0c9ab95837712a",
    3: "a7271f6fd2df6ed4d3ca387f67fd4de90e65e74486e0319282718fb446f6df7f",
    4: "0bc1819af984477f8ed548f995c972e10f302feb0d6624911bf4c8585bbaaab4",
    5: "45a76bc18c79dc1d7727f048021c694094cd70195ed4219800c331e60598afd2",
    6: "dc7793cad8dd03d2e1f78ddd13ca94b2c4a4f0fc67bb468cb1bb9132fca7db52",
    7: "dc51800361a5cd1ae653333a7bf06e3c15003a3b36ab1228ef21fbbc70a66f7f",
}

ID = "5f0c2a8e-1b7d-4c3e-9a6f-0d2e4b6c8a1f"
OTHER = "9b1e7c3d-2a4f-4e6b-8c0d-1f3a5b7c9e2d"


def sample_event(*, embedding: list[float] | None) -> StoredEvent:
    """An event with every field set (the record holds all of them)."""
    return StoredEvent(
        event_id=ID,
        seq=7,
        kind="note",
        ts=1_800_000_000_123_456,
        text="the parcel arrived",
        embedding=embedding,
        embedding_model="m-1",
        properties_raw=b'{"speaker":"agent","n":3}',
        filterable={"speaker": "agent", "n": 3, "flag": True, "x": -0.5},
        supersedes=[OTHER],
        valid_from=1_800_000_000_000_000,
        valid_until=1_900_000_000_000_000,
        subjects=["cust-42", "a b"],
    )


def fingerprint() -> str:
    """A hash of every byte the format decides: names, keys and values of fixed samples."""
    h = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\x00" + len(data).to_bytes(4, "big") + data)

    raw, other = layout.id_bytes(ID), layout.id_bytes(OTHER)
    feed("databases", ",".join(layout.DB_NAMES).encode())
    feed("meta names", ",".join(layout.META_NAMES).encode())
    feed("meta key", layout.meta_key(layout.KEYWORD_SEQ))
    feed("id", raw + layout.id_str(raw).encode())
    feed("u64", layout.u64(2**40 + 3))
    feed("ts", layout.ts_bytes(-5) + layout.ts_bytes(1_800_000_000_123_456))
    feed("op", layout.op_key(9) + layout.op_value(layout.OP_APPEND, raw))
    feed("record key", layout.record_key(9))
    feed("op", layout.op_value(layout.OP_DELETE, raw))
    feed("op", layout.op_value(layout.OP_EMBED, raw))
    feed("unembedded", layout.unembedded_key(9, raw))
    feed("space", layout.u64(layout.SPACE_CLIENT) + layout.u64(layout.SPACE_SERVER))
    feed("by_ts", layout.time_key(1_800_000_000_123_456, raw))
    feed("by_kind", layout.kind_key("note", 1_800_000_000_123_456, raw))
    for value in (True, False, 3, 3.0, -0.0, -1.5, 2**62, "agent", ""):
        feed(f"by_prop {value!r}", layout.property_key("speaker", value, raw))
    for rel in (SOURCE_FROM, SUPERSEDES):
        feed(f"links_out {rel}", layout.link_out_key(raw, rel, 2))
        feed(f"links_in {rel}", layout.link_in_key(other, rel, 7, raw))
    feed("links_out value", layout.link_out_value(other, "note"))
    feed("subject name", layout.SUBJECT.encode())
    for name, key in layout.index_keys(sample_event(embedding=None)):
        feed(f"index {name}", key)
    feed("tombstone", layout.encode_tombstone(Tombstone(seq=7, deleted_at=1_800_000_000_000_001)))
    idem = IdempotencyRecord(body_hash=b"\x01" * 32, unlinked=[OTHER])
    feed("idempotency", layout.encode_idempotency(idem))
    feed("record", layout.encode_event(sample_event(embedding=[0.5, -1.25, 3.0e-8, 7.0])))
    feed("record without embedding", layout.encode_event(sample_event(embedding=None)))
    feed(
        "filterable limits",
        f"{layout.MAX_FILTERABLE},{layout.MAX_FILTER_NAME_BYTES},"
        f"{layout.MAX_FILTER_STRING_BYTES},{layout.PROPERTY_NAME.pattern}".encode(),
    )
    return h.hexdigest()


def test_the_format_changes_only_with_a_new_schema_version() -> None:
    assert layout.SCHEMA_VERSION in RECORDED, (
        f"SCHEMA_VERSION {layout.SCHEMA_VERSION} has no recorded fingerprint: add "
        f"{layout.SCHEMA_VERSION}: {fingerprint()!r} to RECORDED"
    )
    assert fingerprint() == RECORDED[layout.SCHEMA_VERSION], (
        "the log's on-disk format changed: bump SCHEMA_VERSION in storage/log/layout.py (with a "
        "tested migration if existing logs must still open) and record the new fingerprint"
    )
    assert max(RECORDED) == layout.SCHEMA_VERSION


def test_the_fingerprint_sees_a_change_of_one_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint()
    monkeypatch.setitem(layout.REL_CODES, SUPERSEDES, b"Q")
    assert fingerprint() != before


def test_a_new_log_records_the_schema_version(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "events", embedding_dim=4)
    assert log.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
    assert log.meta_int(layout.DIM) == 4
    log.close()


def test_a_log_of_a_newer_format_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    log.append_batch([NewEvent(kind="note", ts=1_800_000_000_000_000, text="kept")])
    log.set_meta_int(layout.SCHEMA, layout.SCHEMA_VERSION + 1)
    log.close()
    with pytest.raises(LogFormatError, match="newer than this version reads"):
        EventLog.open(path, embedding_dim=4)
    # Nothing was changed: with its version set back (by hand), it opens with its event.
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        assert txn.get(layout.meta_key(layout.SCHEMA), db=meta) == layout.u64(
            layout.SCHEMA_VERSION + 1
        )
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(layout.SCHEMA_VERSION), db=meta)
    env.close()
    log = EventLog.open(path, embedding_dim=4)
    with log.reader() as r:
        assert [e.text for e in r.newest_first(None, None, None)] == ["kept"]
    log.close()


def test_a_log_of_schema_1_gets_its_live_bytes_counted_on_open(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    results = log.append_batch(
        [
            NewEvent(
                kind="note",
                ts=1_800_000_000_000_000 + i,
                text=f"event {i}",
                embedding=[0.1 * i, 0.2, 0.3, 0.4],
                properties_raw=b'{"n":1}',
            )
            for i in range(5)
        ]
    )
    log.delete([results[0].event_id])  # type: ignore[union-attr]
    with log.reader() as r:
        counted = sum(len(r.record(e.event_id) or b"") for e in r.newest_first(None, None, None))
        assert r.meta_int(layout.LIVE_BYTES) == counted
    log.close()
    # What version 1 wrote: no counter of live bytes, no last write.
    make_v6(path)
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(1), db=meta)
        txn.delete(layout.meta_key(layout.LIVE_BYTES), db=meta)
        txn.delete(layout.meta_key(layout.LAST_WRITE), db=meta)
    env.close()
    log = EventLog.open(path, embedding_dim=4)
    assert log.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
    assert log.meta_int(layout.LIVE_BYTES) == counted > 0
    # From here the counter moves with each write as it would have from the start.
    log.append_batch([NewEvent(kind="note", ts=1_800_000_000_000_009, text="after")])
    with log.reader() as r:
        now = sum(len(r.record(e.event_id) or b"") for e in r.newest_first(None, None, None))
        assert r.meta_int(layout.LIVE_BYTES) == now > counted
        assert r.meta_int(layout.LAST_WRITE) is not None
    log.close()


def test_a_log_of_schema_3_gets_its_targets_kinds_into_its_links_on_open(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    [turn, call] = log.append_batch(
        [
            NewEvent(kind="turn", ts=1_800_000_000_000_000, text="asked"),
            NewEvent(kind="tool_call", ts=1_800_000_000_000_001, text="looked up"),
        ]
    )
    ids = [turn.event_id, call.event_id]  # type: ignore[union-attr]
    [write] = log.append_batch(
        [NewEvent(kind="tool_call", ts=1_800_000_000_000_002, text="wrote", source_ids=tuple(ids))]
    )
    raw_write = layout.id_bytes(write.event_id)  # type: ignore[union-attr]
    log.close()
    # What version 3 wrote: each links_out value the target's raw id alone.
    make_v6(path)
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    with env.begin(write=True) as txn:
        meta, links = env.open_db(b"meta", txn=txn), env.open_db(b"links_out", txn=txn)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(3), db=meta)
        for i, event_id in enumerate(ids):
            key = layout.link_out_key(raw_write, SOURCE_FROM, i)
            assert txn.get(key, db=links) == layout.link_out_value(
                layout.id_bytes(event_id), ["turn", "tool_call"][i]
            )
            txn.put(key, layout.id_bytes(event_id), db=links)
    env.close()
    with snapshot(path) as r:  # read as it is, not migrated: the kinds from the records
        assert r.raw_links_out_of_kind(raw_write, SOURCE_FROM, "turn") == [layout.id_bytes(ids[0])]
        assert r.raw_links_out_of_kind(raw_write, SOURCE_FROM, "fact") == []
    log = EventLog.open(path, embedding_dim=4)
    assert log.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
    with log.reader() as r:
        assert r.links_out(write.event_id, SOURCE_FROM) == ids  # type: ignore[union-attr]
        assert r.raw_links_out_of_kind(raw_write, SOURCE_FROM, "turn") == [layout.id_bytes(ids[0])]
        assert r.raw_links_out_of_kind(raw_write, SOURCE_FROM, "tool_call") == [
            layout.id_bytes(ids[1])
        ]
    log.close()


def test_a_log_of_schema_4_reads_its_records_without_subjects_on_open(tmp_path: Path) -> None:
    path = tmp_path / "events"
    log = EventLog.open(path, embedding_dim=4)
    [tagged] = log.append_batch(
        [NewEvent(kind="turn", ts=1_800_000_000_000_000, text="hi", subjects=("c-1",))]
    )
    [plain] = log.append_batch([NewEvent(kind="turn", ts=1_800_000_000_000_001, text="yo")])
    log.close()
    # What version 4 wrote: a record without the field `subjects`.
    make_v6(path)
    env = lmdb.open(str(path), max_dbs=len(layout.DB_NAMES) + 2)
    raw_plain = layout.id_bytes(plain.event_id)  # type: ignore[union-attr]
    with env.begin(write=True) as txn:
        meta, events = env.open_db(b"meta", txn=txn), env.open_db(b"events", txn=txn)
        txn.put(layout.meta_key(layout.SCHEMA), layout.u64(4), db=meta)
        record = msgspec.msgpack.decode(txn.get(raw_plain, db=events))
        record.pop("subjects", None)  # version 6 leaves an empty field out
        txn.put(raw_plain, msgspec.msgpack.encode(record), db=events)
    env.close()
    log = EventLog.open(path, embedding_dim=4)
    assert log.meta_int(layout.SCHEMA) == layout.SCHEMA_VERSION
    with log.reader() as r:
        assert r.get(plain.event_id).subjects == []  # type: ignore[union-attr]
        assert r.get(tagged.event_id).subjects == ["c-1"]  # type: ignore[union-attr]
        assert list(r.ids_by_property(layout.SUBJECT, "c-1")) == [tagged.event_id]  # type: ignore[union-attr]
    log.close()
