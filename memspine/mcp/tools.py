"""The memory tools: JSON schemas and descriptions written for a model, each a thin call on a Backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from mcp_types import Tool, ToolAnnotations

from memspine import integers
from memspine.jsonbounds import value_problem
from memspine.mcp import render
from memspine.mcp.backend import Backend
from memspine.routes import memory as ops
from memspine.routes.cypher import CYPHER as CYPHER_OP
from memspine.schemas import MAX_HOPS, MAX_K, MAX_RECALL_TEXT_CHARS
from storage.errors import InvalidRequest

JsonObj = dict[str, Any]
ToolAnswer = tuple[JsonObj, str]  # structured content (the route's JSON) and its text

ID_SCHEMA = {
    "type": "string",
    "description": "The event's event_id, a UUID as the other memory tools print it.",
}
KIND_HINT = "a short label such as fact, decision, preference, turn, summary, task"


class AppendArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_append."""

    kind: str
    text: str | None = None
    properties: JsonObj | None = None
    source_event_ids: list[str] | None = None
    supersedes: list[str] | None = None
    idempotency_key: str | None = None
    subjects: list[str] | None = None


class RecallArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_recall: RecallIn's fields (memspine/schemas.py) with its defaults, less those in
    RECALL_LEFT_OUT (tests/server/test_recall_doors.py holds both to RecallIn)."""

    text: str
    kind: str | None = None
    k: int = 10
    hops: int = 0
    filter: dict[str, bool | int | float | str] | None = None
    wait_for_vectors: bool = False


class GetArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_get."""

    id: str


class ListArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_list."""

    kind: str | None = None
    since: str | int | None = None
    until: str | int | None = None
    limit: int = 20
    cursor: str | None = None


class CypherArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_cypher."""

    query: str
    params: JsonObj | None = None


class DeleteArgs(msgspec.Struct, forbid_unknown_fields=True):
    """memory_delete."""

    id: str
    cascade: bool = False
    dry_run: bool = True
    purge: bool = False


async def append(b: Backend, a: AppendArgs) -> ToolAnswer:
    """Append one event; source ids travel in properties.source_event_ids as the HTTP API takes them."""
    properties = dict(a.properties or {})
    if a.source_event_ids is not None:
        if "source_event_ids" in properties:
            raise InvalidRequest(
                "give source_event_ids once, as its own argument, not inside properties"
            )
        properties["source_event_ids"] = a.source_event_ids
    body: JsonObj = {"kind": a.kind, "text": a.text}
    if properties:
        body["properties"] = properties
    if a.supersedes:
        body["supersedes"] = a.supersedes
    if a.subjects:
        body["subjects"] = a.subjects
    out = await b.append(body, a.idempotency_key)
    return out, render.append_text(out)


# RecallIn's fields a model is not offered, and why.
RECALL_LEFT_OUT = {
    "embedding": "a model has no embeddings: the server embeds the text where it makes vectors",
    "embedding_model": "it goes with an embedding",
    "current": "superseded events stay out: a model corrects by superseding",
    "as_of": "the past state of memory is an audit question, for memory_cypher",
    "explain": "per-arm ranks are for people tuning recall, not for a model",
}


# The tool's arguments that are not RecallIn's fields (a request header's, say): not sent in
# the body.
RECALL_TOOL_ONLY: frozenset[str] = frozenset()


async def recall(b: Backend, a: RecallArgs) -> ToolAnswer:
    """Recall by text (the model has no embeddings; the server embeds the text where it makes
    the tenant's vectors) with the optional walk: every argument given becomes its field."""
    values = msgspec.structs.asdict(a)
    body = {k: v for k, v in values.items() if v is not None and k not in RECALL_TOOL_ONLY}
    out = await b.recall(body)
    return out, render.recall_text(out)


