"""GET /metrics through the app: the series the issue names, no tenant ids unless asked for, a
registry per app (tests/e2e/test_doors.py: the default cap on open tenants computed from the
raised fd limit, as a real server logs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from memspine.app import create_app
from memspine.config import load_settings
from memspine.metrics import Metrics
from storage.tenants.manager import TenantManager
from tests.support.wait import wait_until

SECRET_TENANT = "acme-private-7f3a"
SECRET_TEXT = "zebra orchid manifesto"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and sorted labels (parsed by prometheus-client)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_expose_requests_tenants_batches_and_map_size_without_tenant_ids(
    start_server: Any,
) -> None:
    server = start_server()
    with server.client(SECRET_TENANT) as c:
        body = {"kind": "turn", "text": SECRET_TEXT, "embedding": [1, 0, 0, 0]}
        event_id = c.post("/v1/memory/event", json=body).json()["event_id"]
        assert c.get(f"/v1/memory/event/{event_id}").status_code == 200
        assert c.get("/v1/memory/event/00000000-0000-4000-8000-000000000000").status_code == 404
    with server.client() as anonymous:  # no auth needed
        r = anonymous.get("/metrics")
        assert anonymous.get("/no/such/route").status_code == 404
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")
    assert r.headers["content-type"].count("charset") == 1
    text = r.text
    for private in (SECRET_TENANT, "zebra", event_id):
        assert private not in text
    route = "/v1/memory/event/{event_id}"
    assert value(text, "memspine_requests_total", route=route, method="GET", status="200") == 1
    assert value(text, "memspine_requests_total", route=route, method="GET", status="404") == 1
    post = {"route": "/v1/memory/event", "method": "POST", "status": "201"}
    assert value(text, "memspine_requests_total", **post) == 1
    assert value(text, "memspine_request_duration_seconds_count", **post) == 1
    assert value(text, "memspine_request_duration_seconds_sum", **post) > 0
    assert value(text, "memspine_open_tenants") == 1
    assert value(text, "memspine_tenant_opens_total") == 1
    assert value(text, "memspine_tenant_open_seconds_count") == 1
    assert value(text, "memspine_group_commit_batch_size_count") == 1
    assert value(text, "memspine_group_commit_batch_size_bucket", le="1.0") == 1
    assert value(text, "memspine_lmdb_map_bytes") >= 1 << 20
    assert value(text, "memspine_vectors_pending") in (0, 1)  # the inserter may not have run yet
    assert value(text, "memspine_unavailable_total") == 0
    assert ("memspine_purge_duration_seconds_count", ()) in samples(text)
    # Unknown paths are one series, whatever the path: clients cannot mint label values.
    text = server.client().get("/metrics").text
    assert (
        value(text, "memspine_requests_total", route="unmatched", method="GET", status="404") == 1
    )

    # The fd limit and the default cap that follows from it: tests/e2e/test_doors.py (the
    # server's start, in its log).


def test_per_tenant_series_only_when_asked_and_idle_close_shows(start_server: Any) -> None:
    server = start_server(
        env={"MEMSPINE_METRICS_PER_TENANT": "1", "MEMSPINE_TENANT_IDLE_SECS": "0.3"}
    )
    with server.client(SECRET_TENANT) as c:
        assert c.post("/v1/memory/event", json={"kind": "turn", "text": "x"}).status_code == 201
        text = c.get("/metrics").text
    assert value(text, "memspine_tenant_requests_total", tenant=SECRET_TENANT, status="201") == 1
    assert value(text, "memspine_tenant_lmdb_map_bytes", tenant=SECRET_TENANT) > 0
    exposed = [text]

    def closed() -> bool:
        exposed.append(server.client().get("/metrics").text)
        return value(exposed[-1], "memspine_tenant_idle_closes_total") >= 1

    wait_until(closed, "the idle tenant closed")
    text = exposed[-1]
    assert value(text, "memspine_tenant_idle_closes_total") == 1
    assert value(text, "memspine_open_tenants") == 0
    assert value(text, "memspine_tenant_lmdb_map_bytes", tenant=SECRET_TENANT) == 0


def test_each_app_has_its_own_registry_and_503s_are_counted(tmp_path: Path) -> None:
    def settings(name: str) -> Any:
        env = {"MEMSPINE_DATA_DIR": str(tmp_path / name), "MEMSPINE_MAX_OPEN_TENANTS": "1"}
        return load_settings(env)

    first, second = create_app(settings("one")), create_app(settings("two"))
    first.state.metrics.observe_purge(0.2)
    manager: TenantManager = first.state.engine.manager
    with TestClient(first) as one, TestClient(second) as two:
        held = manager.lease("busy")
        held.wait()
        (tmp_path / "one" / "other").mkdir()  # a tenant that exists: a read of it needs the slot
        r = one.get("/v1/memory/events", headers={"Authorization": "Bearer other"})
        assert r.status_code == 503
        held.release()
        text_one, text_two = one.get("/metrics").text, two.get("/metrics").text
    assert value(text_one, "memspine_unavailable_total") == 1
    route = {"route": "/v1/memory/events", "method": "GET"}
    assert value(text_one, "memspine_requests_total", status="503", **route) == 1
    assert value(text_one, "memspine_purge_duration_seconds_count") == 1
    assert value(text_two, "memspine_purge_duration_seconds_count") == 0
    assert value(text_two, "memspine_unavailable_total") == 0


def test_observe_purge_fills_the_histogram() -> None:
    m = Metrics()
    for seconds in (0.02, 0.3, 4.0):
        m.observe_purge(seconds)
    text = m.render().decode()
    assert value(text, "memspine_purge_duration_seconds_count") == 3
    assert value(text, "memspine_purge_duration_seconds_bucket", le="0.5") == 2
