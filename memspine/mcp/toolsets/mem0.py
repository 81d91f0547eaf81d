"""`memspine mcp --tools mem0`: the tools of Mem0's MCP server (mem0-mcp's
src/mem0_mcp_server/server.py, docs/migrate.md names the commit) over memspine.

A memory is an event of kind `memory` whose properties carry user_id, agent_id, app_id, run_id
and metadata; the tenant is the outer scope, those ids narrow it as Mem0's filters do. Mem0
extracts facts with an LLM and updates them in place; memspine stores the text as given and an
update appends a version that supersedes the old one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from memspine.mcp.backend import Backend
from memspine.mcp.render import iso
from memspine.mcp.tools import ToolSpec
from memspine.mcp.toolsets.common import JsonObj, answer, delete_chain, events, find, tool
from memspine.routes import memory as ops
from storage.errors import InvalidRequest

PREFIX = "mem0"
KIND = "memory"
DEFAULT_USER = "mem0-mcp"  # mem0-mcp's MEM0_DEFAULT_USER_ID default
SCOPES = ("user_id", "agent_id", "app_id", "run_id")
ToolAnswer = tuple[JsonObj, str]
INSTRUCTIONS = (
    "Mem0's memory tools, served by memspine: add_memory to save facts and preferences, "
    "search_memories before answering, get_memories to browse, update_memory to correct "
    "(a new version supersedes the old), delete_memory only when the user confirms."
)


class AddArgs(msgspec.Struct):
    """add_memory."""

    text: str
    messages: list[dict[str, str]] | None = None
    user_id: str | None = None
    agent_id: str | None = None
    app_id: str | None = None
    run_id: str | None = None
    metadata: JsonObj | None = None
    enable_graph: bool | None = None


class SearchArgs(msgspec.Struct):
    """search_memories."""

    query: str
    filters: JsonObj | None = None
    limit: int | None = None
    enable_graph: bool | None = None


class ListArgs(msgspec.Struct):
    """get_memories."""

    filters: JsonObj | None = None
    page: int | None = None
    page_size: int | None = None
    enable_graph: bool | None = None


class IdArgs(msgspec.Struct):
    """get_memory, delete_memory."""

    memory_id: str


class UpdateArgs(msgspec.Struct):
    """update_memory."""

    memory_id: str
    text: str


class ScopeArgs(msgspec.Struct):
    """delete_all_memories, delete_entities."""

    user_id: str | None = None
    agent_id: str | None = None
    app_id: str | None = None
    run_id: str | None = None


class NoArgs(msgspec.Struct):
    """list_entities."""


def item_of(ev: JsonObj, score: float | None = None) -> JsonObj:
    """An event as Mem0 returns a memory."""
    props = dict(ev.get("properties") or {})
    out: JsonObj = {"id": ev["event_id"], "memory": ev.get("text")}
    out |= {k: props[k] for k in SCOPES if props.get(k) is not None}
    out["metadata"] = props.get("metadata")
    out["created_at"] = props.get("created_at") or iso(ev["ts"])
    out["updated_at"] = iso(ev["ts"])
    if score is not None:
        out["score"] = score
    return out


def equalities(filters: JsonObj | None) -> dict[str, Any]:
    """The scope equalities of Mem0's filters ({"user_id": X}, or inside AND); user_id defaults
    as mem0-mcp's does. Other clauses are not applied (the description says so)."""
    found: dict[str, Any] = {}
    clauses = (filters or {}).get("AND", [filters or {}])
    for clause in clauses if isinstance(clauses, list) else []:
        for key in SCOPES:
            if isinstance(clause, dict) and isinstance(clause.get(key), str | int):
                found[key] = clause[key]
    if not any(k in found for k in ("agent_id", "run_id")):
        found.setdefault("user_id", DEFAULT_USER)
    return found


def _in_scope(ev: JsonObj, scope: dict[str, Any]) -> bool:
    props = ev.get("properties") or {}
    return all(props.get(k) == v for k, v in scope.items())


