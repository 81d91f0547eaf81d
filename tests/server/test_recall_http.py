"""Recall at the HTTP level, against the app in process: the limits and bad input say what to
fix, the answer has the seed's shape."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import InProcessServer


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One app for the HTTP checks (each test uses its own tenant), embedding dimension 4."""
    server = InProcessServer(tmp_path_factory.mktemp("recall") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def client(srv: InProcessServer) -> Iterator[httpx.Client]:
    """A client on a fresh tenant holding one event."""
    with srv.client(f"recall-{uuid.uuid4().hex[:12]}") as c:
        resp = c.post(
            "/v1/memory/event", json={"kind": "turn", "text": "apple", "embedding": [1, 0, 0, 0]}
        )
        assert resp.status_code == 201
        yield c


def _recall(c: httpx.Client, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return c.post(
        "/v1/memory/recall", content=content, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        ({}, 400, "invalid_request", "send text, an embedding, or both"),
        (
            {"text": None, "embedding": None},
            400,
            "invalid_request",
            "send text, an embedding, or both",
        ),
        ({"text": "apple", "k": 101}, 400, "invalid_request", "k must be from 1 to 100"),
        ({"text": "apple", "k": 0}, 400, "invalid_request", "k must be from 1 to 100"),
        ({"text": "apple", "hops": 4}, 400, "invalid_request", "hops must be from 0 to 3"),
        ({"text": "apple", "k": "3"}, 400, "invalid_request", "k"),
        ({"text": "apple", "limit": 3}, 400, "invalid_request", "limit"),
        ({"text": "x" * 10_001}, 400, "invalid_request", "text may be at most 10000 characters"),
        ({"embedding": [1.0, 0.0, 0.0]}, 422, "embedding_mismatch", "embedding has 3 values"),
        ({"embedding": []}, 400, "invalid_request", "embedding must not be empty"),
        ('{"embedding": [1e999, 0, 0, 0]}', 400, "invalid_request", "embedding"),
        ('{"embedding": [NaN, 0, 0, 0]}', 400, "invalid_request", ""),
        ({"text": "apple", "filter": {"bad-name": 1}}, 400, "invalid_request", "filter 'bad-name'"),
        ({"text": "apple", "filter": {"ok": [1, 2]}}, 400, "invalid_request", "filter"),
        ({"text": "apple", "filter": {"ok": "x" * 257}}, 400, "invalid_request", "filter 'ok'"),
        ({"text": "apple", "kind": ""}, 400, "invalid_request", "kind"),
        ("[1, 2]", 400, "invalid_request", ""),
        ("{", 400, "invalid_request", "not valid JSON"),
    ],
)
def test_bad_recall_requests_say_what_to_fix(
    client: httpx.Client, body: dict[str, Any] | str, status: int, code: str, words: str
) -> None:
    resp = _recall(client, body)
    assert resp.status_code == status, resp.text
    assert set(resp.json()) == {"error", "detail"}
    assert resp.json()["error"] == code
    assert words in resp.json()["detail"]
    assert "Traceback" not in resp.text and "/" not in resp.json()["detail"].replace("1/", "")


def test_recall_over_http_has_the_seed_shape(client: httpx.Client) -> None:
    resp = _recall(client, {"text": "apple", "embedding": [1, 0, 0, 0], "k": 100, "hops": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"hits", "walk"}
    assert body["walk"] == {"reached": 0, "returned": 0, "omitted": []}
    (hit,) = body["hits"]
    assert set(hit) == {"event_id", "kind", "ts", "text", "properties", "score"}
    assert hit["score"] == pytest.approx(2 / 61) and hit["properties"] == {}


def test_recall_needs_only_the_read_scope_and_a_token(srv: InProcessServer) -> None:
    with srv.client() as anonymous:
        resp = _recall(anonymous, {"text": "apple"})
    assert resp.status_code == 401 and resp.json()["error"] == "unauthorized"


def test_recall_refuses_a_query_parameter(client: httpx.Client) -> None:
    resp = client.post("/v1/memory/recall?k=3", json={"text": "apple"})
    assert resp.status_code == 400 and "k" in resp.json()["detail"]
