"""The keyword index's tail: documents acknowledged but not yet durably committed are searched
beside the committed index, scored and ranked as the index ranks them once they are committed."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import tantivy

from storage.index.keyword import KeywordDoc, KeywordIndex, document, query_terms
from storage.index.keyword_tail import (
    ANALYZER,
    FIELDNORMS,
    Scorer,
    Stats,
    Tail,
    TailDoc,
    analyze,
    committed_stats,
    fieldnorm,
    query_tokens,
)

WORDS = [
    "parcel",
    "refund",
    "carrier",
    "door",
    "code",
    "delivered",
    "running",
    "runner",
    "ran",
    "quickly",
    "sunset",
    "hike",
    "painting",
    "gallery",
    "museum",
    "sister",
    "brother",
    "adoption",
    "agency",
    "support",
    "group",
    "career",
    "counselor",
    "camping",
    "lake",
    "mountain",
    "pottery",
    "class",
    "violin",
    "concert",
    "book",
    "library",
    "recipe",
    "garden",
]
# Other forms of some WORDS: a query that holds two forms of a stem has two clauses of its term.
FORMS = ["parcels", "refunds", "runs", "run", "doors", "gardens", "Parcel"]


def random_text(rng: random.Random) -> str:
    """Some words, some repeated, of varied lengths (so fieldnorms and frequencies vary)."""
    n = rng.choice([1, 2, 3, 5, 8, 13, 30, 60])
    return " ".join(rng.choice(WORDS) for _ in range(n))


def doc(i: int, text: str, kind: str = "turn", **props: str) -> KeywordDoc:
    """Event i as the keyword index gets it."""
    return KeywordDoc(f"00000000-0000-4000-8000-{i:012d}", kind, text, dict(props), i + 1)


def stats_of(
    index: tantivy.Index, query: tantivy.Query, addr: tantivy.DocAddress
) -> dict[str, float]:
    """The values Tantivy's explanation names, by the start of their description."""
    out: dict[str, float] = {}

    def walk(node: dict[str, object]) -> None:
        out.setdefault(str(node.get("description", "")).split(",")[0], float(node["value"]))  # type: ignore[arg-type]
        for child in node.get("details", []):  # type: ignore[attr-defined]
            walk(child)

    walk(json.loads(query.explain(index.searcher(), addr).to_json()))
    return out


def test_fieldnorms_are_the_lengths_tantivy_scores_with() -> None:
    from storage.index.keyword import open_tantivy

    index = open_tantivy(None)
    writer = index.writer(heap_size=20_000_000, num_threads=1)
    lengths = [*range(1, 130), 199, 200, 536, 537, 599, 600, 1047, 1048, 1049, 5000, 9000]
    for i, n in enumerate(lengths):
        writer.add_document(document(doc(i, "zz " + "y " * (n - 1))))
    writer.commit()
    index.reload()
    query = tantivy.Query.term_query(index.schema, "text", "zz")
    searcher = index.searcher()
    hits = searcher.search(query, len(lengths)).hits
    seqs = searcher.fast_field_values("seq", [a for _s, a in hits])
    for (_score, addr), seq in zip(hits, seqs, strict=True):
        n = lengths[seq - 1]
        assert stats_of(index, query, addr)["dl"] == fieldnorm(n), n
    assert len(FIELDNORMS) == 256 and sorted(set(FIELDNORMS)) == FIELDNORMS


def test_analyze_splits_ascii_text_word_by_word_as_the_analyzer_does() -> None:
    # analyze reads an ASCII text's terms word by word from a cache; every text must get what
    # one analyzer call on the whole text gives, the first time and from the cache.
    rng = random.Random(7)
    pieces = [*WORDS, "RUNNING", "Parcels", "x_y", "a-b", "don't", "42", "v2", "3.14", "_", ""]
    pieces += ["b" * 39, "c" * 40, "D" * 41, "e9" * 30, "caf\u00e9", "na\u00efve", "\u00dcber"]
    seps = [" ", "  ", ", ", ".", "\n", "\t", "!", "/", "(", ")", "#", "'", '"']
    texts = ["", " ", "...", "b" * 39, "c" * 40, "Running runners RUN quickly, x_y"]
    for _ in range(300):
        texts.append(
            "".join(rng.choice(pieces) + rng.choice(seps) for _ in range(rng.randint(1, 30)))
        )
    for text in texts * 2:
        tokens = ANALYZER.analyze(text)
        assert analyze(text) == (Counter(tokens), len(tokens)), text


