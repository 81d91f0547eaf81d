"""A real server whose two pool writer threads commit the groups of six tenants at once, killed
with SIGKILL: after the restart every tenant holds every event it was acknowledged, and none of
another's (storage/tenants/pool.py)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx

from tests.support.disk_full import listed_ids

TENANTS = 6
CLIENTS_PER_TENANT = 2
MIN_ACKED = 40  # per tenant, before the kill: every tenant's groups were being committed
T0 = 1_791_208_939_000_000  # µs in 2026


class Client(threading.Thread):
    """Appends to one tenant as fast as the server answers, noting each acknowledged event."""

    def __init__(self, url: str, tenant: str, number: int) -> None:
        super().__init__(daemon=True)
        self.url, self.tenant, self.number = url, tenant, number
        self.acked: set[str] = set()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.tenant}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as c:
            for n in range(100_000):
                body = {
                    "kind": "pooled",
                    "ts": T0 + 1000 * n + self.number,
                    "text": f"{self.tenant} client {self.number} event {n}",
                    "embedding": [1.0, float(self.number), float(n), 0.5],
                }
                try:
                    r = c.post("/v1/memory/event", json=body)
                except httpx.HTTPError:
                    return  # the server died: what was acknowledged before counts
                if r.status_code != 201:
                    return
                self.acked.add(r.json()["event_id"])


def test_sigkill_while_the_pool_commits_several_tenants_loses_no_acknowledged_event(
    start_server: Any,
) -> None:
    server = start_server(env={"MEMSPINE_WRITER_THREADS": "2"})
    tenants = [f"pool-tenant-{i}" for i in range(TENANTS)]
    clients = [Client(server.url, t, k) for t in tenants for k in range(CLIENTS_PER_TENANT)]
    for client in clients:
        client.start()

    def acked(tenant: str) -> set[str]:
        return {e for c in clients if c.tenant == tenant for e in set(c.acked)}

    deadline = time.monotonic() + 120
    while min(len(acked(t)) for t in tenants) < MIN_ACKED:
        assert time.monotonic() < deadline, "the tenants were not all written"
        time.sleep(0.01)
    server.stop(signal.SIGKILL)
    for client in clients:
        client.join(timeout=30)
    server.start()
    seen: set[str] = set()
    for tenant in tenants:
        with server.client(tenant) as c:
            ids = listed_ids(c)
        missing = acked(tenant) - ids
        assert not missing, f"{tenant}: {len(missing)} acknowledged events lost"
        assert not ids & seen  # no tenant holds another's events
        seen |= ids
