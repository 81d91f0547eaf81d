"""The local model in a child process (storage/embedders/child.py), with the real model: the
child runs below the server's priority, a child that is killed is started again and no vector is
lost, and close leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from storage.embedders import make_embedder
from storage.embedders.base import HUNG, EmbedderError
from storage.embedders.child import DIED, ChildEmbedder
from storage.model import NewEvent
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager
from tests.support.wait import wait_until

T0 = 1_800_000_000_000_000
HOUR = 3_600_000_000  # notes an hour apart: no chain between them, each vector its text's own
TEXTS = [
    "Lena wants status notes as three bullets",
    "no tables in the weekly report",
    "the deploy runs every Tuesday at nine",
    "Marco prefers tea to coffee",
]


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts: it was not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def nice_of(pid: int) -> int:
    """A process's nice value, from /proc (field 19 of stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_child_is_started_again_and_no_vector_is_lost(tmp_path: Path) -> None:
    embedder = make_embedder("local")
    assert isinstance(embedder, ChildEmbedder) and not embedder.loaded
    embedder.load()
    first = embedder.pid
    assert first is not None and first != os.getpid()
    # Capped at 19, the lowest priority: the worker running this test may itself run niced.
    assert nice_of(first) == min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + 10)
    # The restart below at the worker's own priority: niced, on a machine busy with the rest of
    # the suite, its start waited for a small CPU share (28 s of a quiet make test's 4 min).
    embedder.niceness = 0
    want = embedder.embed(TEXTS)
    assert want.shape == (4, 384) and np.allclose(np.linalg.norm(want, axis=1), 1, atol=1e-5)
    os.kill(first, signal.SIGKILL)
    worker, got = _vectors_made(tmp_path, embedder, 420)  # a restart, as below
    # The dead child was found on the first batch, counted, and a new one made every vector.
    assert worker.failures_by.get(DIED) == 1 and embedder.deaths == 1 and embedder.starts == 2
    assert np.allclose(np.asarray(got, dtype=np.float32), want, atol=1e-5)
    assert not alive(first)  # reaped, not a zombie
    second = embedder.pid
    assert second is not None and second != first
    # A query is made in this process, the same vector as the child's for the same text.
    assert np.allclose(embedder.embed_query(TEXTS[0]), want[0], atol=1e-5)
    embedder.close()
    assert not embedder.loaded and not alive(second)


def test_the_child_names_the_model_the_local_embedder_does() -> None:
    from storage.embedders import child, local

    assert (child.MODEL_NAME, child.DIM) == (local.MODEL_NAME, local.DIM)


def test_a_child_without_the_model_says_so(tmp_path: Path) -> None:
    embedder = ChildEmbedder(model_dir=tmp_path)
    with pytest.raises(Exception) as err:
        embedder.embed(["anything"])
    assert getattr(err.value, "reason", None) == "model_missing"
    assert str(tmp_path) not in str(err.value)  # no path reaches a client
    assert not embedder.loaded
    embedder.close()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_stopped_child_is_killed_at_its_deadline_and_its_batch_made_by_the_next(
    tmp_path: Path,
) -> None:
    # At the worker's own priority: the child's nice is the first test's subject; at +10 on a
    # machine busy with the rest of the suite its start and calls wait for a small CPU share.
    embedder = ChildEmbedder(niceness=0)
    embedder.load()
    first = embedder.pid
    assert first is not None
    started = time.perf_counter()
    want = embedder.embed(TEXTS)
    # The deadline: well above this machine's own first call of a child as just measured (the
    # next child's first call does the same work; so a loaded machine's slower calls are not
    # taken for hangs), far below the default. The test waits it out once.
    embedder.call_timeout = max(5.0, 6 * (time.perf_counter() - started))
    os.kill(first, signal.SIGSTOP)  # hung: alive, never answering
    # a restarted niced child may take minutes to start on a busy machine (START_TIMEOUT_SECS)
    worker, got = _vectors_made(tmp_path, embedder, 420)
    # The stopped child was killed once at its deadline; its batch went back and a new child
    # made every vector; the tenant was not left keyword-only.
    assert worker.failures_by.get(HUNG) == 1 and embedder.hangs == 1 and embedder.starts == 2
    assert not worker.keyword_only
    assert np.allclose(np.asarray(got, dtype=np.float32), want, atol=1e-5)
    assert not alive(first)  # killed and reaped
    embedder.close()


def test_a_start_has_its_own_deadline_and_one_past_it_is_killed() -> None:
    # A start held to half a second is killed as hung (not reported dead); the next call
    # starts a child under the real deadline.
    # a start takes seconds (imports, the model); at the worker's own priority, as above
    embedder = ChildEmbedder(start_timeout=0.5, niceness=0)
    with pytest.raises(EmbedderError) as refused:
        embedder.embed(TEXTS)
    assert refused.value.reason == HUNG
    assert (embedder.hangs, embedder.deaths, embedder.starts) == (1, 0, 1)
    assert embedder.pid is None
    embedder.start_timeout = 300.0
    try:
        assert embedder.embed(TEXTS[:1]).shape == (1, 384)
        assert (embedder.hangs, embedder.deaths, embedder.starts) == (1, 0, 2)
    finally:
        embedder.close()


def _vectors_made(
    root: Path, embedder: ChildEmbedder, secs: float
) -> tuple[EmbeddingWorker, list[list[float] | None]]:
    """TEXTS appended to a tenant under root through a worker of embedder; its vectors once
    every one is made (within secs), and the worker, stopped, for its counts."""
    worker = EmbeddingWorker(embedder, default_dim=384)
    manager = TenantManager(root, embedding_dim=384, embedding=worker)
    worker.start()
    try:
        with manager.use("t") as t:
            events = [NewEvent(kind="note", ts=T0 + i * HOUR, text=x) for i, x in enumerate(TEXTS)]
            ids = [a.event_id for a in t.submit_append(events).result()]
            wait_until(lambda: not t.unembedded_count(), "vectors made", secs)
            with t.log.reader() as r:
                got = [r.get(e).embedding for e in ids]  # type: ignore[union-attr]
    finally:
        worker.stop()
        manager.close_all()
    return worker, got
