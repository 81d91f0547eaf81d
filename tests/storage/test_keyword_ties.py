"""Equal BM25 scores at a search's cut rank by append order (seq), whatever the segments hold and
however deep the first search went: the same query gives the same hits in the same order across
a reopen, a copy built in another order, and the search-depth hint (storage/index/keyword.py,
Ties), with a bounded number of Tantivy searches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from storage.index import keyword
from storage.index.keyword import KeywordDoc, KeywordIndex
from storage.model import AppendResult, NewEvent
from storage.read.recall import RecallQuery, recall
from storage.tenants.tenant import Tenant
from tests.support.wait import remove_tree

# word -> how many documents hold it (each the same score for that word): runs shorter than the
# first search, past it, past TIE_FIRST, and up to TIE_HITS.
RUNS = {"parcel": 15, "refund": 40, "carrier": 300, "street": 900}
LIMITS = (1, 10, 25)


def docs() -> list[KeywordDoc]:
    """Each run's documents: the word and one other of the same length, so equal texts and
    different texts of equal length tie; some filler with neither."""
    out: list[KeywordDoc] = []
    seq = 0
    for word, n in RUNS.items():
        for i in range(n):
            seq += 1
            text = f"{word} other{i % 7}"
            out.append(KeywordDoc(f"e{seq:05d}", "turn", text, {}, seq))
    for i in range(200):
        seq += 1
        out.append(KeywordDoc(f"e{seq:05d}", "turn", f"filler{i} words here", {}, seq))
    return out


def build(path: Path, order: list[KeywordDoc], per_commit: int) -> KeywordIndex:
    """An index of these documents, added in this order and committed every per_commit."""
    kw = KeywordIndex.open(path)
    for lo in range(0, len(order), per_commit):
        kw.add(order[lo : lo + per_commit])
        kw.commit()
    return kw


def reversed_blocks(all_docs: list[KeywordDoc], size: int) -> list[KeywordDoc]:
    """Blocks of size from the newest, each newest first: every segment holds its documents in
    the opposite of append order, and later events sit in earlier segments."""
    out: list[KeywordDoc] = []
    for hi in range(len(all_docs), 0, -size):
        out += reversed(all_docs[max(0, hi - size) : hi])
    return out


def answers(kw: KeywordIndex) -> dict[tuple[str, int], list[tuple[str, float]]]:
    return {(w, n): kw.search(w, limit=n) for w in RUNS for n in LIMITS}


def oldest(word: str, n: int) -> list[str]:
    """The ids a search of word must return at limit n: the run's first n by seq."""
    return [d.event_id for d in docs() if d.text.split()[0] == word][:n]


def test_equal_scores_rank_oldest_first_whatever_the_segments(tmp_path: Path) -> None:
    kw = build(tmp_path / "kw", reversed_blocks(docs(), 97), 97)
    try:
        searcher = kw._view.searcher
        raw = searcher.search(kw._view.query(["street"], None, None), 10, count=False).hits
        raw_ids = [searcher.doc(addr).get_first("id") for _s, addr in raw]
        assert raw_ids != oldest("street", 10)  # Tantivy's own order is not append order here
        for (word, n), hits in answers(kw).items():
            assert [e for e, _s in hits] == oldest(word, n), (word, n)
            assert len({s for _e, s in hits}) == 1  # one run of equal scores
    finally:
        kw.close()


def test_the_same_hits_after_a_reopen_and_in_a_copy_built_in_another_order(
    tmp_path: Path,
) -> None:
    first = build(tmp_path / "a", reversed_blocks(docs(), 61), 61)
    seen = answers(first)
    first.close()
    again = KeywordIndex.open(tmp_path / "a")
    copy = build(tmp_path / "b", docs(), 500)
    try:
        assert answers(again) == seen
        assert answers(copy) == seen
    finally:
        again.close()
        copy.close()


