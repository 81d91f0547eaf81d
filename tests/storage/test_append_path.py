"""The append path's shortcuts keep their promises: coalesced keyword commits, read-your-writes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from storage import failpoints
from storage.index import keyword
from storage.index.keyword import KeywordDoc, KeywordIndex


def _doc(i: int) -> KeywordDoc:
    return KeywordDoc(f"00000000-0000-4000-8000-{i:012d}", "turn", f"parcel number{i}", {}, i)


@pytest.mark.timing
def test_fold_gathers_publishes_between_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no search waiting, publishes after a commit wait for the interval instead of committing each."""
    monkeypatch.setattr(keyword, "FOLD_INTERVAL_SECS", 30.0)
    index = KeywordIndex.open(tmp_path / "kw")
    try:
        index.publish([_doc(1)], [], 1)
        index.flush()
        for seq in range(2, 6):
            index.publish([_doc(seq)], [], seq)
        time.sleep(0.3)
        assert index.committed_seq == 1  # still gathering: no commit per publish
        started = time.monotonic()
        hits = index.search("number5", limit=5)  # a search does not wait out the interval
        assert time.monotonic() - started < 5.0
        assert [h[0] for h in hits] == [_doc(5).event_id]
        assert index.committed_seq == 5
    finally:
        index.close()


@pytest.mark.timing
def test_close_commits_gathered_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Close does not wait out the interval either, and what was gathered is durable on reopen."""
    monkeypatch.setattr(keyword, "FOLD_INTERVAL_SECS", 30.0)
    index = KeywordIndex.open(tmp_path / "kw")
    index.publish([_doc(1)], [], 1)
    index.flush()
    index.publish([_doc(2)], [], 2)
    started = time.monotonic()
    index.close()
    assert time.monotonic() - started < 5.0
    reopened = KeywordIndex.open(tmp_path / "kw", committed_seq=2)
    try:
        assert [h[0] for h in reopened.search("number2", limit=5)] == [_doc(2).event_id]
    finally:
        reopened.close()


def test_embedding_check_by_sum_stays_exact() -> None:
    """Finite float32 values pass; NaN, infinity or a value beyond float32 anywhere is refused."""
    from memspine.schemas import check_embedding
    from storage.errors import InvalidRequest

    big = 3.0e38  # near float32's largest: finite, and its sum overflows no float64
    assert check_embedding([big, big, -0.5]) == [big, big, -0.5]
    bad_ones = ([0.1, float("nan")], [float("inf"), float("-inf")], [big, big, float("nan")])
    for bad in (*bad_ones, [1e308, 1e308, -0.5]):  # beyond float32: refused (storage/model.py)
        with pytest.raises(InvalidRequest):
            check_embedding(bad)


def _live_docs(index: KeywordIndex) -> int:
    """The documents the committed index holds (deleted ones not counted)."""
    index.index.reload()
    return int(index.index.searcher().num_docs)


def test_new_documents_are_added_once_and_a_replay_replaces_them(tmp_path: Path) -> None:
    """publish(new=True) adds without deleting by id first; a replay (not new) still replaces."""
    index = KeywordIndex.open(tmp_path / "kw")
    try:
        index.publish([_doc(i) for i in range(1, 6)], [], 5, new=True)
        index.flush()
        assert _live_docs(index) == 5
        # A replay of the same ops (the log's watermark behind a durable commit): no doubles.
        index.publish([_doc(i) for i in range(1, 6)], [], 6)
        index.flush()
        assert _live_docs(index) == 5
        assert [h[0] for h in index.search("number3", limit=5)] == [_doc(3).event_id]
    finally:
        index.close()


def test_a_commit_that_failed_once_durable_leaves_no_document_twice(tmp_path: Path) -> None:
    """The fold's commit is durable and then fails (its searcher's reload): the retry adds the
    new documents again, deleting by id first."""
    index = KeywordIndex.open(tmp_path / "kw")
    failpoints.arm("keyword.reload", "eio", 1)
    try:
        index.publish([_doc(i) for i in range(1, 4)], [], 3, new=True)
        deadline = time.monotonic() + 30
        while index.committed_seq != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.committed_seq == 3
        assert failpoints.armed() == {}  # it did fail once
        assert _live_docs(index) == 3
    finally:
        failpoints.disarm_all()
        index.close()
