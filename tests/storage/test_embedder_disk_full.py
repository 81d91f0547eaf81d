"""The background embedder on a full disk (storage/tenants/embedding.py), made full by the log's
failpoint (storage/failpoints.py) so it runs without the root a small filesystem needs: the
vectors it made wait in memory and are written once there is room, without asking the embedder
again; it backs off, logs once, counts `disk_full`; appends are refused meanwhile and nothing
acknowledged is lost. tests/e2e/test_embedding_disk_full.py fills a real filesystem under a
real server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from storage import failpoints
from storage.errors import DiskFull
from storage.model import NewEvent
from storage.read.recall import RecallQuery
from storage.tenants import embedding
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant
from tests.support.embedders import DIM, CountingEmbedder, unit

T0 = 1_800_000_000_000_000


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    """No test leaves a failpoint armed for the next."""
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[TenantManager, EmbeddingWorker, CountingEmbedder]]:
    """A manager whose tenants a started embedding worker serves."""
    embedder = CountingEmbedder()
    worker = EmbeddingWorker(embedder, default_dim=DIM, batch=64)
    manager = TenantManager(tmp_path, embedding_dim=DIM, embedding=worker)
    worker.start()
    try:
        yield manager, worker, embedder
    finally:
        worker.stop()
        manager.close_all()


def note(i: int) -> NewEvent:
    """Text-only note i (its word `wordNq` is its own)."""
    return NewEvent(kind="note", ts=T0 + i, text=f"word{i}q in a note")


def wait_until(done: Callable[[], bool], secs: float = 20.0) -> None:
    """Poll until done() holds."""
    deadline = time.monotonic() + secs
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def check_tenant(t: Tenant, acked: dict[str, int]) -> None:
    """Every acknowledged event is stored with its vector, found by its word and by its vector."""
    with t.log.reader() as r:
        for e, i in acked.items():
            ev = r.get(e)
            assert ev is not None and ev.embedding is not None, e
            assert np.allclose(ev.embedding, unit(f"word{i}q in a note"), atol=1e-6)
    for e, i in acked.items():
        by_word = t.recall(RecallQuery(text=f"word{i}q", k=1)).hits
        assert [h.event.event_id for h in by_word] == [e]
        by_vector = t.recall(RecallQuery(embedding=unit(f"word{i}q in a note").tolist(), k=1))
        assert [h.event.event_id for h in by_vector.hits] == [e]


def test_vectors_made_while_the_disk_is_full_are_written_once_it_has_room(
    world: tuple[TenantManager, EmbeddingWorker, CountingEmbedder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, worker, embedder = world
    with manager.use("acme") as t:
        # The first events get their vectors; the tenant is server-space.
        results = t.submit_append([note(i) for i in range(5)]).result()
        acked = {r.event_id: i for i, r in enumerate(results)}  # type: ignore[union-attr]
        wait_until(lambda: t.unembedded_count() == 0)
        calls_before = len(embedder.calls)
        with caplog.at_level(logging.INFO, logger="memspine.embedding"):
            # The next append is the last write the disk takes: every log commit after it
            # fails with ENOSPC, the embedder's writes of its vectors included.
            failpoints.arm("log.commit", "enospc", after=1)
            more = range(5, 150)
            results = t.submit_append([note(i) for i in more]).result()
            acked.update({r.event_id: i for i, r in zip(more, results, strict=True)})  # type: ignore[union-attr]
            wait_until(lambda: worker.failures_by.get(embedding.DISK_FULL, 0) >= 2)
            with pytest.raises(DiskFull):  # appends are refused, nothing written
                t.submit_append([note(999)]).result()
            # Recall answers meanwhile: by word for everything, by vector for what has one.
            first = next(iter(acked))
            hits = t.recall(RecallQuery(text="word0q", k=1)).hits
            assert [h.event.event_id for h in hits] == [first]
            hits = t.recall(RecallQuery(embedding=unit("word0q in a note").tolist(), k=1)).hits
            assert [h.event.event_id for h in hits] == [first]
            assert [h.event.event_id for h in t.recall(RecallQuery(text="word149q", k=1)).hits] == [
                next(e for e, i in acked.items() if i == 149)
            ]
            assert worker.pending() == 145  # the backlog in view (memspine_embeddings_pending)
            assert worker.last_error == embedding.DISK_FULL
            # The vectors made are kept for the next try: the embedder is not asked again for
            # the same texts while the disk is full, however often the write is refused.
            assert embedder.calls[calls_before:] == [64]
            failpoints.disarm_all()  # space is freed
            # The worker counts a tenant's backlog again after each batch it writes.
            wait_until(lambda: t.unembedded_count() == 0 and worker.pending() == 0)
        assert worker.pending() == 0 and worker.last_error is None
        assert sum(embedder.calls[calls_before:]) == 145  # each text embedded once
        check_tenant(t, acked)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "disk is full" in m]) == 1, messages  # not once a try
    assert [m for m in messages if "resumed" in m], messages
    assert all(r.exc_info is None for r in caplog.records)  # a refusal, not a bug: no traceback


def test_a_full_disk_backs_off_rather_than_spin(
    world: tuple[TenantManager, EmbeddingWorker, CountingEmbedder],
) -> None:
    manager, worker, _embedder = world
    with manager.use("acme") as t:
        t.submit_append([note(i) for i in range(3)]).result()
        wait_until(lambda: t.unembedded_count() == 0)
        failpoints.arm("log.commit", "enospc", after=1)  # this append is the last write taken
        t.submit_append([note(i) for i in range(3, 10)]).result()
        wait_until(lambda: worker.failures_by.get(embedding.DISK_FULL, 0) >= 1)
        time.sleep(1.6)
        # 0.5 s doubling: tries again at about 0.5 and 1.5 s after the first. A loop that did
        # not back off would have tried hundreds of times; a slow machine only tries fewer.
        assert worker.failures_by[embedding.DISK_FULL] <= 4, worker.failures_by
        assert t.unembedded_count() == 7
