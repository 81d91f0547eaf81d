"""Limits per tenant and per key: a tenant's max_events and max_bytes (403 quota_exceeded, reads
and deletes keep working, a delete frees quota), a key's requests per minute (429 with
Retry-After), the server-wide defaults, over both control planes and every door."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from memspine.allowance import Buckets
from memspine.app import create_app
from memspine.auth import Authenticator
from memspine.config import load_settings
from memspine.engine import Engine
from memspine.schemas import EventIn, to_new_event
from memspine_admin.plane import ControlPlane, open_control
from storage.errors import InvalidRequest, NotFound, QuotaExceeded
from storage.model import Quota
from tests.support.control import CHEAP_HASHER as CHEAP

ADMIN_KEY = "admin-key-for-the-limits-tests-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TS = 1_790_000_000_000_000


@pytest.fixture
def plane(tmp_path: Path, url: str | None) -> Iterator[ControlPlane]:
    with open_control(tmp_path, url, create=True, actor="test", hasher=CHEAP) as opened:
        yield opened


@dataclass
class Server:
    """The app in process over a control plane, with one tenant and its read-write key."""

    client: TestClient[Any]
    tenant_id: str
    key: dict[str, str]

    def issue(self, **more: Any) -> dict[str, str]:
        body = {"tenant_id": self.tenant_id, "name": "k", **more}
        r = self.client.post("/v1/admin/keys", json=body, headers=ADMIN)
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['api_key']}"}

    def append(self, text: str, key: dict[str, str] | None = None) -> Any:
        body = {"kind": "note", "ts": TS, "text": text}
        return self.client.post("/v1/memory/event", json=body, headers=key or self.key)

    def patch(self, **limits: Any) -> Any:
        return self.client.patch(f"/v1/admin/tenants/{self.tenant_id}", json=limits, headers=ADMIN)

    def rejected(self) -> dict[str, float]:
        lines = self.client.get("/metrics").text.splitlines()
        out = {}
        for line in lines:
            if line.startswith("memspine_rejected_total{"):
                reason = line.split('reason="')[1].split('"')[0]
                out[reason] = float(line.split()[-1])
        return out


def start(
    tmp_path: Path,
    url: str | None,
    env: dict[str, str] | None = None,
    *,
    hot: bool = True,
    again: Server | None = None,
) -> Any:
    """The app over the control plane (made here for LMDB), as a context manager of Server:
    a new tenant and key, or with `again` those of an earlier start on the same files."""
    data = tmp_path / "data"
    if again is None:
        with open_control(data, url, create=True, actor="test", hasher=CHEAP):
            pass
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(data),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
            **({"MEMSPINE_CONTROL_URL": url} if url else {}),
            **(env or {}),
        }
    )
    auth = Authenticator(data, ADMIN_KEY, hasher=CHEAP, control_url=url)
    return _Running(TestClient(create_app(settings, auth=auth, hot_routes=hot)), again)


class _Running:
    def __init__(self, client: TestClient[Any], again: Server | None) -> None:
        self.client = client
        self.again = again

    def __enter__(self) -> Server:
        c = self.client.__enter__()
        if self.again is not None:
            return Server(c, self.again.tenant_id, self.again.key)
        r = c.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        tenant_id = r.json()["tenant_id"]
        server = Server(c, tenant_id, {})
        server.key = server.issue()
        return server

    def __exit__(self, *exc: Any) -> None:
        self.client.__exit__(*exc)


# -- the control planes ---------------------------------------------------------------------


def test_both_planes_keep_a_tenants_limits_and_a_keys_rate(plane: ControlPlane) -> None:
    tenant = plane.create_tenant("acme", actor="test")
    assert (tenant.max_events, tenant.max_bytes) == (None, None)
    generation = plane.generation()
    set_ = plane.set_tenant_limits(tenant.tenant_id, {"max_events": 5}, actor="alice")
    assert (set_.max_events, set_.max_bytes) == (5, None)
    assert plane.generation() > generation  # servers read the limits again
    both = plane.set_tenant_limits(tenant.tenant_id, {"max_bytes": 1 << 30}, actor="alice")
    assert (both.max_events, both.max_bytes) == (5, 1 << 30)  # the one not named stays
    got = plane.get_tenant(tenant.tenant_id)
    assert got is not None and (got.max_events, got.max_bytes) == (5, 1 << 30)
    listed = [t for t in plane.list_tenants() if t.tenant_id == tenant.tenant_id]
    assert listed == [got]
    cleared = plane.set_tenant_limits(tenant.tenant_id, {"max_events": None}, actor="alice")
    assert (cleared.max_events, cleared.max_bytes) == (None, 1 << 30)
    memory = plane.set_tenant_limits(tenant.tenant_id, {"max_memory": 1 << 28}, actor="alice")
    assert (memory.max_bytes, memory.max_memory) == (1 << 30, 1 << 28)
    got = plane.get_tenant(tenant.tenant_id)
    assert got is not None and got.max_memory == 1 << 28
    entries, _ = plane.audit(tenant_id=tenant.tenant_id)
    assert [(e.action, e.actor, e.detail) for e in entries if e.action == "tenant.limits"] == [
        ("tenant.limits", "alice", {"max_events": 5}),
        ("tenant.limits", "alice", {"max_bytes": 1 << 30}),
        ("tenant.limits", "alice", {"max_events": None}),
        ("tenant.limits", "alice", {"max_memory": 1 << 28}),
    ]
    for bad in (
        {"max_events": 0},
        {"max_bytes": -1},
        {"max_events": True},
        {"max_events": "5"},
        {"max_events": 2**62 + 1},
        {"nope": 1},
        {},
    ):
        with pytest.raises(InvalidRequest):
            plane.set_tenant_limits(tenant.tenant_id, bad, actor="alice")
    with pytest.raises(NotFound):
        plane.set_tenant_limits(
            "0c6c2c85-59a4-4b2d-8a4b-2b1f4a9d2a11", {"max_events": 1}, actor="a"
        )

    issued = plane.create_key(tenant.tenant_id, "bot", actor="test", requests_per_minute=30)
    plain = plane.create_key(tenant.tenant_id, "human", actor="test")
    assert (issued.requests_per_minute, plain.requests_per_minute) == (30, None)
    info = plane.get_key(issued.key_id)
    record = plane.get_key_record(issued.key_id)
    assert info is not None and info.requests_per_minute == 30
    assert record is not None and record.requests_per_minute == 30
    assert {k.key_id: k.requests_per_minute for k in plane.list_keys(tenant.tenant_id)} == {
        issued.key_id: 30,
        plain.key_id: None,
    }
    for bad_rate in (0, 1_000_001, 2.5):
        with pytest.raises(InvalidRequest, match="requests_per_minute"):
            plane.create_key(tenant.tenant_id, "x", actor="t", requests_per_minute=bad_rate)  # type: ignore[arg-type]


# -- quotas ------------------------------------------------------------------------------------


def test_a_tenant_at_its_max_events_is_refused_writes_and_keeps_its_reads(
    tmp_path: Path, url: str | None
) -> None:
    with start(tmp_path, url) as s:
        r = s.patch(max_events=3)
        assert r.status_code == 200, r.text
        assert (r.json()["max_events"], r.json()["limits"]["max_events"]) == (3, 3)
        ids = [s.append(f"note {i}").json()["event_id"] for i in range(2)]
        # A batch that would pass the limit is refused whole, naming the limit.
        events = [{"kind": "note", "text": f"batch {i}"} for i in range(2)]
        r = s.client.post("/v1/memory/events", json={"events": events}, headers=s.key)
        assert r.status_code == 403 and r.json()["error"] == "quota_exceeded"
        assert r.json()["detail"].startswith("events[1]: this tenant may store at most 3")
        assert "max_events" in r.json()["detail"]
        assert s.append("note 2").status_code == 201
        over = s.append("note 3")
        assert over.status_code == 403, over.text
        assert over.json()["error"] == "quota_exceeded" and "max_events" in over.json()["detail"]
        # Reads keep working.
        assert s.client.get(f"/v1/memory/event/{ids[0]}", headers=s.key).status_code == 200
        listing = s.client.get("/v1/memory/events", headers=s.key).json()["events"]
        assert sorted(e["text"] for e in listing) == ["note 0", "note 1", "note 2"]
        hits = s.client.post("/v1/memory/recall", json={"text": "note"}, headers=s.key)
        assert hits.status_code == 200 and len(hits.json()["hits"]) == 3
        # An idempotent replay stores nothing: it is answered at the limit too.
        body = {"kind": "note", "text": "keyed"}
        keyed = {**s.key, "Idempotency-Key": "k-1"}
        s.patch(max_events=4)
        first = s.client.post("/v1/memory/event", json=body, headers=keyed)
        assert first.status_code == 201
        assert s.client.post("/v1/memory/event", json=body, headers=keyed).status_code == 200
        # A delete frees quota, and the next write fits.
        assert s.client.delete(f"/v1/memory/event/{ids[0]}", headers=s.key).status_code == 200
        assert s.append("note 4").status_code == 201
        assert s.append("note 5").status_code == 403
        # Removing the tenant's own limit (no default set) lets it write again.
        r = s.patch(max_events=None)
        assert r.json()["max_events"] is None and r.json()["limits"]["max_events"] is None
        assert s.append("note 5").status_code == 201
        assert s.rejected()["max_events"] == 3


def test_max_bytes_counts_the_live_events_records(tmp_path: Path, url: str | None) -> None:
    with start(tmp_path, url) as s:
        shown = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        assert shown["usage"]["bytes"]["live"] == 0
        first = s.append("x" * 1000).json()["event_id"]
        used = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        size = used["usage"]["bytes"]["live"]
        assert 1000 < size < 1200
        # Room for two such events and one small one (a record's overhead is size - 1000).
        assert s.patch(max_bytes=size * 2 + (size - 1000) + 100).status_code == 200
        assert s.append("y" * 1000).status_code == 201
        over = s.append("z" * 1000)
        assert over.status_code == 403 and "max_bytes" in over.json()["detail"]
        assert s.append("small").status_code == 201  # what fits still goes in
        assert s.client.delete(f"/v1/memory/event/{first}", headers=s.key).status_code == 200
        assert s.append("z" * 1000).status_code == 201
        assert s.rejected()["max_bytes"] == 1


def test_concurrent_appends_never_pass_the_quota(tmp_path: Path) -> None:
    engine = Engine(
        load_settings({"MEMSPINE_DATA_DIR": str(tmp_path), "MEMSPINE_EMBEDDING_DIM": "4"})
    )
    quota = Quota(max_events=10)

    async def one(i: int) -> bool:
        new = to_new_event(EventIn(kind="k", text=f"e{i}"), tenant_id="t", idempotency_key=None)
        try:
            await engine.append("t", new, quota)
        except QuotaExceeded:
            return False
        return True

    async def main() -> list[bool]:
        return await asyncio.gather(*(one(i) for i in range(40)))

    try:
        done = asyncio.run(main())
        assert sum(done) == 10
        assert engine.usage_now("t").events.live == 10
    finally:
        engine.close()


# -- rates -------------------------------------------------------------------------------------


def test_a_key_over_its_requests_per_minute_waits_for_retry_after(
    tmp_path: Path, url: str | None
) -> None:
    with start(tmp_path, url) as s:
        slow = s.issue(requests_per_minute=3)
        listed = s.client.get("/v1/admin/keys", headers=ADMIN).json()["keys"]
        assert sorted(k["requests_per_minute"] or 0 for k in listed) == [0, 3]
        # The key can read its own rate (one of its three requests).
        assert s.client.get("/v1/whoami", headers=slow).json()["requests_per_minute"] == 3
        for _ in range(2):
            assert s.client.get("/v1/whoami", headers=slow).status_code == 200
        r = s.append("too many", slow)
        assert r.status_code == 429 and r.json()["error"] == "too_many_requests"
        assert "requests_per_minute" in r.json()["detail"]
        # One token comes back every 20 s: the wait is said in whole seconds.
        assert 1 <= int(r.headers["retry-after"]) <= 20
        # The refusal comes before the body is read, and nothing was stored.
        listing = s.client.get("/v1/memory/events", headers=s.key).json()["events"]
        assert listing == []
        # Another key of the tenant has its own bucket (and no limit).
        for _ in range(10):
            assert s.client.get("/v1/whoami", headers=s.key).status_code == 200
        mcp = s.client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={**slow, "Accept": "application/json, text/event-stream"},
        )
        assert mcp.status_code == 429 and mcp.headers["retry-after"]
        assert s.rejected()["requests_per_minute"] == 2


def test_a_bucket_refills_at_its_rate() -> None:
    now = [100.0]
    buckets = Buckets(clock=lambda: now[0])
    key = ("tenant", "key")
    assert [buckets.take(key, 60) for _ in range(60)] == [0.0] * 60
    assert buckets.take(key, 60) == pytest.approx(1.0)
    now[0] += 0.5
    assert buckets.take(key, 60) == pytest.approx(0.5)  # half a token back
    now[0] += 0.5
    assert buckets.take(key, 60) == 0.0
    now[0] += 3600
    assert [buckets.take(key, 60) for _ in range(60)] == [0.0] * 60  # full, never more
    assert buckets.take(key, 60) > 0
    assert buckets.take(("tenant", "other"), 60) == 0.0


# -- defaults ----------------------------------------------------------------------------------


def test_server_defaults_apply_to_keys_and_tenants_without_their_own(tmp_path: Path) -> None:
    env = {"MEMSPINE_DEFAULT_MAX_EVENTS": "2", "MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE": "5"}
    with start(tmp_path, None, env) as s:
        shown = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        assert shown["max_events"] is None and shown["limits"] == {
            "max_events": 2,
            "max_bytes": None,
            "max_memory": None,
        }
        assert s.append("a").status_code == 201 and s.append("b").status_code == 201
        assert s.append("c").status_code == 403
        assert s.patch(max_events=3).json()["limits"]["max_events"] == 3  # its own beats it
        assert s.append("c").status_code == 201
        fast = s.issue(requests_per_minute=100)
        statuses = [s.client.get("/v1/whoami", headers=fast).status_code for _ in range(8)]
        assert statuses == [200] * 8  # its own rate beats the default
        statuses = [s.client.get("/v1/whoami", headers=s.key).status_code for _ in range(3)]
        assert statuses == [200, 429, 429]  # five requests a minute: four were spent above


def test_the_defaults_hold_in_local_mode_too(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(tmp_path),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_DEFAULT_MAX_BYTES": "1K",
            "MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE": "6",
        }
    )
    with TestClient(create_app(settings)) as c:
        auth = {"Authorization": "Bearer acme"}
        body = {"kind": "note", "text": "x" * 600}
        assert c.post("/v1/memory/event", json=body, headers=auth).status_code == 201
        r = c.post("/v1/memory/event", json=body, headers=auth)
        assert r.status_code == 403 and "at most 1024 bytes" in r.json()["detail"]
        other = {"Authorization": "Bearer other"}  # each tenant its own quota
        assert c.post("/v1/memory/event", json=body, headers=other).status_code == 201
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "memory_append", "arguments": {"kind": "note", "text": "y" * 600}},
        }
        r = c.post(
            "/mcp", json=call, headers={**auth, "Accept": "application/json, text/event-stream"}
        )
        result = r.json()["result"]
        assert result["isError"] is True
        assert result["structuredContent"]["error"] == "quota_exceeded"
        # Six requests a minute for each tenant id: acme has made three, other one.
        statuses = [c.get("/v1/whoami", headers=auth).status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        assert c.get("/v1/whoami", headers=other).status_code == 200


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("MEMSPINE_DEFAULT_MAX_EVENTS", "-1", "whole number"),
        ("MEMSPINE_DEFAULT_MAX_BYTES", "1X", "whole number"),
        ("MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE", "1000001", "at most"),
    ],
)
def test_a_bad_default_stops_the_server_naming_it(name: str, value: str, why: str) -> None:
    from memspine.config import SettingsError

    with pytest.raises(SettingsError, match=f"{name}: .*{why}"):
        load_settings({name: value})
    assert load_settings({name: "0"}).default_max_events is None


# -- hostile paths -------------------------------------------------------------------------------


def _queued(tenant: Any, n: int, timeout: float = 10.0) -> None:
    """Wait until n jobs wait in the tenant's writer queue."""
    deadline = time.monotonic() + timeout
    while tenant.writer.queued() < n:
        waiting = tenant.writer.queued()
        assert time.monotonic() < deadline, f"{waiting} of {n} appends reached the writer"
        time.sleep(0.01)


