"""The events database's record layout: embeddings as raw little-endian float32 bytes, given back
as the float32 nearest each float sent by every read, across a reopen, a purge and the HTTP
routes (which render each as its shortest decimal)."""

from __future__ import annotations

import random
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.config import load_settings
from storage.log.layout import decode_event, encode_event
from storage.log.reader import LogReader
from storage.model import FLOAT32_MAX, AppendResult, NewEvent, StoredEvent
from storage.read.recall import RecallQuery, RecallResult, recall
from storage.tenants.tenant import Tenant
from tests.support.erasure import scan

DIM = 8
T0 = 1_700_000_000_000_000
TENANT = "acme"
# Doubles the event's rules let through: tiny ones become 0.0 (or a subnormal) in float32, the
# largest float32 stays itself.
EDGES = [0.1, 1e-300, -2.5, -0.0, 5e-324, FLOAT32_MAX, 1 / 3, 2.0**-149]
# Doubles a JSON client may send (float32 rounds most of them).
SENT = [0.1, 1e-300, -2.5, -0.0, 5e-324, 1 / 3, 2.0**-1022, 123456.789]


def bits(values: list[float] | None) -> list[str] | None:
    """Floats as exact hex (tells -0.0 from 0.0); also checks every one is a float."""
    if values is None:
        return None
    assert all(type(v) is float for v in values)
    return [v.hex() for v in values]


def f8(values: list[float]) -> bytes:
    """The little-endian float64 bytes of values."""
    return struct.pack(f"<{len(values)}d", *values)


def f4(values: list[float]) -> bytes:
    """The little-endian float32 bytes of values (each the nearest float32)."""
    return struct.pack(f"<{len(values)}f", *values)


def as_f4(values: list[float] | None) -> list[float] | None:
    """Each value as the float32 nearest it (what a record keeps)."""
    return None if values is None else list(struct.unpack(f"<{len(values)}f", f4(values)))


def printed(values: list[float]) -> list[float]:
    """Each value's float32 as its shortest decimal, as numpy prints it (what the doors send)."""
    return [float(str(np.float32(v))) for v in values]


def stored(embedding: list[float] | None) -> StoredEvent:
    """A StoredEvent with every field set."""
    return StoredEvent(
        event_id="6f1c2a55-0d53-4c2e-9a3e-3a0b7d9e2f10",
        seq=41,
        kind="fact",
        ts=T0,
        text="the door code is 4471",
        embedding=embedding,
        embedding_model="m1",
        properties_raw=b'{"site": "north", "n": 2}',
        filterable={"site": "north", "n": 2},
        supersedes=["0b6e5a3c-6c8e-4b52-a4f7-2f1d0b9f0c11"],
        valid_from=T0 - 5,
        valid_until=T0 + 5,
    )


# -- the layout ----------------------------------------------------------------------------------


EMBEDDINGS: list[list[float] | None] = [
    EDGES,
    [random.Random(3).uniform(-1, 1) for _ in range(384)],
    [random.Random(4).uniform(-1e6, 1e6) for _ in range(DIM)],
    [],
    None,
]


@pytest.mark.parametrize("embedding", EMBEDDINGS)
def test_a_record_gives_back_the_float32_of_each_float_it_was_given(
    embedding: list[float] | None,
) -> None:
    ev = stored(embedding)
    back = decode_event(encode_event(ev))
    assert back == msgspec.structs.replace(ev, embedding=as_f4(embedding))
    assert bits(back.embedding) == bits(as_f4(embedding))
    assert decode_event(encode_event(back)) == back  # a float32 is kept as it is


@pytest.mark.parametrize("embedding", [e for e in EMBEDDINGS if e is not None])
def test_the_embedding_is_an_ext_of_little_endian_float32s(embedding: list[float]) -> None:
    raw = encode_event(stored(embedding))
    assert msgspec.msgpack.decode(raw)["embedding"] == msgspec.msgpack.Ext(1, f4(embedding))


@pytest.mark.parametrize("embedding", EMBEDDINGS)
def test_a_record_of_version_5_still_decodes_its_float64s(embedding: list[float] | None) -> None:
    # What versions 5 and older wrote: every field, the embedding a bin of float64s.
    ev = stored(embedding)
    fields = msgspec.structs.asdict(ev)
    fields["embedding"] = None if embedding is None else f8(embedding)
    back = decode_event(msgspec.msgpack.encode(fields))
    assert back == ev and bits(back.embedding) == bits(embedding)


