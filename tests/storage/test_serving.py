"""The server-embedding policy in storage (storage/tenants/serving.py): appends held back while
the embedder's backlog is full, a recall that waits for vectors woken by their write rather than
by a poll, and recall by text given the embedder's vector and the feedback step."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from storage.embedders.base import QueryCache
from storage.errors import Unavailable
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants import serving
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager
from storage.tenants.serving import ServerVectors
from tests.support.embedders import CountingEmbedder

T0 = 1_800_000_000_000_000


def note(i: int) -> NewEvent:
    """A text-only event (the server makes its vector)."""
    return NewEvent(kind="note", ts=T0 + i, text=f"note {i} about okapis")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[EmbeddingWorker, TenantManager]]:
    """A worker (not started: nothing is embedded until a test starts it) and its manager."""
    worker = EmbeddingWorker(CountingEmbedder(), default_dim=4, max_pending=2, linger=0.0)
    manager = TenantManager(tmp_path, embedding_dim=4, embedding=worker)
    try:
        yield worker, manager
    finally:
        worker.stop()
        manager.close_all()


def test_appends_wait_for_room_then_are_refused(
    world: tuple[EmbeddingWorker, TenantManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, manager = world
    policy = ServerVectors(worker)
    with manager.use("t") as t:
        assert not policy.must_wait(t, [note(0)])  # room: no wait
        t.submit_append([note(0), note(1)]).result(10)
        assert worker.pending() == 2
        assert policy.must_wait(t, [note(2)])
        with_vector = NewEvent(kind="note", ts=T0, text="x", embedding=[0.5, 0.5, 0.5, 0.5])
        assert not policy.must_wait(t, [with_vector])  # lists nothing for the embedder
        monkeypatch.setattr(serving, "BACKLOG_WAIT_SECS", 0.2)
        with pytest.raises(Unavailable, match="embedder is behind"):
            policy.wait_for_room()
        worker.start()  # the backlog drains: the wait ends
        monkeypatch.setattr(serving, "BACKLOG_WAIT_SECS", 30.0)
        policy.wait_for_room()
        assert worker.has_room()


def test_a_recall_waiting_for_vectors_is_woken_by_their_write(
    world: tuple[EmbeddingWorker, TenantManager],
) -> None:
    worker, manager = world
    policy = ServerVectors(worker)
    with manager.use("t") as t:
        t.submit_append([note(0)]).result(10)
        waited: Future[int] = Future()

        def recall() -> None:
            try:
                hits = policy.recall(t, RecallQuery(text="okapis", k=1), wait_for_vectors=True)
                waited.set_result(len(hits.hits))
            except BaseException as exc:
                waited.set_exception(exc)

        threading.Thread(target=recall).start()
        # The worker is not started: nothing can be written, so the recall still waits.
        seen = worker.written()
        assert not worker.wait_written(seen, 0.3) and not waited.done()
        worker.start()
        assert waited.result(20) == 1
        assert t.unembedded_count() == 0
        # Recall by text in a server-space tenant: the embedder's vector and the feedback step.
        assert policy.answers_at_once(t, RecallQuery(text="okapis", k=1)) is False
        result = policy.recall(t, RecallQuery(text="okapis", k=1))
        assert [h.event.text for h in result.hits] == ["note 0 about okapis"]
        assert result.hits[0].event.embedding is None  # answers never carry vectors


def test_a_recall_whose_vectors_never_come_is_refused_in_time(
    world: tuple[EmbeddingWorker, TenantManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, manager = world  # never started: no vector is ever written
    policy = ServerVectors(worker)
    monkeypatch.setattr(serving, "VECTORS_WAIT_SECS", 0.3)
    with manager.use("t") as t:
        t.submit_append([note(0)]).result(10)
        with pytest.raises(Unavailable, match="still await their vectors"):
            policy.recall(t, RecallQuery(text="okapis", k=1), wait_for_vectors=True)
        assert t.unembedded_count() == 1


def test_without_an_embedder_every_step_is_a_no_op(tmp_path: Path) -> None:
    policy = ServerVectors(None)
    manager = TenantManager(tmp_path, embedding_dim=4)
    try:
        with manager.use("t") as t:
            t.submit_append([note(0)]).result(10)
            assert not policy.must_wait(t, [note(1)])
            policy.wait_for_room()
            policy.wait_for_vectors(t)
            assert policy.answers_at_once(t, RecallQuery(text="okapis", k=1))
            assert len(policy.recall(t, RecallQuery(text="okapis", k=1)).hits) == 1
    finally:
        manager.close_all()


class QueryRecorder(CountingEmbedder):
    """The counting embedder with a real query LRU, recording each query text it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.embedded: list[str] = []
        self.queries = QueryCache()

    def embed_query(self, text: str) -> np.ndarray:
        """A query's vector, from the LRU when it has it; the texts embedded are recorded."""
        return self.queries.get(text, self._embed)

    def _embed(self, text: str) -> np.ndarray:
        self.embedded.append(text)
        return super().embed_query(text)


def test_the_question_is_embedded_less_the_people_it_names(tmp_path: Path) -> None:
    embedder = QueryRecorder()
    worker = EmbeddingWorker(embedder, default_dim=4, linger=0.0)
    manager = TenantManager(tmp_path, embedding_dim=4, embedding=worker)
    policy = ServerVectors(worker)
    try:
        worker.start()
        with manager.use("t") as t:
            said = NewEvent(
                kind="turn",
                ts=T0,
                text="Nate: I fed the turtles",
                properties_raw=b'{"speaker":"Nate"}',
            )
            t.submit_append([said]).result(10)
            asked = RecallQuery(text="What does Nate feed his turtles?", k=1)
            assert not policy.answers_at_once(t, asked)
            result = policy.recall(t, asked, wait_for_vectors=True)
            assert [h.event.text for h in result.hits] == ["Nate: I fed the turtles"]
            assert embedder.embedded == ["What does   feed his turtles?"]
            # The LRU holds the text embedded: the same question is answered at once.
            assert policy.answers_at_once(t, asked)
            # The keyword arm still reads the name: the text as asked finds the turn alone.
            assert policy.recall(t, RecallQuery(text="Nate", k=1)).hits
            assert embedder.embedded[-1] == "Nate"  # nothing else: the text as asked
    finally:
        worker.stop()
        manager.close_all()
