"""The writer pool every open tenant shares (storage/tenants/pool.py), with real tenants: its
threads do not grow with the tenants written, a flooding tenant gets its turn and no more, a
tenant's writes are committed in order and never by two threads at once, and a tenant closed
with writes queued (evicted under load) commits them first."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage.errors import Unavailable
from storage.model import AppendResult, NewEvent
from storage.tenants.manager import TenantManager
from storage.tenants.pool import MAX_BATCH, WriterPool
from storage.tenants.tenant import Tenant, TenantHooks
from storage.tenants.writer import GroupWriter, Job
from tests.support.budget import size
from tests.support.wait import wait_until

DIM = 4


def event(n: int, text: str | None = None) -> NewEvent:
    """One small event numbered n."""
    return NewEvent(kind="note", ts=1_800_000_000_000_000 + n, text=text, embedding=[1, 0, 0, n])


def logged_ids(t: Tenant) -> list[str]:
    """The tenant's appended event ids in the order of its log."""
    return t.snapshot_read(lambda r: [e for _seq, _op, e in r.ops_after(0)])


def ids_of(futures: list[Future[list[AppendResult]]]) -> list[str]:
    """The ids the appends were answered with, in the order they were submitted."""
    return [r.event_id for f in futures for r in f.result(timeout=120)]


@contextmanager
def pooled(tmp_path: Path, threads: int, names: list[str], groups: list[str] | None = None):  # type: ignore[no-untyped-def]
    """Tenants opened on a pool of their own; each group commit's tenant noted in `groups`."""
    pool = WriterPool(threads, name="test-writer")
    tenants = {}
    for name in names:
        hooks = TenantHooks(
            on_batch=None if groups is None else (lambda _n, k=name: groups.append(k))
        )
        tenants[name] = Tenant.open(
            name, tmp_path / name, embedding_dim=DIM, hooks=hooks, writers=pool
        )
    try:
        yield tenants
    finally:
        for t in tenants.values():
            t.close()
        pool.close()


def python_threads() -> list[str]:
    """The names of this process's Python threads but those each open tenant's indexes run of
    their own (storage/index/: the vector inserter, the keyword fold)."""
    return sorted(t.name for t in threading.enumerate() if t.name not in ("vectors", "keyword"))


@pytest.mark.long
def test_the_threads_are_the_same_with_200_written_tenants_open_as_with_one(
    tmp_path: Path,
) -> None:
    manager = TenantManager(tmp_path, embedding_dim=DIM, max_open=300, writer_threads=3)

    def write(name: str) -> None:
        with manager.use(name) as t:
            t.submit_append([event(0)]).result(timeout=120)

    # 200 tenants under make test-long; 60 (still 20 a writer thread) under make test
    names = [f"t{i}" for i in range(size(200, 60))]
    try:
        with ThreadPoolExecutor(8) as submitters:  # at once: shared pools grow to their bounds
            list(submitters.map(write, names))
        assert manager.open_count() == len(names)
        many = python_threads()
        for name in names[1:]:  # closed: what a tenant ran of its own goes with it
            with manager.exclusive(name):
                pass
        assert manager.open_count() == 1
        one = python_threads()
        assert many == one
        # not one a tenant (counted on this manager's pool: the process-wide pool of tenants
        # opened without a manager keeps the threads earlier tests in this process started)
        assert 1 <= manager.writers.threads() <= 3
        assert manager.writers.groups >= len(names)  # every tenant's write went through the pool
    finally:
        manager.close_all()
    assert manager.writers.threads() == 0  # closed with the manager


def test_a_flooding_tenant_gets_one_group_a_turn_and_another_tenants_append_goes_next(
    tmp_path: Path,
) -> None:
    groups: list[str] = []
    with pooled(tmp_path, 1, ["flood", "quiet"], groups) as t:
        busy, release = threading.Event(), threading.Event()
        held = t["flood"].call(lambda: (busy.set(), release.wait(120)))
        assert busy.wait(120)  # the pool's one thread holds the flood's first group
        flood = [t["flood"].submit_append([event(i)]) for i in range(4 * MAX_BATCH)]
        quiet = t["quiet"].submit_append([event(0, "the quiet tenant's one append")])
        release.set()
        held.result(timeout=120)
        flooded = ids_of(flood)
        quiet.result(timeout=120)
        # Served in turn: the flood's held group, then the quiet tenant's, then the flood's
        # four groups of MAX_BATCH jobs; first come first served would have put it last. (A
        # group is noted after its jobs are answered: the last one's note may come a moment
        # after the futures resolve.)
        wait_until(lambda: len(groups) >= 6, "every group noted")
        assert groups == ["flood", "quiet", "flood", "flood", "flood", "flood"], groups
        assert logged_ids(t["flood"]) == flooded  # in the order they came
        assert len(set(flooded)) == 4 * MAX_BATCH