@pytest.mark.parametrize("hot", [True, False])
def test_a_limit_lowered_while_appends_wait_holds_for_them(
    tmp_path: Path, url: str | None, hot: bool
) -> None:
    with start(tmp_path, url, hot=hot) as s:
        assert s.append("first").status_code == 201 and s.append("second").status_code == 201
        engine = s.client.app.state["engine"]
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:
            busy.set()
            release.wait()

        with engine.manager.inspect(s.tenant_id) as tenant:
            held = tenant.call(hold)  # the writer is busy until released
        assert busy.wait(10)  # and nothing queued after this joins the call's batch
        statuses: list[int] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            status = s.append(f"waiting {i}").status_code
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        try:
            for t in threads:
                t.start()
            _queued(tenant, 6)  # admitted, their quota taken, waiting for the writer
            # Lowered while they wait: the writer holds them to it when it gets to them.
            assert s.patch(max_events=4).status_code == 200
        finally:
            release.set()
            held.result(timeout=10)
            for t in threads:
                t.join(timeout=30)
        assert sorted(statuses) == [201, 201, 403, 403, 403, 403]
        shown = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        assert shown["usage"]["events"]["live"] == 4
        # Raised again while refused: the next write goes in.
        assert s.patch(max_events=5).status_code == 200
        assert s.append("fits again").status_code == 201


