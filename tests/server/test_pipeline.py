"""One pipeline behind the three doors (memspine/pipeline.py): Litestar's handlers, the hot
routes and the MCP backend run the same operations with the same checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from memspine import hot
from memspine.app import create_app
from memspine.config import load_settings
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.tools import BY_NAME
from memspine.pipeline import bearer_token
from memspine.routes import OPERATIONS, memory
from memspine.verifier import Principal
from storage.errors import InvalidRequest

AUTH = {"Authorization": "Bearer acme"}
EVENT = {
    "kind": "fact",
    "ts": 1_790_000_000_000_000,
    "text": "the parcel was signed for at number 16",
    "properties": {"topic": "parcel", "n": 2, "source_event_ids": []},
}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    settings = load_settings({"MEMSPINE_DATA_DIR": str(tmp_path), "MEMSPINE_EMBEDDING_DIM": "4"})
    with TestClient(create_app(settings)) as c:
        yield c


def backend(client: TestClient[Any]) -> EngineBackend:
    """The MCP backend on the app's own engine, for tenant acme with both scopes."""
    engine: Engine = client.app.state.engine
    return EngineBackend(
        engine, Principal(tenant_id="acme", key_id="local", scopes=("read", "write"))
    )


def test_the_hot_routes_and_the_tools_use_the_declared_operations() -> None:
    assert hot.ROUTES["/v1/memory/event"] is memory.APPEND
    assert hot.ROUTES["/v1/memory/recall"] is memory.RECALL
    assert memory.APPEND in OPERATIONS and memory.RECALL in OPERATIONS
    assert BY_NAME["memory_append"].scope == memory.APPEND.scope == "write"
    assert BY_NAME["memory_delete"].scope == memory.DELETE.scope == "write"
    assert BY_NAME["memory_recall"].scope == memory.RECALL.scope == "read"
    names = [op.name for op in OPERATIONS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer acme", "acme"),
        ("bearer  acme ", "acme"),
        (b"Bearer acme", "acme"),
        ("Basic acme", None),
        ("Bearer", None),
        ("Bearer    ", None),
    ],
)
def test_one_bearer_parser(header: str | bytes | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_an_idempotent_append_replays_across_doors(client: TestClient[Any]) -> None:
    """The same Idempotency-Key and body over HTTP and through the MCP backend is one event:
    both doors build the same EventIn and hash it alike."""
    r = client.post("/v1/memory/event", json=EVENT, headers=AUTH | {"Idempotency-Key": "k-1"})
    assert r.status_code == 201, r.text
    first = r.json()["event_id"]
    again = asyncio.run(backend(client).append(dict(EVENT), "k-1"))
    assert again == {"event_id": first, "replayed": True}
    other = dict(EVENT, text="another text")
    with pytest.raises(Exception) as refused:
        asyncio.run(backend(client).append(other, "k-1"))
    assert getattr(refused.value, "status", None) == 422
    # And back: a key first used through MCP replays over HTTP, properties byte for byte.
    made = asyncio.run(backend(client).append(dict(EVENT, text="via mcp"), "k-2"))
    r = client.post(
        "/v1/memory/event",
        json=dict(EVENT, text="via mcp"),
        headers=AUTH | {"Idempotency-Key": "k-2"},
    )
    assert (r.status_code, r.json()["event_id"]) == (200, made["event_id"])
    assert r.headers["idempotent-replayed"] == "true"


def test_the_backend_answers_what_the_routes_answer(client: TestClient[Any]) -> None:
    made = client.post("/v1/memory/event", json=EVENT, headers=AUTH).json()["event_id"]
    b = backend(client)
    http_get = client.get(f"/v1/memory/event/{made}", headers=AUTH).json()
    assert asyncio.run(b.get(made.upper())) == http_get
    http_list = client.get("/v1/memory/events", params={"limit": 5}, headers=AUTH).json()
    assert asyncio.run(b.list_events({"limit": 5})) == http_list
    body = {"text": "signed for at number 16", "k": 3}
    http_recall = client.post("/v1/memory/recall", json=body, headers=AUTH)
    assert http_recall.status_code == 200
    assert asyncio.run(b.recall(body)) == http_recall.json()
    query = "MATCH (e:Event) RETURN e.event_id, e.properties LIMIT 5"
    http_cypher = client.post("/v1/memory/cypher", json={"query": query}, headers=AUTH).json()
    assert asyncio.run(b.cypher(query, None)) == http_cypher
    dry = client.delete(f"/v1/memory/event/{made}", params={"dry_run": "true"}, headers=AUTH)
    assert asyncio.run(b.delete(made, cascade=False, dry_run=True)) == dry.json()
    done = asyncio.run(b.delete(made, cascade=False, dry_run=False))
    assert done == {"deleted": True, "purged": False, "deleted_ids": [made]}
    gone = client.get(f"/v1/memory/event/{made}", headers=AUTH)
    assert gone.status_code == 404
    with pytest.raises(InvalidRequest) as bad:
        asyncio.run(b.get("not-a-uuid"))
    bad_http = client.get("/v1/memory/event/not-a-uuid", headers=AUTH).json()
    assert bad_http == {"error": "invalid_request", "detail": bad.value.detail}


def test_a_path_with_two_methods_allows_both(client: TestClient[Any]) -> None:
    """405 and OPTIONS name every method of the path, not only the first handler's."""
    made = client.post("/v1/memory/event", json=EVENT, headers=AUTH).json()["event_id"]
    r = client.request("PATCH", f"/v1/memory/event/{made}", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert {"GET", "DELETE"} <= {m.strip() for m in r.headers["allow"].split(",")}
    r = client.options("/v1/admin/keys")
    assert {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}


def test_every_error_the_pipeline_renders_has_the_api_shape(client: TestClient[Any]) -> None:
    cases = [
        ("GET", "/v1/memory/events?nope=1", AUTH, None, 400),
        ("GET", "/v1/memory/events?limit=0", AUTH, None, 400),
        ("GET", "/v1/memory/events?prop.9x=1", AUTH, None, 400),
        ("GET", "/v1/whoami", {}, None, 401),
        ("POST", "/v1/memory/cypher", AUTH, b"{", 400),
        ("POST", "/v1/memory/cypher", AUTH, b'{"query": "MATCH (e) RETURN e", "x": 1}', 400),
        ("GET", "/v1/admin/tenants", AUTH, None, 404),  # no admin key configured
        ("DELETE", "/v1/memory/event/00000000-0000-4000-8000-000000000000", AUTH, None, 404),
    ]
    for method, url, headers, body, status in cases:
        r = client.request(method, url, headers=headers, content=body)
        assert r.status_code == status, (url, r.text)
        assert set(msgspec.json.decode(r.content)) == {"error", "detail"}, (url, r.text)
