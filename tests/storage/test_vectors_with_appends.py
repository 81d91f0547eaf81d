"""Server vectors committed in an append group's transaction (storage/tenants/tenant.py,
VectorJob): one durable commit for both, every acknowledged event and every vector kept across
a reopen and a kill, a delete racing the write, a refusal of one never costing the other; the
writer's linger that lets a vector write wait for an append (storage/tenants/writer.py); the
embedding worker's linger on a small backlog and the hurry of a recall that waits for it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from storage import failpoints
from storage.errors import DiskFull
from storage.model import ItemRefused, NewEvent, Quota, ServerSpace, StoredVector
from storage.read.recall import RecallQuery
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant
from storage.tenants.writer import GroupWriter, Job
from tests.support.embedders import CountingEmbedder

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000_000_000
MINUTE = 60_000_000
MODEL = "test/disk-model"  # CountingEmbedder's name
OFFER = ServerSpace(model=MODEL, dim=4)


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    """No test leaves a failpoint armed for the next."""
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def open_tenant(root: Path) -> Tenant:
    """A tenant of dimension 4 that the test's embedder serves."""
    return Tenant.open("t", root, embedding_dim=4, offer=lambda: OFFER)


def ev(i: int, kind: str = "note") -> NewEvent:
    """Text-only event i, i minutes after T0 (its word `wordNq` is its own)."""
    return NewEvent(kind=kind, ts=T0 + i * MINUTE, text=f"word{i}q in a note")


def unit(text: str) -> list[float]:
    """A vector for text, the same in every process (str hashes are not: the kill test's
    writer is another process)."""
    v = np.random.default_rng(zlib.crc32(text.encode())).standard_normal(4)
    return (v / np.linalg.norm(v)).tolist()


def vectors_for(t: Tenant) -> tuple[list[StoredVector], int]:
    """The listed events' vectors as the embedder makes them, and the delete count then."""
    events, _before, deletes, model = t.to_embed(1000)
    assert model == MODEL
    items = [StoredVector(e.event_id, e.seq, unit(e.text or "")) for e in events]
    return items, deletes


def commits(t: Tenant) -> int:
    """LMDB write transactions committed in the tenant's log so far."""
    with t.log.environment() as env:
        return int(env.info()["last_txnid"])


@contextmanager
def one_batch(t: Tenant) -> Iterator[None]:
    """The tenant's writer held busy while the block runs: what it submits is its next batch."""
    gate, busy = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        gate.wait(10)

    t.call(hold)
    assert busy.wait(10)
    try:
        yield
    finally:
        gate.set()


def listed(t: Tenant) -> list[str]:
    """Ids of the events awaiting their server vector, oldest first."""
    with t.log.reader() as r:
        return [e for _seq, e in r.unembedded(1000)]


def found_by_vector(t: Tenant, i: int) -> str:
    """The id recall by event i's vector ranks first."""
    hits = t.recall(RecallQuery(embedding=unit(f"word{i}q in a note"), k=1)).hits
    return hits[0].event.event_id


def check(t: Tenant, with_vectors: dict[str, int], without: dict[str, int]) -> None:
    """Every event stored and found by its word; those given a vector found by it."""
    with t.log.reader() as r:
        for e in with_vectors:
            assert r.get(e).embedding is not None, e  # type: ignore[union-attr]
        for e in without:
            assert r.get(e).embedding is None, e  # type: ignore[union-attr]
    for e, i in {**with_vectors, **without}.items():
        hits = t.recall(RecallQuery(text=f"word{i}q", k=1)).hits
        assert [h.event.event_id for h in hits] == [e]
    for e, i in with_vectors.items():
        assert found_by_vector(t, i) == e
    assert sorted(listed(t)) == sorted(without)


def ride(t: Tenant) -> tuple[dict[str, int], dict[str, int]]:
    """Four events, then their vectors and four more events in one batch of the writer: the
    events with a vector and those awaiting one, by id to their number."""
    first = t.submit_append([ev(i) for i in range(4)]).result()
    items, deletes = vectors_for(t)
    before = commits(t)
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        later = t.submit_append([ev(i) for i in range(4, 8)])
    assert wrote.result(10) == 4
    second = later.result(10)
    assert commits(t) == before + 1  # one durable commit for the appends and the vectors
    return (
        {r.event_id: i for i, r in enumerate(first)},  # type: ignore[union-attr]
        {r.event_id: i for i, r in enumerate(second, 4)},  # type: ignore[union-attr]
    )


