"""Placement in the PostgreSQL control plane: a chosen node, the least-loaded default from the
nodes' own figures, what a node may serve, and the steps of a move (memspine_admin/placement.py,
memspine_admin/control_pg.py)."""

from __future__ import annotations

import msgspec
import psycopg
import pytest

from memspine_admin.control_pg import NodeReporter, PgControl
from memspine_admin.placement import (
    LIVE_SECS,
    NEW_TENANT_BYTES,
    NodeFigures,
    NodeLoad,
    Placement,
    least_loaded,
    refusal,
)
from memspine_admin.records import now_us
from storage.errors import Conflict, InvalidRequest, Misdirected, NotFound, Unavailable
from tests.support.control import CHEAP_HASHER as WEAK

NOW = 10**15


def _nodes(url: str, *names: str) -> None:
    for name in names:
        PgControl.open(url, node=name, node_url=f"http://{name}.test:7780").close()


def test_the_least_loaded_node_weighs_bytes_and_tenants_placed_since_the_report() -> None:
    a = NodeLoad(name="a", bytes=5 * NEW_TENANT_BYTES, tenants=5, placed=5, seen_at=NOW)
    b = NodeLoad(name="b", bytes=2 * NEW_TENANT_BYTES, tenants=1, placed=4, seen_at=NOW)
    assert b.load == 5 * NEW_TENANT_BYTES  # 3 placed since its report count 1 MiB each
    assert least_loaded([a, b], NOW) == "b"  # equal load: fewer placed tenants
    c = NodeLoad(name="c", bytes=0, seen_at=NOW - int(LIVE_SECS * 1e6) - 1)
    assert least_loaded([a, b, c], NOW) == "b"  # c is emptiest but not seen lately
    assert least_loaded([c], NOW) == "c"  # with no live node, any node rather than none
    assert least_loaded([], NOW) is None


def test_what_a_node_may_serve() -> None:
    here = Placement(node="a")
    assert refusal(here, "a", write=True) is None
    assert isinstance(refusal(here, "b", write=False), Misdirected)
    assert refusal(Placement(node=None), "b", write=True) is None  # unplaced: one machine
    assert refusal(None, "b", write=True) is None  # unknown tenants are authentication's
    assert refusal(here, None, write=True) is None  # a server that is no cluster node
    copying = Placement(node="a", move_to="b")
    assert refusal(copying, "a", write=True) is None
    assert isinstance(refusal(copying, "b", write=False), Misdirected)  # not its copy yet
    tail = Placement(node="a", move_to="b", writes_held=True)
    assert refusal(tail, "a", write=False) is None
    held = refusal(tail, "a", write=True)
    assert isinstance(held, Unavailable) and held.headers == {"Retry-After": "1"}
    switched = Placement(node="b", move_from="a", writes_held=True)
    assert refusal(switched, "a", write=False) is None  # a stale route still reads
    assert isinstance(refusal(switched, "a", write=True), Unavailable)
    assert isinstance(refusal(switched, "b", write=True), Unavailable)
    assert refusal(switched, "b", write=False) is None
    assert isinstance(refusal(switched, "c", write=False), Misdirected)
    error = Misdirected("x")
    assert (error.status, error.code) == (421, "misdirected")


def test_a_tenant_goes_to_the_node_asked_for_or_the_least_loaded(control_url: str) -> None:
    _nodes(control_url, "node-1", "node-2", "node-3")
    with PgControl.open(control_url, hasher=WEAK) as db:
        chosen = db.create_tenant("chosen", actor="test", node="node-3")
        assert chosen.node == "node-3" == db.get_tenant(chosen.tenant_id).node  # type: ignore[union-attr]
        with pytest.raises(NotFound, match="no node named 'node-9'"):
            db.create_tenant("nowhere", actor="test", node="node-9")
        with pytest.raises(InvalidRequest):
            db.create_tenant("bad", actor="test", node="Node_1")
        assert [t.name for t in db.list_tenants()] == ["chosen"]  # the refusals made nothing
        burst = [db.create_tenant(f"t{i}", actor="test").node for i in range(8)]
        # node-3 holds one already: the burst fills node-1 and node-2 first, then takes turns.
        assert sorted(burst) == ["node-1"] * 3 + ["node-2"] * 3 + ["node-3"] * 2
        entries, _ = db.audit(tenant_id=chosen.tenant_id)
        assert entries[0].detail == {"name": "chosen", "node": "node-3"}
        loads = {n.name: n for n in db.node_loads()}
        assert loads["node-1"].url == "http://node-1.test:7780"
        assert {n: loads[n].placed for n in loads} == {"node-1": 3, "node-2": 3, "node-3": 3}