def test_a_tenant_at_its_quota_appending_a_batch(tmp_path: Path, url: str | None) -> None:
    with start(tmp_path, url) as s:

        def post(events: list[dict[str, Any]]) -> Any:
            return s.client.post("/v1/memory/events", json={"events": events}, headers=s.key)

        assert s.patch(max_events=5).status_code == 200
        keyed = [
            {"kind": "note", "text": f"keyed {i}", "idempotency_key": f"k{i}"} for i in range(3)
        ]
        first = post(keyed)
        assert first.status_code == 201
        # Exactly the room left: it goes in whole.
        two = [{"kind": "note", "text": f"fill {i}"} for i in range(2)]
        assert post(two).status_code == 201
        # At the limit: a replay of the keyed batch stores nothing and is answered as before.
        again = post(keyed)
        assert again.status_code == 200 and again.json()["event_ids"] == first.json()["event_ids"]
        # Replays and one new event: the new one does not fit, so the batch stores nothing.
        r = post([*keyed, {"kind": "note", "text": "one too many"}])
        assert r.status_code == 403 and r.json()["error"] == "quota_exceeded"
        assert r.json()["detail"].startswith("events[3]: this tenant may store at most 5 live")
        assert r.json()["detail"].endswith("the batch stored nothing")
        shown = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        assert shown["usage"]["events"]["live"] == 5
        # A delete frees room for exactly one.
        victim = first.json()["event_ids"][0]
        assert s.client.delete(f"/v1/memory/event/{victim}", headers=s.key).status_code == 200
        assert post(two).status_code == 403
        assert post(two[:1]).status_code == 201
        assert s.rejected()["max_events"] == 2


