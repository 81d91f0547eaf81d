"""`memspine mcp --tools automem`: AutoMem's six tools under their names and argument shapes
(mcp-automem's src/index.ts, docs/migrate.md names the commit), each description saying what
memspine does where AutoMem's semantics cannot hold."""

from __future__ import annotations

from typing import Any

from memspine.mcp.tools import ToolSpec
from memspine.mcp.toolsets import automem_reads as r
from memspine.mcp.toolsets import automem_writes as w
from memspine.mcp.toolsets.common import JsonObj, tool
from memspine.routes import memory as ops

MEMORY_TYPES = ["Decision", "Pattern", "Preference", "Style", "Habit", "Insight", "Context"]
RELATIONS = [
    "RELATES_TO",
    "LEADS_TO",
    "OCCURRED_BEFORE",
    "PREFERS_OVER",
    "EXEMPLIFIES",
    "CONTRADICTS",
    "REINFORCES",
    "INVALIDATED_BY",
    "EVOLVED_INTO",
    "DERIVED_FROM",
    "PART_OF",
]
INSTRUCTIONS = (
    "AutoMem's tools, served by memspine: the agent's persistent long-term memory. Use "
    "recall_memory to retrieve context, store_memory to persist decisions, patterns, preferences "
    "and fixes, associate_memories to link related memories. Memories are immutable here: "
    "update_memory and supersede mode append a new version that replaces the old one in recall."
)


def _s(kind: str, description: str, **more: Any) -> JsonObj:
    return {"type": kind, "description": description, **more}


STRINGS = {"type": "array", "items": {"type": "string"}}
_TYPE = _s(
    "string", "Memory type; memspine stores it as the event's kind, lowercased.", enum=MEMORY_TYPES
)
_UNIT = {"minimum": 0, "maximum": 1}
STORE_PROPS: JsonObj = {
    "content": _s("string", "Single-memory mode (XOR with `memories`): the memory's text."),
    "memories": _s(
        "array",
        "Batch mode (XOR with `content`): up to 500 memories, each stored as its own event.",
        maxItems=500,
        items={
            "type": "object",
            "required": ["content"],
            "properties": {
                "content": {"type": "string"},
                "tags": STRINGS,
                "importance": {"type": "number", **_UNIT},
                "timestamp": {"type": "string"},
                "type": {"type": "string", "enum": MEMORY_TYPES},
                "confidence": {"type": "number", **_UNIT},
                "metadata": {"type": "object"},
            },
        },
    ),
    "tags": {**STRINGS, "description": "Tags, stored in properties.tags."},
    "importance": _s("number", "Importance 0-1, stored in properties.", **_UNIT),
    "embedding": _s(
        "array",
        "Accepted and not stored: memspine embeds the text where the server makes vectors.",
        items={"type": "number"},
    ),
    "metadata": _s("object", "Structured metadata, stored in properties.metadata."),
    "timestamp": _s("string", "ISO timestamp of the memory (default now): the event's ts."),
    "type": _TYPE,
    "confidence": _s("number", "Classification confidence 0-1, stored in properties.", **_UNIT),
    "id": _s(
        "string",
        "Your own id for the memory: the event is stored under Idempotency-Key automem:<id>, so "
        "the same call again stores nothing twice, and recall_memory finds it by this id. Other "
        "content under an id already used is refused (memspine does not overwrite: use "
        "update_memory).",
    ),
    "t_valid": _s("string", "ISO 8601 time the memory becomes valid: the event's valid_from."),
    "t_invalid": _s("string", "ISO 8601 time the memory expires: the event's valid_until."),
    "updated_at": _s("string", "Stored in properties."),
    "last_accessed": _s("string", "Stored in properties."),
    "supersedes_memory_id": _s(
        "string", "Supersede mode: the memory this one replaces (the new event supersedes it)."
    ),
    "supersede_relation": _s(
        "string",
        "INVALIDATED_BY (default) or EVOLVED_INTO, kept in properties.supersession.",
        enum=["INVALIDATED_BY", "EVOLVED_INTO"],
        default="INVALIDATED_BY",
    ),
    "supersede_reason": _s("string", "Kept in properties.supersession of the new memory."),
}
STORE = tool(
    "store_memory",
    "Store Memory",
    "Store memory in one of two modes: single (top-level `content`) or batch (`memories`, up to "
    "500).\n**Supersede/correct:** pass `content` plus `supersedes_memory_id`: the new memory "
    "supersedes the old, which recall no longer returns (memspine does not change the old memory: "
    "events are immutable; it stays readable by id with current: false).\n"
    "Content is stored whole (memspine neither summarises nor rejects long content, up to 100 000 "
    "characters). Returns memory_id, a memspine event_id.\n"
    "**Examples:**\n"
    '- store_memory({ content: "Chose PostgreSQL over MongoDB for user service. Need ACID for '
    'transactions.", tags: ["architecture", "database"], importance: 0.9 })\n'
    '- store_memory({ content: "User now prefers SQLite for small local tools.", '
    'supersedes_memory_id: "old-id", supersede_reason: "Correction from user" })',
    STORE_PROPS,
    [],
    read_only_hint=False,
    destructive_hint=False,
    idempotent_hint=False,
)

