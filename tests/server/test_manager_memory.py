"""Open tenants within a memory budget (storage/tenants/manager.py) on real stores and a real server, and
reads of tenants that do not exist: they answer as an empty tenant and create nothing."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from litestar.testing import TestClient
from mcp import Client

from memspine import limits
from memspine.app import create_app
from memspine.auth import Authenticator
from memspine.config import Settings, SettingsError, load_settings
from memspine.engine import Engine
from memspine.limits import machine_memory
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from memspine_admin.control import ControlDB
from storage.errors import Unauthorized, Unavailable
from storage.index.vectors import EXACT_BELOW
from storage.model import NewEvent
from storage.tenants.footprint import TENANT_BASE_BYTES
from storage.tenants.manager import BUSY_MEMORY, CAP, MEMORY, TenantManager
from storage.tenants.tenant import Tenant
from tests.support.big_tenants import build, copies
from tests.support.metrics import value
from tests.support.wait import wait_until

DIM = 16
EVENTS = 300  # per in-process tenant


def count_events(tenant: Tenant) -> int:
    """Live events in the tenant's log."""
    with tenant.log.reader() as r:
        return r.count()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small closed tenant, copied by each test under the names it needs."""
    return build(tmp_path_factory.mktemp("template") / "tpl", EVENTS, DIM)


def one_tenant_bytes(data: Path, name: str) -> int:
    """What the manager accounts for one open tenant like `name` (copies are alike)."""
    m = TenantManager(data, embedding_dim=DIM, max_open_bytes=1 << 40)
    try:
        with m.use(name):
            return m.stats().open_bytes
    finally:
        m.close_all()


@pytest.fixture
def ten(tmp_path: Path, template: Path) -> tuple[Path, list[str], int]:
    """Ten copies of the template in a data directory, and one tenant's accounted bytes."""
    data = tmp_path / "data"
    names = [f"t{i}" for i in range(10)]
    copies(template, data, names)
    return data, names, one_tenant_bytes(data, names[0])


# -- the budget, in process --------------------------------------------------------------------


def test_more_tenants_than_fit_opened_in_turn_stay_under_the_budget(
    ten: tuple[Path, list[str], int],
) -> None:
    data, names, size = ten
    assert size > TENANT_BASE_BYTES  # the rows of its vectors and its searcher besides
    budget = int(3.5 * size)  # three fit
    m = TenantManager(data, embedding_dim=DIM, max_open=100, max_open_bytes=budget)
    try:
        for _round in range(2):
            for name in names:
                with m.use(name, create=False) as t:
                    assert count_events(t) == EVENTS  # evicted before, reopened whole
                st = m.stats()
                assert st.open_bytes <= budget, st
                assert st.open <= 3
        st = m.stats()
        assert st.opens == 20
        assert st.evictions_by[MEMORY] == 17 and st.evictions_by[CAP] == 0
        assert st.rejections == 0  # nothing was busy: room was always made
        assert sum(m.open_bytes().values()) == st.open_bytes
    finally:
        m.close_all()
    assert m.stats().open_bytes == 0


@pytest.mark.timing
def test_every_tenant_in_the_budget_busy_gives_503_and_none_is_evicted(
    ten: tuple[Path, list[str], int],
) -> None:
    data, names, size = ten
    m = TenantManager(data, embedding_dim=DIM, max_open=100, max_open_bytes=int(2.5 * size))
    try:
        held = [m.lease(names[0]), m.lease(names[1])]
        tenants = [lease.wait() for lease in held]
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            m.lease(names[2])
        assert time.monotonic() - started < 0.5  # refused at once, not queued
        assert caught.value.status == 503
        assert caught.value.headers["Retry-After"] == "1"
        assert caught.value.detail == BUSY_MEMORY
        assert m.stats().rejections_by == {CAP: 0, MEMORY: 1}
        assert all(count_events(t) == EVENTS for t in tenants)  # both still open and whole
        held[1].release()
        with m.use(names[2]):  # the idle one makes room; the busy one stays
            assert sorted(t.tenant_id for t in m.open_tenants()) == [names[0], names[2]]
        assert count_events(tenants[0]) == EVENTS
        held[0].release()
    finally:
        m.close_all()


