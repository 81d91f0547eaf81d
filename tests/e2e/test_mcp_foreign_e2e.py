"""`memspine mcp --tools automem|mem0` over stdio, as an agent host launches it, embedded on a
data directory (tests/server/test_mcp_foreign.py calls every tool in process)."""

from __future__ import annotations

from pathlib import Path

import anyio
from mcp import Client

from tests.support.mcp_calls import stdio
from tests.support.mcp_foreign import AUTOMEM_TOOLS, MEM0_TOOLS, call
from tests.support.servers import ServerProcess


def test_stdio_serves_the_other_servers_tools(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    base = ["--data-dir", str(data_dir), "--tenant", "agent-1"]

    async def main() -> None:
        async with Client(stdio([*base, "--tools", "automem"])) as c:
            assert {t.name for t in (await c.list_tools()).tools} == AUTOMEM_TOOLS
            made = await call(c, "store_memory", {"content": "User prefers early returns over nested conditionals.", "tags": ["code-style"], "importance": 0.7})  # fmt: skip
            hits = await call(c, "recall_memory", {"query": "early returns", "limit": 5})
            assert hits["results"][0]["id"] == made["memory_id"]
        async with Client(stdio([*base, "--tools", "mem0"])) as c:
            assert {t.name for t in (await c.list_tools()).tools} == MEM0_TOOLS
            got = await call(c, "get_memory", {"memory_id": made["memory_id"]})
            assert got["memory"] == "User prefers early returns over nested conditionals."

    anyio.run(main)


def test_stdio_through_a_server_finds_memories_by_automem_ids(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", {"MEMSPINE_EMBEDDER": "none"}).start()
    try:
        params = stdio(["--tools", "automem", "--url", server.url], {"MEMSPINE_API_KEY": "agent-2"})

        async def main() -> None:
            async with Client(params) as c:
                made = await call(c, "store_memory", {"content": "Auth tokens expire after one hour.", "id": "abc123"})  # fmt: skip
                got = await call(c, "recall_memory", {"memory_id": "abc123"})
                assert got["results"][0]["id"] == made["memory_id"]
                up = await call(c, "update_memory", {"memory_id": "abc123", "importance": 0.95})
                gone = await call(c, "delete_memory", {"memory_id": "abc123"})
                assert gone["memory_id"] == up["memory_id"] and len(gone["deleted"]) == 2
                missing = await c.call_tool("recall_memory", {"memory_id": "abc123"})
                assert missing.is_error and missing.structured_content["error"] == "not_found"

        anyio.run(main)
    finally:
        server.stop()