_IGNORED = "Accepted for compatibility; memspine does not use it."
RECALL_PROPS: JsonObj = {
    "memory_id": _s("string", "ID fetch: the one memory (a memspine event_id or your AutoMem id)."),
    "exhaustive": _s("boolean", "Tag enumeration: every memory with any of `tags`, newest first."),
    "exclude_tags": {**STRINGS, "description": "Leave out memories with any of these tags."},
    "query": _s(
        "string",
        "What to look for: memspine's hybrid recall (words and, where the server embeds, meaning).",
    ),
    "queries": {
        **STRINGS,
        "description": "Several queries; results merged, each memory once at its best score.",
    },
    "embedding": _s("array", _IGNORED, items={"type": "number"}),
    "limit": _s(
        "integer",
        "Max memories to return (default 5; ranked at most 100, enumeration 200).",
        minimum=1,
        maximum=200,
        default=5,
    ),
    "time_query": _s("string", _IGNORED + " Use start and end."),
    "start": _s("string", "ISO time: only memories at or after it."),
    "end": _s("string", "ISO time: only memories at or before it."),
    "tags": {**STRINGS, "description": "Only memories with these tags (properties.tags)."},
    "tag_mode": _s("string", '"any" (default) or "all".', enum=["any", "all"]),
    "tag_match": _s("string", '"exact" (default) or "prefix".', enum=["exact", "prefix"]),
    "current_only": _s(
        "boolean",
        "Current memories only (default true): superseded and expired ones are left out.",
        default=True,
    ),
    "state_mode": _s(
        "string", '"history" includes superseded memories.', enum=["current", "history"]
    ),
    "sort": _s(
        "string",
        "score (default), time_desc or time_asc; the others sort by score.",
        enum=["score", "time_desc", "time_asc", "updated_desc", "updated_asc"],
    ),
    "offset": _s("integer", "Enumeration: how many matches to skip."),
}
for _name, _kind in (
    ("expand_entities", "boolean"),
    ("expand_relations", "boolean"),
    ("expand_respect_tags", "boolean"),
    ("auto_decompose", "boolean"),
    ("expansion_limit", "integer"),
    ("relation_limit", "integer"),
    ("expand_min_importance", "number"),
    ("expand_min_strength", "number"),
    ("state_debug", "boolean"),
    ("recency_bias", "string"),
    ("scope_fallback", "boolean"),
    ("min_score", "number"),
    ("adaptive_floor", "boolean"),
    ("context", "string"),
    ("language", "string"),
    ("active_path", "string"),
    ("per_query_limit", "integer"),
    ("format", "string"),
):
    RECALL_PROPS[_name] = _s(_kind, _IGNORED)
for _name in ("context_tags", "context_types", "priority_ids"):
    RECALL_PROPS[_name] = {**STRINGS, "description": _IGNORED}
RECALL = tool(
    "recall_memory",
    "Recall Memory",
    "Recall memories in one of three modes, picked by the arguments.\n"
    "**ID fetch:** `memory_id` returns that memory (a memspine event_id, or the id AutoMem gave).\n"
    "**Tag enumeration:** `tags` + `exhaustive: true` lists every memory with any of the tags, "
    "newest first, `limit` (at most 200) from `offset`.\n"
    "**Ranked (default):** memspine's hybrid recall of `query` (BM25 over the words, and by "
    "meaning where the server embeds), current memories only unless `current_only: false`; "
    "`tags`, `exclude_tags`, `start` and `end` filter the ranked hits. Graph and entity expansion, "
    "time_query and the other tuning arguments are accepted and not used.\n"
    "**Examples:**\n"
    '- recall_memory({ query: "database architecture decisions", tags: ["my-project"], limit: 5 })\n'
    '- recall_memory({ memory_id: "abc123" })\n'
    '- recall_memory({ tags: ["benchmark-test"], exhaustive: true, limit: 50 })',
    RECALL_PROPS,
    [],
    read_only_hint=True,
)

