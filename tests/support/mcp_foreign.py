"""The tool sets of the automem and mem0 MCP doors, and a call that checks its text states its
structured content as JSON."""

from __future__ import annotations

import json
from typing import Any

from mcp import Client
from mcp_types import CallToolResult

AUTOMEM_TOOLS = {
    "store_memory",
    "recall_memory",
    "associate_memories",
    "update_memory",
    "delete_memory",
    "check_database_health",
}


MEM0_TOOLS = {
    "add_memory",
    "search_memories",
    "get_memories",
    "get_memory",
    "update_memory",
    "delete_memory",
    "delete_all_memories",
    "delete_entities",
    "list_entities",
}


async def call(c: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A call that must succeed: its structured content, which its text states as JSON."""
    result: CallToolResult = await c.call_tool(name, args)
    body = "\n".join(b.text for b in result.content if b.type == "text")
    assert not result.is_error, body
    out: dict[str, Any] = result.structured_content
    assert json.loads(body) == out
    return out