def test_limits_and_rates_survive_a_restart(tmp_path: Path, url: str | None) -> None:
    with start(tmp_path, url) as s:
        assert s.patch(max_events=2, max_bytes=1 << 20).status_code == 200
        slow = s.issue(requests_per_minute=2)
        assert s.append("a").status_code == 201 and s.append("b").status_code == 201
        assert s.append("c").status_code == 403
        first = s
    with start(tmp_path, url, again=first) as s:
        shown = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
        assert (shown["max_events"], shown["max_bytes"]) == (2, 1 << 20)
        assert shown["usage"]["events"]["live"] == 2 and shown["keys"]["active"] == 2
        assert s.append("c").status_code == 403
        keys = s.client.get("/v1/admin/keys", headers=ADMIN).json()["keys"]
        assert sorted(k["requests_per_minute"] or 0 for k in keys) == [0, 2]
        # A bucket starts full in a new process: the key's rate, not what it spent before.
        assert [s.client.get("/v1/whoami", headers=slow).status_code for _ in range(3)] == [
            200,
            200,
            429,
        ]


def test_every_door_refuses_over_the_limits_the_same_way(tmp_path: Path) -> None:
    accept = {"Accept": "application/json, text/event-stream"}
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "memory_append", "arguments": {"kind": "note", "text": "over"}},
    }
    for hot in (True, False):
        with start(tmp_path / str(hot), None, hot=hot) as s:
            assert s.patch(max_events=1).status_code == 200
            assert s.append("in").status_code == 201
            http = s.append("over")
            batch = s.client.post(
                "/v1/memory/events", json={"events": [{"kind": "k"}]}, headers=s.key
            )
            mcp = s.client.post("/mcp", json=call, headers={**s.key, **accept}).json()["result"]
            assert http.status_code == batch.status_code == 403
            assert mcp["isError"] is True
            assert http.json()["error"] == mcp["structuredContent"]["error"] == "quota_exceeded"
            assert http.json()["detail"] == mcp["structuredContent"]["detail"]
            assert batch.json()["detail"] == "events[0]: " + http.json()["detail"] + (
                "; the batch stored nothing"
            )
            slow = s.issue(requests_per_minute=1)
            assert s.client.get("/v1/whoami", headers=slow).status_code == 200
            refused = [
                s.append("x", slow),
                s.client.post("/v1/memory/events", json={"events": [{"kind": "k"}]}, headers=slow),
                s.client.post("/v1/memory/recall", json={"text": "x"}, headers=slow),
                s.client.post("/mcp", json=call, headers={**slow, **accept}),
            ]
            assert [r.status_code for r in refused] == [429] * 4
            assert len({r.json()["detail"] for r in refused}) == 1
            assert all(1 <= int(r.headers["retry-after"]) <= 60 for r in refused)