def test_each_tenants_writes_are_committed_in_order_and_one_group_at_a_time(
    tmp_path: Path,
) -> None:
    names = [f"t{i}" for i in range(6)]
    with pooled(tmp_path, 4, names) as tenants:
        running = dict.fromkeys(names, 0)
        most = dict.fromkeys(names, 0)
        lock = threading.Lock()

        def inside(name: str) -> None:
            """A call on the tenant's writer: counts the tenant's groups running at once."""
            with lock:
                running[name] += 1
                most[name] = max(most[name], running[name])
            threading.Event().wait(0.001)  # long enough for a second thread to come in
            with lock:
                running[name] -= 1

        answered: dict[str, list[str]] = {}

        def write(name: str) -> None:
            t = tenants[name]
            futures: list[Future[list[AppendResult]]] = []
            calls = []
            for i in range(300):
                futures.append(t.submit_append([event(i)]))
                if i % 10 == 0:
                    calls.append(t.call(lambda n=name: inside(n)))  # type: ignore[misc]
            for call in calls:
                call.result(timeout=120)
            answered[name] = ids_of(futures)

        workers = [threading.Thread(target=write, args=(name,)) for name in names]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for name in names:
            assert logged_ids(tenants[name]) == answered[name], name
        assert most == dict.fromkeys(names, 1)


def test_a_tenant_evicted_with_its_appends_still_queued_commits_them_first(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    manager = TenantManager(data, embedding_dim=DIM, max_open=1, writer_threads=1)
    blocker = Tenant.open(
        "blocker", tmp_path / "blocker", embedding_dim=DIM, writers=manager.writers
    )
    busy, release = threading.Event(), threading.Event()
    try:
        held = blocker.call(lambda: (busy.set(), release.wait(120)))
        assert busy.wait(120)  # the manager's one writer thread is held
        with manager.use("a") as a:
            queued = [a.submit_append([event(i, f"queued {i}")]) for i in range(20)]
        assert a.writer.queued() == 20
        lease = manager.lease("b")  # the cap is 1: a is evicted, its appends still queued
        assert manager.stats().evictions == 1
        opener = threading.Thread(target=lease.wait)  # closes a, then opens b
        opener.start()
        wait_until(lambda: a.writer._stopping, "a closing")
        assert not any(f.done() for f in queued)
        release.set()
        opener.join(120)
        lease.release()
        held.result(timeout=120)
        answered = ids_of(queued)
    finally:
        release.set()
        blocker.close()
        manager.close_all()
    reopened = Tenant.open("a", data / "a", embedding_dim=DIM)
    try:
        assert logged_ids(reopened) == answered
    finally:
        reopened.close()


def test_tenants_evicted_under_write_load_lose_no_acknowledged_append(tmp_path: Path) -> None:
    # One writer thread and a cap of 2 for 6 tenants: each lease ends before its appends are
    # committed, so tenants are often evicted (closed) with appends in their queues.
    manager = TenantManager(tmp_path, embedding_dim=DIM, max_open=2, writer_threads=1)
    names = [f"t{i}" for i in range(6)]
    submitted: dict[str, list[Future[list[AppendResult]]]] = {name: [] for name in names}
    try:
        for round_ in range(10):
            for name in names:
                with manager.use(name) as t:
                    batch = [event(round_ * 10 + k, f"{name} {round_} {k}") for k in range(10)]
                    submitted[name].append(t.submit_append(batch))
        assert manager.stats().evictions >= 50
        answered = {name: ids_of(futures) for name, futures in submitted.items()}
    finally:
        manager.close_all()
    reopened = TenantManager(tmp_path, embedding_dim=DIM, max_open=10, writer_threads=1)
    try:
        for name in names:
            with reopened.use(name) as t:
                assert len(answered[name]) == 100
                assert logged_ids(t) == answered[name], name
    finally:
        reopened.close_all()


def test_a_write_after_its_tenant_closed_is_refused_not_left_unanswered(tmp_path: Path) -> None:
    pool = WriterPool(1, name="test-writer")
    t = Tenant.open("t", tmp_path / "t", embedding_dim=DIM, writers=pool)
    t.submit_append([event(0)]).result(timeout=120)
    t.writer.stop()
    late = t.submit_delete(["nothing"])
    wait_until(late.done, "the late write answered")
    assert isinstance(late.exception(), Unavailable)
    t.close()
    pool.close()
    assert pool.threads() == 0


def test_a_lingering_job_alone_on_a_pool_with_no_thread_yet_is_committed_once_due() -> None:
    pool = WriterPool(2, name="test-writer")
    groups: list[int] = []

    def commit(jobs: list[Job[None]]) -> None:
        groups.append(len(jobs))
        for job in jobs:
            job.answer(None)

    writer: GroupWriter[Job[None]] = GroupWriter("w", commit, pool=pool)
    try:
        assert pool.threads() == 0  # nothing written: no thread
        lingering = Job[None](linger=0.2)
        writer.submit(lingering)
        lingering.future.result(timeout=120)  # a thread was started to wake it
        assert groups == [1] and pool.threads() == 1
    finally:
        writer.stop()
        pool.close()
