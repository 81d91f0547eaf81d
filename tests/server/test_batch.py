"""POST /v1/memory/events: a batch is one all-or-nothing job of the tenant's group commit, its
events answered in order, replayable by their keys, able to link to one another as $N."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.batch import MAX_BATCH
from memspine.config import load_settings
from memspine.schemas import idempotent_id

AUTH = {"Authorization": "Bearer acme"}
TS = 1_790_000_000_000_000


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    settings = load_settings({"MEMSPINE_DATA_DIR": str(tmp_path), "MEMSPINE_EMBEDDING_DIM": "4"})
    with TestClient(create_app(settings)) as c:
        yield c


def event(i: int, **more: Any) -> dict[str, Any]:
    return {"kind": "turn", "ts": TS + i, "text": f"turn number {i}", **more}


def batch(c: TestClient[Any], events: list[dict[str, Any]], **headers: str) -> Any:
    return c.post("/v1/memory/events", json={"events": events}, headers={**AUTH, **headers})


def stored(c: TestClient[Any]) -> list[str]:
    """Every live event's text, newest first."""
    texts: list[str] = []
    params: dict[str, Any] = {"limit": 1000, "current": "false"}
    while True:
        page = c.get("/v1/memory/events", params=params, headers=AUTH)
        assert page.status_code == 200, page.text
        texts += [e["text"] for e in page.json()["events"]]
        if page.json()["next_cursor"] is None:
            return texts
        params["cursor"] = page.json()["next_cursor"]


def test_a_batch_answers_every_id_in_order_and_every_event_is_readable(
    client: TestClient[Any],
) -> None:
    events = [event(i, embedding=[0.1 * i, 0.2, 0.3, 0.4]) for i in range(50)]
    r = batch(client, events)
    assert r.status_code == 201, r.text
    ids = r.json()["event_ids"]
    assert len(set(ids)) == 50 and set(r.json()) == {"event_ids"}
    for i in (0, 17, 49):
        got = client.get(f"/v1/memory/event/{ids[i]}", headers=AUTH).json()
        assert got["text"] == f"turn number {i}" and got["embedding"][0] == pytest.approx(0.1 * i)
    assert stored(client) == [f"turn number {i}" for i in reversed(range(50))]
    hits = client.post("/v1/memory/recall", json={"text": "number 17"}, headers=AUTH).json()
    assert hits["hits"][0]["event_id"] == ids[17]  # indexed before the answer


@pytest.mark.parametrize(
    ("bad", "code", "words"),
    [
        ({"kind": ""}, "invalid_request", "kind must be 1 to 64 bytes"),
        ({"ts": 1_790_000_000}, "invalid_request", "ts 1790000000 looks like seconds"),
        ({"embedding": [1.0, 2.0]}, "embedding_mismatch", "embedding has 2 values"),
        (
            {
                "properties": {
                    "a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
                }
            },
            "invalid_request",
            "nested too deeply",
        ),
        ({"valid_from": TS + 5, "valid_until": TS}, "invalid_request", "valid_from must be"),
    ],
)
def test_one_bad_event_refuses_the_whole_batch_naming_its_index(
    client: TestClient[Any], bad: dict[str, Any], code: str, words: str
) -> None:
    assert batch(client, [event(0)]).status_code == 201
    events = [event(1), event(2), {**event(3), **bad}, event(4)]
    r = batch(client, events)
    assert r.status_code in (400, 422), r.text
    body = r.json()
    assert body["error"] == code
    # The nesting bound runs on the whole body before anything is decoded: no index to name.
    if code != "invalid_request" or "nested" not in words:
        assert body["detail"].startswith("events[2]: "), body
        assert body["detail"].endswith("the batch stored nothing")
    assert words in body["detail"]
    assert stored(client) == ["turn number 0"]


