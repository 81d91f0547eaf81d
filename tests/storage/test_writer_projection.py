"""Append-only batches reach the indexes from memory, exactly as a replay of the log would."""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import storage.log.eventlog as log_module
from storage.errors import EmbeddingMismatch, IdempotencyMismatch
from storage.model import AppendResult, NewEvent
from storage.tenants.tenant import Tenant

DIM = 4
WORDS = ("parcel", "refund", "carrier", "zebra", "yak", "okapi", "street", "agent")


def one_batch(t: Tenant, jobs: list[tuple[str, Any]]) -> list[Any]:
    """Submit jobs ("append", events) / ("delete", ids) so the writer commits them as one batch."""
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    # The writer is busy in hold() while the jobs queue up, then takes them all at once.
    held = t.call(hold)
    assert started.wait(10)
    futures = [t.submit_append(arg) if op == "append" else t.submit_delete(arg) for op, arg in jobs]
    gate.set()
    held.result(10)
    return [f.result(10) for f in futures]


def ev(ts: int, text: str | None = None, vec: list[float] | None = None, **kw: Any) -> NewEvent:
    """An event of kind turn at ts."""
    return NewEvent(kind=kw.pop("kind", "turn"), ts=ts, text=text, embedding=vec, **kw)


def searches(t: Tenant) -> dict[str, Any]:
    """Every keyword and vector answer the comparison looks at."""
    out: dict[str, Any] = {}
    for word in WORDS:
        # Ids only, sorted: BM25 statistics may still count deleted documents until a merge.
        out[f"kw {word}"] = sorted(i for i, _ in t.keyword.search(word, limit=100))
        out[f"kw {word} note"] = sorted(
            i for i, _ in t.keyword.search(word, limit=100, kind="note")
        )
        hits = t.keyword.search(word, limit=100, filters={"speaker": "agent"})
        out[f"kw {word} agent"] = sorted(i for i, _ in hits)
    for q in ([1.0, 0, 0, 0], [0, 1.0, 0, 0], [0.3, -0.2, 0.9, 0.1]):
        out[f"vec {q}"] = [(label, round(sim, 5)) for label, sim in t.vectors.search(q, 100)]
    out["vec count"] = t.vectors.count()
    out["kw count"] = t.keyword.doc_count()
    return out


