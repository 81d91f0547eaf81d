"""The index projection: how the keyword and vector indexes follow a tenant's log.

The rules, written once here (and in docs/architecture.md, "The projection"):

1. Every change of the log is an op, numbered in order: OP_APPEND (a new record), OP_DELETE (a
   record gone, its tombstone left), OP_EMBED (a live record's vector written or taken out).
2. Each index has a watermark, the last op handed to it (`keyword_seq`, `vector_seq`); it is
   handed every op past it, in order, and the watermark moves only once they are handed. A
   failure leaves it behind, and the next catch-up replays what was not applied.
3. Handed is not durable: only the durable marks go into the log's meta (the keyword index's
   `committed_seq`, written with each group commit; `vector_saved_seq`, once the saved graph
   and its meta are synced), so a reopen replays from them, never past what is on disk.
4. A group commit feeds the indexes from memory instead of reading the log back only when that
   is provably what a catch-up would do: both watermarks at the op before the group, its
   records numbered one op each from there, in order (project_appends, project_vectors).
   Anything else (a delete, a gap, writes behind the writer's back) takes catch_up's path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from storage.index.keyword import KeywordDoc, KeywordIndex, indexed, keyword_doc
from storage.index.vectors import VectorIndex
from storage.log.eventlog import EventLog
from storage.log.layout import OP_APPEND, OP_DELETE, OP_EMBED
from storage.log.reader import LogReader
from storage.model import StoredEvent, StoredVector


class Projected(Protocol):
    """What the projection keeps in step: the log, both indexes and their watermarks (an open
    storage/tenants/tenant.py Tenant)."""

    log: EventLog
    keyword: KeywordIndex
    vectors: VectorIndex
    keyword_seq: int  # the last op handed to the keyword index
    vector_seq: int  # the last op handed to the vector index
    catch_ups: int  # catch-ups that read ops back from the log (open, deletes, repair)


class _Replay:
    """What a catch-up hands each index, gathered from the ops past the watermarks."""

    def __init__(self, r: LogReader, keyword_seq: int, vector_seq: int) -> None:
        self.r = r
        self.keyword_seq, self.vector_seq = keyword_seq, vector_seq
        self.docs: list[KeywordDoc] = []
        self.kw_deletes: list[str] = []
        self.labels: list[int] = []
        self.vectors: list[list[float]] = []
        self.vec_deletes: list[int] = []
        self.replaced: dict[int, list[float] | None] = {}  # label -> its vector now (OP_EMBED)

    def append(self, seq: int, event_id: str) -> None:
        """A new record: its text to the keyword index, its vector to the vector index."""
        ev = self.r.get(event_id)
        if ev is None or ev.seq != seq:  # gone, or its id written again by a later op: that
            return  # op's record (the log keeps one record an id, under its append's seq)
        if seq > self.keyword_seq and indexed(ev.text, ev.properties_raw):
            self.docs.append(keyword_doc(ev))
        if seq > self.vector_seq and ev.embedding is not None:
            self.labels.append(seq)
            self.vectors.append(ev.embedding)

    def delete(self, seq: int, event_id: str) -> None:
        """A record gone: out of both indexes (the vector's label is the deleted record's seq)."""
        if seq > self.keyword_seq:
            self.kw_deletes.append(event_id)
        tomb = self.r.tombstone(event_id)
        if seq > self.vector_seq and tomb is not None:
            self.vec_deletes.append(tomb.seq)

    def embed(self, seq: int, event_id: str) -> None:
        """A live record's vector changed after its append: the label takes what it holds now."""
        if seq > self.vector_seq:
            changed = self.r.get(event_id)
            if changed is not None:
                self.replaced[changed.seq] = changed.embedding

    def hand_over(self, p: Projected, last: int) -> None:
        """Give both indexes what was gathered, then move the watermarks to last."""
        # Neither index makes the acknowledgement wait: the keyword index commits in the
        # background (a search waits for what was published before it), and vectors are
        # searched exactly from memory until the background insert places them in the graph.
        p.keyword.publish(self.docs, self.kw_deletes, last)
        # Vectors go to the index's exact tail now and into the graph in the background. A
        # vector the server wrote (or cleared) after the append replaces what the label had.
        p.vectors.add(self.labels, self.vectors)
        if self.replaced:
            p.vectors.delete(list(self.replaced))
            now = [(label, v) for label, v in self.replaced.items() if v is not None]
            p.vectors.add([label for label, _v in now], [v for _label, v in now])
        p.vectors.delete(self.vec_deletes)
        # Handed over, not yet durable: each index keeps what it was handed until it is (the
        # keyword fold retries a failed commit with it), and only the durable marks are
        # recorded in the log (rule 3), so a reopen replays.
        p.keyword_seq = p.vector_seq = last


# What a catch-up does with each op of the log (rule 1).
RULES: dict[bytes, Callable[[_Replay, int, str], None]] = {
    OP_APPEND: _Replay.append,
    OP_DELETE: _Replay.delete,
    OP_EMBED: _Replay.embed,
}


def catch_up(p: Projected) -> None:
    """Hand both indexes every log op past their watermarks (replay on open, after deletes,
    and whenever a group cannot be projected from memory)."""
    start = min(p.keyword_seq, p.vector_seq)
    last = start
    with p.log.reader() as r:
        replay = _Replay(r, p.keyword_seq, p.vector_seq)
        for seq, op, event_id in r.ops_after(start):
            last = seq
            RULES[op](replay, seq, event_id)
    if last == start:
        return
    p.catch_ups += 1
    replay.hand_over(p, last)


def project_appends(p: Projected, start: int, written: list[StoredEvent]) -> bool:
    """Feed both indexes an append-only group's records from memory; False if catch_up must."""
    # Rule 4: catch_up would replay exactly the ops after start, here these records, one op
    # each, in order, and each still the live record of its id (the group deleted nothing and,
    # ids being distinct, overwrote nothing).
    if not (start == p.keyword_seq == p.vector_seq):
        return False
    if any(rec.seq != start + i for i, rec in enumerate(written, 1)):
        return False
    if len({rec.event_id for rec in written}) != len(written):
        return False
    if not written:
        return True  # no op written (replays, errors): catch_up would have nothing to do
    docs = [keyword_doc(r) for r in written if indexed(r.text, r.properties_raw)]
    labels = [r.seq for r in written if r.embedding is not None]
    vectors = [r.embedding for r in written if r.embedding is not None]
    last = written[-1].seq
    # The same order as catch_up: a failure here leaves the watermarks behind (rule 2).
    # Every record is a new event: no document of the index has its id.
    p.keyword.publish(docs, [], last, new=True)
    p.vectors.add(labels, vectors)
    p.keyword_seq = p.vector_seq = last
    return True


def project_vectors(p: Projected, start: int, written: list[StoredVector]) -> bool:
    """Feed the vector index server vectors just written from memory, as catch_up would from
    the log; False if catch_up must (the indexes are behind start)."""
    # Rule 4: their ops are the log's ops after start, one OP_EMBED each in the order written,
    # and each vector what catch_up would read back: reading 1.5 KB records back would hold the
    # writer (and appends queued behind it) for longer than the write itself.
    if not (start == p.keyword_seq == p.vector_seq):
        return False
    labels = [item.seq for item in written]
    last = start + len(written)
    p.keyword.publish([], [], last)
    p.vectors.delete(labels)
    p.vectors.add(labels, [item.vector for item in written])
    p.keyword_seq = p.vector_seq = last
    return True
