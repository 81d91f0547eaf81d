"""`memspine mcp --tools automem|mem0`: the other servers' tools through the official MCP client,
each called with the example arguments its own description gives (mcp-automem's src/index.ts;
mem0-mcp's filter patterns), on a real engine in tmp_path; and on data imported from those
servers' files (tests/support/foreign_files.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client

from memspine.config import Settings
from memspine.engine import Engine
from memspine.mcp.backend import EngineBackend
from memspine.mcp.server import Caller, build_server
from memspine.mcp.toolsets import TOOLSETS
from memspine.verifier import Principal
from memspine_admin.cli import main as admin
from tests.support import foreign_files as ff
from tests.support.mcp_foreign import AUTOMEM_TOOLS, MEM0_TOOLS, call


class Env:
    """An engine on a data directory; clients of one tenant with a tool set."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.engine = Engine(Settings(data_dir=data_dir, embedder="none"))

    @asynccontextmanager
    async def client(
        self, tools: str, tenant: str = "t1", scopes: tuple[str, ...] = ("read", "write")
    ) -> AsyncIterator[Client]:
        principal = Principal(tenant_id=tenant, key_id="k", scopes=scopes)
        caller = Caller(principal, EngineBackend(self.engine, principal))
        async with Client(build_server(lambda _ctx: caller, tools)) as client:
            yield client


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path / "data")
    yield e
    e.engine.close()


def test_the_tool_sets_list_their_servers_tools_by_scope(env: Env) -> None:
    async def main() -> None:
        for tools, names in (("automem", AUTOMEM_TOOLS), ("mem0", MEM0_TOOLS)):
            async with env.client(tools) as c:
                listed = {t.name: t for t in (await c.list_tools()).tools}
                assert set(listed) == names
                for tool in listed.values():
                    assert tool.description and tool.input_schema["type"] == "object"
            async with env.client(tools, scopes=("read",)) as c:
                read = {t.name for t in (await c.list_tools()).tools}
                assert read and read < names
        async with env.client("memspine") as c:
            assert "memory_append" in {t.name for t in (await c.list_tools()).tools}

    anyio.run(main)


def test_each_tool_parses_every_argument_its_schema_names() -> None:
    for name in ("automem", "mem0"):
        for spec in TOOLSETS[name].specs:
            assert set(spec.tool.input_schema["properties"]) == set(spec.args.__struct_fields__)
            for prop, schema in spec.tool.input_schema["properties"].items():
                assert schema.get("description"), f"{spec.tool.name}.{prop}"