def test_concurrent_requests_of_one_key_get_exactly_its_rate(tmp_path: Path) -> None:
    with start(tmp_path, None) as s:
        rate = 40
        key = s.issue(requests_per_minute=rate)
        statuses: list[int] = []
        lock = threading.Lock()
        began = time.monotonic()

        def hammer() -> None:
            for _ in range(10):
                status = s.client.get("/v1/whoami", headers=key).status_code
                with lock:
                    statuses.append(status)

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
        refilled = int(elapsed * rate / 60)  # tokens that came back while it ran
        assert set(statuses) == {200, 429}
        assert rate <= statuses.count(200) <= rate + refilled


def test_patch_refuses_bad_limits_and_takes_an_empty_change(tmp_path: Path) -> None:
    with start(tmp_path, None) as s:
        assert s.patch(max_events=7).status_code == 200
        for bad, words in (
            ({"max_events": 0}, "max_events"),
            ({"max_bytes": "5"}, "max_bytes"),
            ({"max_events": 1.5}, "max_events"),
            ({"max_keys": 1}, "max_keys"),
        ):
            r = s.patch(**bad)
            assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
            assert words in r.json()["detail"]
        same = s.patch()
        assert same.status_code == 200 and same.json()["max_events"] == 7
        entries = s.client.get("/v1/admin/audit", headers=ADMIN).json()["entries"]
        assert [e["detail"] for e in entries if e["action"] == "tenant.limits"] == [
            {"max_events": 7}
        ]
        unknown = "0c6c2c85-59a4-4b2d-8a4b-2b1f4a9d2a11"
        for method in ("GET", "PATCH"):
            r = s.client.request(
                method, f"/v1/admin/tenants/{unknown}", json={"max_events": 1}, headers=ADMIN
            )
            assert r.status_code == 404 and r.json()["detail"] == "no tenant with that id"
        r = s.client.get("/v1/admin/tenants/not-a-tenant", headers=ADMIN)
        assert r.status_code == 404
        assert s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=s.key).status_code == 401