def test_a_record_leaves_out_the_fields_at_their_defaults() -> None:
    ev = StoredEvent(event_id="6f1c2a55-0d53-4c2e-9a3e-3a0b7d9e2f10", seq=3, kind="turn", ts=T0)
    assert list(msgspec.msgpack.decode(encode_event(ev))) == ["event_id", "seq", "kind", "ts"]
    assert decode_event(encode_event(ev)) == ev
    assert set(msgspec.msgpack.decode(encode_event(stored([1.0])))) == set(
        StoredEvent.__struct_fields__
    ) - {"subjects"}


@pytest.mark.parametrize("embedding", [e for e in EMBEDDINGS if e])
def test_an_embedding_as_a_float_array_is_not_this_layout(embedding: list[float]) -> None:
    # A layout no released version wrote: refused, never misread as another event.
    with pytest.raises(msgspec.ValidationError):
        decode_event(msgspec.msgpack.encode(stored(embedding)))


def test_integers_given_as_an_embedding_come_back_as_floats() -> None:
    ev = stored([1, 0, -3, 2**40])  # as a caller may build it
    assert bits(decode_event(encode_event(ev)).embedding) == bits([1.0, 0.0, -3.0, 2.0**40])


def test_a_record_keeps_four_bytes_a_float() -> None:
    ev = stored([random.Random(5).uniform(-1, 1) for _ in range(384)])
    bare = encode_event(msgspec.structs.replace(ev, embedding=None))
    # the ext's 4-byte header and the field's name (left out of a record without one)
    assert len(encode_event(ev)) - len(bare) == 4 * 384 + 4 + len("embedding") + 1


# -- a tenant written, closed and opened again -----------------------------------------------------


def vector(rng: random.Random) -> list[float]:
    """Arbitrary doubles, including some no float32 (or short decimal) holds exactly."""
    values = [rng.uniform(-1, 1) for _ in range(DIM - 3)] + [0.1, 1e-300, -2.5]
    rng.shuffle(values)
    return values


def add(t: Tenant, events: list[NewEvent]) -> list[str]:
    """Append in one group commit and return the ids."""
    results = t.submit_append(events).result()
    assert all(isinstance(r, AppendResult) for r in results), results
    return [r.event_id for r in results]


def turn(rng: random.Random, i: int) -> NewEvent:
    """An ordinary turn with an embedding and a word only it uses."""
    words = " ".join(rng.choice(["parcel", "carrier", "refund", "street"]) for _ in range(6))
    return NewEvent(
        kind="turn",
        ts=T0 + i,
        text=f"{words} tok{i:04d}",
        embedding=vector(rng),
        properties_raw=msgspec.json.encode({"speaker": rng.choice(["agent", "customer"])}),
    )


def fill(t: Tenant, rng: random.Random, at: int, n: int) -> list[str]:
    """N events of several shapes: links, supersession, properties, validity, no embedding."""
    ids = add(t, [turn(rng, at + i) for i in range(n)])
    return ids + add(
        t,
        [
            NewEvent(
                kind="fact",
                ts=T0 + at + n,
                text=f"parcel {at} is with the neighbour",
                embedding=vector(rng),
                embedding_model="m1",
                properties_raw=b'{"site": "north", "n": 2}',
                source_ids=(ids[0], ids[1]),
                supersedes=(ids[2],),
                valid_from=T0,
            ),
            NewEvent(kind="turn", ts=T0 + at + n + 1, text=f"no vector for parcel {at}"),
        ],
    )


def layout(t: Tenant, event_id: str) -> str:
    """Which layout the event's record has on disk: "float32", "bin", "array" or "none"."""
    with t.log.reader() as r:
        value = msgspec.msgpack.decode(raw_record(r, event_id)).get("embedding")
    if isinstance(value, msgspec.msgpack.Ext):
        return "float32"
    return "bin" if isinstance(value, bytes) else "array" if isinstance(value, list) else "none"


def raw_record(r: LogReader, event_id: str) -> bytes:
    """The event's record as the events database holds it."""
    raw = r.record(event_id)
    assert raw is not None
    return bytes(raw)


def everything(t: Tenant) -> dict[str, StoredEvent]:
    """Every live event, whole."""
    with t.log.reader() as r:
        return {e: ev for e in r.all_ids() if (ev := r.get(e)) is not None}