def test_a_tenant_growing_while_busy_evicts_idle_ones_never_itself_nor_another_busy_one(
    ten: tuple[Path, list[str], int],
) -> None:
    data, names, size = ten
    budget = int(3.5 * size)
    m = TenantManager(data, embedding_dim=DIM, max_open=100, max_open_bytes=budget)
    try:
        for name in names[:2]:
            with m.use(name):
                pass  # open and idle
        other = m.lease(names[3])
        other.wait()
        writer = m.lease(names[2])  # write leases recount the tenant at release
        tenant = writer.wait()
        rng = np.random.default_rng(1)
        for batch in range(4):  # a Tantivy writer and 2,000 vectors: past the budget
            rows = rng.standard_normal((500, DIM), dtype=np.float32)
            events = [NewEvent(kind="turn", ts=2_000_000_000_000_000 + batch * 500 + i,
                               text=f"more {i}", embedding=row.tolist()) for i, row in enumerate(rows)]  # fmt: skip
            tenant.submit_append(events).result(timeout=60)
        tenant.vectors.flush()
        second = m.lease(names[2])  # another request on the growing tenant keeps it busy
        writer.release()
        # The background closer evicts the idle ones.
        wait_until(lambda: len(m.open_tenants()) <= 2, "idle tenants evicted to the budget")
        assert sorted(t.tenant_id for t in m.open_tenants()) == sorted([names[2], names[3]])
        assert m.stats().evictions_by[MEMORY] == 2
        assert count_events(tenant) == EVENTS + 2000  # the busy tenant was never closed
        second.release()
        other.release()
    finally:
        m.close_all()


