"""Two cluster nodes in process on one PostgreSQL control plane: a node serves only the tenants
placed on it (421 `misdirected`, never an empty directory), whatever the door, and a move's
hold refuses writes (503 with Retry-After) while reads go on (memspine/cluster.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from memspine_admin.control_pg import PgControl
from memspine_admin.placement import MISDIRECTED, MOVING
from tests.support.wait import wait_until

WEAK = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
ADMIN = "admin-key-for-the-cluster-node-tests"
EVENT = {"kind": "note", "text": "the orchid blooms in march", "embedding": [1.0, 0.0, 0.0, 0.0]}


@pytest.fixture
def cluster(start_server: Any, tmp_path: Path, control_url: str) -> dict[str, Any]:
    """node-a and node-b, a tenant placed on node-a and a key of it."""
    nodes = {
        name: start_server(
            env={
                "MEMSPINE_CONTROL_URL": control_url,
                "MEMSPINE_NODE": f"node-{name}",
                "MEMSPINE_ADMIN_KEY": ADMIN,
            },
            data_dir=tmp_path / name,
            hasher=WEAK,
        )
        for name in ("a", "b")
    }
    with PgControl.open(control_url, hasher=WEAK) as db:
        tenant = db.create_tenant("placed-on-a", actor="test", node="node-a")
        key = db.create_key(tenant.tenant_id, "agent", actor="test")
    return {"nodes": nodes, "tenant": tenant.tenant_id, "key": key.api_key, "url": control_url}


def _misdirected(r: httpx.Response) -> None:
    assert r.status_code == 421, r.text
    assert r.json() == {"error": "misdirected", "detail": MISDIRECTED}


def test_a_node_serves_only_its_tenants(cluster: dict[str, Any], tmp_path: Path) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    tid, key = cluster["tenant"], cluster["key"]
    with a.client(key) as ca, b.client(key) as cb:
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201
        for r in (
            cb.post("/v1/memory/event", json=EVENT),  # the hot route
            cb.post("/v1/memory/recall", json={"text": "orchid", "k": 3}),
            cb.get("/v1/memory/events"),  # Litestar's
            cb.get("/v1/whoami"),
            cb.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "application/json, text/event-stream"},
            ),
        ):
            _misdirected(r)
        assert tid not in r.text
        hits = ca.post("/v1/memory/recall", json={"text": "orchid", "k": 3}).json()["hits"]
        assert [h["text"] for h in hits] == [EVENT["text"]]
    assert (tmp_path / "a" / tid).is_dir()
    assert not (tmp_path / "b" / tid).exists()  # nothing was opened or made on node-b
    # A revoked key is 401 on every node, the wrong one too: the key is checked first.
    with PgControl.open(cluster["url"], hasher=WEAK) as db:
        db.revoke_key(db.list_keys(tid)[0].key_id, actor="test")
    for server in (a, b):
        with server.client(key) as c:
            wait_until(lambda c=c: c.get("/v1/whoami").status_code == 401, "revoked key refused")


def test_a_moves_hold_refuses_writes_serves_reads_and_ends_with_the_move(
    cluster: dict[str, Any],
) -> None:
    a = cluster["nodes"]["a"]
    tid, key = cluster["tenant"], cluster["key"]
    with a.client(key) as ca, PgControl.open(cluster["url"], hasher=WEAK) as db:
        first = ca.post("/v1/memory/event", json=EVENT).json()["event_id"]
        db.begin_move(tid, "node-b", actor="test")
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201  # the bulk copy
        db.hold_writes(tid, actor="test")
        a.auth.gate.drain(tid)
        r = ca.post("/v1/memory/event", json=EVENT)
        assert (r.status_code, r.headers.get("retry-after")) == (503, "1"), r.text
        assert r.json() == {"error": "unavailable", "detail": MOVING}
        r = ca.delete(f"/v1/memory/event/{first}")
        assert (r.status_code, r.json()["detail"]) == (503, MOVING)
        assert ca.post("/v1/memory/recall", json={"text": "orchid", "k": 5}).status_code == 200
        assert len(ca.get("/v1/memory/events").json()["events"]) == 2
        db.abort_move(tid, actor="test")  # given up: writes go on where the tenant is
        answers: list[httpx.Response] = []

        def written() -> bool:
            answers.append(ca.post("/v1/memory/event", json=EVENT))
            return answers[-1].status_code != 503

        wait_until(written, "writes taken again after the abort")
        assert answers[-1].status_code == 201, answers[-1].text


def test_a_drain_waits_for_the_writes_in_flight(cluster: dict[str, Any]) -> None:
    gate = cluster["nodes"]["a"].auth.gate
    tid = cluster["tenant"]
    gate.enter_write(tid)  # a write that passed its checks before the hold
    drained = threading.Event()
    thread = threading.Thread(target=lambda: (gate.drain(tid), drained.set()))
    thread.start()
    time.sleep(0.2)
    assert not drained.is_set()
    gate.exit_write(tid)
    thread.join(5)
    assert drained.is_set()
    with pytest.raises(Exception) as info:  # held here until the plane says otherwise
        gate.enter_write(tid)
    assert getattr(info.value, "status", None) == 503
