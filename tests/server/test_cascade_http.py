"""Cascading deletes and dry runs over HTTP (the app in process) on a chain and a diamond."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import InProcessServer

NOT_FOUND = {"error": "not_found", "detail": "no event with that id"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One app for the HTTP cases (each works on its own events)."""
    server = InProcessServer(tmp_path_factory.mktemp("cascade") / "data").start()
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
