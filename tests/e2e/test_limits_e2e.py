"""Limits on a real server over sockets: one key's rate under many concurrent connections, a
limit set by memspine-admin in another process while the server runs, `tenant show` beside
the server, and a batch load at its quota cut by kill -9, after which the figures and the
limits are what they were (tests/server/test_limits.py has the rest in process)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage.log.eventlog import read_only, record_bytes
from storage.tenants.usage import closed_usage
from tests.support.admin import Admin
from tests.support.servers import ServerProcess

ADMIN_KEY = "admin-key-for-the-limits-e2e-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Running:
    server: ServerProcess
    admin: Admin

    def tenant(self, name: str, **key: Any) -> tuple[str, str]:
        """A new tenant and one key for it (the key's own fields as given)."""
        r = httpx.post(
            self.server.url + "/v1/admin/tenants", json={"name": name}, headers=ADMIN, timeout=30
        )
        assert r.status_code == 201, r.text
        tid = r.json()["tenant_id"]
        return tid, self.key(tid, **key)

    def key(self, tenant_id: str, **more: Any) -> str:
        body = {"tenant_id": tenant_id, "name": "k", **more}
        r = httpx.post(self.server.url + "/v1/admin/keys", json=body, headers=ADMIN, timeout=30)
        assert r.status_code == 201, r.text
        return str(r.json()["api_key"])

    def shown(self, tenant_id: str) -> Any:
        r = httpx.get(f"{self.server.url}/v1/admin/tenants/{tenant_id}", headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("limits")
    admin = Admin(root / "data", root)
    admin.ok("init")
    server = ServerProcess(root / "data", {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    yield Running(server, admin)
    server.stop()


def test_one_keys_rate_holds_across_many_connections(running: Running) -> None:
    rate = 60
    tid, key = running.tenant("hammered", requests_per_minute=rate)
    calm = running.key(tid)  # the same tenant, its own bucket (no limit)
    statuses: list[int] = []
    retry_after: set[str] = set()
    lock = threading.Lock()
    go = threading.Barrier(16)

    with running.server.client(key) as c:  # verified once (argon2), then from the cache
        statuses.append(c.get("/v1/whoami").status_code)

    def connection() -> None:
        with running.server.client(key) as c:  # a connection of its own
            go.wait()
            for _ in range(8):
                r = c.get("/v1/whoami")
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 429:
                        retry_after.add(r.headers["retry-after"])

    began = time.monotonic()
    threads = [threading.Thread(target=connection) for _ in range(16)]
    for t in threads:
        t.start()
    with running.server.client(calm) as c:
        assert all(c.get("/v1/whoami").status_code == 200 for _ in range(20))
    for t in threads:
        t.join()
    refilled = int((time.monotonic() - began) * rate / 60) + 1  # the bucket's first token included
    assert len(statuses) == 129 and set(statuses) == {200, 429}
    assert rate <= statuses.count(200) <= rate + refilled
    assert retry_after and all(1 <= int(s) <= 60 for s in retry_after)
    metrics = httpx.get(running.server.url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if 'reason="requests_per_minute"' in x)
    assert float(line.split()[-1]) >= statuses.count(429)


def test_a_limit_set_from_the_command_line_holds_on_the_next_write(running: Running) -> None:
    tid, key = running.tenant("commanded")
    with running.server.client(key) as c:
        for i in range(3):
            assert (
                c.post("/v1/memory/event", json={"kind": "k", "text": f"e{i}"}).status_code == 201
            )
        running.admin.ok("tenant", "limits", tid, "--max-events", "3")  # another process
        r = c.post("/v1/memory/event", json={"kind": "k", "text": "one more"})
        assert r.status_code == 403 and r.json()["error"] == "quota_exceeded"
        # The command reads the files the server holds open: the same figures.
        shown = running.admin.json("tenant", "show", tid)
        assert shown["max_events"] == 3 and shown["usage"]["events"]["live"] == 3
        assert shown["usage"]["bytes"]["live"] == running.shown(tid)["usage"]["bytes"]["live"]
        r = httpx.patch(
            f"{running.server.url}/v1/admin/tenants/{tid}",
            json={"max_events": None},
            headers=ADMIN,
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["limits"]["max_events"] is None
        assert c.post("/v1/memory/event", json={"kind": "k", "text": "fits"}).status_code == 201


# Last: it leaves the server stopped.
def test_a_batch_load_at_its_quota_cut_by_kill_9_keeps_figures_and_limits(
    running: Running,
) -> None:
    tid, key = running.tenant("loaded")
    r = httpx.patch(
        f"{running.server.url}/v1/admin/tenants/{tid}",
        json={"max_events": 700},
        headers=ADMIN,
        timeout=30,
    )
    assert r.status_code == 200
    stored: list[str] = []
    refused: list[int] = []
    errors: list[BaseException] = []

    def load(n: int) -> None:
        try:
            with running.server.client(key) as c:
                for b in range(100):
                    events = [{"kind": "k", "text": f"w{n} b{b} e{i}"} for i in range(25)]
                    r = c.post("/v1/memory/events", json={"events": events})
                    if r.status_code == 403:
                        refused.append(b)
                        continue
                    assert r.status_code == 201, r.text
                    stored.extend(r.json()["event_ids"])
        except httpx.TransportError:
            return  # the server was killed under it
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(stored) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    running.server.stop(signal.SIGKILL)
    for t in threads:
        t.join()
    assert not errors, errors
    running.server.start()
    shown = running.shown(tid)
    live = shown["usage"]["events"]["live"]
    # Every acknowledged batch survived; batches are whole; the quota was never passed.
    assert len(stored) <= live <= 700 and live % 25 == 0
    with running.server.client(key) as c:
        listed = c.get("/v1/memory/events", params={"limit": 1000}).json()["events"]
        assert len(listed) == live and set(stored) <= {e["event_id"] for e in listed}
        room = 700 - live
        if room:
            filler = [{"kind": "k", "text": f"fill {i}"} for i in range(room)]
            assert c.post("/v1/memory/events", json={"events": filler}).status_code == 201
        over = c.post("/v1/memory/events", json={"events": [{"kind": "k", "text": "over"}]})
        assert over.status_code == 403 and "max_events" in over.json()["detail"]
    # The live bytes the log keeps equal its records' after the crash (read from the files).
    running.server.stop()
    root = Path(running.admin.data_dir) / tid
    usage = closed_usage(root)
    with read_only(root / "events") as r:
        assert usage.events.live == r.event_count() == 700
        assert usage.bytes.live == record_bytes(r) > 0