def test_the_analyzer_and_query_terms_are_the_index_s() -> None:
    assert analyze("Running runners RUN quickly, x_y")[0] == {
        "run": 2,
        "runner": 1,
        "quick": 1,
        "x": 1,
        "y": 1,
    }
    assert analyze("a " + "b" * 41 + " c")[1] == 2  # tokens over 40 bytes are dropped
    # One clause a distinct word, as Tantivy's query parser makes them: "parcel parcel" is one
    # clause, "parcels parcel" two of the same term (which counts twice in the score).
    assert query_tokens(["running", "parcels", "parcel", "runs", "parcel"]) == [
        "run",
        "parcel",
        "parcel",
        "run",
    ]


def test_scores_computed_here_are_tantivy_s(tmp_path: Path) -> None:
    """With the committed index's own statistics, the Python BM25 gives Tantivy's scores for
    every hit of many queries (stems, repeats, deleted documents still counted)."""
    rng = random.Random(7)
    kw = KeywordIndex.open(tmp_path / "kw")
    docs = [doc(i, random_text(rng)) for i in range(300)]
    kw.add(docs)
    kw.commit()
    kw.delete([d.event_id for d in docs[:40]])  # deleted: still in N, n and the tokens
    kw.commit()
    searcher = kw.index.searcher()
    stats = committed_stats(kw.index, searcher, None)
    assert stats is not None and stats.docs == 300
    texts = {d.event_id: d.text for d in docs}
    for _ in range(60):
        words = query_terms(" ".join(rng.choice(WORDS + FORMS) for _ in range(rng.randint(1, 5))))
        terms = query_tokens(words)
        assert terms is not None
        scorer = Scorer(terms, {t: searcher.doc_freq("text", t) for t in terms}, stats)
        hits = kw.search(" ".join(words), limit=300)
        assert hits
        for event_id, score in hits:
            assert scorer.score(*analyze(texts[event_id])) == pytest.approx(score, rel=1e-5)
    kw.close()


def test_the_tail_s_postings_score_each_document_as_its_terms_do() -> None:
    """Scoring the queued documents from the query terms' postings gives every document that
    holds one exactly the sum `score` gives it (equal texts tie, queued or committed), with
    repeated terms and stems; documents that hold none are not scored."""
    rng = random.Random(11)
    tail = Tail()
    texts = [random_text(rng) for _ in range(200)]
    tail.add_all([TailDoc(i + 1, f"e{i}", "turn", frozenset(), t) for i, t in enumerate(texts)])
    stats = Stats(5000, 5000 * 9)
    for _ in range(80):
        words = query_terms(" ".join(rng.choice(WORDS + FORMS) for _ in range(rng.randint(1, 6))))
        terms = query_tokens(words)
        assert terms is not None
        postings, df = tail.matching(terms)
        scorer = Scorer(terms, {t: n + rng.randint(0, 50) for t, n in df.items()}, stats)
        got = {d.seq: score for score, d in scorer.score_postings(postings)}
        held = {d.seq for d in tail.docs if set(d.tf) & set(terms)}
        assert set(got) == held
        for d in tail.docs:
            if d.seq in got:
                assert got[d.seq] == scorer.score(d.tf, d.length)  # to the bit
                assert got[d.seq] == scorer.score(*analyze(texts[d.seq - 1]))


@pytest.fixture
def held() -> Iterator[threading.Event]:
    """Set it to let a held fold go on."""
    event = threading.Event()
    yield event
    event.set()


def hold_fold(kw: KeywordIndex, release: threading.Event) -> None:
    """Keep the background fold from committing (it waits for the writer lock) until release."""
    kw.writer_lock.acquire()

    def later() -> None:
        release.wait()
        kw.writer_lock.release()

    threading.Thread(target=later, daemon=True).start()