QUERIES: list[dict[str, Any]] = [
    {"text": "parcel neighbour"},
    {"embedding": [0.5, -0.1, 0.3, 0.0, 0.2, -0.4, 0.9, 0.1]},
    {"text": "carrier refund", "embedding": [0.1] * DIM, "k": 5, "hops": 1},
    {"text": "parcel", "embedding": [0.3, 0.1, -0.2, 0.4, 0.0, 0.2, 0.1, 0.5], "current": False},
]


def ask(t: Tenant, query: dict[str, Any], *, embeddings: bool = True) -> RecallResult:
    """One recall."""
    with t.log.reader() as r:
        return recall(r, t.keyword, t.vectors, RecallQuery(**query), embeddings=embeddings)


def answers(t: Tenant) -> list[list[tuple[Any, ...]]]:
    """Everything each query answers, the events' embeddings bit for bit."""
    out = []
    for query in QUERIES:
        for embeddings in (True, False):
            hits = ask(t, query, embeddings=embeddings).hits
            out.append([(h.event, bits(h.event.embedding), h.score, h.via, h.hop) for h in hits])
    return out


class ClosedTenant(msgspec.Struct):
    """A tenant written and closed, and what it held."""

    data: Path
    events: dict[str, StoredEvent]
    sent: dict[str, list[float] | None]
    answers: list[list[tuple[Any, ...]]]


@pytest.fixture
def old(tmp_path: Path) -> ClosedTenant:
    data = tmp_path / "data"
    t = Tenant.open(TENANT, data / TENANT, embedding_dim=DIM)
    rng = random.Random(20261130)
    batch = [turn(rng, i) for i in range(30)]
    ids = add(t, batch) + fill(t, rng, 100, 5)
    sent = dict(zip(ids[:30], (e.embedding for e in batch), strict=True))
    events = everything(t)
    assert len(events) == len(ids) == 37
    t.keyword.flush()
    before = answers(t)
    t.close()
    return ClosedTenant(data, events, sent, before)


@pytest.fixture
def reopened(old: ClosedTenant) -> Iterator[Tenant]:
    t = Tenant.open(TENANT, old.data / TENANT, embedding_dim=DIM)
    yield t
    t.close()


def test_records_read_back_as_they_were_written(old: ClosedTenant, reopened: Tenant) -> None:
    t = reopened
    assert {layout(t, e) for e, ev in old.events.items() if ev.embedding is not None} == {"float32"}
    assert {layout(t, e) for e, ev in old.events.items() if ev.embedding is None} == {"none"}
    assert everything(t) == old.events
    with t.log.reader() as r:
        for event_id, ev in old.events.items():
            got = r.get(event_id)
            assert got is not None and bits(got.embedding) == bits(ev.embedding)
            assert got == decode_event(raw_record(r, event_id))
            assert r.get_light(event_id) == msgspec.structs.replace(ev, embedding=None)
        for event_id, embedding in old.sent.items():
            got = r.get(event_id)
            assert got is not None and bits(got.embedding) == bits(as_f4(embedding))


def test_recall_after_a_reopen_answers_as_before(old: ClosedTenant, reopened: Tenant) -> None:
    assert answers(reopened) == old.answers


def test_records_written_after_a_reopen_join_the_others(
    old: ClosedTenant, reopened: Tenant
) -> None:
    t = reopened
    rng = random.Random(99)
    batch = [turn(rng, 500 + i) for i in range(5)]
    new = add(t, batch)
    assert {layout(t, e) for e in new} == {"float32"}
    t.keyword.flush()
    with t.log.reader() as r:
        for event_id, ev in zip(new, batch, strict=True):
            got = r.get(event_id)
            assert got is not None and bits(got.embedding) == bits(as_f4(ev.embedding))
            assert r.get_light(event_id) == msgspec.structs.replace(got, embedding=None)
    for event_id, ev in zip(new, batch, strict=True):
        assert ev.text is not None and ev.embedding is not None
        token = {"text": ev.text.split()[-1], "k": 1}
        assert [h.event.event_id for h in ask(t, token).hits] == [event_id]
        [hit] = ask(t, {"embedding": ev.embedding, "k": 1}).hits
        assert hit.event.event_id == event_id
        assert bits(hit.event.embedding) == bits(as_f4(ev.embedding))
    assert {e: ev for e, ev in everything(t).items() if e in old.events} == old.events


def on_disk(root: Path, pattern: bytes) -> list[str]:
    """Files under root holding pattern."""
    return [Path(p).name for p in scan(root, {"pattern": pattern}).get("pattern", [])]