def test_an_embedding_model_other_than_the_tenants_refuses_the_batch_in_the_writer(
    client: TestClient[Any],
) -> None:
    first = event(0, embedding=[1, 0, 0, 0], embedding_model="m-1")
    assert batch(client, [first]).status_code == 201
    events = [event(1, embedding=[0, 1, 0, 0], embedding_model="m-1"), event(2), event(3)]
    events[2] |= {"embedding": [0, 0, 1, 0], "embedding_model": "m-2"}
    r = batch(client, events)
    assert r.status_code == 422 and r.json()["error"] == "embedding_mismatch"
    assert r.json()["detail"].startswith("events[2]: this tenant's embeddings come from 'm-1'")
    assert stored(client) == ["turn number 0"]


def test_a_replayed_batch_answers_the_same_ids_and_stores_nothing(
    client: TestClient[Any],
) -> None:
    events = [event(i, idempotency_key=f"turn-{i}") for i in range(3)]
    first = batch(client, events)
    assert first.status_code == 201
    again = batch(client, events)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == {**first.json(), "replayed": [0, 1, 2]}
    assert len(stored(client)) == 3
    # An event's key derives its id as the Idempotency-Key header does for one event.
    assert first.json()["event_ids"][1] == idempotent_id("acme", "turn-1")
    one = client.post(
        "/v1/memory/event", json=event(1), headers={**AUTH, "Idempotency-Key": "turn-1"}
    )
    assert one.status_code == 200 and one.json()["event_id"] == first.json()["event_ids"][1]


def test_a_partly_replayed_batch_stores_only_its_new_events(client: TestClient[Any]) -> None:
    first = batch(client, [event(0, idempotency_key="a"), event(1, idempotency_key="b")])
    ids = first.json()["event_ids"]
    mixed = batch(client, [event(1, idempotency_key="b"), event(2), event(3, idempotency_key="c")])
    assert mixed.status_code == 201, mixed.text
    assert mixed.json()["event_ids"][0] == ids[1] and mixed.json()["replayed"] == [0]
    assert "idempotent-replayed" not in mixed.headers
    assert sorted(stored(client)) == [f"turn number {i}" for i in range(4)]


def test_a_key_used_with_another_event_refuses_the_batch(client: TestClient[Any]) -> None:
    assert batch(client, [event(0, idempotency_key="a")]).status_code == 201
    r = batch(client, [event(5), event(6, idempotency_key="a")])
    assert r.status_code == 422 and r.json()["error"] == "idempotency_mismatch"
    assert r.json()["detail"].startswith("events[1]: this Idempotency-Key was first used")
    assert stored(client) == ["turn number 0"]


def test_the_header_key_makes_a_whole_batch_retry_safe(client: TestClient[Any]) -> None:
    events = [event(0), event(1), event(2, idempotency_key="own")]
    first = batch(client, events, **{"Idempotency-Key": "load-7"})
    assert first.status_code == 201
    ids = first.json()["event_ids"]
    assert ids[0] == idempotent_id("acme", "load-7/0") and ids[2] == idempotent_id("acme", "own")
    again = batch(client, events, **{"Idempotency-Key": "load-7"})
    assert again.status_code == 200 and again.json()["event_ids"] == ids
    assert len(stored(client)) == 3


