"""Server-side embedding through the app: text-only appends get vectors from the real local model,
recall by text alone is hybrid in a server-space tenant (HTTP, hot routes and MCP), the space
rules answer 422 embedding_mismatch, whoami names the space, the backlog holds appends back and
an embedder that fails loses nothing (an OpenAI-compatible endpoint on loopback).

The embedder is on only here (MEMSPINE_EMBEDDER=local or openai, dimension 384 or the endpoint's):
tests/support/servers.py turns it off for every other test. A handful of texts each: the model is small.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from memspine.auth import Authenticator
from memspine.config import Settings
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from memspine.mcp.tools import TOOLS
from tests.support.endpoint import Endpoint
from tests.support.mcp_calls import CHEAP_HASHER, call, issue_keys
from tests.support.servers import InProcessServer
from tests.support.wait import wait_until

LOCAL = {"MEMSPINE_EMBEDDER": "local", "MEMSPINE_EMBEDDING_DIM": "384"}
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
T0 = 1_800_000_000_000_000
NOTES = [
    "Lena wants status notes as three bullets, no tables.",
    "The parcel for number 16 was signed for by a neighbour.",
    "The quarterly invoice run moved to the second Tuesday.",
]
QUESTION = "how does Lena want status reports formatted?"


def event(text: str, i: int = 0, **kw: Any) -> dict[str, Any]:
    """A text-only note (plus whatever kw adds)."""
    return {"kind": "note", "ts": T0 + i, "text": text, **kw}


@pytest.fixture
def local(start_server: Any) -> InProcessServer:
    """The app with the local embedder and 384-dimensional tenants."""
    return start_server(env=LOCAL)  # type: ignore[no-any-return]


def test_text_only_events_get_vectors_and_recall_by_text_is_hybrid(local: InProcessServer) -> None:
    c = local.client("acme")
    assert c.get("/v1/whoami").json()["vector_space"] == {
        "made_by": "none",
        "model": None,
        "dim": 384,
        "server_embeds": True,
        "unembedded": 0,
    }
    for i, text in enumerate(NOTES):
        assert c.post("/v1/memory/event", json=event(text, i)).status_code == 201
    # The server waits 10 s at most for the backlog; a loaded machine embeds slower than that.
    wait_until(lambda: c.get("/v1/whoami").json()["vector_space"]["unembedded"] == 0, "vectors")
    body = {"text": QUESTION, "k": 3, "explain": True, "wait_for_vectors": True}
    r = c.post("/v1/memory/recall", json=body)
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits[0]["text"] == NOTES[0]
    assert hits[0]["vector_rank"] == 1  # the vector arm ranked it: the query was embedded
    space = c.get("/v1/whoami").json()["vector_space"]
    assert space == {
        "made_by": "server",
        "model": MODEL,
        "dim": 384,
        "server_embeds": True,
        "unembedded": 0,
    }
    got = c.get(f"/v1/memory/event/{hits[0]['event_id']}").json()
    assert got["embedding_model"] == MODEL and len(got["embedding"]) == 384
    # The Litestar route answers as the hot route does.
    assert "memspine_embeddings_pending 0.0" in c.get("/metrics").text


def test_a_question_that_shares_no_word_is_found_by_meaning(local: InProcessServer) -> None:
    c = local.client("acme")
    for i, text in enumerate(NOTES):
        c.post("/v1/memory/event", json=event(text, i))
    # wait_for_vectors waits a bounded time: on a busy machine the model may load for longer
    wait_until(lambda: c.get("/v1/whoami").json()["vector_space"]["unembedded"] == 0, "vectors")
    body = {"text": "who received the package?", "k": 1, "wait_for_vectors": True}
    r = c.post("/v1/memory/recall", json=body)
    assert r.status_code == 200, r.text
    assert [h["text"] for h in r.json()["hits"]] == [NOTES[1]]


def test_the_space_rules_answer_embedding_mismatch(local: InProcessServer) -> None:
    c = local.client("acme")
    c.post("/v1/memory/event", json=event("text first"))
    vector = [0.0] * 383 + [1.0]
    r = c.post("/v1/memory/event", json=event("mine", 1, embedding=vector))
    assert r.status_code == 422
    assert r.json()["error"] == "embedding_mismatch"
    assert MODEL in r.json()["detail"]
    ok = c.post("/v1/memory/event", json=event("mine", 1, embedding=vector, embedding_model=MODEL))
    assert ok.status_code == 201
    # A tenant whose first vector came from its client is never embedded by the server.
    other = local.client("other")
    other.post("/v1/memory/event", json=event("client", 0, embedding=vector))
    other.post("/v1/memory/event", json=event("text only", 1))
    space = other.get("/v1/whoami").json()["vector_space"]
    assert space["made_by"] == "client" and not space["server_embeds"]
    assert space["unembedded"] == 0


def test_tenant_usage_names_the_space(start_server: Any, tmp_path: Path) -> None:
    admin = "test-admin-key-7c1f0e9a2b"
    keys = issue_keys(tmp_path / "data")
    s = start_server(env={**LOCAL, "MEMSPINE_ADMIN_KEY": admin}, hasher=CHEAP_HASHER)
    c = s.client(keys["rw"])
    assert c.post("/v1/memory/event", json=event("hello")).status_code == 201
    # wait_for_vectors waits a bounded time: on a busy machine the model may load for longer
    url = f"/v1/admin/tenants/{keys['tenant']}"
    wait_until(
        lambda: s.client(admin).get(url).json()["usage"]["vectors"]["unembedded"] == 0,
        "the server to embed the event",
    )
    usage = s.client(admin).get(url).json()["usage"]
    assert usage["vector_space"]["made_by"] == "server"
    assert usage["vector_space"]["model"] == MODEL
    assert usage["vectors"]["unembedded"] == 0


# -- MCP --------------------------------------------------------------------------------------


class McpInProcess:
    """The engine with the local embedder and an MCP client per key (tests/server/test_mcp.py)."""

    def __init__(self, data_dir: Path) -> None:
        self.keys = issue_keys(data_dir)
        self.engine = Engine(Settings(data_dir=data_dir, embedding_dim=384, embedder="local"))
        self.auth = Authenticator(data_dir, None, hasher=CHEAP_HASHER)

    @asynccontextmanager
    async def client(self, key: str) -> AsyncIterator[Client]:
        """The SDK's in-process client, authenticating `key`."""

        def resolve(_ctx: Any) -> Caller:
            principal = self.auth.authenticate(key)
            return Caller(principal, EngineBackend(self.engine, principal))

        async with Client(build_server(resolve)) as client:
            yield client

    def backlog(self) -> int:
        """Events of the key's tenant still without a vector (0 once it is closed)."""
        with self.engine.manager.use_open(self.keys["tenant"]) as tenant:
            return 0 if tenant is None else tenant.unembedded_count()

    def close(self) -> None:
        self.engine.close()
        self.auth.close()