def test_max_memory_holds_the_open_tenants_memory(tmp_path: Path, url: str | None) -> None:
    with start(tmp_path, url) as s:
        assert s.append("opens it").status_code == 201
        # The keyword fold makes its writer after the first write (megabytes): measure once the
        # figure has settled, or the first append under the limit would meet that growth.
        readings: list[int] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(readings) < 3 or len(set(readings[-3:])) > 1):
            time.sleep(0.1)
            memory = s.client.get(f"/v1/admin/tenants/{s.tenant_id}", headers=ADMIN).json()
            readings.append(memory["usage"]["memory"])
        held = memory["usage"]["memory"]
        assert memory["usage"]["open"] is True and held > 0
        # Room for a few vectors more: what the exact tail holds grows with each.
        r = s.patch(max_memory=held + 64 * 1024)
        assert r.status_code == 200 and r.json()["limits"]["max_memory"] == held + 64 * 1024
        statuses = []
        for i in range(200):
            body = {"kind": "note", "text": f"vector {i}", "embedding": [0.1, 0.2, 0.3, float(i)]}
            r = s.client.post("/v1/memory/event", json=body, headers=s.key)
            statuses.append(r.status_code)
            if r.status_code == 403:
                assert r.json()["error"] == "quota_exceeded" and "max_memory" in r.json()["detail"]
                break
        assert statuses[0] == 201 and statuses[-1] == 403, statuses
        # The refusal names what the tenant held when its commit was weighed: the limit at least.
        # (A later reading of the usage may be lower: the background inserter and the keyword
        # fold move what the tails held, sooner or later on a loaded machine.)
        said = re.search(r"and holds (\d+)", r.json()["detail"])
        assert said is not None and int(said.group(1)) >= held + 64 * 1024, r.json()["detail"]
        # Reads still work; removing the limit lets writes in again.
        assert (
            s.client.post("/v1/memory/recall", json={"text": "vector"}, headers=s.key).status_code
            == 200
        )
        assert s.patch(max_memory=None).json()["limits"]["max_memory"] is None
        assert s.append("fits again").status_code == 201
        assert s.rejected()["max_memory"] == 1


