"""The tenant manager on real stores: the LRU cap, 503 under pressure, idle close, exclusive holds,
fast reopen, and open/close cycles that leak neither descriptors, threads nor LMDB reader slots."""

from __future__ import annotations

import os
import resource
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import pytest
from litestar.testing import TestClient

from memspine import config
from memspine.app import create_app
from memspine.config import load_settings
from memspine.limits import raise_fd_limit
from storage.errors import Unavailable
from storage.log.eventlog import EventLog
from storage.model import NewEvent
from storage.tenants.footprint import closed_tenant_bytes
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant
from tests.support.metrics import metric
from tests.support.procfs import fd_count
from tests.support.servers import InProcessServer
from tests.support.wait import wait_until

DIM = 4
PER_WRITER = 12  # appends by each of four writers to the hot tenant
CYCLES = 300  # open/close cycles in the leak test: a leak of one fd, thread or slot a cycle shows 300 times


def event(text: str, i: int = 0) -> NewEvent:
    """A small event with text and an embedding."""
    return NewEvent(kind="turn", ts=1_000_000 + i, text=text, embedding=[1.0, float(i), 0.0, 0.5])


def append(tenant: Tenant, *events: NewEvent) -> list[Any]:
    """Append through the tenant's writer and wait for the group commit."""
    results: list[Any] = tenant.submit_append(list(events)).result(timeout=30)
    return results


def count_events(tenant: Tenant) -> int:
    """Live events in the tenant's log."""
    with tenant.log.reader() as r:
        return r.count()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[TenantManager]:
    """A manager over tmp_path with a cap of 2 and 4-dimensional tenants."""
    m = TenantManager(tmp_path / "data", embedding_dim=DIM, max_open=2)
    yield m
    m.close_all()


# -- the LRU and 503 -------------------------------------------------------------------------


def test_least_recently_used_idle_tenant_is_evicted_and_its_data_survives(
    manager: TenantManager,
) -> None:
    for name in ("a", "b"):
        with manager.use(name) as t:
            append(t, event(f"fact of {name}"))
    with manager.use("a"):
        pass  # a is now the most recently used: b goes first
    with manager.use("c") as t:
        append(t, event("fact of c"))
    assert sorted(t.tenant_id for t in manager.open_tenants()) == ["a", "c"]
    assert manager.stats().evictions == 1
    with manager.use("b") as t:  # reopened from disk, evicting a
        assert count_events(t) == 1
    assert manager.stats().opens == 4


@pytest.mark.timing
def test_every_slot_busy_gives_503_with_retry_after_at_once(manager: TenantManager) -> None:
    held = [manager.lease("a"), manager.lease("b")]
    for lease in held:
        lease.wait()
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        manager.lease("c")
    assert time.monotonic() - started < 0.5  # refused, not queued
    assert caught.value.status == 503
    assert caught.value.headers["Retry-After"] == "1"
    assert manager.stats().rejections == 1
    held[0].release()
    with manager.use("c"):  # a is idle now and gives its slot
        assert manager.open_count() == 2
    held[1].release()


def test_503_over_http_carries_the_error_shape_and_retry_after(tmp_path: Path) -> None:
    # Two tenants held busy in-process, exactly like two requests in flight; the third tenant's
    # request goes through the real app (routing, guard, engine, error handler).
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(tmp_path / "data"),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_MAX_OPEN_TENANTS": "2",
        }
    )
    app = create_app(settings)
    manager: TenantManager = app.state.engine.manager
    with TestClient(app) as client:
        held = [manager.lease("busy1"), manager.lease("busy2")]
        for lease in held:
            lease.wait()
        headers = {"Authorization": "Bearer third"}
        r = client.post("/v1/memory/event", json={"kind": "turn", "text": "x"}, headers=headers)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json() == {
            "error": "unavailable",
            "detail": "every open tenant slot has a request in flight; retry shortly",
        }
        held[0].release()
        r = client.post("/v1/memory/event", json={"kind": "turn", "text": "x"}, headers=headers)
        assert r.status_code == 201
        held[1].release()


# -- idle close --------------------------------------------------------------------------------


def test_idle_tenants_close_after_the_idle_time(tmp_path: Path) -> None:
    manager = TenantManager(tmp_path / "data", embedding_dim=DIM, max_open=4, idle_secs=0.2)
    manager.start_idle_closer()
    try:
        with manager.use("quiet") as t:
            append(t, event("kept"))
        held = manager.lease("busy")
        held.wait()
        wait_until(lambda: manager.stats().idle_closes > 0, "the idle tenant closed")
        time.sleep(0.3)  # a request in flight is never closed, however long it takes
        assert [t.tenant_id for t in manager.open_tenants()] == ["busy"]
        assert manager.stats().idle_closes == 1
        held.release()
        with manager.use("quiet") as t:
            assert count_events(t) == 1
    finally:
        manager.close_all()


