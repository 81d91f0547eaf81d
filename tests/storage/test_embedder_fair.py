"""The background embedder shares its backlog and its model time fairly between tenants
(storage/tenants/embedding.py): one tenant's flood of text-only batches holds back its own
appends, never another's, and another tenant's new events are embedded after at most a batch or
two of the flood, not after all of it. Counted, not timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from storage.embedders.base import HUNG, EmbedderError
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager

T0 = 1_800_000_000_000_000
DIM = 4
BATCH = 16
MAX_PENDING = 100


class GatedEmbedder:
    """A real Embedder (no model) that answers only while its gate is open, and records which
    tenant's texts each call carried (a text starts with its tenant's id)."""

    name = "test/fair-model"
    dim = DIM

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[list[str]] = []  # the tenant of each text, per call
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One vector per text, once the gate is open."""
        with self._lock:
            self.calls.append([t.split(":", 1)[0] for t in texts])
        self.gate.wait()
        rows = [np.eye(DIM, dtype=np.float32)[len(t) % DIM] for t in texts]
        return np.stack(rows) if rows else np.zeros((0, DIM), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """A query's vector."""
        return np.eye(DIM, dtype=np.float32)[0]

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[TenantManager, EmbeddingWorker, GatedEmbedder]]:
    """A manager whose tenants a started worker serves, its backlog bound MAX_PENDING."""
    embedder = GatedEmbedder()
    embedder.gate.set()  # open while the first event fixes the dimension
    worker = EmbeddingWorker(
        embedder, default_dim=DIM, batch=BATCH, max_pending=MAX_PENDING, linger=0
    )
    manager = TenantManager(tmp_path, embedding_dim=DIM, embedding=worker)
    worker.start()
    try:
        yield manager, worker, embedder
    finally:
        embedder.gate.set()
        worker.stop()
        manager.close_all()


def notes(tenant: str, start: int, n: int) -> list[NewEvent]:
    """Text-only notes of `tenant`, n of them."""
    return [
        NewEvent(kind="note", ts=T0 + start + i, text=f"{tenant}: note {start + i}")
        for i in range(n)
    ]


def wait_until(done: Callable[[], bool], secs: float = 30.0) -> None:
    """Poll until done() holds."""
    deadline = time.monotonic() + secs
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_tenants_flood_holds_back_its_own_appends_not_anothers(
    world: tuple[TenantManager, EmbeddingWorker, GatedEmbedder],
) -> None:
    manager, worker, embedder = world
    refused = {"flood": 0, "victim": 0}
    sent = {"flood": 0, "victim": 0}
    with manager.use("flood") as flood, manager.use("victim") as victim:
        embedder.gate.clear()  # the model is slow: nothing leaves the backlog meanwhile
        for round_ in range(12):
            # Each round, the flood tries a batch of 50 and the victim one of 2, each only if
            # the backlog has room for it (as the engine's back-pressure asks).
            for name, t, size in (("flood", flood, 50), ("victim", victim, 2)):
                if not worker.has_room(name):
                    refused[name] += 1
                    continue
                t.submit_append(notes(name, sent[name], size)).result()
                sent[name] += size
            wait_until(lambda: worker.pending() == sent["flood"] + sent["victim"])
            assert round_ or worker.pending() == 52
        # The flood filled the backlog, then was held back; the victim never was.
        assert refused["victim"] == 0 and sent["victim"] == 24
        assert refused["flood"] >= 9 and sent["flood"] <= MAX_PENDING + 50
        assert not worker.has_room("flood") and worker.has_room("victim")
        # A third tenant arriving now has its share too.
        assert worker.has_room("newcomer")
        embedder.gate.set()
        wait_until(lambda: worker.pending() == 0)
        assert worker.has_room("flood")


def test_another_tenants_events_are_embedded_after_a_batch_of_the_flood_not_all_of_it(
    world: tuple[TenantManager, EmbeddingWorker, GatedEmbedder],
) -> None:
    manager, worker, embedder = world
    with manager.use("flood") as flood, manager.use("victim") as victim:
        flood.submit_append(notes("warm", 0, 1)).result()
        wait_until(lambda: worker.pending() == 0)
        embedder.calls.clear()
        embedder.gate.clear()
        flood.submit_append(notes("flood", 1, 10 * BATCH)).result()
        wait_until(lambda: len(embedder.calls) == 1)  # the flood's first batch is on the model
        victim.submit_append(notes("victim", 0, 3)).result()
        embedder.gate.set()
        wait_until(lambda: worker.pending() == 0)
    owners = [call[0] for call in embedder.calls]
    assert owners.count("victim") == 1 and all(set(c) == {c[0]} for c in embedder.calls)
    # Served ahead of the victim: the batch on the model when it came, and at most one more.
    ahead = sum(len(c) for c in embedder.calls[: owners.index("victim")])
    assert ahead <= 2 * BATCH
    assert sum(len(c) for c in embedder.calls) == 10 * BATCH + 3


class HangingEmbedder(GatedEmbedder):
    """Hangs (fails as a call past its deadline does) on any batch with a text of `stuck`."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """HUNG if a text of the stuck tenant is in the batch, else vectors."""
        if any(t.startswith("stuck:") for t in texts):
            with self._lock:
                self.calls.append([t.split(":", 1)[0] for t in texts])
            raise EmbedderError(HUNG, "the model stopped answering")
        return super().embed(texts)


def test_a_batch_that_hangs_twice_leaves_its_tenant_keyword_only_and_no_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = HangingEmbedder()
    embedder.gate.set()
    worker = EmbeddingWorker(embedder, default_dim=DIM, batch=BATCH, max_pending=10, linger=0)
    manager = TenantManager(tmp_path, embedding_dim=DIM, embedding=worker)
    worker.start()
    try:
        with manager.use("stuck") as stuck, manager.use("other") as other:
            stuck.submit_append(notes("stuck", 0, 20)).result()
            wait_until(lambda: "stuck" in worker.keyword_only)
            # Tried once, back on the queue once, then no more: two calls in all.
            assert [c[0] for c in embedder.calls].count("stuck") == 2
            assert worker.failures_by.get(HUNG) == 2
            # Its text-only writes go on (never held back by its listed events), found by word.
            assert worker.has_room("stuck") and worker.pending() == 0
            stuck.submit_append(notes("stuck", 20, 20)).result()
            assert worker.has_room("stuck") and worker.pending() == 0
            hits = stuck.recall(RecallQuery(text="note 33", k=1)).hits
            assert [h.event.text for h in hits] == ["stuck: note 33"]
            # Every other tenant is embedded as before.
            other.submit_append(notes("other", 0, 5)).result()
            wait_until(lambda: other.unembedded_count() == 0)
            assert [c[0] for c in embedder.calls].count("stuck") == 2
    finally:
        worker.stop()
        manager.close_all()
    assert "found by keyword only" in caplog.text