def test_automem_tools_with_their_documented_examples(env: Env) -> None:
    async def main() -> None:
        async with env.client("automem") as c:
            first = await call(c, "store_memory", {"content": "Chose PostgreSQL over MongoDB for user service. Need ACID for transactions.", "tags": ["architecture", "database"], "importance": 0.9})  # fmt: skip
            await call(c, "store_memory", {"content": "User prefers early returns over nested conditionals.", "tags": ["code-style"], "importance": 0.7})  # fmt: skip
            # The ids the examples name, stored under them (AutoMem's `id`).
            for mid, content, tags in (
                ("old-id", "User prefers PostgreSQL for small local tools.", ["tools"]),
                ("abc123", "Auth tokens expire after one hour.", ["my-project", "auth"]),
                ("bug-fix-123", "Fixed the login redirect loop.", ["benchmark-test"]),
                ("feature-456", "Login with passkeys shipped.", ["benchmark-test"]),
                ("new-decision", "Use Redis for sessions.", []),
                ("old-decision", "Use Redis with persistence for sessions.", []),
                ("a", "Memory a", []),
                ("b", "Memory b", []),
            ):
                await call(c, "store_memory", {"content": content, "id": mid, "tags": tags})
            again = await call(c, "store_memory", {"content": "Memory a", "id": "a", "tags": []})
            a_id = again["memory_id"]
            other = await c.call_tool("store_memory", {"content": "Memory A", "id": "a"})
            assert other.is_error and other.structured_content["error"] == "idempotency_mismatch"
            assert (await call(c, "recall_memory", {"memory_id": "a"}))["results"][0]["id"] == a_id
            sup = await call(c, "store_memory", {"content": "User now prefers SQLite for small local tools.", "supersedes_memory_id": "old-id", "supersede_reason": "Correction from user"})  # fmt: skip
            assert sup["association_created"] is True
            found = await call(c, "recall_memory", {"query": "prefers local tools", "limit": 5})
            ids = [r["id"] for r in found["results"]]
            assert sup["memory_id"] in ids and sup["superseded_memory_id"] not in ids

            ranked = await call(c, "recall_memory", {"query": "database architecture decisions", "tags": ["my-project"], "limit": 5})  # fmt: skip
            assert all("my-project" in r["memory"]["tags"] for r in ranked["results"])
            assert (await call(c, "recall_memory", {"memory_id": "abc123"}))["mode"] == "id_fetch"
            listed = await call(c, "recall_memory", {"tags": ["benchmark-test"], "exhaustive": True, "limit": 50})  # fmt: skip
            assert listed["count"] == 2 and listed["has_more"] is False
            auth = await call(c, "recall_memory", {"query": "auth", "exclude_tags": ["deprecated"]})
            assert auth["results"][0]["memory"]["content"] == "Auth tokens expire after one hour."
            await call(c, "recall_memory", {"query": "What is Sarah's sister's job?", "expand_entities": True})  # fmt: skip
            postgres = await call(c, "recall_memory", {"query": "PostgreSQL ACID"})
            assert postgres["results"][0]["id"] == first["memory_id"]

            rel = await call(c, "associate_memories", {"memory1_id": "bug-fix-123", "memory2_id": "feature-456", "type": "RELATES_TO", "strength": 0.9})  # fmt: skip
            assert rel["success"] is True
            async with env.client("memspine") as m:
                listed = await m.call_tool("memory_list", {"kind": "relation"})
            (event,) = listed.structured_content["events"]
            props = event["properties"]
            assert (props["relation"], props["strength"]) == ("RELATES_TO", 0.9)
            assert props["source_event_ids"] == [props["from"], props["to"]]
            assert set(props) == {"relation", "from", "to", "strength", "source_event_ids"}
            evo = await call(c, "associate_memories", {"memory1_id": "new-decision", "memory2_id": "old-decision", "type": "EVOLVED_INTO", "strength": 0.8})  # fmt: skip
            redis = await call(c, "recall_memory", {"query": "Redis sessions"})
            assert [r["id"] for r in redis["results"]] == [evo["memory2_id"]]
            batch = await call(c, "associate_memories", {"associations": [{"memory1_id": "a", "memory2_id": "b", "type": "RELATES_TO", "strength": 0.8}]})  # fmt: skip
            assert batch["created_count"] == 1 and batch["failed_count"] == 0

            up = await call(c, "update_memory", {"memory_id": "abc123", "importance": 0.95})
            await call(c, "update_memory", {"memory_id": "abc123", "tags": ["project-x", "critical", "auth"]})  # fmt: skip
            last = await call(c, "update_memory", {"memory_id": "abc123", "content": "Updated: PostgreSQL chosen for ACID + team expertise"})  # fmt: skip
            head = (await call(c, "recall_memory", {"query": "team expertise"}))["results"][0]
            assert head["id"] == last["memory_id"] != up["memory_id"]
            assert head["memory"]["importance"] == 0.95
            assert head["memory"]["tags"] == ["project-x", "critical", "auth"]
            # The old words find the chain's head in place of the versions they were in.
            old_words = await call(c, "recall_memory", {"query": "Auth tokens expire"})
            assert [r["id"] for r in old_words["results"]] == [last["memory_id"]]

            gone = await call(c, "delete_memory", {"memory_id": "abc123"})
            assert len(gone["deleted"]) == 4  # the stored memory and its three updates
            assert (await call(c, "recall_memory", {"query": "tokens expertise"}))["count"] == 0
            bulk = await call(c, "delete_memory", {"tags": ["benchmark-test"]})
            assert bulk["deleted_count"] == 2
            health = await call(c, "check_database_health", {})
            assert health["status"] == "healthy" and health["statistics"]["tenant_id"] == "t1"
            bad = await c.call_tool(
                "store_memory", {"content": "x", "memories": [{"content": "y"}]}
            )
            assert bad.is_error
            stored = await call(c, "store_memory", {"memories": [{"content": "one"}, {"content": "two", "type": "Habit"}]})  # fmt: skip
            assert stored["stored"] == 2

    anyio.run(main)