def test_close_idle_takes_only_tenants_idle_long_enough(manager: TenantManager) -> None:
    manager.idle_secs = 100
    with manager.use("a"):
        pass
    assert manager.close_idle() == 0
    assert manager.close_idle(now=time.monotonic() + 101) == 1
    assert manager.open_count() == 0


# -- exclusive holds, abandoned and failed opens ---------------------------------------------------


def test_exclusive_waits_for_requests_in_flight_and_holds_new_ones(manager: TenantManager) -> None:
    with manager.use("a") as t:
        append(t, event("before"))
    in_flight = manager.lease("a")
    in_flight.wait()
    entered = threading.Event()
    leave = threading.Event()

    def hold() -> None:
        with manager.exclusive("a"):
            entered.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert not entered.wait(0.3)  # the request in flight keeps the tenant open
    in_flight.release()
    assert entered.wait(5)
    assert manager.open_count() == 0
    waiter = manager.lease("a")  # arrives during the hold: must wait for it, not open the files
    opened: list[Tenant] = []
    opener = threading.Thread(target=lambda: opened.append(waiter.wait()))
    opener.start()
    time.sleep(0.3)
    assert not opened
    leave.set()
    holder.join(5)
    opener.join(5)
    assert opened and count_events(opened[0]) == 1
    waiter.release()


def test_a_lease_released_before_it_opened_still_opens_and_frees_its_slot(
    manager: TenantManager,
) -> None:
    first = manager.lease("a")
    second = manager.lease("a")  # waits on the same open
    assert first.must_open and not second.must_open
    first.release()  # the request went away before opening: the open runs in the background
    assert second.ready.result(timeout=10).tenant_id == "a"
    assert not second.ready.cancel()  # one waiter giving up cannot cancel the shared open
    second.release()
    # It becomes idle once the background open released its count.
    wait_until(lambda: manager.close_idle(now=time.monotonic() + 10**6) > 0, "the slot idle")
    assert manager.open_count() == 0


def test_a_failed_open_answers_every_waiter_and_leaves_no_slot(manager: TenantManager) -> None:
    manager.data_dir.mkdir(parents=True)
    (manager.data_dir / "broken").write_text("not a directory")
    first = manager.lease("broken")
    second = manager.lease("broken")
    with pytest.raises(Exception):  # noqa: B017 - whatever the filesystem says
        first.wait()
    with pytest.raises(Exception):  # noqa: B017
        second.ready.result(timeout=5)
    first.release()
    second.release()
    assert manager.open_count() == 0
    with manager.use("fine") as t:
        append(t, event("still works"))


def test_shutdown_refuses_new_requests(manager: TenantManager) -> None:
    with manager.use("a"):
        pass
    manager.close_all()
    with pytest.raises(Unavailable):
        manager.lease("a")


# -- concurrency under eviction pressure ----------------------------------------------------------


@pytest.fixture
def capped(start_server: Any) -> InProcessServer:
    """The app with at most three tenants open."""
    return start_server(env={"MEMSPINE_MAX_OPEN_TENANTS": "3"})  # type: ignore[no-any-return]


def test_concurrent_writes_to_one_tenant_during_eviction_pressure_lose_nothing(
    capped: InProcessServer,
) -> None:
    server = capped  # three slots for the hot tenant and six cold ones
    for n in range(6):  # the cold tenants exist: a read of one opens it (and evicts another)
        with server.client(f"cold{n}") as c:
            assert c.post("/v1/memory/event", json={"kind": "turn"}).status_code == 201
    statuses: list[int] = []
    lock = threading.Lock()

    def write(worker: int) -> list[str]:
        written = []
        with server.client("hot") as c:
            for n in range(PER_WRITER):
                key = f"w{worker}-{n}"
                body = {"kind": "turn", "text": f"hot {key}"}
                while True:
                    r = c.post("/v1/memory/event", json=body, headers={"Idempotency-Key": key})
                    with lock:
                        statuses.append(r.status_code)
                    if r.status_code != 503:
                        break
                    time.sleep(0.01)
                assert r.status_code in (200, 201), r.text
                written.append(r.json()["event_id"])
        return written

    def churn(worker: int) -> None:
        for n in range(PER_WRITER):
            with server.client(f"cold{(worker * PER_WRITER + n) % 6}") as c:
                r = c.get("/v1/memory/events")
                with lock:
                    statuses.append(r.status_code)
                assert r.status_code in (200, 503), r.text
                if r.status_code == 503:
                    assert r.headers["retry-after"] == "1"

    with ThreadPoolExecutor(max_workers=8) as pool:
        writers = [pool.submit(write, w) for w in range(4)]
        churners = [pool.submit(churn, w) for w in range(4)]
        for f in churners:
            f.result(timeout=120)
        written = [eid for f in writers for eid in f.result(timeout=120)]
    assert set(statuses) <= {200, 201, 503}
    assert len(set(written)) == 4 * PER_WRITER
    with server.client("hot") as c:
        listed = c.get("/v1/memory/events", params={"limit": 1000}).json()["events"]
    assert sorted(e["event_id"] for e in listed) == sorted(written)
    with server.client("x") as c:
        text = c.get("/metrics").text
    assert metric(text, "memspine_tenant_evictions_total") > 0  # the pressure was real