def test_a_purge_keeps_the_layout_and_erases_the_embeddings(
    old: ClosedTenant, reopened: Tenant
) -> None:
    t = reopened
    rng = random.Random(7)
    new = add(t, [turn(rng, 700 + i) for i in range(6)])
    olds = [e for e, ev in old.events.items() if ev.embedding is not None]
    victims = {olds[3]: "written before the reopen", new[0]: "written after it"}
    whole = everything(t)
    patterns = {e: f4(whole[e].embedding or []) for e in victims}
    t.save_vectors()
    assert all(on_disk(t.root, p) for p in patterns.values())  # the scan can fail
    assert t.submit_delete(list(victims)).result() == list(victims)
    late: list[str] = []

    def meanwhile(name: str) -> None:
        if name == "copied":  # between the snapshot and the swap: the delta reads these too
            late.extend(add(t, [turn(rng, 800)]))
            t.submit_delete([olds[4], new[1]]).result()

    stats = t.purge(meanwhile)
    assert stats.purged == 2
    assert t.purge().purged == 2
    gone = {*victims, olds[4], new[1]}
    expected = {e: ev for e, ev in whole.items() if e not in gone}
    after = everything(t)
    assert {e: ev for e, ev in after.items() if e not in late} == expected
    assert [bits(ev.embedding) for ev in after.values() if ev.event_id in expected] == [
        bits(expected[e].embedding) for e in after if e in expected
    ]
    assert {layout(t, e) for e in [*olds, *new, *late] if e not in gone} == {"float32"}
    for event_id, pattern in patterns.items():
        assert on_disk(t.root, pattern) == [], victims[event_id]
    t.keyword.flush()
    for ev in after.values():  # the rebuilt keyword index read every record's text
        if ev.text and ev.kind == "turn" and ev.embedding is not None:
            found = t.keyword.search(ev.text.split()[-1], limit=1)
            assert [e for e, _score in found] == [ev.event_id]


@pytest.mark.parametrize("hot", [True, False])
def test_get_over_http_returns_the_floats_sent(old: ClosedTenant, hot: bool) -> None:
    settings = load_settings(
        {"MEMSPINE_DATA_DIR": str(old.data), "MEMSPINE_EMBEDDING_DIM": str(DIM)}
    )
    auth = {"Authorization": f"Bearer {TENANT}"}
    with TestClient(create_app(settings, hot_routes=hot)) as client:
        body = {"kind": "turn", "ts": T0 + 900, "text": "new layout", "embedding": SENT}
        r = client.post("/v1/memory/event", headers=auth, content=msgspec.json.encode(body))
        assert r.status_code == 201, r.text
        cases = {r.json()["event_id"]: SENT, **old.sent}
        for event_id, embedding in cases.items():
            r = client.get(f"/v1/memory/event/{event_id}", headers=auth)
            assert r.status_code == 200, r.text
            got = msgspec.json.decode(r.content)["embedding"]
            assert embedding is not None and bits(got) == bits(printed(embedding))


# -- reads that leave the embedding out ------------------------------------------------------------


@pytest.mark.parametrize("reopen", [False, True])
def test_a_light_read_never_builds_the_embedding(tmp_path: Path, reopen: bool) -> None:
    dim = 2048
    t = Tenant.open("big", tmp_path / "big", embedding_dim=dim)
    embedding = [random.Random(1).uniform(-1, 1) for _ in range(dim)]
    [event_id] = add(t, [NewEvent(kind="turn", ts=T0, text="big", embedding=embedding)])
    if reopen:
        t.close()
        t = Tenant.open("big", tmp_path / "big", embedding_dim=dim)
    # tracemalloc counts every thread's allocations: the fold and the inserter idle first
    t.keyword.flush()
    t.vectors.flush()
    floats = dim * 24  # what 2048 Python floats alone take, the list aside
    with t.log.reader() as r:
        size = len(raw_record(r, event_id))
        light, light_peak = peak(lambda: r.get_light(event_id))
        whole, whole_peak = peak(lambda: r.get(event_id))
    t.close()
    assert light is not None and light.embedding is None
    assert whole is not None and bits(whole.embedding) == bits(as_f4(embedding))
    assert light_peak < size + 4096  # the record's bytes and a few small objects
    assert whole_peak > size + floats


def peak(fn: Any) -> tuple[Any, int]:
    """Fn's result and the most memory Python held for it at once."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
