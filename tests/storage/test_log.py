"""Storage unit tests of the event log on real LMDB in tmp_path: records, indexes, links, deletes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import lmdb
import msgspec
import pytest

import storage.log.appender as appender_module
import storage.log.eventlog as log_module
from storage.errors import EmbeddingMismatch, IdempotencyMismatch, InvalidRequest
from storage.log import layout as enc
from storage.log.eventlog import EventLog
from storage.model import SOURCE_FROM, AppendResult, NewEvent
from storage.read.listing import ListQuery, decode_cursor, list_events
from storage.tenants.tenant import Tenant


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    """An empty log with 4-dimensional embeddings."""
    opened = EventLog.open(tmp_path / "events", embedding_dim=4)
    yield opened
    opened.close()


def event(kind: str = "turn", ts: int = 1_000, **kw: object) -> NewEvent:
    """A NewEvent with defaults for what a test does not care about."""
    props = kw.pop("properties", None)
    raw = kw.pop("properties_raw", None)
    if props is not None:
        raw = msgspec.json.encode(props)
        # The HTTP layer lifts source ids out of the properties; do the same here.
        kw.setdefault("source_ids", tuple(props.get("source_event_ids", ())))  # type: ignore[union-attr]
    return NewEvent(kind=kind, ts=ts, properties_raw=raw, **kw)  # type: ignore[arg-type]


def append(log: EventLog, *events: NewEvent) -> list[AppendResult]:
    """Append events in one batch and return their results, failing on any error."""
    results = log.append_batch(list(events))
    for r in results:
        assert isinstance(r, AppendResult), r
    return results  # type: ignore[return-value]


def keys(log: EventLog, db: str) -> list[bytes]:
    """Every key of one named database."""
    with log.environment() as env, env.begin() as txn:
        return [bytes(k) for k in txn.cursor(db=log.dbs[db]).iternext(values=False)]


# -- records -------------------------------------------------------------------


def test_append_then_get_returns_every_field(log: EventLog) -> None:
    raw = b'{ "speaker":"agent",  "z":[1, 2.50, {"x":null}], "a":"\\u00e9" }'
    [res] = append(
        log,
        event(
            ts=1791208939000000, text="hello", embedding=[0.9, 0.1, 0.0, 0.0], properties_raw=raw
        ),
    )
    with log.reader() as r:
        ev = r.get(res.event_id)
    assert ev is not None
    assert uuid.UUID(res.event_id).version == 4
    # the embedding stored as float32s, given back as sent (storage/floats.py)
    assert (ev.kind, ev.ts, ev.text, ev.embedding_out()) == (
        "turn",
        1791208939000000,
        "hello",
        [0.9, 0.1, 0.0, 0.0],
    )
    assert ev.properties_raw == raw  # whitespace, key order and escapes kept byte for byte
    assert ev.to_object()["properties"] == {
        "speaker": "agent",
        "z": [1, 2.5, {"x": None}],
        "a": "é",
    }


def test_unknown_and_malformed_ids_read_as_none(log: EventLog) -> None:
    with log.reader() as r:
        assert r.get(str(uuid.uuid4())) is None
        assert r.get("not-a-uuid") is None


def test_seq_counts_appends_and_survives_reopen(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "events", embedding_dim=4)
    append(log, event(), event(), event())
    log.close()
    log = EventLog.open(tmp_path / "events", embedding_dim=4)
    [res] = append(log, event())
    with log.reader() as r:
        assert r.get(res.event_id).seq == 4  # type: ignore[union-attr]
        assert r.count() == 4
    log.close()


def test_meta_records_schema_dimension_and_projection_watermarks(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "events", embedding_dim=7)
    assert log.meta_int("schema") == enc.SCHEMA_VERSION
    assert log.meta_int("dim") == 7
    assert log.meta_int("keyword_seq") is None  # nothing applied yet
    log.set_meta_int("keyword_seq", 12)
    log.close()
    log = EventLog.open(tmp_path / "events", embedding_dim=384)
    assert log.meta_int("dim") == 7  # a reopened tenant keeps its dimension
    assert log.meta_int("keyword_seq") == 12
    log.close()


def test_environment_is_durable_by_default(log: EventLog) -> None:
    with log.environment() as env:
        flags = env.flags()
    assert flags["sync"] and flags["metasync"]


def test_embedding_of_wrong_length_fails_alone_in_its_batch(log: EventLog) -> None:
    good, bad = log.append_batch([event(text="ok"), event(embedding=[1.0, 2.0])])
    assert isinstance(good, AppendResult)
    assert isinstance(bad, EmbeddingMismatch) and "4" in bad.detail
    with log.reader() as r:
        assert r.count() == 1


def test_embedding_model_is_recorded_then_enforced(log: EventLog) -> None:
    append(log, event(embedding=[1.0, 0, 0, 0], embedding_model="m1"))
    [other] = log.append_batch([event(embedding=[1.0, 0, 0, 0], embedding_model="m2")])
    assert isinstance(other, EmbeddingMismatch) and "m1" in other.detail


# -- secondary indexes ------------------------------------------------------------


def test_time_and_kind_indexes_order_by_time(log: EventLog) -> None:
    ids = {
        ts: res.event_id
        for ts, res in zip(
            (30, 10, 20),
            append(log, *(event("a" if ts != 20 else "b", ts) for ts in (30, 10, 20))),
            strict=True,
        )
    }
    with log.reader() as r:
        assert list(r.ids_by_ts(None, None)) == [ids[10], ids[20], ids[30]]
        assert list(r.ids_by_ts(10, 30)) == [ids[10], ids[20]]  # since inclusive, until exclusive
        assert list(r.ids_by_kind("a")) == [ids[10], ids[30]]
        assert list(r.ids_by_kind("")) == []


def test_one_kind_never_prefixes_another(log: EventLog) -> None:
    [a] = append(log, event("fact"))
    append(log, event("facts"), event("fac"))
    with log.reader() as r:
        assert list(r.ids_by_kind("fact")) == [a.event_id]


def test_filterable_properties_follow_the_api_rules(log: EventLog) -> None:
    props = {
        "speaker": "agent",
        "n": 3,
        "x": 1.5,
        "ok": True,
        "long": "é" * 129,  # 258 bytes: stored, not filterable
        "edge": "e" * 256,  # exactly 256 bytes: filterable
        "nested": {"a": 1},
        "list": [1],
        "nothing": None,
        "9lives": "bad name",
        "with-dash": "bad name",
        "trailing\n": "bad name",
        "_under": "bad name",
    }
    [res] = append(log, event(properties=props))
    with log.reader() as r:
        ev = r.get(res.event_id)
    assert ev is not None
    assert ev.filterable == {"speaker": "agent", "n": 3, "x": 1.5, "ok": True, "edge": "e" * 256}
    assert ev.properties() == props


def test_only_the_first_16_property_names_in_sorted_order_are_filterable(log: EventLog) -> None:
    names = [f"p{i:02d}" for i in range(20)]
    # Sent in reverse order: sorted key order, not the client's order, decides.
    [res] = append(log, event(properties={n: i for i, n in reversed(list(enumerate(names)))}))
    with log.reader() as r:
        ev = r.get(res.event_id)
        assert ev is not None and list(ev.filterable) == names[:16]
        assert list(r.ids_by_property("p15", 15)) == [res.event_id]
        assert list(r.ids_by_property("p16", 16)) == []


def test_property_index_compares_typed_values(log: EventLog) -> None:
    [one] = append(log, event(properties={"v": 1}))
    [one_f] = append(log, event(properties={"v": 1.0}))
    [text] = append(log, event(properties={"v": "1"}))
    [true] = append(log, event(properties={"v": True}))
    with log.reader() as r:
        assert set(r.ids_by_property("v", 1)) == {one.event_id, one_f.event_id}
        assert list(r.ids_by_property("v", "1")) == [text.event_id]
        assert list(r.ids_by_property("v", True)) == [true.event_id]
        assert list(r.ids_by_property("v", "x" * 300)) == []


def test_number_encoding_sorts_numerically() -> None:
    values = [-1e300, -5, -1.5, -0.0, 0, 1e-9, 1, 2.5, 10, 2**53, 1e300]
    encoded = [enc.value_bytes(v) for v in values]
    assert encoded == sorted(encoded)
    assert enc.value_bytes(-0.0) == enc.value_bytes(0)
    assert [enc.read_ts(enc.ts_bytes(t)) for t in (-5, 0, 2**62)] == [-5, 0, 2**62]


# -- links ------------------------------------------------------------------------


def test_sources_become_links_and_unknown_ids_come_back_unlinked(log: EventLog) -> None:
    a, b = (res.event_id for res in append(log, event(ts=1), event(ts=2)))
    ghost = str(uuid.uuid4())
    [reply] = append(
        log, event(ts=3, properties={"source_event_ids": [b, ghost, a, b, "not-an-id"]})
    )
    assert reply.unlinked == [ghost, "not-an-id"]
    with log.reader() as r:
        assert r.links_out(reply.event_id, SOURCE_FROM) == [
            b,
            a,
        ]  # link order as sent, deduplicated
        assert r.links_in(a, SOURCE_FROM) == [reply.event_id]
        assert r.links_in(b, SOURCE_FROM) == [reply.event_id]


def test_a_source_appended_in_the_same_batch_earlier_is_linked(log: EventLog) -> None:
    first = str(uuid.uuid4())
    results = append(
        log,
        event(event_id=first),
        event(properties={"source_event_ids": [first]}),
    )
    assert results[1].unlinked == []


# -- idempotency ------------------------------------------------------------------


def test_idempotent_retry_replays_and_stores_nothing(log: EventLog) -> None:
    key_id = str(uuid.uuid5(uuid.NAMESPACE_URL, "k"))
    ghost = str(uuid.uuid4())
    ev = event(event_id=key_id, body_hash=b"h1", properties={"source_event_ids": [ghost]})
    [first] = append(log, ev)
    before = keys(log, "ops")
    [again] = append(log, ev)
    assert (first.replayed, again.replayed) == (False, True)
    assert again.event_id == first.event_id == key_id
    assert again.unlinked == first.unlinked == [ghost]  # the retry gets the first answer
    assert keys(log, "ops") == before
    [other] = log.append_batch([event(event_id=key_id, body_hash=b"h2")])
    assert isinstance(other, IdempotencyMismatch)
    assert "different body" in other.detail


# -- deletion ---------------------------------------------------------------------


def test_delete_removes_the_record_links_and_index_entries(log: EventLog) -> None:
    a, b = (r.event_id for r in append(log, event("k", 1), event("k", 2)))
    [mid] = append(log, event("k", 3, properties={"tag": "x", "source_event_ids": [a, b]}))
    [top] = append(log, event("k", 4, properties={"source_event_ids": [b, mid.event_id, a]}))
    snapshot = {
        db: keys(log, db) for db in ("by_ts", "by_kind", "by_prop", "links_out", "links_in")
    }
    assert log.delete([mid.event_id, str(uuid.uuid4())]) == [mid.event_id]
    with log.reader() as r:
        assert r.get(mid.event_id) is None
        assert list(r.ids_by_kind("k")) == [a, b, top.event_id]
        assert list(r.ids_by_property("tag", "x")) == []
        assert r.links_out(top.event_id, SOURCE_FROM) == [b, a]  # the rest keep their order
        assert r.links_in(a, SOURCE_FROM) == [top.event_id]
        assert r.tombstone_ids() == [mid.event_id]
        tomb = r.tombstone(mid.event_id)
        assert tomb is not None and tomb.seq == 3
    raw = enc.id_bytes(mid.event_id)
    for db, before in snapshot.items():
        after = keys(log, db)
        assert not any(raw in k for k in after), db
        assert len(after) < len(before), db
    assert log.delete([mid.event_id]) == []  # a second delete finds nothing


def test_delete_keeps_seq_increasing_even_for_the_newest_event(log: EventLog) -> None:
    [a] = append(log, event())
    log.delete([a.event_id])
    with log.reader() as r:
        ops = list(r.ops_after(0))
    # The delete gets a seq past the append it undoes, so projections at seq 1 still replay it.
    assert ops == [(2, b"D", a.event_id)]
    [b] = append(log, event())
    with log.reader() as r:
        assert r.get(b.event_id).seq == 3  # type: ignore[union-attr]


def test_an_appender_numbers_ops_past_its_own_deletes(log: EventLog) -> None:
    [a, b] = append(log, event(), event())

    def batch(txn: lmdb.Transaction) -> object:
        app = log.appender(txn)
        assert app.delete([b.event_id]) == [b.event_id]  # the newest append: seq 3 goes to it
        return app.append(event(text="after"))

    c = log.write(batch)
    assert isinstance(c, AppendResult)
    with log.reader() as r:
        assert list(r.ops_after(0)) == [
            (1, b"A", a.event_id),
            (3, b"D", b.event_id),
            (4, b"A", c.event_id),
        ]


def test_an_appender_refuses_ops_written_behind_its_back(log: EventLog) -> None:
    [a, b] = append(log, event(), event())

    def batch(txn: lmdb.Transaction) -> object:
        app = log.appender(txn)
        log.delete_in(txn, [b.event_id])  # takes seq 3 without the appender knowing
        return app.append(event(text="after"))

    # Numbered on, the append would overwrite the delete's op; the whole batch fails instead.
    with pytest.raises(RuntimeError, match="not past the newest op"):
        log.write(batch)
    with log.reader() as r:
        assert list(r.ops_after(0)) == [(1, b"A", a.event_id), (2, b"A", b.event_id)]


def test_an_atomic_batch_also_refuses_ops_written_behind_its_back(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    [a, b] = append(log, event(), event())
    put = appender_module.Appender._put

    def put_then_write_an_op(self: appender_module.Appender, *args: object, **kw: object) -> None:
        put(self, *args, **kw)  # type: ignore[arg-type]
        # An op past the batch's own, written into its transaction behind the appender's back.
        self.txn.put(enc.op_key(self.last + 5), b"D" + bytes(16), db=log.dbs["ops"])

    monkeypatch.setattr(appender_module.Appender, "_put", put_then_write_an_op)

    def batch(txn: lmdb.Transaction) -> object:
        return log.appender(txn).append_atomic([event(text="one"), event(text="two")])

    # The batch's second op (4) is not past op 8: numbered on, it would reorder ops.
    with pytest.raises(RuntimeError, match="not past the newest op"):
        log.write(batch)
    with log.reader() as r:
        assert list(r.ops_after(0)) == [(1, b"A", a.event_id), (2, b"A", b.event_id)]


def test_an_atomic_batch_writes_what_one_append_at_a_time_writes(tmp_path: Path) -> None:
    # append_atomic writes through a nested transaction: the databases must end up byte for
    # byte as appending the same events one by one leaves them.
    events = [
        event(
            kind=("turn", "fact", "note")[i % 3],
            ts=5_000 - 7 * (i % 11),
            text=f"event {i}",
            properties={"speaker": ("a", "b")[i % 2], "n": i % 4, "ok": i % 5 == 0},
            event_id=str(uuid.UUID(int=(i * 7919) % 97 + 1)),
        )
        for i in range(60)
    ]
    logs = []
    for name in ("one", "batch"):
        opened = EventLog.open(tmp_path / name, embedding_dim=4)
        if name == "one":
            for ev in events:
                append(opened, ev)
        else:
            [results] = [opened.write(lambda txn, o=opened: o.appender(txn).append_atomic(events))]
            assert all(isinstance(r, AppendResult) for r in results)  # type: ignore[union-attr]
        logs.append(opened)
    try:
        for db in enc.DB_NAMES:
            if db == "meta":
                continue
            with logs[0].env.begin() as t0, logs[1].env.begin() as t1:
                one = list(t0.cursor(db=logs[0].dbs[db]).iternext())
                batch = list(t1.cursor(db=logs[1].dbs[db]).iternext())
            assert one == batch, db
        assert len(keys(logs[1], "by_prop")) == 3 * len(events)
    finally:
        for opened in logs:
            opened.close()


def test_deleting_the_newest_event_reaches_both_projections(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    try:
        [[res]] = [
            t.submit_append([event(text="door code 4471", embedding=[1.0, 0, 0, 0])]).result()
        ]
        assert t.keyword.search("door code", limit=5) != []
        assert t.submit_delete([res.event_id]).result() == [res.event_id]
        assert t.keyword.search("door code", limit=5) == []
        assert t.vectors.search([1.0, 0, 0, 0], 5) == []
    finally:
        t.close()


# -- LMDB hygiene -----------------------------------------------------------------


def test_map_grows_instead_of_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "INITIAL_MAP_SIZE", 256 << 10)  # a small map, so growth happens
    log = EventLog.open(tmp_path / "events", embedding_dim=4)
    text = "x" * 20_000
    ids = [
        r.event_id for _ in range(10) for r in append(log, *(event(text=text) for _ in range(10)))
    ]
    assert log.map_size() > 256 << 10
    with log.reader() as r:
        assert r.count() == 100
        assert all(r.get(i).text == text for i in ids)  # type: ignore[union-attr]
    log.close()


_DIE_HOLDING_A_READER = """
import os, signal, sys
from pathlib import Path
from storage.log.eventlog import EventLog
log = EventLog.open(Path(sys.argv[1]), embedding_dim=4)
txn = log.env.begin()
txn.get(b"x")
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