_ASSOC_EXTRA: JsonObj = {
    "context": _s("string", "Kept on the association."),
    "reason": _s("string", "Kept on the association."),
    "pattern_type": _s("string", "Kept on the association."),
    "confidence": _s("number", "Kept on the association.", **_UNIT),
    "resolution": _s("string", "Kept on the association."),
    "observations": {**STRINGS, "description": "Kept on the association."},
    "timestamp": _s("string", "Kept on the association."),
    "transformation": _s("string", "Kept on the association."),
    "role": _s("string", "Kept on the association."),
}
_PAIR: JsonObj = {
    "memory1_id": _s("string", "ID of the source memory."),
    "memory2_id": _s("string", "ID of the target memory."),
    "type": _s("string", "Relationship type.", enum=RELATIONS),
    "strength": _s("number", "Relationship strength 0-1.", **_UNIT),
}
ASSOCIATE = tool(
    "associate_memories",
    "Associate Memories",
    "Create typed relationships between memories: one pair, or `associations` (up to 500).\n"
    "In memspine a relationship is an event of kind relation drawn from both memories "
    "(source_event_ids), so recall's walk reaches one from the other. INVALIDATED_BY and "
    "EVOLVED_INTO (memory1 replaced by memory2) append a new version of memory2 that supersedes "
    "both: memory1 leaves current recall, and memory2's id then leads to the new version.\n"
    "**Examples:**\n"
    '- associate_memories({ memory1_id: "bug-fix-123", memory2_id: "feature-456", type: '
    '"RELATES_TO", strength: 0.9 })\n'
    '- associate_memories({ associations: [{ memory1_id: "a", memory2_id: "b", type: '
    '"RELATES_TO", strength: 0.8 }] })',
    {
        **_PAIR,
        **_ASSOC_EXTRA,
        "associations": _s(
            "array",
            "Batch mode: up to 500 associations.",
            minItems=1,
            maxItems=500,
            items={
                "type": "object",
                "properties": {**_PAIR, **_ASSOC_EXTRA},
                "required": ["memory1_id", "memory2_id", "type", "strength"],
            },
        ),
    },
    [],
    read_only_hint=False,
    destructive_hint=False,
    idempotent_hint=True,
)

UPDATE = tool(
    "update_memory",
    "Update Memory",
    "Update a memory's content, tags, importance or metadata. memspine does not change a stored "
    "memory: it appends a new version holding the changes (metadata merged, the rest replaced) "
    "that supersedes the old one, and returns the new memory_id; the old id keeps leading to the "
    "newest version.\n**Examples:**\n"
    '- update_memory({ memory_id: "abc123", importance: 0.95 })\n'
    '- update_memory({ memory_id: "abc123", content: "Updated: PostgreSQL chosen for ACID + team '
    'expertise" })',
    {
        "memory_id": _s("string", "ID of the memory to update."),
        "content": _s("string", "New content (replaces the text)."),
        "tags": {**STRINGS, "description": "New tags (replace the old)."},
        "importance": _s("number", "New importance.", **_UNIT),
        "metadata": _s("object", "New metadata (merged with the old)."),
        "timestamp": _s("string", "The new version's time (default: the old one's)."),
        "t_valid": _s("string", "ISO 8601 time the memory becomes valid (valid_from)."),
        "t_invalid": _s("string", "ISO 8601 time the memory expires (valid_until)."),
        "updated_at": _s("string", "Stored in properties."),
        "last_accessed": _s("string", "Stored in properties."),
        "type": _TYPE,
        "confidence": _s("number", "Confidence 0-1.", **_UNIT),
    },
    ["memory_id"],
    read_only_hint=False,
    destructive_hint=False,
    idempotent_hint=False,
)

DELETE = tool(
    "delete_memory",
    "Delete Memory",
    "Delete a memory by ID (`memory_id`), or every memory with any of `tags`. memspine deletes "
    "the memory and the earlier versions it replaced (else the version before would be current "
    "again); their bytes leave the disk at the next purge. There is no dry run here.\n"
    '**Examples:**\n- delete_memory({ memory_id: "abc123" })\n'
    '- delete_memory({ tags: ["benchmark-test"] })',
    {
        "memory_id": _s("string", "ID of the memory to delete (XOR with tags)."),
        "tags": {
            **STRINGS,
            "description": "Delete every memory with any of these tags (exact, case-insensitive).",
        },
    },
    [],
    read_only_hint=False,
    destructive_hint=True,
    idempotent_hint=False,
)

HEALTH = tool(
    "check_database_health",
    "Check Database Health",
    "Check that the memory service answers: memspine answers for this key's tenant (there is no "
    "FalkorDB or Qdrant behind it).\n**Example:**\n- check_database_health({})",
    {},
    [],
    read_only_hint=True,
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(STORE, ops.APPEND.scope, w.StoreArgs, w.store),
    ToolSpec(RECALL, ops.RECALL.scope, r.RecallArgs, r.recall),
    ToolSpec(ASSOCIATE, ops.APPEND.scope, w.AssociateArgs, w.associate),
    ToolSpec(UPDATE, ops.APPEND.scope, w.UpdateArgs, w.update),
    ToolSpec(DELETE, ops.DELETE.scope, w.DeleteArgs, w.delete),
    ToolSpec(HEALTH, ops.GET.scope, r.HealthArgs, r.health),
)