async def add(b: Backend, a: AddArgs) -> ToolAnswer:
    """The text as one memory (Mem0 would have an LLM extract memories from it)."""
    props: JsonObj = {k: getattr(a, k) for k in SCOPES if getattr(a, k) is not None}
    if not any(k in props for k in ("user_id", "agent_id", "run_id")):
        props["user_id"] = DEFAULT_USER
    if a.metadata:
        props["metadata"] = a.metadata
    if a.messages:
        props["messages"] = a.messages
    out = await b.append({"kind": KIND, "text": a.text, "properties": props}, None)
    result = {"id": out["event_id"], "memory": a.text, "event": "ADD"}
    return answer({"results": [result]})


async def search(b: Backend, a: SearchArgs) -> ToolAnswer:
    """Hybrid recall, narrowed to the scope of the filters."""
    scope = equalities(a.filters)
    k = min(max(a.limit or 10, 1), 100)
    out = await b.recall({"text": a.query, "kind": KIND, "k": k, "filter": scope})
    return answer({"results": [item_of(h, h["score"]) for h in out["hits"]]})


async def list_(b: Backend, a: ListArgs) -> ToolAnswer:
    """A page of the scope's memories, newest first."""
    scope = equalities(a.filters)
    size = min(max(a.page_size or 10, 1), 1000)
    page = max(a.page or 1, 1)
    matched = [ev async for ev in events(b, KIND) if _in_scope(ev, scope)]
    chunk = matched[(page - 1) * size : page * size]
    return answer(
        {
            "count": len(matched),
            "page": page,
            "page_size": size,
            "results": [item_of(e) for e in chunk],
        }
    )


async def get(b: Backend, a: IdArgs) -> ToolAnswer:
    """One memory by id (memspine's, or the id Mem0 gave an imported one)."""
    return answer(item_of(await find(b, PREFIX, a.memory_id)))


async def update(b: Backend, a: UpdateArgs) -> ToolAnswer:
    """A new version with the new text, superseding the current one."""
    old = await find(b, PREFIX, a.memory_id, head=True)
    props = dict(old.get("properties") or {})
    body = {
        "kind": old["kind"],
        "text": a.text,
        "properties": props,
        "supersedes": [old["event_id"]],
    }
    new = await b.append(body, None)
    return answer(
        {
            "message": "Memory updated successfully!",
            "id": new["event_id"],
            "supersedes": old["event_id"],
        }
    )


async def delete(b: Backend, a: IdArgs) -> ToolAnswer:
    """The memory and the versions it replaced."""
    gone = await delete_chain(b, await find(b, PREFIX, a.memory_id, head=True))
    return answer({"message": "Memory deleted successfully!", "deleted": gone})


async def delete_all(b: Backend, a: ScopeArgs) -> ToolAnswer:
    """Every memory of the scope (user_id defaults as mem0-mcp's does)."""
    scope = {k: getattr(a, k) for k in SCOPES if getattr(a, k) is not None}
    scope.setdefault("user_id", DEFAULT_USER)
    return await _delete_scope(b, scope)


async def delete_entities(b: Backend, a: ScopeArgs) -> ToolAnswer:
    """As delete_all_memories: memspine keeps no entity records besides the memories."""
    scope = {k: getattr(a, k) for k in SCOPES if getattr(a, k) is not None}
    if not scope:
        raise InvalidRequest(
            "Provide user_id, agent_id, app_id, or run_id before calling delete_entities."
        )
    return await _delete_scope(b, scope)


async def _delete_scope(b: Backend, scope: dict[str, Any]) -> ToolAnswer:
    matched = [ev async for ev in events(b, KIND) if _in_scope(ev, scope)]
    count = sum([bool(await delete_chain(b, ev)) for ev in matched])
    return answer({"message": f"Deleted {count} memories", "deleted_count": count})


async def entities(b: Backend, _a: NoArgs) -> ToolAnswer:
    """Each user, agent, app and run id holding current memories, with how many."""
    counts: dict[tuple[str, str], int] = {}
    async for ev in events(b, KIND):
        props = ev.get("properties") or {}
        for key in SCOPES:
            if props.get(key) is not None:
                name = (key.removesuffix("_id"), str(props[key]))
                counts[name] = counts.get(name, 0) + 1
    rows = [{"type": t, "name": n, "total_memories": c} for (t, n), c in sorted(counts.items())]
    return answer({"count": len(rows), "results": rows})