def test_a_full_tenants_appends_are_refused_before_their_body_is_decoded(tmp_path: Path) -> None:
    """Once its quota refused an append, a tenant still full is refused the next at once: a
    body that is not even JSON gets 403, not 400 (it was never decoded), unless the request
    may be an idempotent replay (a key in its header or body), which is answered as before."""
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(tmp_path),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_DEFAULT_MAX_EVENTS": "2",
        }
    )
    app = create_app(settings)
    with TestClient(app) as c:
        auth = {"Authorization": "Bearer acme", "Content-Type": "application/json"}
        ids = [
            c.post("/v1/memory/event", json={"kind": "note", "text": f"n{i}"}, headers=auth).json()[
                "event_id"
            ]
            for i in range(2)
        ]
        r = c.post("/v1/memory/event", json={"kind": "note", "text": "n2"}, headers=auth)
        assert r.status_code == 403  # refused by the writer: the tenant is known full
        junk = b"[" + b"x" * (2 << 20)  # 2 MiB that no decoder would take
        statuses = [
            c.post("/v1/memory/events", content=junk, headers=auth).status_code,
            c.post("/v1/memory/event", content=junk[:1000], headers=auth).status_code,
            # May be replays: read and decoded as ever (so the junk is a 400).
            c.post(
                "/v1/memory/events", content=junk, headers={**auth, "Idempotency-Key": "k"}
            ).status_code,
            c.post(
                "/v1/memory/events", content=b'{"idempotency_key"' + junk, headers=auth
            ).status_code,
        ]
        assert statuses == [403, 403, 400, 400]
        assert app.state.engine.full.refused_unread == 2
        # A delete makes room: the next append is read and stored.
        assert c.delete(f"/v1/memory/event/{ids[0]}", headers=auth).status_code == 200
        r = c.post("/v1/memory/event", json={"kind": "note", "text": "n3"}, headers=auth)
        assert r.status_code == 201
        assert app.state.engine.full.refused_unread == 2
