"""What the other servers' tool sets share: their ids over memspine's, the chain behind a
memory, pages walked, answers as the JSON text those servers return."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from mcp_types import Tool, ToolAnnotations

from memspine.mcp.backend import Backend
from memspine.schemas import idempotent_id as event_id
from storage.errors import InvalidRequest, MemspineError, NotFound

JsonObj = dict[str, Any]
PAGE = 1000  # events per listing page
MAX_SCAN = 100_000  # events a tag or scope scan reads at most
MAX_CHAIN = 64  # versions followed along a supersession chain
ABSENT = (NotFound.code, InvalidRequest.code)  # what an id that names no event is answered


def tool(
    name: str, title: str, description: str, properties: JsonObj, required: list[str], **hints: bool
) -> Tool:
    """A tool under another server's name and argument shape (its properties as it declares them)."""
    schema: JsonObj = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    annotations = ToolAnnotations(title=title, open_world_hint=False, **hints)
    return Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        annotations=annotations,
    )


def answer(out: JsonObj) -> tuple[JsonObj, str]:
    """The structured content and its text, the JSON those servers return."""
    return out, json.dumps(out, ensure_ascii=False)


async def find(b: Backend, prefix: str, memory_id: str, *, head: bool = False) -> JsonObj:
    """The event a source's id names: a memspine event_id, or the id an import or a store
    under it was keyed by (`prefix:<id>`); with head, the current version it was replaced by."""
    if not memory_id:
        raise InvalidRequest("memory_id must name a memory")
    event = await _get(b, memory_id)
    if event is None:
        tenant = (await b.whoami())["tenant_id"]
        event = await _get(b, event_id(tenant, f"{prefix}:{memory_id}"))
    if event is None:
        raise NotFound(f"no memory with id {memory_id[:80]}")
    for _ in range(MAX_CHAIN if head else 0):
        newer = event.get("superseded_by") or []
        nxt = await _get(b, newer[-1]) if newer else None
        if nxt is None:
            break
        event = nxt
    return event


async def _get(b: Backend, eid: str) -> JsonObj | None:
    """One event, or None where there is none by that id."""
    try:
        return await b.get(eid)
    except MemspineError as exc:  # by code: through a server (remote.py) it comes as Refused
        if exc.code in ABSENT:
            return None
        raise


async def delete_chain(b: Backend, event: JsonObj) -> list[str]:
    """Delete a memory and the versions it replaced: deleting only the newest would make the
    one before it current again (docs/current-state.md)."""
    deleted: list[str] = []
    todo = [event["event_id"]]
    while todo and len(deleted) < MAX_CHAIN:
        eid = todo.pop()
        older = await _get(b, eid)
        if older is None:
            continue
        todo.extend(older.get("supersedes") or [])
        try:
            await b.delete(eid, cascade=False, dry_run=False)
        except MemspineError as exc:
            if exc.code in ABSENT:
                continue
            raise
        deleted.append(eid)
    return deleted


async def events(b: Backend, kind: str | None = None) -> AsyncIterator[JsonObj]:
    """Every current event (of a kind), newest first, up to MAX_SCAN."""
    cursor: str | None = None
    seen = 0
    while seen < MAX_SCAN:
        params: JsonObj = {"limit": PAGE, "kind": kind, "cursor": cursor}
        page = await b.list_events({k: v for k, v in params.items() if v is not None})
        for event in page["events"]:
            seen += 1
            yield event
        cursor = page.get("next_cursor")
        if not cursor:
            return


def tags_of(event: JsonObj) -> list[str]:
    """An event's tags (properties.tags), lowercased."""
    tags = (event.get("properties") or {}).get("tags") or []
    return [t.lower() for t in tags if isinstance(t, str)]


def refused(exc: MemspineError) -> JsonObj:
    """A failure inside a batch, as an item of its answer."""
    return {"error": exc.code, "detail": exc.detail}