def test_an_event_links_to_earlier_events_of_its_batch_as_dollar_n(
    client: TestClient[Any],
) -> None:
    assert batch(client, [event(9)]).status_code == 201
    known = client.get("/v1/memory/events", headers=AUTH).json()["events"][0]["event_id"]
    events = [
        event(0),
        event(1, idempotency_key="k1"),
        event(2, properties={"source_event_ids": ["$0", "$1", known, "nope"], "n": 1.5}),
        event(3, supersedes=["$2"], properties={"speaker": "agent"}),
    ]
    r = batch(client, events)
    assert r.status_code == 201, r.text
    ids = r.json()["event_ids"]
    assert r.json()["unlinked"] == ["nope"]
    assert ids[1] == idempotent_id("acme", "k1")
    derived = client.get(f"/v1/memory/event/{ids[2]}", headers=AUTH).json()
    # The stored properties name the ids, as if the client had sent them.
    assert derived["properties"] == {"source_event_ids": [ids[0], ids[1], known, "nope"], "n": 1.5}
    assert derived["superseded_by"] == [ids[3]] and derived["current"] is False
    last = client.get(f"/v1/memory/event/{ids[3]}", headers=AUTH).json()
    assert last["supersedes"] == [ids[2]] and last["properties"] == {"speaker": "agent"}
    rows = client.post(
        "/v1/memory/cypher",
        json={
            "query": "MATCH (d:Event {event_id: $id})-[:SOURCE_FROM]->(s:Event) "
            "RETURN s.event_id ORDER BY s.ts",
            "params": {"id": ids[2]},
        },
        headers=AUTH,
    ).json()["rows"]
    assert rows == [[ids[0]], [ids[1]], [known]]  # by ts: the earlier batch came later


@pytest.mark.parametrize("ref", ["$2", "$3", "$10", "$1000", "$" + "9" * 4300, "$1" + "0" * 5000])
def test_a_link_to_the_event_itself_or_a_later_one_is_refused(
    client: TestClient[Any], ref: str
) -> None:
    events = [event(0), event(1), event(2, supersedes=[ref]), event(3)]
    r = batch(client, events)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(f"events[2]: supersedes names {ref}, which is not an")
    assert stored(client) == []


def test_the_size_of_a_batch_is_bounded(client: TestClient[Any]) -> None:
    r = batch(client, [])
    assert r.status_code == 400 and "at least one event" in r.json()["detail"]
    r = batch(client, [{"kind": "k"}] * (MAX_BATCH + 1))
    assert r.status_code == 400 and f"at most {MAX_BATCH} events" in r.json()["detail"]
    # A batch has its own body limit, above one event's (MEMSPINE_MAX_BODY_BYTES, 1 MiB).
    big = [event(i, text="x" * 2000) for i in range(600)]
    assert batch(client, big).status_code == 201
    one = client.post("/v1/memory/event", json=event(0, text="x" * 1_200_000), headers=AUTH)
    assert one.status_code == 413
    assert batch(client, [{"kind": "k"}] * MAX_BATCH).status_code == 201
    assert len(stored(client)) == MAX_BATCH + 600


@pytest.mark.parametrize("hot", [True, False])
def test_a_batch_over_its_body_limit_is_413_naming_the_setting(tmp_path: Path, hot: bool) -> None:
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(tmp_path),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_MAX_BATCH_BYTES": "50000",
        }
    )
    with TestClient(create_app(settings, hot_routes=hot)) as c:
        r = batch(c, [event(i, text="x" * 1000) for i in range(60)])
        assert r.status_code == 413 and r.json() == {
            "error": "payload_too_large",
            "detail": "the request body is larger than MEMSPINE_MAX_BATCH_BYTES (50000 bytes)",
        }
        assert batch(c, [event(i, text="x" * 1000) for i in range(40)]).status_code == 201
        assert len(stored(c)) == 40


def test_the_batch_route_is_write_scoped_and_strict(client: TestClient[Any]) -> None:
    r = client.post("/v1/memory/events", json={"events": [event(0)], "x": 1}, headers=AUTH)
    assert r.status_code == 400 and "x" in r.json()["detail"]
    r = client.post("/v1/memory/events", json={"events": [{**event(0), "nope": 1}]}, headers=AUTH)
    assert r.status_code == 400 and "`nope` - at `events[0]`" in r.json()["detail"]
    r = client.post("/v1/memory/events?purge=1", json={"events": [event(0)]}, headers=AUTH)
    assert r.status_code == 400
    r = batch(client, [event(0, idempotency_key="")])
    assert r.status_code == 400 and r.json()["detail"].startswith("events[0]: idempotency_key")
    assert client.post("/v1/memory/events", json={"events": [event(0)]}).status_code == 401