_ID = {
    "type": "string",
    "description": "Exact memory_id (memspine's event_id, or Mem0's id of an imported memory).",
}
_SCOPE = {
    k: {
        "type": "string",
        "description": f"{k}, stored in and matched against the memory's properties.",
    }
    for k in SCOPES
}
_GRAPH = {"type": "boolean", "description": "Accepted; memspine has no Mem0 graph memory."}
_FILTERS = {
    "type": "object",
    "description": 'Scope filters: user_id, agent_id, app_id, run_id equalities, alone or in "AND" '
    "(user_id defaults to mem0-mcp). Other clauses (dates, OR, NOT) are not applied.",
}
WRITE = {"read_only_hint": False, "destructive_hint": False, "idempotent_hint": False}
GONE = {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": False}

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tool(
            "add_memory",
            "Add memory",
            "Store a new preference, fact, or conversation snippet. memspine stores `text` as one memory as given (no LLM extraction; `messages` are kept in its properties).",
            {
                "text": {
                    "type": "string",
                    "description": "Plain sentence summarizing what to store.",
                },
                "messages": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "Conversation turns, kept in properties.messages.",
                },
                **_SCOPE,
                "metadata": {"type": "object", "description": "Stored in properties.metadata."},
                "enable_graph": _GRAPH,
            },
            ["text"],
            **WRITE,
        ),
        ops.APPEND.scope,
        AddArgs,
        add,
    ),
    ToolSpec(
        tool(
            "search_memories",
            "Search memories",
            "Run a search over existing memories: memspine's hybrid recall (words, and meaning where the server embeds), current memories only, within the filters' scope.",
            {
                "query": {
                    "type": "string",
                    "description": "Natural language description of what to find.",
                },
                "filters": _FILTERS,
                "limit": {
                    "type": "integer",
                    "description": "Maximum number of results (default 10, at most 100).",
                },
                "enable_graph": _GRAPH,
            },
            ["query"],
            read_only_hint=True,
        ),
        ops.RECALL.scope,
        SearchArgs,
        search,
    ),
    ToolSpec(
        tool(
            "get_memories",
            "Get memories",
            "Page through the scope's current memories, newest first.",
            {
                "filters": _FILTERS,
                "page": {"type": "integer", "description": "1-indexed page."},
                "page_size": {"type": "integer", "description": "Memories per page (default 10)."},
                "enable_graph": _GRAPH,
            },
            [],
            read_only_hint=True,
        ),
        ops.LIST.scope,
        ListArgs,
        list_,
    ),
    ToolSpec(
        tool(
            "get_memory",
            "Get memory",
            "Fetch a single memory once you know its memory_id.",
            {"memory_id": _ID},
            ["memory_id"],
            read_only_hint=True,
        ),
        ops.GET.scope,
        IdArgs,
        get,
    ),
    ToolSpec(
        tool(
            "update_memory",
            "Update memory",
            "Overwrite a memory's text after confirming the ID. memspine appends a new version that supersedes the old one (returned as id); the old id keeps leading to it.",
            {"memory_id": _ID, "text": {"type": "string", "description": "The new text."}},
            ["memory_id", "text"],
            **WRITE,
        ),
        ops.APPEND.scope,
        UpdateArgs,
        update,
    ),
    ToolSpec(
        tool(
            "delete_memory",
            "Delete memory",
            "Delete one memory after the user confirms its memory_id (with the earlier versions it replaced).",
            {"memory_id": _ID},
            ["memory_id"],
            **GONE,
        ),
        ops.DELETE.scope,
        IdArgs,
        delete,
    ),
    ToolSpec(
        tool(
            "delete_all_memories",
            "Delete all memories",
            "Delete every memory in the given user/agent/app/run (user_id defaults to mem0-mcp).",
            _SCOPE,
            [],
            **GONE,
        ),
        ops.DELETE.scope,
        ScopeArgs,
        delete_all,
    ),
    ToolSpec(
        tool(
            "delete_entities",
            "Delete entities",
            "Remove a user/agent/app/run and its memories; memspine keeps no entity record, so this deletes the memories.",
            _SCOPE,
            [],
            **GONE,
        ),
        ops.DELETE.scope,
        ScopeArgs,
        delete_entities,
    ),
    ToolSpec(
        tool(
            "list_entities",
            "List entities",
            "List which users/agents/apps/runs currently hold memories.",
            {},
            [],
            read_only_hint=True,
        ),
        ops.LIST.scope,
        NoArgs,
        entities,
    ),
)