def same_ranking(merged: list[tuple[str, float]], after: list[tuple[str, float]]) -> bool:
    """Whether merged is the head of after: the same scores place by place (to float32's
    precision, which is Tantivy's), the same ids within each run of equal scores (Tantivy breaks
    ties by where a document sits in its segments), a run the cut splits taken from the run."""
    if len(merged) > len(after):
        return False
    if any(
        sm != pytest.approx(sa, rel=1e-5) for (_e, sm), (_a, sa) in zip(merged, after, strict=False)
    ):
        return False
    i = 0
    while i < len(merged):
        j = i
        while j < len(after) and after[j][1] == pytest.approx(after[i][1], rel=1e-5):
            j += 1
        ours = {e for e, _s in merged[i:j]}
        theirs = {e for e, _s in after[i:j]}
        if not ours <= theirs or (j <= len(merged) and ours != theirs):
            return False
        i = j
    return True


@pytest.mark.parametrize(
    "committed_docs, queued_docs", [(0, 40), (30, 200), (400, 25), (400, 300), (3000, 30)]
)
def test_the_tail_ranks_as_a_commit_would(
    tmp_path: Path, held: threading.Event, committed_docs: int, queued_docs: int
) -> None:
    rng = random.Random(committed_docs * 1000 + queued_docs)
    kw = KeywordIndex.open(tmp_path / "kw")
    texts: dict[int, str] = {}
    seq = 0

    def make(n: int) -> list[KeywordDoc]:
        nonlocal seq
        out = []
        for _ in range(n):
            props = {"speaker": rng.choice(["agent", "user"])} if rng.random() < 0.7 else {}
            d = doc(seq, random_text(rng), rng.choice(["turn", "fact"]), **props)
            texts[d.seq] = d.text
            out.append(d)
            seq += 1
        return out

    first = make(committed_docs)
    kw.publish(first, [], seq)
    kw.flush()
    hold_fold(kw, held)
    queued = make(queued_docs)
    # Deletes queued too: a committed document's, and every fourth queued one's.
    deleted = first[:1] + queued[::4]
    kw.publish(queued, [d.event_id for d in deleted], seq + 1)
    gone = {d.seq for d in deleted}
    assert not kw.settled()

    def text_of(s: int) -> str | None:
        return None if s in gone else texts.get(s)

    queries = []
    for _ in range(40):
        text = " ".join(rng.choice(WORDS + FORMS) for _ in range(rng.randint(1, 4)))
        kind = rng.choice([None, None, "fact"])
        filters = rng.choice([None, None, {"speaker": "agent"}])
        limit = rng.choice([1, 5, 20])
        found = kw.ranked(text, limit=limit, kind=kind, filters=filters, text_of=text_of)
        queries.append((text, kind, filters, limit, list(found)))
    assert kw.committed_seq < seq + 1  # every answer above came from the tail beside the index
    held.set()
    kw.flush()
    for text, kind, filters, limit, merged in queries:
        # The same search once the tail is committed (deep, so the cut does not split ties).
        after = kw.search(text, limit=limit + 50, kind=kind, filters=filters)
        assert len(merged) == min(limit, len(after)), text
        assert same_ranking(merged, after), (text, kind, filters, merged, after[:limit])
    kw.close()


def test_a_recall_never_waits_for_a_commit(tmp_path: Path, held: threading.Event) -> None:
    """With the fold held, the tail answers at once; the committed watermark has not moved."""
    kw = KeywordIndex.open(tmp_path / "kw")
    kw.publish([doc(0, "parcel delivered")], [], 1)
    kw.flush()
    hold_fold(kw, held)
    kw.publish([doc(1, "parcel refund"), doc(2, "door code")], [], 3)
    texts = {1: "parcel delivered", 2: "parcel refund", 3: "door code"}
    found = kw.ranked("refund parcel", limit=5, text_of=texts.get)
    assert next(e for e, _s in found) == doc(1, "").event_id
    assert {e for e, _s in found} == {doc(0, "").event_id, doc(1, "").event_id}
    assert kw.committed_seq == 1
    held.set()
    kw.close()
