"""The MCP server: tools/list shows what the caller's key may use, tools/call runs one tool."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
)

from memspine import __version__
from memspine.mcp import render
from memspine.mcp.backend import Backend
from memspine.mcp.tools import BY_NAME, ToolSpec
from memspine.verifier import Principal
from storage.errors import MemspineError

log = logging.getLogger("memspine.mcp")

INSTRUCTIONS = (
    "memspine is your long-term memory: an append-only log of events (facts, decisions, "
    "preferences, conversation summaries) kept across sessions, with provenance links between them. "
    "Before answering from scratch, memory_recall the distinctive words of the topic. Store what "
    "should outlive this conversation with memory_append, one statement per event, linking the "
    "events it came from in source_event_ids. Correct a memory by appending the new version with "
    "supersedes, not by deleting. Delete only what the user asks to erase, and always dry-run first."
)


class Caller(NamedTuple):
    """Who is calling and the backend that acts for them."""

    principal: Principal
    backend: Backend


Resolve = Callable[[ServerRequestContext[Any, Any]], Caller]


def error_result(exc: MemspineError) -> CallToolResult:
    """A refused or failed call as a tool error the model can read and correct."""
    return CallToolResult(
        content=[TextContent(text=render.error_text(exc.code, exc.detail))],
        structured_content={"error": exc.code, "detail": exc.detail},
        is_error=True,
    )


def build_server(resolve: Resolve, tools: str = "memspine") -> Server[Any]:
    """An MCP server whose every request is answered for the caller `resolve` finds in its
    context, with one tool set of memspine/mcp/toolsets/ (memspine's own by default)."""
    from memspine.mcp.toolsets import TOOLSETS

    toolset = TOOLSETS[tools]
    specs, by_name = toolset.specs, toolset.by_name()

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], _params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        principal = resolve(ctx).principal
        return ListToolsResult(tools=[s.tool for s in specs if principal.has(s.scope)])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        spec = by_name.get(params.name)
        if spec is None:
            names = ", ".join(by_name)
            raise MCPError(
                INVALID_PARAMS, f"unknown tool '{params.name[:64]}'; the tools are {names}"
            )
        caller = resolve(ctx)
        who = f"tenant={caller.principal.tenant_id} key={caller.principal.key_id}"
        try:
            caller.principal.require(spec.scope)
            structured, text = await spec.run(caller.backend, spec.parse(params.arguments))
        except MemspineError as exc:
            log.info("mcp %s %s -> %s", spec.tool.name, who, exc.code)
            return error_result(exc)
        except Exception as exc:  # a bug: the model gets a sentence, the log the traceback
            log.error(
                "mcp %s %s -> unhandled %s", spec.tool.name, who, type(exc).__name__, exc_info=exc
            )
            err = MemspineError("the server failed to handle this tool call")
            return error_result(err)
        log.debug("mcp %s %s -> ok", spec.tool.name, who)
        return CallToolResult(content=[TextContent(text=text)], structured_content=structured)

    return Server(
        "memspine",
        version=__version__,
        title="memspine memory",
        instructions=toolset.instructions or INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # Spares the 2026 wire a tools/list run per call.
        get_tool_input_schema=lambda name: input_schema(name, by_name),
    )


def input_schema(name: str, by_name: dict[str, ToolSpec] = BY_NAME) -> dict[str, Any] | None:
    """A tool's input schema by name (the same for every caller), None for unknown names."""
    spec = by_name.get(name)
    return None if spec is None else spec.tool.input_schema


def fixed(caller: Caller) -> Resolve:
    """A resolver for one caller whatever the request (stdio, in-process)."""
    return lambda _ctx: caller


def principal_of(who: dict[str, Any]) -> Principal:
    """A Principal from a whoami answer."""
    return Principal(
        tenant_id=str(who["tenant_id"]),
        key_id=str(who["key_id"]),
        scopes=tuple(who["scopes"]),
        expires_at=who.get("expires_at"),
    )