@pytest.mark.parametrize("score", [0, keyword.TIE_MAX])
def test_the_first_search_depth_changes_the_cost_not_the_answer(tmp_path: Path, score: int) -> None:
    kw = build(tmp_path / "kw", reversed_blocks(docs(), 97), 97)
    try:
        expected = {(w, n): oldest(w, n) for w in RUNS for n in LIMITS}
        for key in expected:
            kw._ties.score = score  # held: each search starts shallow, or deep
            assert [e for e, _s in kw.search(key[0], limit=key[1])] == expected[key], key
    finally:
        kw.close()


class CountingSearcher:
    """A real searcher that counts its searches (stands in for View.searcher)."""

    def __init__(self, searcher: Any) -> None:
        self.searcher = searcher
        self.searches: list[int] = []

    def search(self, query: Any, limit: int, **kw: Any) -> Any:
        self.searches.append(limit)
        return self.searcher.search(query, limit, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.searcher, name)


def test_where_most_cuts_tie_a_search_takes_one_tantivy_search(tmp_path: Path) -> None:
    kw = build(tmp_path / "kw", reversed_blocks(docs(), 97), 97)
    try:
        counting = CountingSearcher(kw._view.searcher)
        kw._view.searcher = counting
        kw.search("refund", limit=10)  # 40 equal scores: the cut ties past the first 21
        assert counting.searches == [21, 42]
        counting.searches.clear()
        kw.search("street", limit=10)  # 900: the chain doubles until the run ends
        assert counting.searches == [21, 42, 84, 168, 336, 672, 10 + keyword.TIE_HITS]
        for _ in range(keyword.TIE_COMMON):
            kw.search("refund", limit=10)
        assert kw._ties.common()
        counting.searches.clear()
        hits = kw.search("refund", limit=10)
        assert counting.searches == [10 + keyword.TIE_FIRST]
        assert [e for e, _s in hits] == oldest("refund", 10)
        counting.searches.clear()
        kw.search("street", limit=10)
        assert counting.searches == [266, 532, 10 + keyword.TIE_HITS]
        # Cuts that do not tie bring the first search back to its shallow depth.
        for _ in range(keyword.TIE_MAX):
            kw.search("filler3", limit=10)
        assert not kw._ties.common()
        counting.searches.clear()
        kw.search("filler3 words", limit=10)
        assert counting.searches[0] == 21
    finally:
        kw.close()


def test_fused_recall_over_equal_texts_answers_alike_after_a_restart_and_a_rebuild(
    tmp_path: Path,
) -> None:
    """A tenant appended in many small commits (many segments, merged as Tantivy chooses), the
    same after a restart, and the same again once its keyword index is rebuilt from the log
    (one segment in append order), as an import's copy would be."""
    root = tmp_path / "t"
    texts = ["the parcel was signed for at the door"] * 150 + ["a refund for a lost parcel"] * 50
    batch = [
        NewEvent(
            kind="turn",
            ts=1_000_000 + i,
            text=text,
            embedding=[1.0, float(i % 3), 0.5, 0.25],
            event_id=f"00000000-0000-4000-8000-{i:012d}",
        )
        for i, text in enumerate(texts)
    ]
    queries = [
        RecallQuery(text="parcel signed door", k=10),
        RecallQuery(text="refund parcel", embedding=[1.0, 1.0, 0.5, 0.25], k=10),
    ]

    def ask() -> list[list[str]]:
        t = Tenant.open("ties", root, embedding_dim=4)
        try:
            with t.log.reader() as r:
                return [
                    [h.event.event_id for h in recall(r, t.keyword, t.vectors, q).hits]
                    for q in queries
                ]
        finally:
            t.close()

    t = Tenant.open("ties", root, embedding_dim=4)
    try:
        for lo in range(0, len(batch), 5):  # many small commits: many segments
            done = t.submit_append(batch[lo : lo + 5]).result()
            assert all(isinstance(r, AppendResult) for r in done)
            t.keyword.flush()
    finally:
        t.close()
    before = ask()
    assert before[0] == [e.event_id for e in batch[:10]]  # the oldest of 150 equal texts
    assert ask() == before
    remove_tree(root / "keyword")  # rebuilt from the log on open
    assert ask() == before