def test_mem0_tools_with_their_documented_filters(env: Env) -> None:
    john = {"AND": [{"user_id": "john"}]}

    async def main() -> None:
        async with env.client("mem0") as c:
            added = await call(c, "add_memory", {"text": "John prefers window seats on long flights", "user_id": "john", "metadata": {"source": "chat"}})  # fmt: skip
            mid = added["results"][0]["id"]
            await call(c, "add_memory", {"text": "Jane prefers aisle seats", "user_id": "jane"})
            await call(c, "add_memory", {"text": "The travel agent books refundable fares", "agent_id": "agent_name"})  # fmt: skip
            found = await call(c, "search_memories", {"query": "seats", "filters": john})
            assert [r["id"] for r in found["results"]] == [mid]
            assert found["results"][0]["metadata"] == {"source": "chat"}
            agent = await call(c, "search_memories", {"query": "fares", "filters": {"AND": [{"agent_id": "agent_name"}]}})  # fmt: skip
            assert len(agent["results"]) == 1
            page = await call(c, "get_memories", {"filters": john, "page": 1, "page_size": 10})
            assert page["count"] == 1
            assert (await call(c, "get_memory", {"memory_id": mid}))["memory"].startswith("John")
            new = await call(c, "update_memory", {"memory_id": mid, "text": "John prefers aisle seats now"})  # fmt: skip
            found = await call(c, "search_memories", {"query": "seats", "filters": john})
            assert [r["id"] for r in found["results"]] == [new["id"]]
            assert (await call(c, "get_memory", {"memory_id": mid}))["id"] == mid  # still readable
            entities = await call(c, "list_entities", {})
            names = {(r["type"], r["name"]) for r in entities["results"]}
            assert {("user", "john"), ("user", "jane"), ("agent", "agent_name")} <= names
            assert len((await call(c, "delete_memory", {"memory_id": mid}))["deleted"]) == 2
            assert (await call(c, "search_memories", {"query": "seats", "filters": john}))[
                "results"
            ] == []
            assert (await call(c, "delete_all_memories", {"user_id": "jane"}))["deleted_count"] == 1
            assert (await call(c, "delete_entities", {"agent_id": "agent_name"}))[
                "deleted_count"
            ] == 1
            assert (await c.call_tool("delete_entities", {})).is_error

    anyio.run(main)


def test_the_tools_find_imported_memories_by_their_old_ids(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for source, data in (("automem", ff.automem_file()), ("mem0", ff.mem0_file())):
        path = tmp_path / source
        path.write_bytes(data)
        assert admin(["--data-dir", str(env.data_dir), "import-from", source, str(path), "--tenant", source]) == 0  # fmt: skip
    capsys.readouterr()

    async def main() -> None:
        async with env.client("automem", tenant="automem") as c:
            head = await call(c, "recall_memory", {"memory_id": ff.A_HEAD})
            assert head["results"][0]["memory"]["content"].startswith("Billing service runs")
            hits = await call(c, "recall_memory", {"query": "billing invoices", "limit": 10})
            contents = [r["memory"]["content"] for r in hits["results"]]
            assert contents[0].startswith("Billing service runs CockroachDB 24.1")
            assert not any("PostgreSQL" in t or "multi-region" in t for t in contents)
            old = await call(
                c, "recall_memory", {"query": "billing invoices", "current_only": False}
            )
            assert len(old["results"]) == 3
        async with env.client("mem0", tenant="mem0") as c:
            got = await call(c, "get_memory", {"memory_id": ff.M_COFFEE})
            assert got["memory"] == "Likes dark roast coffee"
            alice = {"AND": [{"user_id": "alice"}]}
            found = await call(c, "search_memories", {"query": "roast coffee", "filters": alice})
            assert [r["memory"] for r in found["results"]] == ["Likes dark roast coffee"]

    anyio.run(main)
