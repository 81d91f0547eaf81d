"""Subjects on events over HTTP (the app in process): stored, returned, listed, recalled,
matched in Cypher, carried by batches and export/import, refused when malformed."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from memspine.schemas import EventIn, _body_hash
from storage.transfer.landing import import_tenant
from tests.support.servers import InProcessServer


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    server = InProcessServer(tmp_path_factory.mktemp("subjects") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def client(app: InProcessServer, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """A tenant of its own per test."""
    with app.client(f"subj-{request.node.name[:40]}") as c:
        yield c


def post(client: httpx.Client, text: str, **extra: Any) -> str:
    resp = client.post("/v1/memory/event", json={"kind": "note", "text": text, **extra})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["event_id"])


def test_subjects_are_stored_and_returned_on_every_read(client: httpx.Client) -> None:
    tagged = post(client, "Ann asked about her order", subjects=["cust-1", "agent 7"])
    plain = post(client, "the weather is fine")
    got = client.get(f"/v1/memory/event/{tagged}").json()
    assert got["subjects"] == ["cust-1", "agent 7"]
    assert "subjects" not in client.get(f"/v1/memory/event/{plain}").json()
    listed = client.get("/v1/memory/events").json()["events"]
    assert {e["event_id"]: e.get("subjects") for e in listed} == {
        tagged: ["cust-1", "agent 7"],
        plain: None,
    }
    hits = client.post("/v1/memory/recall", json={"text": "order"}).json()["hits"]
    assert hits[0]["subjects"] == ["cust-1", "agent 7"]


def test_listing_recall_and_cypher_filter_by_subject(client: httpx.Client) -> None:
    a = post(client, "order 1 shipped", subjects=["cust-1"])
    b = post(client, "order 2 shipped", subjects=["cust-2"])
    c = post(client, "order 3 shipped", subjects=["cust-1", "cust-2"])
    post(client, "order 4 shipped")
    ids = [e["event_id"] for e in client.get("/v1/memory/events?subject=cust-1").json()["events"]]
    assert ids == [c, a]
    page = client.get("/v1/memory/events?subject=cust-2&limit=1").json()
    assert [e["event_id"] for e in page["events"]] == [c]
    rest = client.get(f"/v1/memory/events?subject=cust-2&cursor={page['next_cursor']}").json()
    assert [e["event_id"] for e in rest["events"]] == [b]
    assert client.get("/v1/memory/events?subject=nobody").json()["events"] == []
    recall = client.post(
        "/v1/memory/recall", json={"text": "order shipped", "filter": {"subject": "cust-2"}}
    ).json()
    assert {h["event_id"] for h in recall["hits"]} == {b, c}
    rows = client.post(
        "/v1/memory/cypher",
        json={
            "query": "MATCH (e:Event) WHERE 'cust-1' IN e.subjects RETURN e.event_id AS id, "
            "e.subjects AS s ORDER BY e.ts"
        },
    ).json()["rows"]
    assert rows == [[a, ["cust-1"]], [c, ["cust-1", "cust-2"]]]


def test_a_batch_carries_subjects(client: httpx.Client) -> None:
    resp = client.post(
        "/v1/memory/events",
        json={"events": [{"kind": "turn", "text": "hello", "subjects": ["c-9"]}, {"kind": "turn"}]},
        headers={"Idempotency-Key": "batch-subjects"},
    )
    assert resp.status_code == 201, resp.text
    first, second = resp.json()["event_ids"]
    listed = client.get("/v1/memory/events?subject=c-9").json()["events"]
    assert [e["event_id"] for e in listed] == [first]
    assert "subjects" not in client.get(f"/v1/memory/event/{second}").json()


@pytest.mark.parametrize(
    ("subjects", "says"),
    [
        ([f"s{i}" for i in range(17)], "subjects may name at most 16"),
        (["x" * 129], "subjects[0] may be at most 128 bytes"),
        (["ok", ""], "subjects[1] must be a non-empty string"),
        (["tab\there"], "subjects[0] must be printable ASCII"),
        (["caf\u00e9"], "subjects[0] must be printable ASCII"),
    ],
)
def test_bad_subjects_are_refused_naming_the_field(
    client: httpx.Client, subjects: list[str], says: str
) -> None:
    resp = client.post("/v1/memory/event", json={"kind": "note", "subjects": subjects})
    assert resp.status_code == 400
    assert resp.json()["error"] == "invalid_request"
    assert says in resp.json()["detail"]
    listing = client.get("/v1/memory/events", params={"subject": "x" * 129})
    assert listing.status_code == 400 and "subject" in listing.json()["detail"]


def test_an_idempotent_retry_without_subjects_still_replays(client: httpx.Client) -> None:
    body = {"kind": "note", "text": "same"}
    first = client.post("/v1/memory/event", json=body, headers={"Idempotency-Key": "k-1"})
    again = client.post("/v1/memory/event", json=body, headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    other = client.post(
        "/v1/memory/event", json={**body, "subjects": ["c"]}, headers={"Idempotency-Key": "k-1"}
    )
    assert other.status_code == 422  # the same key with another body
    # The hash of a body without subjects is the one it had before subjects existed.
    before = {f: None for f in EventIn.__struct_fields__ if f != "subjects"}
    before.update(kind="note", text="same")
    digest = hashlib.sha256(msgspec.json.encode(before, order="sorted")).digest()
    assert _body_hash(EventIn(kind="note", text="same")) == digest


def test_export_and_import_carry_subjects(app: InProcessServer, tmp_path: Path) -> None:
    with app.client("subj-export-src") as src:
        tagged = post(src, "about ann", subjects=["ann"])
        exported = src.get("/v1/memory/export")
        assert exported.status_code == 200
    assert b'"subjects":["ann"]' in exported.content
    import_tenant(tmp_path / "data", "dst", io.BytesIO(exported.content))
    other = InProcessServer(tmp_path / "data").start()
    try:
        with other.client("dst") as dst:
            assert dst.get(f"/v1/memory/event/{tagged}").json()["subjects"] == ["ann"]
            listed = dst.get("/v1/memory/events?subject=ann").json()["events"]
            assert [e["event_id"] for e in listed] == [tagged]
    finally:
        other.stop()
