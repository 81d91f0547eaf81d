"""MCP helpers: keys of each scope, a tool call and its text, a refusal, and the stdio bridge's
command line."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult

from memspine_admin.control import ControlDB
from tests.support.control import CHEAP_HASHER
from tests.support.wait import PATIENCE_SECS

MEMSPINE = Path(sys.executable).parent / "memspine"
COMMAND = [str(MEMSPINE)] if MEMSPINE.exists() else [sys.executable, "-m", "memspine.cli"]


READ_TOOLS = {"memory_recall", "memory_get", "memory_list", "memory_cypher"}


ALL_TOOLS = READ_TOOLS | {"memory_append", "memory_delete"}


FORBIDDEN = {"error": "forbidden", "detail": "api key is missing the 'write' scope"}


NO_EVENT = {"error": "not_found", "detail": "no event with that id"}


def issue_keys(data_dir: Path) -> dict[str, str]:
    """A control database with one tenant and a read, a write and a read+write key."""
    with ControlDB.open(data_dir, create=True, hasher=CHEAP_HASHER) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
        made = {
            name: db.create_key(tenant, name, scopes, actor="test").api_key
            for name, scopes in (
                ("read", ("read",)),
                ("write", ("write",)),
                ("rw", ("read", "write")),
            )
        }
    return {"tenant": tenant, **made}


def text(result: CallToolResult) -> str:
    """The text a model reads from a tool result."""
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call a tool that must succeed; its structured content."""
    result = await client.call_tool(name, args)
    assert not result.is_error, text(result)
    out: dict[str, Any] = result.structured_content
    return out


# What a recall with wait_for_vectors answers while the embedder is still behind after its own
# 10 s wait (a loaded machine embeds slower): a condition to wait on, not a failure.
AWAITING_VECTORS = "still await their vectors"


async def recall_embedded(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """memory_recall with wait_for_vectors, asked again while the answer is that the events still
    await their vectors; the answer once they have them."""
    deadline = time.monotonic() + PATIENCE_SECS
    while True:
        result = await client.call_tool("memory_recall", {**args, "wait_for_vectors": True})
        if not (result.is_error and AWAITING_VECTORS in text(result)):
            break
        assert time.monotonic() < deadline, text(result)
        await anyio.sleep(0.05)
    assert not result.is_error, text(result)
    out: dict[str, Any] = result.structured_content
    return out


async def refused(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call a tool that must fail as a tool error; its {"error", "detail"}."""
    result = await client.call_tool(name, args)
    assert result.is_error, text(result)
    err: dict[str, Any] = result.structured_content
    assert text(result) == f"Error ({err['error']}): {err['detail']}"
    return err


def stdio(args: list[str], env: dict[str, str] | None = None) -> StdioServerParameters:
    """`memspine mcp ARGS` as the SDK's stdio client launches it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    return StdioServerParameters(
        command=COMMAND[0], args=[*COMMAND[1:], "mcp", *args], env={**clean, **(env or {})}
    )
