"""AutoMem's read tools (recall_memory, check_database_health) over memspine
(memspine/mcp/toolsets/automem.py declares them)."""

from __future__ import annotations

from typing import Any

import msgspec

from memspine.mcp.backend import Backend
from memspine.mcp.render import iso, parse_time
from memspine.mcp.toolsets.automem_writes import MEMORY_PROPS, PREFIX, ToolAnswer
from memspine.mcp.toolsets.common import JsonObj, answer, events, find, tags_of
from storage.errors import InvalidRequest


class RecallArgs(msgspec.Struct):
    """recall_memory: every argument AutoMem takes; those memspine does not use are accepted."""

    memory_id: str | None = None
    exhaustive: bool = False
    exclude_tags: list[str] | None = None
    query: str | None = None
    queries: list[str] | None = None
    embedding: list[float] | None = None
    limit: int = 5
    time_query: str | None = None
    start: str | None = None
    end: str | None = None
    tags: list[str] | None = None
    tag_mode: str = "any"
    tag_match: str = "exact"
    expand_entities: bool | None = None
    expand_relations: bool | None = None
    expand_respect_tags: bool | None = None
    auto_decompose: bool | None = None
    expansion_limit: int | None = None
    relation_limit: int | None = None
    expand_min_importance: float | None = None
    expand_min_strength: float | None = None
    current_only: bool = True
    state_debug: bool | None = None
    state_mode: str | None = None
    recency_bias: str | None = None
    scope_fallback: bool | None = None
    min_score: float | None = None
    adaptive_floor: bool | None = None
    context: str | None = None
    language: str | None = None
    active_path: str | None = None
    context_tags: list[str] | None = None
    context_types: list[str] | None = None
    priority_ids: list[str] | None = None
    per_query_limit: int | None = None
    sort: str | None = None
    format: str | None = None
    offset: int = 0


def memory_of(ev: JsonObj, score: float | None = None) -> JsonObj:
    """An event as AutoMem's recall returns a result."""
    props = dict(ev.get("properties") or {})
    memory = {
        "id": ev["event_id"],
        "content": ev.get("text"),
        "timestamp": iso(ev["ts"]),
        **{k: props.pop(k) for k in MEMORY_PROPS if k in props},
    }
    if ev.get("valid_from") is not None:
        memory["t_valid"] = iso(ev["valid_from"])
    if ev.get("valid_until") is not None:
        memory["t_invalid"] = iso(ev["valid_until"])
    memory["type"] = memory.get("type") or ev["kind"]
    if props:
        memory["properties"] = props
    result: JsonObj = {"id": ev["event_id"], "memory_id": ev["event_id"], "memory": memory}
    if score is not None:
        result["final_score"] = score
        result["match_type"] = "hybrid"
    return result


def _tagged(ev: JsonObj, a: RecallArgs) -> bool:
    """Whether an event passes the tag arguments."""
    have = tags_of(ev)
    if a.exclude_tags and any(t.lower() in have for t in a.exclude_tags):
        return False
    if not a.tags:
        return True
    want = [t.lower() for t in a.tags]

    def hit(w: str) -> bool:
        return any(h.startswith(w) for h in have) if a.tag_match == "prefix" else w in have

    return all(map(hit, want)) if a.tag_mode == "all" else any(map(hit, want))


async def recall(b: Backend, a: RecallArgs) -> ToolAnswer:
    """ID fetch, tag enumeration or ranked recall, as AutoMem picks by the arguments."""
    if a.memory_id:
        ev = await find(b, PREFIX, a.memory_id)
        return answer({"count": 1, "mode": "id_fetch", "results": [memory_of(ev)]})
    if a.exhaustive:
        return await _enumerate(b, a)
    texts = [q for q in [a.query, *(a.queries or [])] if q]
    if not texts:
        raise InvalidRequest("give query (or queries), memory_id, or tags with exhaustive")
    since = parse_time(a.start, "start") if a.start else None
    until = parse_time(a.end, "end") if a.end else None
    current = a.current_only and a.state_mode != "history"
    best: dict[str, tuple[float, JsonObj]] = {}
    k = 100 if (a.tags or a.exclude_tags or since or until) else min(max(a.limit, 1), 100)
    for text in texts:
        out = await b.recall({"text": text, "k": k, "current": current})
        for hit in out["hits"]:
            if (
                not _tagged(hit, a)
                or (since and hit["ts"] < since)
                or (until and hit["ts"] > until)
            ):
                continue
            if hit["event_id"] not in best or best[hit["event_id"]][0] < hit["score"]:
                best[hit["event_id"]] = (hit["score"], hit)
    ranked = sorted(best.values(), key=lambda sh: -sh[0])
    if a.sort in ("time_desc", "time_asc"):
        ranked.sort(key=lambda sh: sh[1]["ts"], reverse=a.sort == "time_desc")
    results = [memory_of(h, s) for s, h in ranked[: max(a.limit, 1)]]
    mode = "current" if current else "history"
    return answer(
        {
            "count": len(results),
            "mode": "ranked",
            "state_mode": mode,
            "results": results,
            "query": texts[0],
        }
    )


async def _enumerate(b: Backend, a: RecallArgs) -> ToolAnswer:
    """Every memory carrying any of the tags, newest first, a page at a time."""
    if not a.tags:
        raise InvalidRequest("exhaustive needs tags")
    if a.tag_match == "prefix" or a.tag_mode == "all":
        raise InvalidRequest('exhaustive takes exact tags in "any" mode only')
    limit = min(max(a.limit, 1), 200)
    matched = [ev async for ev in events(b) if _tagged(ev, a)]
    page = matched[a.offset : a.offset + limit]
    return answer(
        {
            "count": len(page),
            "mode": "enumeration",
            "results": [memory_of(ev) for ev in page],
            "has_more": a.offset + limit < len(matched),
            "limit": limit,
            "offset": a.offset,
        }
    )


class HealthArgs(msgspec.Struct):
    """check_database_health takes nothing."""


async def health(b: Backend, _a: HealthArgs) -> ToolAnswer:
    """The key's tenant answers."""
    who = await b.whoami()
    stats: dict[str, Any] = {"tenant_id": who["tenant_id"], "scopes": who["scopes"]}
    return answer({"status": "healthy", "backend": "memspine", "statistics": stats})