_OPEN_AND_LIST_READERS = """
import sys
from pathlib import Path
from storage.log.eventlog import EventLog
log = EventLog.open(Path(sys.argv[1]), embedding_dim=4)
print(log.env.readers(), flush=True)
"""


def _python(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (another process, as a second server would be)."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    return subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=repo, env=env
    )


def test_open_clears_reader_slots_of_dead_processes(tmp_path: Path) -> None:
    path = tmp_path / "events"
    EventLog.open(path, embedding_dim=4).close()
    # Hold the environment open here: a lone opener resets the reader table anyway, so stale
    # slots only matter (and reader_check only has work) while another process has it open.
    holder = lmdb.open(str(path), max_dbs=16)
    try:
        died = _python(_DIE_HOLDING_A_READER, path)
        assert died.returncode == -signal.SIGKILL
        dead_pid = died.stdout.strip()
        assert dead_pid and dead_pid in holder.readers()
        opened = _python(_OPEN_AND_LIST_READERS, path)
        assert opened.returncode == 0, opened.stderr
        assert dead_pid not in opened.stdout
        assert dead_pid not in holder.readers()
    finally:
        holder.close()


# -- listing ----------------------------------------------------------------------


def _page_all(log: EventLog, **kw: object) -> list[str]:
    """Every id the listing returns, following cursors page by page."""
    seen: list[str] = []
    cursor = None
    while True:
        with log.reader() as r:
            page, cursor = list_events(r, ListQuery(cursor=cursor, **kw))  # type: ignore[arg-type]
        seen += [e.event_id for e in page]
        if cursor is None:
            return seen


