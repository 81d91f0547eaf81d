"""Keyword hits carry their event's seq in a fast field, so recall reaches events without reading
Tantivy's document store; indexes made before the field existed still open, answer alike, and
get it at the next purge."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import tantivy

from storage import keyword
from storage.keyword import KeywordDoc, KeywordIndex
from storage.model import AppendResult, NewEvent
from storage.recall import RecallQuery, recall
from storage.tenant import Tenant

DIM = 4
WORDS = ["parcel", "refund", "carrier", "signed", "street", "number"]


def events(n: int) -> list[NewEvent]:
    """Events sharing words, of two kinds, with embeddings."""
    return [
        NewEvent(
            kind="turn" if i % 3 else "fact",
            ts=1_000_000 + i,
            text=f"{WORDS[i % 6]} {WORDS[(i * 5) % 6]} item{i}",
            embedding=[1.0, float(i % 7), float(i % 5), 0.5],
            event_id=f"00000000-0000-4000-8000-{i:012d}",  # the same in every tenant
        )
        for i in range(n)
    ]


def add(t: Tenant, batch: list[NewEvent]) -> list[str]:
    results = t.submit_append(batch).result()
    assert all(isinstance(r, AppendResult) for r in results)
    return [r.event_id for r in results if isinstance(r, AppendResult)]


def answers(t: Tenant) -> list[list[tuple[str, float]]]:
    """Ranked ids and scores of a few recalls: text, fused, restricted by kind."""
    shapes: list[dict[str, Any]] = [
        {"text": "parcel signed"},
        {"text": "refund carrier", "embedding": [1.0, 2.0, 3.0, 0.5]},
        {"text": "street number", "kind": "fact"},
        {"text": "item7 parcel", "k": 3},
    ]
    out = []
    with t.log.reader() as r:
        for shape in shapes:
            result = recall(r, t.keyword, t.vectors, RecallQuery(k=shape.pop("k", 10), **shape))
            out.append([(h.event.event_id, h.score) for h in result.hits])
    return out


def make_old_index(t: Tenant) -> None:
    """Replace the tenant's keyword index with one of the schema before the seq, from its log."""
    path = t.root / "keyword"
    t.keyword.close()
    shutil.rmtree(path)
    path.mkdir()
    index = tantivy.Index(keyword._schema(with_seq=False), path=str(path), reuse=True)
    old = KeywordIndex(path, index, with_seq=False)
    with t.log.reader() as r:
        docs = [
            KeywordDoc(ev.event_id, ev.kind, ev.text, ev.filterable, ev.seq)
            for ev in (r.get(e) for _s, _op, e in r.ops_after(0))
            if ev is not None and ev.text
        ]
    old.add(docs)
    old.commit()
    old.close()


def test_hits_carry_the_seq_of_their_event(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=DIM)
    add(t, events(40))
    found = t.keyword.ranked("parcel refund", limit=30)
    assert found.seqs is not None and len(found.seqs) == len(found) > 5
    with t.log.reader() as r:
        for seq, (event_id, _score) in zip(found.seqs, found, strict=True):
            ev = r.get(event_id)
            assert ev is not None and ev.seq == seq
            assert r.id_for_seq(seq) == event_id
    t.close()


def test_an_index_made_before_the_seq_opens_and_answers_alike(tmp_path: Path) -> None:
    new = Tenant.open("t", tmp_path / "new", embedding_dim=DIM)
    old = Tenant.open("t", tmp_path / "old", embedding_dim=DIM)
    batch = events(60)
    add(new, batch)
    add(old, batch)
    old.close()
    reopened = Tenant.open("t", tmp_path / "old", embedding_dim=DIM)
    make_old_index(reopened)
    reopened.close()

    old = Tenant.open("t", tmp_path / "old", embedding_dim=DIM)
    assert not old.keyword.with_seq  # opened as it is, not rebuilt
    assert old.keyword.ranked("parcel", limit=10).seqs is None
    assert new.keyword.with_seq
    assert answers(old) == answers(new)

    # It goes on taking documents (without a seq) and finds them.
    more = [
        NewEvent(
            kind="turn",
            ts=2_000_000,
            text="zanzibar parcel",
            embedding=[0.0, 0.0, 1.0, 1.0],
            event_id="00000000-0000-4000-8000-999999999999",
        )
    ]
    assert add(old, more) and add(new, more)
    assert answers(old) == answers(new)
    with old.log.reader() as r:
        hits = recall(r, old.keyword, old.vectors, RecallQuery(text="zanzibar")).hits
    assert [h.event.text for h in hits] == ["zanzibar parcel"]

    # A purge rebuilds the keyword index: it has the seq from then on, and answers the same.
    victim = answers(old)[0][0][0]
    for t in (old, new):
        t.submit_delete([victim]).result()
        t.purge()
    assert old.keyword.with_seq
    assert answers(old) == answers(new)
    old.close()
    new.close()
