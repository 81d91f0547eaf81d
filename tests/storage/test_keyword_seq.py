"""Keyword hits carry their event's seq in a fast field, so recall reaches events without reading
Tantivy's document store; an index of any other schema is rebuilt from the log on open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tantivy

from storage.model import AppendResult, NewEvent
from storage.read.recall import RecallQuery, recall
from storage.tenants.tenant import Tenant
from tests.support.wait import remove_tree

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


def make_seqless_index(t: Tenant) -> None:
    """Replace the tenant's keyword index with one whose documents have no seq, from its log."""
    path = t.root / "keyword"
    t.keyword.close()
    remove_tree(path)
    path.mkdir()
    b = tantivy.SchemaBuilder()
    b.add_text_field("id", stored=True, tokenizer_name="raw")
    b.add_text_field("text", stored=False, tokenizer_name="en_stem", index_option="freq")
    b.add_text_field("kind", stored=False, tokenizer_name="raw")
    b.add_text_field("tag", stored=False, tokenizer_name="raw")
    index = tantivy.Index(b.build(), path=str(path), reuse=True)
    writer = index.writer(heap_size=15_000_000, num_threads=1)
    with t.log.reader() as r:
        for _s, _op, e in r.ops_after(0):
            ev = r.get(e)
            if ev is not None and ev.text:
                doc = tantivy.Document()
                doc.add_text("id", ev.event_id)
                doc.add_text("text", ev.text)
                doc.add_text("kind", ev.kind)
                writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()


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


def test_an_index_of_another_schema_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    new = Tenant.open("t", tmp_path / "new", embedding_dim=DIM)
    other = Tenant.open("t", tmp_path / "other", embedding_dim=DIM)
    batch = events(60)
    add(new, batch)
    add(other, batch)
    make_seqless_index(other)
    other.close()  # its watermark says the index covers the whole log

    other = Tenant.open("t", tmp_path / "other", embedding_dim=DIM)
    try:
        assert other.catch_ups == 1  # rebuilt: every op replayed into a new index
        found = other.keyword.ranked("parcel", limit=10)
        assert len(found.seqs) == len(found) > 0
        assert answers(other) == answers(new)
    finally:
        other.close()
        new.close()