def test_a_tenant_larger_than_the_budget_opens_alone_and_closes_once_idle(
    ten: tuple[Path, list[str], int],
) -> None:
    data, names, size = ten
    m = TenantManager(data, embedding_dim=DIM, max_open=100, max_open_bytes=size // 2)
    try:
        busy = m.lease(names[0])
        busy.wait()  # alone: it opens, though larger than the budget
        with pytest.raises(Unavailable):
            m.lease(names[1])  # the budget is held by a request in flight
        busy.release()
        wait_until(lambda: not m.open_tenants(), "the tenants closed")
        assert m.open_tenants() == []  # idle and over the budget: closed in the background
        with m.use(names[1]) as t:
            assert count_events(t) == EVENTS
    finally:
        m.close_all()


@pytest.fixture
def three_wide(tmp_path: Path) -> tuple[Path, list[str], int]:
    """Three tenants of 384-float vectors, big enough that 2.5 of them make a budget the
    server accepts: past EXACT_BELOW, with a graph (a tenant without one holds little: its rows
    stay mapped from its file)."""
    template = build(tmp_path / "wide" / "tpl", EXACT_BELOW + 52, 384)
    data = tmp_path / "data"
    names = [f"w{i}" for i in range(3)]
    copies(template, data, names)
    return data, names, one_tenant_bytes(data, names[0])


def test_all_busy_over_http_is_503_unavailable_with_retry_after(
    three_wide: tuple[Path, list[str], int],
) -> None:
    data, names, size = three_wide
    settings = load_settings({
        "MEMSPINE_DATA_DIR": str(data), "MEMSPINE_EMBEDDING_DIM": str(DIM),
        "MEMSPINE_MAX_OPEN_BYTES": str(int(2.5 * size)), "MEMSPINE_METRICS_PER_TENANT": "1",
    })  # fmt: skip
    app = create_app(settings)
    manager: TenantManager = app.state.engine.manager
    with TestClient(app) as client:
        held = [manager.lease(names[0]), manager.lease(names[1])]
        for lease in held:
            lease.wait()
        headers = {"Authorization": f"Bearer {names[2]}"}
        for r in (
            client.get("/v1/memory/events", headers=headers),
            client.post("/v1/memory/event", json={"kind": "turn", "text": "x"}, headers=headers),
        ):
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert r.json() == {"error": "unavailable", "detail": BUSY_MEMORY}
        text = client.get("/metrics").text
        assert value(text, "memspine_unavailable_by_reason_total", reason=MEMORY) == 2
        assert value(text, "memspine_open_bytes_budget") == int(2.5 * size)
        held_bytes = [value(text, "memspine_tenant_memory_bytes", tenant=n) for n in names[:2]]
        assert all(b > TENANT_BASE_BYTES for b in held_bytes)
        assert value(text, "memspine_open_tenant_bytes") == pytest.approx(sum(held_bytes), rel=0.01)
        held[0].release()
        r = client.get("/v1/memory/events", params={"limit": 10}, headers=headers)
        assert r.status_code == 200 and len(r.json()["events"]) == 10
        held[1].release()


# -- reads of a tenant that does not exist ---------------------------------------------------------


def test_a_read_with_a_mistyped_token_creates_nothing_and_a_write_creates_the_tenant(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    app = create_app(load_settings({"MEMSPINE_DATA_DIR": str(data), "MEMSPINE_EMBEDDING_DIM": "4"}))
    headers = {"Authorization": "Bearer acme-typo"}
    with TestClient(app) as c:
        assert c.post("/v1/memory/event", json={"kind": "turn", "text": "hello"},
                      headers={"Authorization": "Bearer acme"}).status_code == 201  # fmt: skip
        r = c.get(f"/v1/memory/event/{uuid.uuid4()}", headers=headers)
        assert (r.status_code, r.json()["error"]) == (404, "not_found")
        assert c.get("/v1/memory/events", headers=headers).json() == {
            "events": [],
            "next_cursor": None,
        }
        recall = c.post("/v1/memory/recall", json={"text": "hello", "embedding": [1, 0, 0, 0]},
                        headers=headers)  # fmt: skip
        assert recall.status_code == 200 and recall.json()["hits"] == []
        cypher = c.post("/v1/memory/cypher", json={"query": "MATCH (e:Event) RETURN e.text"},
                        headers=headers)  # fmt: skip
        assert cypher.status_code == 200 and cypher.json()["rows"] == []
        assert c.post("/v1/memory/cypher", json={"query": "RETURN 1 + 1 AS two"},
                      headers=headers).json()["rows"] == [[2]]  # fmt: skip
        bad = c.post("/v1/memory/recall", json={"embedding": [1, 0]}, headers=headers)
        assert bad.status_code == 422  # checked as for any tenant of this server's dimension
        dry = c.delete(f"/v1/memory/event/{uuid.uuid4()}?dry_run=true", headers=headers)
        assert dry.status_code == 404
        assert c.get("/v1/whoami", headers=headers).json()["tenant_id"] == "acme-typo"
        assert sorted(p.name for p in data.iterdir()) == ["acme"]  # nothing made for the typo
        text = c.get("/metrics").text
        assert value(text, "memspine_open_tenants") == 1
        r = c.post(
            "/v1/memory/event", json={"kind": "turn", "text": "now it exists"}, headers=headers
        )
        assert r.status_code == 201
        assert sorted(p.name for p in data.iterdir()) == ["acme", "acme-typo"]
        listed = c.get("/v1/memory/events", headers=headers).json()["events"]
        assert [e["text"] for e in listed] == ["now it exists"]
        other = {"Authorization": "Bearer another-typo"}
        assert c.get("/v1/memory/events", headers=other).json()["events"] == []  # not shared
    assert sorted(p.name for p in data.iterdir()) == ["acme", "acme-typo"]


def test_mcp_read_tools_on_a_tenant_that_does_not_exist_create_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = Engine(Settings(data_dir=data, embedding_dim=4))
    auth = Authenticator(data, None)

    def resolve(_ctx: Any) -> Caller:
        principal = auth.authenticate("mcp-typo")
        return Caller(principal, EngineBackend(engine, principal))

    async def main() -> None:
        async with Client(build_server(resolve)) as c:
            got = await c.call_tool("memory_get", {"id": str(uuid.uuid4())})
            assert got.is_error and got.structured_content["error"] == "not_found"
            for name, args in (
                ("memory_list", {}),
                ("memory_recall", {"text": "anything"}),
                ("memory_cypher", {"query": "MATCH (e:Event) RETURN e.id"}),
            ):
                result = await c.call_tool(name, args)
                assert not result.is_error, result
                out = result.structured_content
                assert out.get("events", out.get("hits", out.get("rows"))) == [], (name, out)
            assert not data.exists() or not any(data.iterdir())
            made = await c.call_tool("memory_append", {"kind": "turn", "text": "first"})
            assert not made.is_error
            assert [p.name for p in data.iterdir()] == ["mcp-typo"]

    try:
        anyio.run(main)
    finally:
        engine.close()
        auth.close()


def test_with_issued_keys_a_created_tenant_reads_as_empty_and_an_erased_one_is_refused(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ControlDB.init(data, actor="test")
    auth = Authenticator(data, None)
    control = auth.control()
    assert control is not None
    made = control.create_tenant("made", actor="test").tenant_id
    gone = control.create_tenant("gone", actor="test").tenant_id
    control.delete_tenant(gone, actor="test")
    m = TenantManager(data, embedding_dim=4, admit=auth.admit_tenant)
    try:
        with m.use(made, create=False) as t:  # created by the admin, never written: empty
            assert count_events(t) == 0
        with pytest.raises(Unauthorized), m.use(gone, create=False):
            pass
        assert not (data / made).exists() and not (data / gone).exists()
        with m.use(made) as t:  # its first write creates its directory
            t.submit_append([NewEvent(kind="turn", ts=1, text="x")]).result(timeout=30)
        assert (data / made).is_dir()
    finally:
        m.close_all()
        auth.close()


def test_a_read_never_creates_a_tenant_being_written_concurrently(tmp_path: Path) -> None:
    # Reads of a tenant arrive while its first write opens it: each read answers either empty
    # or with the event, never an error, and the tenant ends with exactly the written event.
    m = TenantManager(tmp_path / "data", embedding_dim=4)
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            with m.use("fresh", create=False) as t:
                seen.append(count_events(t))

    def wait_for(count: int) -> None:
        wait_until(lambda: count in seen[-3:], f"a read that counts {count}", every=0.005)

    readers = [threading.Thread(target=read) for _ in range(3)]
    try:
        for r in readers:
            r.start()
        wait_for(0)
        with m.use("fresh") as t:
            t.submit_append([NewEvent(kind="turn", ts=1, text="x")]).result(timeout=30)
        wait_for(1)
    finally:
        stop.set()
        for r in readers:
            r.join(10)
    assert set(seen) == {0, 1}  # empty before the write, the event after; never an error
    with m.use("fresh", create=False) as t:
        assert count_events(t) == 1
    m.close_all()


# -- a real server cycling through more tenants than fit ---------------------------------------------


# -- the setting ---------------------------------------------------------------------------------


def test_the_budget_setting_takes_bytes_units_and_shares_and_refuses_nonsense() -> None:
    def budget(raw: str) -> int:
        return load_settings({"MEMSPINE_MAX_OPEN_BYTES": raw}).max_open_bytes

    assert budget("41943040") == budget("40M") == budget("40MiB") == budget(" 40m ") == 40 << 20
    assert budget("2G") == 2 << 30
    assert budget("25%") == machine_memory() // 4
    assert load_settings({}).max_open_bytes == machine_memory() // 2 == Settings().max_open_bytes
    for raw in ("0", "1k", "lots", "-5M", "150%", "%"):
        with pytest.raises(SettingsError, match=r"^MEMSPINE_MAX_OPEN_BYTES: expected"):
            budget(raw)


def test_machine_memory_is_the_tighter_of_physical_memory_and_the_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    physical = limits._physical_memory()
    assert physical is not None and physical > 0
    cgroups = tmp_path / "cgroup"
    (cgroups / "box" / "inner").mkdir(parents=True)
    (cgroups / "memory" / "old").mkdir(parents=True)
    proc = tmp_path / "proc-self-cgroup"
    monkeypatch.setattr(limits, "PROC_CGROUP", proc)
    monkeypatch.setattr(limits, "CGROUP_ROOT", cgroups)
    proc.write_text("0::/box/inner\n")
    (cgroups / "box" / "inner" / "memory.max").write_text("max\n")  # no limit here...
    (cgroups / "box" / "memory.max").write_text(f"{1 << 30}\n")  # ...but its parent has one
    assert limits.machine_memory() == min(physical, 1 << 30)
    proc.write_text("4:memory:/old\n")  # cgroup v1
    (cgroups / "memory" / "old" / "memory.limit_in_bytes").write_text(f"{512 << 20}\n")
    assert limits.machine_memory() == min(physical, 512 << 20)
    (cgroups / "memory" / "old" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert limits.machine_memory() == physical  # v1's "unlimited"
    assert limits.default_max_open_bytes() == physical // 2