def test_listing_pages_newest_first_without_gaps_or_repeats(log: EventLog) -> None:
    results = append(log, *(event("a" if i % 3 else "b", ts=i // 2) for i in range(25)))
    with log.reader() as r:
        expected = sorted(
            (r.get(x.event_id) for x in results),  # type: ignore[misc]
            key=lambda e: (e.ts, enc.id_bytes(e.event_id)),
            reverse=True,
        )
    assert _page_all(log, limit=4) == [e.event_id for e in expected]
    assert _page_all(log, limit=3, kind="b") == [e.event_id for e in expected if e.kind == "b"]
    window = [e.event_id for e in expected if 3 <= e.ts < 9]
    assert _page_all(log, limit=2, since=3, until=9) == window
    assert _page_all(log, limit=1000, since=5, until=5) == []


def test_listing_refuses_bad_queries(log: EventLog) -> None:
    with log.reader() as r:
        for q, words in (
            (ListQuery(limit=0), "limit"),
            (ListQuery(limit=1001), "1000"),
            (ListQuery(since=5, until=4), "since"),
            (ListQuery(cursor="abc"), "cursor"),
            (ListQuery(cursor="!!!!"), "cursor"),
        ):
            with pytest.raises(InvalidRequest, match=words):
                list_events(r, q)
    with pytest.raises(InvalidRequest):
        decode_cursor("A" * 40)


def test_listing_filters_on_properties(log: EventLog) -> None:
    a, b, c = (
        r.event_id
        for r in append(
            log,
            event("t", 1, properties={"effect": "write", "n": 2}),
            event("t", 2, properties={"effect": "read", "n": 2.0}),
            event("u", 3, properties={"effect": "write"}),
        )
    )
    assert _page_all(log, filters={"effect": ["write"]}) == [c, a]
    assert _page_all(log, filters={"effect": ["write"]}, kind="t") == [a]
    assert _page_all(log, filters={"n": [2]}, limit=1) == [b, a]
    assert _page_all(log, filters={"effect": ["write"], "n": [2]}) == [a]
    assert _page_all(log, filters={"effect": ["write"]}, until=3) == [a]
