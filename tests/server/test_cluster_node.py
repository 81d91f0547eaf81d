"""Two cluster nodes in process on one PostgreSQL control plane: a node serves only the tenants
placed on it (421 `misdirected`, never an empty directory), whatever the door, and a move's
hold refuses writes (503 with Retry-After) while reads go on (memspine/cluster.py)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from memspine_admin.control_pg import PgControl
from memspine_admin.placement import MISDIRECTED, MOVING
from tests.support.control import CHEAP_HASHER as WEAK
from tests.support.wait import wait_until

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


def test_a_hold_left_by_a_killed_move_runs_out_with_its_lease(cluster: dict[str, Any]) -> None:
    """A move killed while it holds writes (its hold made HOLD_LEASE_SECS ago, by a clock set
    back) refuses them no more: they go on where the tenant is, even after the source's
    drain, and the move's switch is refused (the copy would be behind), so nothing is lost."""
    from memspine_admin.placement import HOLD_LEASE_SECS
    from storage.errors import Conflict

    a = cluster["nodes"]["a"]
    tid, key = cluster["tenant"], cluster["key"]
    past = int((time.time() - HOLD_LEASE_SECS - 5) * 1e6)
    with (
        a.client(key) as ca,
        PgControl.open(cluster["url"], hasher=WEAK, clock=lambda: past) as killed,
    ):
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201
        killed.begin_move(tid, "node-b", actor="test")
        killed.hold_writes(tid, actor="test")  # then the mover was killed
        a.auth.gate.drain(tid)
        statuses = [ca.post("/v1/memory/event", json=EVENT).status_code for _ in range(3)]
        assert statuses == [201, 201, 201]
        assert len(ca.get("/v1/memory/events").json()["events"]) == 4
        with pytest.raises(Conflict, match="lease"):
            killed.switch_move(tid, actor="test")
        killed.abort_move(tid, actor="test")
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201


def test_a_copy_left_by_a_killed_move_is_erased_by_its_old_node(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """A move killed between its switch and its erase leaves the tenant's files on its old node:
    that node erases them itself (at start and with its heartbeat) once the tenant serves from
    its new node alone; while the switched move still holds writes, or for a tenant it never
    moved away, it keeps them. Counted: which directories are on node-a's disk."""
    from memspine.leftovers import Leftovers
    from memspine_admin.placement import HOLD_LEASE_SECS

    a = cluster["nodes"]["a"]
    tid, key = cluster["tenant"], cluster["key"]
    past = int((time.time() - HOLD_LEASE_SECS - 5) * 1e6)
    with PgControl.open(cluster["url"], hasher=WEAK) as db:
        stays = db.create_tenant("stays-on-a", actor="test", node="node-a")
        stays_key = db.create_key(stays.tenant_id, "agent", actor="test")
        other = db.create_tenant("moved-by-hand", actor="test", node="node-a")
        other_key = db.create_key(other.tenant_id, "agent", actor="test")
    with a.client(key) as ca, a.client(stays_key.api_key) as cs, a.client(other_key.api_key) as co:
        for c in (ca, cs, co):
            assert c.post("/v1/memory/event", json=EVENT).status_code == 201
    on_a = tmp_path / "a"
    sweeper = Leftovers(a.app.state.engine, a.auth.gate, on_a)
    with PgControl.open(cluster["url"], hasher=WEAK) as db:
        db.begin_move(tid, "node-b", actor="test")
        db.hold_writes(tid, actor="test")
        db.switch_move(tid, actor="test")  # then the move command was killed
        # Placed elsewhere by hand (no move switched it away): never taken for a leftover.
        with db._conn() as conn:
            conn.execute(
                "UPDATE tenants SET node = 'node-b' WHERE tenant_id = %s", (other.tenant_id,)
            )
        assert sweeper.sweep() == []  # switched, its hold in force: node-a still serves reads
        assert (on_a / tid).is_dir()
    # The hold made long ago (its lease run out): the sweep finishes the move and erases.
    with PgControl.open(cluster["url"], hasher=WEAK) as db, db._conn() as conn:
        conn.execute(
            "UPDATE audit SET ts = %s WHERE tenant_id = %s AND action = 'tenant.move'",
            (past, tid),
        )
    deadline = time.monotonic() + 30  # the node's own loop: at start and every 5 s
    while (on_a / tid).exists():
        assert time.monotonic() < deadline, "node-a kept the copy its move left"
        time.sleep(0.05)
    with PgControl.open(cluster["url"], hasher=WEAK) as db:
        placement = db.placement(tid)
        assert placement is not None and (placement.node, placement.move_from) == ("node-b", None)
    assert (on_a / stays.tenant_id).is_dir() and (on_a / other.tenant_id).is_dir()
    assert sweeper.sweep() == []


def test_a_copy_a_given_up_move_left_on_its_target_is_erased_there(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """A move given up after its copy landed on the target leaves the tenant's files there: the
    target erases them once the tenant is neither on it nor moving to it. While the move is
    under way, or for a tenant whose move to it was never begun, it keeps them."""
    from memspine.leftovers import Leftovers

    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    tid, key = cluster["tenant"], cluster["key"]
    with a.client(key) as ca:
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201
    on_b = tmp_path / "b"
    stray = str(uuid.uuid4())  # a directory no move ever brought here: never the sweep's
    for landed in (tid, stray):
        (on_b / landed / "events").mkdir(parents=True)
        (on_b / landed / "events" / "data.mdb").write_bytes(b"the copy the move pulled")
    sweeper = Leftovers(b.app.state.engine, b.auth.gate, on_b)
    with PgControl.open(cluster["url"], hasher=WEAK) as db:
        db.begin_move(tid, "node-b", actor="test")
        assert sweeper.sweep() == []  # the copy is the move's, under way
        assert (on_b / tid).is_dir()
        db.abort_move(tid, actor="test")
    assert sweeper.sweep() == [tid]
    assert not (on_b / tid).exists() and (on_b / stray).is_dir()
    with a.client(key) as ca:  # the tenant is where it was, whole
        assert ca.post("/v1/memory/event", json=EVENT).status_code == 201
        assert len(ca.get("/v1/memory/events").json()["events"]) == 2
    assert sweeper.sweep() == []