@pytest.fixture
def mcp_env(tmp_path: Path) -> Iterator[McpInProcess]:
    env = McpInProcess(tmp_path / "data")
    yield env
    env.close()


def test_an_mcp_only_tenant_gets_vectors_and_hybrid_recall(mcp_env: McpInProcess) -> None:
    async def main() -> None:
        async with mcp_env.client(mcp_env.keys["rw"]) as c:
            for text in NOTES:
                await call(c, "memory_append", {"kind": "note", "text": text})
            deadline = time.monotonic() + 300  # the recall's own wait is 10 s: a loaded machine
            while mcp_env.backlog() > 0:  # embeds slower, so the test waits for the backlog first
                assert time.monotonic() < deadline, "the embedder never caught up"
                await anyio.sleep(0.05)
            args = {"text": "who received the package?", "k": 1, "wait_for_vectors": True}
            out = await call(c, "memory_recall", args)
            assert [h["text"] for h in out["hits"]] == [NOTES[1]]

    anyio.run(main)


def test_the_recall_tool_says_it_is_hybrid_when_the_server_embeds() -> None:
    recall = next(t.tool for t in TOOLS if t.tool.name == "memory_recall")
    assert "hybrid when the server embeds" in (recall.description or "")


# -- an embedder that fails, and the backlog ----------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    yield ep
    ep.close()


def remote_env(ep: Endpoint, **extra: str) -> dict[str, str]:
    """Settings for the app with the endpoint as its embedder (8 dimensions)."""
    return {
        "MEMSPINE_EMBEDDER": "openai",
        "MEMSPINE_EMBEDDER_URL": ep.url,
        "MEMSPINE_EMBEDDER_MODEL": "test-embed",
        "MEMSPINE_EMBEDDING_DIM": "8",
        **extra,
    }


def test_an_endpoint_that_fails_loses_nothing_and_the_backlog_holds_appends(
    start_server: Any, endpoint: Endpoint
) -> None:
    s = start_server(env=remote_env(endpoint, MEMSPINE_EMBEDDINGS_MAX_PENDING="2"))
    c = s.client("acme")
    wait_until(lambda: c.get("/v1/whoami").json()["vector_space"]["server_embeds"], "server space")
    # From here the endpoint refuses (a 400 is not retried by the embedder: the worker backs off).
    endpoint.script[:] = [{"status": 400}] * 3
    for i in range(2):
        assert c.post("/v1/memory/event", json=event(f"held {i}", i)).status_code == 201
    wait_until(lambda: "memspine_embeddings_pending 2.0" in c.get("/metrics").text, "the gauge")
    done: list[int] = []
    worker = threading.Thread(
        target=lambda: done.append(c.post("/v1/memory/event", json=event("third", 3)).status_code)
    )
    worker.start()
    time.sleep(0.3)
    assert done == []  # past MEMSPINE_EMBEDDINGS_MAX_PENDING the append waits
    # The endpoint recovers (its script runs out): the worker's retry embeds the backlog, the
    # append goes through, and every event gets its vector.
    worker.join(30)
    assert done == [201]
    wait_until(lambda: c.get("/v1/whoami").json()["vector_space"]["unembedded"] == 0, "vectors")
    for hit in c.post("/v1/memory/recall", json={"text": "held third", "k": 3}).json()["hits"]:
        got = c.get(f"/v1/memory/event/{hit['event_id']}").json()
        assert got["embedding_model"] == "test-embed" and len(got["embedding"]) == 8