def test_the_nodes_own_figures_steer_new_tenants(control_url: str) -> None:
    _nodes(control_url, "node-1", "node-2")
    # node-1 reports a big tenant on its disk: new tenants go to node-2 until it holds as much.
    NodeReporter(control_url, "node-1", lambda: NodeFigures(1, 4 * NEW_TENANT_BYTES, 1)).stop()
    NodeReporter(control_url, "node-2", lambda: NodeFigures(0, 0, 0)).stop()
    with PgControl.open(control_url, hasher=WEAK) as db:
        loads = {n.name: n for n in db.node_loads()}
        assert (loads["node-1"].tenants, loads["node-1"].bytes, loads["node-1"].open_tenants) == (
            1,
            4 * NEW_TENANT_BYTES,
            1,
        )
        placed = [db.create_tenant(f"t{i}", actor="test").node for i in range(5)]
        assert placed == ["node-2"] * 4 + ["node-1"]
        # A node that stopped beating gets no new tenant while another is live.
        with psycopg.connect(control_url, autocommit=True) as conn:
            conn.execute("UPDATE nodes SET seen_at = 0 WHERE name = 'node-2'")
        assert db.create_tenant("late", actor="test").node == "node-1"
        assert now_us() > 0


def test_the_steps_of_a_move_and_the_routes_that_follow_them(control_url: str) -> None:
    _nodes(control_url, "node-1", "node-2")
    with PgControl.open(control_url, hasher=WEAK) as db:
        t = db.create_tenant("moving", actor="test", node="node-1")
        tid = t.tenant_id
        route = db.tenant_route(tid)
        with pytest.raises(Conflict, match="not being moved"):
            db.hold_writes(tid, actor="test")
        with pytest.raises(Conflict, match="on node-1 already"):
            db.begin_move(tid, "node-1", actor="test")
        with pytest.raises(NotFound):
            db.begin_move(tid, "node-7", actor="test")
        generation = db.generation()
        assert db.begin_move(tid, "node-2", actor="test") == Placement(
            node="node-1", move_to="node-2"
        )
        assert db.generation() == generation + 1  # every step moves it: nodes re-read
        assert db.begin_move(tid, "node-2", actor="test").move_to == "node-2"  # resumable
        assert db.routes()[route] == "node-1"  # still served where it is
        with pytest.raises(Conflict, match="not switched"):  # nothing to finish yet
            db.finish_move(tid, actor="test")
        db.hold_writes(tid, actor="test")
        held = db.placement(tid)
        assert held.held_since is not None  # the hold's lease runs from the audited hold step
        assert msgspec.structs.replace(held, held_since=None) == Placement(
            node="node-1", move_to="node-2", writes_held=True
        )
        switched = db.switch_move(tid, actor="test")
        assert switched == Placement(node="node-2", move_from="node-1", writes_held=True)
        assert db.routes()[route] == "node-2" == db.routes()[tid]
        assert db.get_tenant(tid).node == "node-2"  # type: ignore[union-attr]
        with pytest.raises(Conflict, match="switched already"):
            db.abort_move(tid, actor="test")
        with pytest.raises(Conflict, match="finishing"):
            db.begin_move(tid, "node-1", actor="test")
        assert db.finish_move(tid, actor="test") == Placement(node="node-2")
        # Moved back and given up: it stays, and writes are no longer held.
        db.begin_move(tid, "node-1", actor="test")
        db.hold_writes(tid, actor="test")
        assert db.abort_move(tid, actor="test") == Placement(node="node-2")
        steps = [e.detail["step"] for e in db.audit(tenant_id=tid)[0] if e.action == "tenant.move"]
        assert steps == ["begin", "begin", "hold", "switch", "finish", "begin", "hold", "abort"]
        assert db.placement("not-a-tenant") is None