def test_in_memory_projection_answers_like_a_replay_of_the_log(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "a", embedding_dim=DIM)
    key, other_key, doomed_key = (str(uuid.uuid4()) for _ in range(3))
    agent = b'{"speaker":"agent","n":1}'

    first = one_batch(
        t,
        [
            ("append", [ev(1, "parcel refund", [1.0, 0, 0, 0], properties_raw=agent)]),
            # Twins of one key in one call are answered in order (another call with the key
            # while this one is in flight is refused: tests/storage/test_tenant_ops.py).
            (
                "append",
                [
                    ev(2, "parcel street", event_id=key, body_hash=b"h1"),
                    ev(3, "parcel street", event_id=key, body_hash=b"h1"),  # replay
                    ev(4, "zebra", [0, 1.0, 0, 0], event_id=key, body_hash=b"h2"),
                ],
            ),
            ("append", [ev(5, "yak", [1.0, 2.0])]),  # wrong length
            ("append", [ev(6, None, [0, 1.0, 0, 0], embedding_model="m1")]),  # no text
            ("append", [ev(7, "", [0.5, 0.5, 0, 0])]),  # empty text: no keyword doc
            ("append", [ev(8, kind="marker")]),  # neither text nor embedding
            ("append", [ev(9, "carrier agent", kind="note", properties_raw=agent)]),
        ],
    )
    ids = [r[0].event_id if isinstance(r[0], AppendResult) else None for r in first]
    assert first[1][1].replayed and first[1][1].event_id == ids[1] == key
    assert isinstance(first[1][2], IdempotencyMismatch)
    assert isinstance(first[2][0], EmbeddingMismatch)
    assert t.catch_ups == 0  # projected from memory

    second = one_batch(
        t,
        [
            ("append", [ev(10, "parcel street", event_id=key, body_hash=b"h1")]),  # replay
            ("append", [ev(11, "zebra", [1.0, 1.0, 0, 0], embedding_model="m2")]),  # model
            (
                "append",
                [
                    ev(12, "okapi parcel", [0, 0, 1.0, 0], supersedes=(str(ids[0]),)),
                    ev(13, "okapi", [0, 0, 0, 1.0], source_ids=(str(ids[3]), str(uuid.uuid4()))),
                ],
            ),
        ],
    )
    assert second[0][0].replayed and isinstance(second[1][0], EmbeddingMismatch)
    assert len(second[2][1].unlinked) == 1
    assert t.catch_ups == 0

    # Deletes (of an older event and of one appended in the same batch) take catch_up's path,
    # wherever they sit in the batch.
    one_batch(
        t,
        [
            (
                "append",
                [ev(14, "refund okapi", [1.0, 0, 1.0, 0], event_id=doomed_key, body_hash=b"d")],
            ),
            ("append", [ev(15, "carrier refund", [0.2, 0.1, 0, 1.0], properties_raw=agent)]),
            ("delete", [doomed_key]),
            (
                "append",
                [ev(16, "agent street", [0, 0.3, 0.3, 0], event_id=other_key, body_hash=b"o")],
            ),
        ],
    )
    assert t.catch_ups == 1
    one_batch(t, [("append", [ev(17, "okapi street", [0, 0.1, 0, 0.8])]), ("delete", [ids[6]])])
    assert t.catch_ups == 2
    assert t.keyword.search("carrier", limit=10, kind="note") == []  # the delete applied at once

    # Caught up again, the next append-only batch is projected from memory.
    one_batch(t, [("append", [ev(18, "yak yak", [0.9, 0.1, 0, 0])]), ("append", [ev(19, None)])])
    assert t.catch_ups == 2

    # One id written twice in a batch (an event_id without a body hash): the second record
    # replaces the first, under the second op only, as a replay reads them.
    twice = str(uuid.uuid4())
    one_batch(
        t,
        [
            (
                "append",
                [
                    ev(20, "street", [0, 0, 1.0, 0.1], event_id=twice),
                    ev(21, "agent", [0.7, 0, 0, 0.7], event_id=twice),
                ],
            ),
        ],
    )
    assert t.catch_ups == 3

    # Something written past the watermarks behind the writer's back: catch_up's path picks it up.
    t.log.append_batch([ev(22, "carrier okapi", [0.1, 0.9, 0.1, 0])])
    one_batch(t, [("append", [ev(23, "parcel yak", [0, 0, 0.5, 0.5])])])
    assert t.catch_ups == 4

    with t.log.reader() as r:
        last = r.last_seq()
    assert t.keyword_seq == t.vector_seq == last
    live = searches(t)
    t.close()

    # The same log replayed from scratch into fresh indexes.
    shutil.copytree(tmp_path / "a" / "events", tmp_path / "b" / "events")
    rebuilt = Tenant.open("t", tmp_path / "b", embedding_dim=DIM)
    try:
        assert rebuilt.catch_ups == 1 and rebuilt.keyword_seq == rebuilt.vector_seq == last
        replayed = searches(rebuilt)
    finally:
        rebuilt.close()
    assert replayed == live
    # The comparison saw the cases that matter: replays, errors and deletes indexed nothing.
    assert live["kw zebra"] == [] and live["kw yak"] != [] and ids[3] is not None
    assert live["kw parcel"].count(key) == 1 and doomed_key not in live["kw refund"]
    assert live["kw carrier note"] == [] and len(live["kw carrier agent"]) == 1
    # 12 vectors: an id written twice is one record, under the later op's seq (its first op
    # is replayed as nothing: storage/tenants/projection.py)
    assert live["vec count"] == 12 and live["kw count"] == 11

    # And the watermarks it saved let the tenant reopen without replaying anything.
    again = Tenant.open("t", tmp_path / "a", embedding_dim=DIM)
    try:
        assert again.catch_ups == 0 and searches(again) == live
    finally:
        again.close()


def test_a_batch_that_grows_the_map_is_projected_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small map, so the batch's transaction fails full half-way and runs again from the start.
    monkeypatch.setattr(log_module, "INITIAL_MAP_SIZE", 256 << 10)
    t = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    try:
        text = "parcel " + "x" * 20_000
        events = [ev(i, text, [1.0, float(i), 0, 0] if i % 2 else None) for i in range(40)]
        results = one_batch(t, [("append", events[:20]), ("append", events[20:])])
        assert t.log.map_size() > 256 << 10
        assert t.catch_ups == 0
        with t.log.reader() as r:
            by_seq = {seq: eid for seq, _op, eid in r.ops_after(0)}
        ids = [res.event_id for job in results for res in job]
        assert sorted(by_seq.values()) == sorted(ids) and t.keyword_seq == max(by_seq)
        assert sorted(i for i, _ in t.keyword.search("parcel", limit=100)) == sorted(ids)
        labels = sorted(label for label, _ in t.vectors.search([1.0, 0, 0, 0], 100))
        assert labels == sorted(s for s, e in by_seq.items() if ids.index(e) % 2)
    finally:
        t.close()
