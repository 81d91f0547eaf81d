"""Cascading deletes and dry runs on a chain and a diamond of SOURCE_FROM links, in storage and
over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from storage.model import NewEvent
from storage.read.cascade import derived_closure
from storage.tenants.tenant import Tenant

NOT_FOUND = {"error": "not_found", "detail": "no event with that id"}


# -- storage -----------------------------------------------------------------------------------


def add(
    t: Tenant, name: str, sources: tuple[str, ...] = (), supersedes: tuple[str, ...] = ()
) -> str:
    """Append one event and return its id."""
    ev = NewEvent(kind="fact", ts=len(name), text=name, source_ids=sources, supersedes=supersedes)
    [result] = t.submit_append([ev]).result()
    return str(result.event_id)


def closure(t: Tenant, event_id: str) -> list[str]:
    with t.log.reader() as r:
        return derived_closure(r, event_id)


def test_closure_of_a_diamond_is_breadth_first_in_link_order(tenant: Tenant) -> None:
    #      a
    #    /   \
    #   b     c      (b and c derive from a; d from both; e from d; x unrelated; s supersedes a)
    #    \   /
    #      d - e
    a = add(tenant, "a")
    x = add(tenant, "x")
    b = add(tenant, "b", (a,))
    c = add(tenant, "c", (a, x))
    d = add(tenant, "d", (c, b))
    e = add(tenant, "e", (d,))
    s = add(tenant, "s", supersedes=(a,))
    assert closure(tenant, a) == [a, b, c, d, e]
    assert closure(tenant, c) == [c, d, e]
    assert closure(tenant, e) == [e]
    assert closure(tenant, x) == [x, c, d, e]
    assert closure(tenant, s) == [s]
    assert closure(tenant, "00000000-0000-4000-8000-000000000000") == []


def test_cascading_delete_is_one_transaction_and_reaches_the_indexes(tenant: Tenant) -> None:
    a = add(tenant, "alpha")
    b = add(tenant, "beta", (a,))
    keep = add(tenant, "gamma")
    deleted = tenant.submit_delete_cascade(a).result()
    assert deleted == [a, b]
    with tenant.log.reader() as r:
        assert r.get(a) is None and r.get(b) is None and r.get(keep) is not None
        assert sorted(r.tombstone_ids()) == sorted([a, b])
    assert tenant.keyword.search("beta", limit=5) == []
    assert [e for e, _s in tenant.keyword.search("gamma", limit=5)] == [keep]
    assert tenant.submit_delete_cascade(a).result() == []


def test_an_event_derived_while_the_cascade_is_queued_goes_with_it(tenant: Tenant) -> None:
    root = add(tenant, "root")
    gate = threading.Event()
    blocker = tenant.call(gate.wait)  # hold the writer so both jobs queue behind it
    late = tenant.submit_append([NewEvent(kind="fact", ts=9, text="late", source_ids=(root,))])
    cascade = tenant.submit_delete_cascade(root)
    gate.set()
    blocker.result()
    [appended] = late.result()
    assert cascade.result() == [root, appended.event_id]


# -- HTTP --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One server for the HTTP cases (each works on its own events)."""
    server = ServerProcess(tmp_path_factory.mktemp("cascade") / "data").start()
    with server.client("cascade-tenant") as c:
        yield c
    server.stop()


def post(client: httpx.Client, name: str, sources: list[str] = (), **extra: Any) -> str:  # type: ignore[assignment]
    body: dict[str, Any] = {"kind": "fact", "text": f"event {name}", "properties": {}, **extra}
    if sources:
        body["properties"]["source_event_ids"] = list(sources)
    resp = client.post("/v1/memory/event", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["event_id"])


def live(client: httpx.Client, ids: list[str]) -> list[bool]:
    return [client.get(f"/v1/memory/event/{e}").status_code == 200 for e in ids]


def test_chain_and_diamond_over_http(client: httpx.Client) -> None:
    # chain: c1 <- c2 <- c3 <- c4; diamond: top <- left, right <- bottom; other stands alone
    c1 = post(client, "c1")
    c2 = post(client, "c2", [c1])
    c3 = post(client, "c3", [c2])
    c4 = post(client, "c4", [c3])
    top = post(client, "top")
    left = post(client, "left", [top])
    right = post(client, "right", [top])
    bottom = post(client, "bottom", [left, right])
    other = post(client, "other")
    everything = [c1, c2, c3, c4, top, left, right, bottom, other]

    # Dry runs change nothing.
    assert client.delete(f"/v1/memory/event/{c2}?cascade=derived&dry_run=true").json() == {
        "would_delete": [c2, c3, c4]
    }
    assert client.delete(f"/v1/memory/event/{top}?dry_run=true&cascade=derived").json() == {
        "would_delete": [top, left, right, bottom]
    }
    assert client.delete(f"/v1/memory/event/{top}?dry_run=true").json() == {"would_delete": [top]}
    assert all(live(client, everything))

    resp = client.delete(f"/v1/memory/event/{c2}?cascade=derived")
    assert resp.json() == {"deleted": True, "purged": False, "deleted_ids": [c2, c3, c4]}
    resp = client.delete(f"/v1/memory/event/{top}?cascade=derived&purge=true")
    assert resp.json() == {
        "deleted": True,
        "purged": True,
        "deleted_ids": [top, left, right, bottom],
    }
    assert live(client, everything) == [True, False, False, False, False, False, False, False, True]
    # c1 lost its derived events' links, not its own record.
    rows = client.post(
        "/v1/memory/cypher",
        json={
            "query": "MATCH (d)-[:SOURCE_FROM]->(s {event_id: $id}) RETURN d.event_id",
            "params": {"id": c1},
        },
    ).json()["rows"]
    assert rows == []


def test_cascade_refusals(client: httpx.Client) -> None:
    a = post(client, "a")
    unknown = "00000000-0000-4000-8000-000000000000"
    for query in ("?cascade=derived&dry_run=true", "?dry_run=true", "?cascade=derived", ""):
        resp = client.delete(f"/v1/memory/event/{unknown}{query}")
        assert (resp.status_code, resp.json()) == (404, NOT_FOUND)
    resp = client.delete(f"/v1/memory/event/{a}?cascade=supersedes")
    assert resp.status_code == 400 and resp.json()["error"] == "invalid_request"
    assert "cascade must be derived" in resp.json()["detail"]
    resp = client.delete(f"/v1/memory/event/{a}?dry_run=maybe")
    assert resp.status_code == 400
    assert live(client, [a]) == [True]


def test_supersedes_is_not_followed(client: httpx.Client) -> None:
    old = post(client, "old")
    new = post(client, "new", supersedes=[old])
    resp = client.delete(f"/v1/memory/event/{old}?cascade=derived")
    assert resp.json()["deleted_ids"] == [old]
    assert live(client, [new]) == [True]