def test_vectors_and_appends_in_one_commit_survive_a_reopen(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    with_vectors, without = ride(t)
    check(t, with_vectors, without)  # projected from memory as catch_up would
    t.close()
    t = open_tenant(tmp_path / "t")
    check(t, with_vectors, without)
    t.close()


_RIDE_AND_DIE = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
import test_vectors_with_appends as m
t = m.open_tenant(Path(sys.argv[1]))
print(json.dumps(m.ride(t)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close: neither index saved
"""


def test_vectors_and_appends_in_one_commit_survive_a_kill(tmp_path: Path) -> None:
    import json

    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    died = subprocess.run(
        [sys.executable, "-c", _RIDE_AND_DIE, str(tmp_path / "t"), here],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert died.returncode == -9, died.stderr
    with_vectors, without = json.loads(died.stdout)
    t = open_tenant(tmp_path / "t")  # catch_up replays the appends, then the vectors
    check(t, with_vectors, without)
    t.close()


def test_a_vector_write_beside_a_delete_goes_after_it_and_is_made_again(
    tmp_path: Path,
) -> None:
    t = open_tenant(tmp_path / "t")
    a, b, c = (r.event_id for r in t.submit_append([ev(i) for i in range(3)]).result())  # type: ignore[union-attr]
    items, deletes = vectors_for(t)
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        deleted = t.submit_delete([b])
        appended = t.submit_append([ev(3)])
    assert deleted.result(10) == [b]
    assert wrote.result(10) is None  # stale: a chain may carry the deleted event
    (d,) = (r.event_id for r in appended.result(10))  # type: ignore[union-attr]
    assert listed(t) == [a, c, d]  # nothing lost: made again by the embedder
    # Made before a delete that committed first: refused though appends could carry it.
    items, deletes = vectors_for(t)
    t.submit_delete([c]).result()
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        appended = t.submit_append([ev(4)])
    assert wrote.result(10) is None
    (e,) = (r.event_id for r in appended.result(10))  # type: ignore[union-attr]
    assert listed(t) == [a, d, e]
    t.close()


def test_a_cascade_queued_before_a_carried_vector_write_clears_its_chain(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    # Turns a minute apart: one chain, each turn's vector carrying the one before it.
    a, b, c = (r.event_id for r in t.submit_append([ev(i, "turn") for i in range(3)]).result())  # type: ignore[union-attr]
    items, deletes = vectors_for(t)
    with one_batch(t):
        cascade = t.submit_delete_cascade(b)
        wrote = t.store_vectors(items, MODEL, deletes)
        t.submit_append([ev(3, "note")])
    # The vectors ride with the append, before the cascade's call runs: the delete then
    # finds c's vector, which carried b's, and lists c again.
    assert wrote.result(10) == 3
    assert cascade.result(10) == [b]
    assert c in listed(t)
    with t.log.reader() as r:
        assert r.get(a).embedding is not None  # type: ignore[union-attr]
        assert r.get(c).embedding is None  # type: ignore[union-attr]
    t.close()


def test_a_full_disk_refusing_the_group_refuses_the_vectors_not_the_appends(
    tmp_path: Path,
) -> None:
    t = open_tenant(tmp_path / "t")
    first = t.submit_append([ev(i) for i in range(4)]).result()
    items, deletes = vectors_for(t)
    failpoints.arm("log.commit", "enospc", 1)  # the group's commit fails, then there is room
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        later = t.submit_append([ev(i) for i in range(4, 6)])
    with pytest.raises(DiskFull):
        wrote.result(10)
    second = later.result(10)  # committed again alone
    awaiting = {r.event_id: i for i, r in enumerate([*first, *second])}  # type: ignore[union-attr]
    check(t, {}, awaiting)  # the vectors' events still listed: the embedder keeps and retries
    assert t.store_vectors(items, MODEL, deletes).result(10) == 4
    # A full disk that refuses the appends too refuses both; nothing acknowledged is lost.
    items, deletes = vectors_for(t)
    failpoints.arm("log.commit", "enospc", 2)
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        refused = t.submit_append([ev(9)])
    with pytest.raises(DiskFull):
        wrote.result(10)
    with pytest.raises(DiskFull):
        refused.result(10)
    assert t.store_vectors(items, MODEL, deletes).result(10) == 2
    given = {r.event_id: i for i, r in enumerate([*first, *second])}  # type: ignore[union-attr]
    check(t, given, {})
    t.close()


def test_an_append_refused_in_the_group_keeps_the_vectors_beside_it(tmp_path: Path) -> None:
    t = open_tenant(tmp_path / "t")
    first = t.submit_append([ev(i) for i in range(3)]).result()
    items, deletes = vectors_for(t)
    with one_batch(t):
        wrote = t.store_vectors(items, MODEL, deletes)
        # Refused by its quota (one event more than the tenant may hold), atomically.
        refused = t.submit_append([ev(3), ev(4)], quota=Quota(max_events=4), atomic=True)
    assert wrote.result(10) == 3
    with pytest.raises(ItemRefused):
        refused.result(10)
    check(t, {r.event_id: i for i, r in enumerate(first)}, {})  # type: ignore[union-attr]
    t.close()


class Named(Job[None]):
    """A job known by its name."""

    __slots__ = ("name",)

    def __init__(self, name: str, linger: float = 0.0) -> None:
        super().__init__(linger)
        self.name = name


@pytest.mark.timing
def test_a_lingering_job_waits_for_one_that_does_not_to_share_its_batch() -> None:
    batches: list[list[str]] = []

    def answer(jobs: list[Named]) -> None:
        batches.append([j.name for j in jobs])
        for j in jobs:
            j.answer(None)

    def submit(name: str, linger: float = 0.0) -> Future[None]:
        job = Named(name, linger)
        writer.submit(job)
        return job.future

    writer: GroupWriter[Named] = GroupWriter("w", answer)
    try:
        started = time.monotonic()
        lingering = submit("vectors", linger=30.0)
        time.sleep(0.05)
        submit("append").result(10)
        lingering.result(10)
        assert time.monotonic() - started < 10  # it went with the append, not after 30 s
        assert batches == [["vectors", "append"]]
        started = time.monotonic()
        submit("alone", linger=0.2).result(10)
        assert time.monotonic() - started >= 0.2  # nothing came: committed once it was due
        assert batches[-1] == ["alone"]
    finally:
        writer.stop()


def test_a_notice_that_read_its_count_before_an_append_keeps_the_append_listed(
    tmp_path: Path,
) -> None:
    """The worker's own notice after a batch reads the count, then an append commits and its
    notice lists the tenant, then the worker's takes its stale count in: the tenant must stay
    listed (it was forgotten, and the new event waited for the tenant's next change)."""
    worker = EmbeddingWorker(CountingEmbedder(), default_dim=4, linger=60.0)  # not started
    manager = TenantManager(tmp_path, embedding_dim=4, embedding=worker)
    read, go_on = threading.Event(), threading.Event()
    with manager.use("t") as t:

        class ReadEarly:
            """The tenant, its first count read before the append and handed over after it."""

            tenant_id = t.tenant_id
            reads = 0

            def unembedded_count(self) -> int:
                self.reads += 1
                count = t.unembedded_count()
                if self.reads == 1:
                    read.set()
                    go_on.wait(60)
                return count

        early = ReadEarly()
        notice = threading.Thread(target=worker.notice, args=(early,))
        notice.start()
        assert read.wait(60)
        t.submit_append([ev(0)]).result()
        wait_until(lambda: worker.pending() == 1)  # the append's own notice listed it
        go_on.set()
        notice.join(60)
        assert early.reads == 2  # the count was read again, not taken in stale
        assert worker.pending() == 1
        worker.hurry("t")  # a recall waiting for the vector finds the tenant listed
        worker.start()
        try:
            wait_until(lambda: t.unembedded_count() == 0)
        finally:
            worker.stop()


def test_the_worker_lingers_on_a_small_backlog_unless_a_recall_hurries_it(
    tmp_path: Path,
) -> None:
    embedder = CountingEmbedder()
    worker = EmbeddingWorker(embedder, default_dim=4, linger=0.5)
    manager = TenantManager(tmp_path, embedding_dim=4, embedding=worker)
    worker.start()
    try:
        with manager.use("t") as t:
            t.submit_append([ev(0)]).result()
            started = time.monotonic()
            t.submit_append([ev(1), ev(2)]).result()
            wait_until(lambda: t.unembedded_count() == 0)
            assert time.monotonic() - started >= 0.4  # lingered (from the first's list)
            assert embedder.calls == [3]  # one call for the three
            worker.linger = 60.0
            t.submit_append([ev(3)]).result()
            time.sleep(0.2)
            assert t.unembedded_count() == 1
            worker.hurry("t")  # what a recall with wait_for_vectors does
            wait_until(lambda: t.unembedded_count() == 0)
            # A backlog of a write's worth or more is embedded at once.
            t.submit_append([ev(i) for i in range(10, 10 + worker.write_chunk)]).result()
            wait_until(lambda: t.unembedded_count() == 0)
    finally:
        worker.stop()
        manager.close_all()


def wait_until(done: Any, secs: float = 20.0) -> None:
    """Poll until done() holds."""
    deadline = time.monotonic() + secs
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
