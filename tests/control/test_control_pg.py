"""What only the PostgreSQL control plane has: migrations, the generation watcher, placement,
the routes a proxy reads, and a clean 503 when the database is out of reach."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from memspine_admin.control_pg import (
    POLL_SECS,
    STALE_SECS,
    ControlUnavailable,
    GenerationWatcher,
    PgControl,
    migrate,
    migrations,
)
from memspine_admin.controlurl import redact
from memspine_admin.plane import open_control
from storage.errors import Conflict, InvalidRequest
from tests.support.control import CHEAP_HASHER as WEAK
from tests.support.servers import free_port


def _versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM memspine_migrations ORDER BY 1")]


def test_migrations_are_numbered_from_one_and_applied_once(control_url: str) -> None:
    known = migrations()
    assert [v for v, _, _ in known] == list(range(1, len(known) + 1))
    assert PgControl.init(control_url, actor="test") is True
    assert _versions(control_url) == [v for v, _, _ in known]
    with psycopg.connect(control_url) as conn:
        assert migrate(conn) == []  # nothing left to apply
    assert PgControl.init(control_url, actor="test") is False
    assert _versions(control_url) == [v for v, _, _ in known]


def test_nodes_starting_at_once_migrate_once(control_url: str) -> None:
    results: list[bool] = []
    errors: list[BaseException] = []

    def init() -> None:
        try:
            results.append(PgControl.init(control_url, actor="test"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=init) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(results) == [False, False, False, True]
    with open_control(Path("."), control_url) as db:
        entries, _ = db.audit()
    assert [e.action for e in entries] == ["control.init"]


def test_a_schema_from_a_newer_version_is_refused(control_url: str) -> None:
    PgControl.init(control_url, actor="test")
    with psycopg.connect(control_url) as conn:
        conn.execute("INSERT INTO memspine_migrations VALUES (999, 'future', 0)")
    with pytest.raises(Conflict, match="unknown schema version"):
        PgControl.open(control_url)


def test_the_watcher_sees_a_change_without_a_notification_within_the_poll(
    control_url: str,
) -> None:
    """A lost notification costs at most POLL_SECS: the counter is read again that often."""
    PgControl.init(control_url, actor="test")
    watcher = GenerationWatcher(control_url)
    try:
        assert watcher.wait_confirmed(5)
        before = watcher.current()
        with psycopg.connect(control_url) as conn:  # a change that sends no NOTIFY
            conn.execute("UPDATE control_meta SET generation = generation + 1")
        changed = time.monotonic()
        while watcher.current() == before:
            assert time.monotonic() - changed < POLL_SECS + 0.5
            time.sleep(0.005)
        assert watcher.current() == (before or 0) + 1
    finally:
        watcher.stop()


def test_a_notified_change_is_seen_at_once(control_url: str) -> None:
    with PgControl.open(control_url, hasher=WEAK, watch=True) as db:
        tenant = db.create_tenant("acme", actor="test")
        other = PgControl.open(control_url, hasher=WEAK, watch=True)
        try:
            before = other.generation()
            issued = db.create_key(tenant.tenant_id, "agent", actor="test")
            db.revoke_key(issued.key_id, actor="test")
            changed = time.monotonic()
            while other.generation() != before + 2:
                assert time.monotonic() - changed < POLL_SECS
                time.sleep(0.001)
        finally:
            other.close()


def test_a_stale_watcher_falls_back_to_the_database(control_url: str) -> None:
    with PgControl.open(control_url, hasher=WEAK, watch=True) as db:
        assert db._watcher is not None
        db._watcher.stop()
        time.sleep(STALE_SECS + 0.1)
        assert db._watcher.current() is None
        with psycopg.connect(control_url) as conn:
            conn.execute("UPDATE control_meta SET generation = generation + 5")
        assert db.generation() == 6  # read from the database, not the stopped watcher


def test_an_unreachable_database_is_a_503_that_names_no_password() -> None:
    url = f"postgresql://memspine:hunter2@127.0.0.1:{free_port()}/memspine"
    with pytest.raises(ControlUnavailable) as info:
        PgControl.open(url)
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "1"
    assert "hunter2" not in info.value.detail and "memspine:***@" in info.value.detail
    assert redact(url) == url.replace("hunter2", "***")


def test_placement_uses_the_registered_nodes_and_routes_follow(control_url: str) -> None:
    with PgControl.open(control_url, hasher=WEAK) as db:
        alone = db.create_tenant("before-any-node", actor="test")
        assert alone.node is None and db.routes() == {}
    for name in ("node-2", "node-1", "node-3"):
        PgControl.open(control_url, node=name).close()
    with PgControl.open(control_url, hasher=WEAK) as db:
        assert db.nodes() == ["node-1", "node-2", "node-3"]
        tenants = [db.create_tenant(f"t{i}", actor="test") for i in range(30)]
        for t in tenants:
            assert db.get_tenant(t.tenant_id) == t
        # The least-loaded default (tests/control/test_placement.py): a burst spreads evenly.
        assert sorted(t.node or "" for t in tenants) == sorted(
            [f"node-{n}" for n in (1, 2, 3)] * 10
        )
        routes = db.routes()
        for t in tenants:
            route = db.tenant_route(t.tenant_id)
            assert route is not None and routes[route] == t.node == routes[t.tenant_id]
        assert alone.tenant_id not in routes
        db.delete_tenant(tenants[0].tenant_id, actor="test")
        assert tenants[0].tenant_id not in db.routes()


def test_a_bad_node_name_is_refused(control_url: str) -> None:
    with pytest.raises(InvalidRequest):
        PgControl.open(control_url, node="Node_1")


def test_a_tenant_waits_for_live_proxies_to_route_it(control_url: str) -> None:
    """A proxy seen lately that has not applied the tenant's generation holds the creation
    back (until it does, or PROXY_WAIT_SECS); a proxy not seen for long holds nothing."""
    PgControl.open(control_url, node="node-1").close()
    with PgControl.open(control_url, hasher=WEAK) as db:
        with psycopg.connect(control_url, autocommit=True) as conn:
            conn.execute("INSERT INTO proxies VALUES ('gone', 0, 0)")  # seen in 1970
        started = time.monotonic()
        db.create_tenant("quick", actor="test")
        assert time.monotonic() - started < 1.0

        def apply_soon() -> None:
            time.sleep(0.3)
            with psycopg.connect(control_url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE proxies SET applied_generation = (SELECT generation FROM control_meta)"
                    " WHERE name = 'live'"
                )

        with psycopg.connect(control_url, autocommit=True) as conn:
            conn.execute("INSERT INTO proxies VALUES ('live', 0, %s)", (time.time_ns() // 1000,))
        helper = threading.Thread(target=apply_soon)
        helper.start()
        started = time.monotonic()
        db.create_tenant("waits", actor="test")
        waited = time.monotonic() - started
        helper.join()
        assert 0.25 <= waited < 2.0