# -- fast reopen and leaks -----------------------------------------------------------------------


def test_clean_close_leaves_nothing_to_replay_or_rewrite(tmp_path: Path) -> None:
    root = tmp_path / "t"
    t = Tenant.open("t", root, embedding_dim=DIM)
    for batch in range(3):
        append(t, *(event(f"batch {batch} item {i}", batch * 10 + i) for i in range(10)))
    t.close()
    log = EventLog.open(root / "events")
    with log.reader() as r:
        last = r.last_seq()
        watermarks = (r.meta_int("keyword_seq"), r.meta_int("vector_seq"))
    log.close()
    assert watermarks == (last, last)  # a reopen replays nothing
    files = [root / "vectors.hnsw", root / "vectors.hnsw.live.npy"]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    t = Tenant.open("t", root, embedding_dim=DIM)
    assert t.keyword_seq == t.vector_seq == last
    assert t.vectors.count() == 30 and count_events(t) == 30
    t.close()
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == before  # nothing rebuilt


def test_open_close_cycles_leak_no_fds_threads_or_reader_slots(tmp_path: Path) -> None:
    # CYCLES here (a few seconds); bench/tenants.py runs the full 10,000.
    manager = TenantManager(tmp_path / "data", embedding_dim=DIM, max_open=1)
    names = ["a", "b", "c"]
    for name in names:
        with manager.use(name) as t:
            append(t, event(f"only event of {name}"))
    manager.close_all()
    fds, threads = fd_count(), threading.active_count()
    manager = TenantManager(tmp_path / "data", embedding_dim=DIM, max_open=1)
    for i in range(CYCLES):
        with manager.use(names[i % 3]) as t, t.log.reader() as r:
            assert r.last_seq() == 1
    assert manager.stats().opens == CYCLES
    manager.close_all()
    # No more than before: threads or fds of earlier tests in this process (idle worker
    # threads, a warm-up thread) may end meanwhile, but the cycles must leave none behind. A
    # Tantivy index let go ends its watcher thread at its next poll (storage/index/held.py):
    # waited for, within a bound that a leak (one fd a cycle) would never meet.
    wait_until(lambda: fd_count() <= fds, f"fds back to {fds} (now {fd_count()})", 10)
    wait_until(lambda: threading.active_count() <= threads, "threads back", 10)
    for name in names:
        env = lmdb.open(str(tmp_path / "data" / name / "events"), max_dbs=16, readonly=True)
        try:
            assert env.reader_check() == 0  # no slot left by a dead or leaked reader
            assert "(no active readers)" in env.readers()
        finally:
            env.close()


# -- the fd limit -------------------------------------------------------------------------------


def test_fd_limit_is_raised_toward_the_hard_limit_and_never_lowered() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
        limit = raise_fd_limit()
        assert limit.before == lowered
        assert limit.soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert limit.soft >= lowered
        if hard != resource.RLIM_INFINITY:
            assert limit.soft == hard
        again = raise_fd_limit()
        assert again.soft == again.before == limit.soft
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_default_cap_follows_from_memory_not_from_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle open tenant holds no descriptor (storage/log/held.py, storage/index/held.py), so
    a low fd limit no longer caps open tenants: the budget does, at the smallest tenant's
    estimate, and the kernel's memory-map limit where that is lower."""
    smallest = closed_tenant_bytes(Path(os.devnull), 384)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        assert config.default_max_open_tenants(smallest * 10_000) == 10_000
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    limit = tmp_path / "max_map_count"
    limit.write_text(f"{config.MAPS_RESERVE + 500 * config.MAPS_PER_TENANT}\n")
    monkeypatch.setattr(config, "MAX_MAP_COUNT", limit)
    assert config.default_max_open_tenants(smallest * 10_000) == 500


def test_each_tenant_id_opens_its_own_directory(manager: TenantManager) -> None:
    name = str(uuid.uuid4())
    with manager.use(name) as t:
        assert t.root == manager.data_dir / name