async def get(b: Backend, a: GetArgs) -> ToolAnswer:
    """One event in full; the embedding is left out (a model cannot use it)."""
    out = await b.get(a.id)
    out.pop("embedding", None)
    return out, render.event_text(out)


async def list_(b: Backend, a: ListArgs) -> ToolAnswer:
    """One page of events newest first."""
    params: JsonObj = {"kind": a.kind, "limit": a.limit, "cursor": a.cursor}
    for name in ("since", "until"):
        value = getattr(a, name)
        params[name] = None if value is None else render.parse_time(value, name)
    out = await b.list_events({k: v for k, v in params.items() if v is not None})
    return out, render.list_text(out)


async def cypher(b: Backend, a: CypherArgs) -> ToolAnswer:
    """A read-only Cypher query."""
    out = await b.cypher(a.query, a.params)
    return out, render.cypher_text(out)


async def delete(b: Backend, a: DeleteArgs) -> ToolAnswer:
    """A dry run (the default) or the delete itself."""
    out = await b.delete(a.id, cascade=a.cascade, dry_run=a.dry_run, purge=a.purge)
    return out, render.delete_text(out, a.id)


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what tools/list shows, the scope it needs, how its arguments parse and what it calls."""

    tool: Tool
    scope: str
    args: type[msgspec.Struct]
    run: Callable[[Backend, Any], Awaitable[ToolAnswer]]

    def parse(self, arguments: JsonObj | None) -> msgspec.Struct:
        """The arguments as the tool's Struct; InvalidRequest saying what to fix.

        The SDK's JSON parser reads NaN, Infinity and 1e400 as floats and nests up to its own
        limit, far past what the HTTP routes take: the same bounds apply here before anything
        is converted, re-encoded (where a NaN would turn into null) or stored.
        """
        problem = value_problem(arguments or {})
        if problem is not None:
            raise InvalidRequest(f"invalid arguments for {self.tool.name}: {problem}")
        try:
            return msgspec.convert(arguments or {}, self.args)
        except msgspec.ValidationError as exc:
            exact = integers.INT_WORDS.search(str(exc)) is not None
            lax = integers.convert(arguments or {}, self.args) if exact else None
            if lax is not None:
                return lax  # k=2.0: an integer to JSON Schema
            where = str(exc).replace("`$.", "`").replace("`$`", "the arguments")
            raise InvalidRequest(f"invalid arguments for {self.tool.name}: {where}") from None


def _tool(
    name: str, title: str, description: str, properties: JsonObj, required: list[str], **hints: bool
) -> Tool:
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    annotations = ToolAnnotations(title=title, open_world_hint=False, **hints)
    return Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        annotations=annotations,
    )


READ = {"read_only_hint": True}
WRITE_ONCE = {"read_only_hint": False, "destructive_hint": False, "idempotent_hint": False}
DESTRUCTIVE = {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": True}

APPEND = _tool(
    "memory_append",
    "Store a memory",
    "Store one new event in long-term memory: a fact learned, a decision made, a preference, "
    "a task, or a summary of a conversation. Write one self-contained statement per event, "
    "with the names and numbers a later search would use.\n"
    "- Events are immutable. To correct or update an earlier event, append the new version with "
    "supersedes=[old event_id]; recall then returns the new one in its place. Do not delete to correct.\n"
    "- Link a conclusion to the events it was drawn from with source_event_ids, so it can be traced "
    "(memory_cypher, memory_recall hops) and erased along with its sources.\n"
    "- Before storing, memory_recall the key words to avoid storing the same thing twice.\n"
    "Returns the new event_id; the event is durable and recallable by its words as soon as this "
    "returns, and by meaning a moment later, once the server has embedded it (where it does). "
    "Ids in source_event_ids or supersedes that name no event are reported back, not linked.",
    {
        "kind": {
            "type": "string",
            "description": f"What sort of event this is: {KIND_HINT}. 1-64 bytes.",
        },
        "text": {
            "type": "string",
            "description": "The memory itself, in plain words (at most 100 000 characters).",
        },
        "properties": {
            "type": "object",
            "description": "Optional JSON object of extra fields, stored as given. Top-level booleans, "
            'numbers and short strings with simple names (e.g. {"topic": "billing", "priority": 2}) '
            "can later be used as memory_recall filters and in memory_cypher.",
        },
        "source_event_ids": {
            "type": "array",
            "items": {"type": "string"},
            "description": "event_ids this event was derived from (at most 1000).",
        },
        "supersedes": {
            "type": "array",
            "items": {"type": "string"},
            "description": "event_ids of earlier events this one corrects or replaces.",
        },
        "subjects": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Ids of the people this event is about (at most 16, e.g. a customer "
            "number), so that everything about a person can be found and erased together.",
        },
        "idempotency_key": {
            "type": "string",
            "description": "Optional key (1-255 printable ASCII characters) that makes a retry safe: "
            "the same key with the same arguments stores nothing new and returns the first event_id.",
        },
    },
    ["kind", "text"],
    **WRITE_ONCE,
)

RECALL = _tool(
    "memory_recall",
    "Search memory",
    "Find stored events relevant to a topic. Use it before answering anything that may depend on "
    "what was said, decided or learned before, and before storing something that may already be stored.\n"
    "Ranking is hybrid when the server embeds (its default): by the words (BM25) and by meaning "
    "(the server's embedding of text, compared with those it made of each memory), fused, so a "
    "question finds a memory that shares none of its words. Where the server makes no vectors "
    "it is by the words alone: then pass the distinctive words the memory would contain (names, "
    "numbers, terms), not a long question. Returns up to k hits, best first, one line each: "
    "event_id · kind · time (UTC) · text. Superseded and deleted events never appear; a hit that "
    "replaced older events says 'replaces'. With hops 1-3 it also follows provenance links "
    "(what a hit was derived from, and what was derived from it) and marks those lines 'via <event_id>'. "
    "Texts over 1000 characters are cut; memory_get returns an event in full.",
    {
        "text": {
            "type": "string",
            "description": f"Words to search for (at most {MAX_RECALL_TEXT_CHARS:,} characters).",
        },
        "kind": {
            "type": "string",
            "description": "Only events of this kind (e.g. fact, decision).",
        },
        "k": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_K,
            "default": 10,
            "description": f"How many ranked hits at most (1-{MAX_K}, default 10).",
        },
        "hops": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_HOPS,
            "default": 0,
            "description": f"How far to follow SOURCE_FROM links from the hits (0-{MAX_HOPS}, "
            "default 0); linked events are added within the same allowance of k.",
        },
        "filter": {
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean"]},
            "description": 'Only events whose properties have these exact values, e.g. {"topic": "billing"}.',
        },
        "wait_for_vectors": {
            "type": "boolean",
            "default": False,
            "description": "Wait (up to 10 s) until events stored just before are findable by "
            "meaning too (the server embeds them in the background); rarely needed.",
        },
    },
    ["text"],
    **READ,
)

GET = _tool(
    "memory_get",
    "Read one memory",
    "Read one event in full by its event_id: kind, time, the whole text, its properties, and "
    "whether it is still current (superseded_by lists the newer events that replace it). Use it when "
    "a memory_recall or memory_list line was cut, or to check an event before building on it.",
    {"id": ID_SCHEMA},
    ["id"],
    **READ,
)

LIST = _tool(
    "memory_list",
    "List recent memories",
    "List events newest first, optionally only one kind and only within a time range. Use it to "
    "review what happened recently or in a period ('what did we decide last week'); to find a topic "
    "use memory_recall instead. Superseded events are left out. Returns one line per event "
    "(event_id · kind · time · text) and, when there are more, a cursor for the next page.",
    {
        "kind": {"type": "string", "description": "Only events of this kind."},
        "since": {
            "type": "string",
            "description": "Earliest time, inclusive: ISO 8601 such as "
            "2026-05-01T09:00:00Z (UTC unless an offset is given), or microseconds since the epoch.",
        },
        "until": {
            "type": "string",
            "description": "Latest time, exclusive, in the same form as since.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "default": 20,
            "description": "How many events at most (1-1000, default 20).",
        },
        "cursor": {
            "type": "string",
            "description": "The cursor a previous memory_list returned, "
            "to get the next page (keep the other arguments the same).",
        },
    },
    [],
    **READ,
)

CYPHER = _tool(
    "memory_cypher",
    "Query memory with Cypher",
    "Ask an exact question of the memory as a graph, in read-only openCypher. Use it for audits "
    "and questions recall cannot answer: which events were derived from X, counts per kind, "
    "everything with a given property.\n"
    "- Nodes are (:Event) with properties event_id, kind, ts (microseconds since the epoch), text, "
    "and the event's simple top-level properties.\n"
    "- Relationships: (a)-[:SOURCE_FROM]->(b) when a was derived from b; (a)-[:SUPERSEDES]->(b) "
    "when a replaces b.\n"
    "- MATCH, OPTIONAL MATCH, WHERE, WITH, UNWIND, RETURN [DISTINCT], ORDER BY, SKIP, LIMIT, "
    "paths *1..N (N at most 5), $params, count, collect, min, max, sum, avg, size, coalesce, "
    "toLower, toUpper. Returning a node gives the whole event. Write clauses are refused.\n"
    "Example: MATCH (d:Event)-[:SOURCE_FROM]->(s:Event {event_id: $id}) RETURN d.event_id, d.text "
    "ORDER BY d.ts DESC LIMIT 20. Always add LIMIT: the server bounds rows and time. Returns the "
    "column names and one JSON array per row.",
    {
        "query": {"type": "string", "description": "One read-only Cypher query."},
        "params": {
            "type": "object",
            "description": 'Values for the $names the query uses, e.g. {"id": "…"}.',
        },
    },
    ["query"],
    **READ,
)

DELETE = _tool(
    "memory_delete",
    "Delete a memory",
    "Permanently delete one event, and with cascade=true every event derived from it "
    "(over SOURCE_FROM links, transitively). Deleted events are unreadable at once and their bytes "
    "leave the disk at the next purge; this cannot be undone.\n"
    "Always dry-run first: with dry_run=true (the default) nothing is deleted and the answer lists "
    "every event_id that would be. Show that list to the user and call again with dry_run=false "
    "only after they confirm. To correct a memory, do not delete it: memory_append the correction "
    "with supersedes=[its event_id].",
    {
        "id": ID_SCHEMA,
        "cascade": {
            "type": "boolean",
            "default": False,
            "description": "Also delete every event derived from this one (default false).",
        },
        "dry_run": {
            "type": "boolean",
            "default": True,
            "description": "Only report what would be deleted (default true). "
            "Pass false to delete.",
        },
        "purge": {
            "type": "boolean",
            "default": False,
            "description": "Also erase the deleted events' bytes from disk before answering "
            "(default false: the background purge does it within minutes).",
        },
    },
    ["id"],
    **DESTRUCTIVE,
)

# Each tool needs the scope of the HTTP operation it stands for (memspine/routes/).
TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(RECALL, ops.RECALL.scope, RecallArgs, recall),
    ToolSpec(APPEND, ops.APPEND.scope, AppendArgs, append),
    ToolSpec(GET, ops.GET.scope, GetArgs, get),
    ToolSpec(LIST, ops.LIST.scope, ListArgs, list_),
    ToolSpec(CYPHER, CYPHER_OP.scope, CypherArgs, cypher),
    ToolSpec(DELETE, ops.DELETE.scope, DeleteArgs, delete),
)
BY_NAME = {spec.tool.name: spec for spec in TOOLS}
