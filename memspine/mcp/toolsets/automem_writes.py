"""AutoMem's write tools (mcp-automem's src/index.ts) over memspine: what each does here.

A memory is an event whose kind is AutoMem's `type` (lowercased); tags, importance, confidence
and metadata are its properties; `t_valid`/`t_invalid` its validity. Ids are memspine's
event_ids, and the ids AutoMem gave are found too (an import or a store with `id` keys the event
`automem:<id>`). Events are immutable: an update appends a version that supersedes the old one.
"""

from __future__ import annotations

import msgspec

from memspine.mcp.backend import Backend
from memspine.mcp.render import parse_time
from memspine.mcp.toolsets.common import (
    JsonObj,
    answer,
    delete_chain,
    events,
    find,
    refused,
    tags_of,
)
from storage.errors import InvalidRequest, MemspineError

PREFIX = "automem"
SUPERSEDING = ("INVALIDATED_BY", "EVOLVED_INTO")
MEMORY_PROPS = (
    "tags",
    "importance",
    "type",
    "confidence",
    "metadata",
    "updated_at",
    "last_accessed",
)
ToolAnswer = tuple[JsonObj, str]


class Item(msgspec.Struct):
    """One memory of store_memory's batch mode."""

    content: str
    tags: list[str] | None = None
    importance: float | None = None
    timestamp: str | None = None
    type: str | None = None
    confidence: float | None = None
    metadata: JsonObj | None = None


class StoreArgs(msgspec.Struct):
    """store_memory."""

    content: str | None = None
    memories: list[Item] | None = None
    tags: list[str] | None = None
    importance: float | None = None
    embedding: list[float] | None = None
    metadata: JsonObj | None = None
    timestamp: str | None = None
    type: str | None = None
    confidence: float | None = None
    id: str | None = None
    t_valid: str | None = None
    t_invalid: str | None = None
    updated_at: str | None = None
    last_accessed: str | None = None
    supersedes_memory_id: str | None = None
    supersede_relation: str = "INVALIDATED_BY"
    supersede_reason: str | None = None


def body_of(a: StoreArgs | Item, content: str) -> JsonObj:
    """An append body for one memory."""
    props = {f: getattr(a, f, None) for f in MEMORY_PROPS}
    properties = {k: v for k, v in props.items() if v is not None}
    body: JsonObj = {"kind": (a.type or "memory").lower(), "text": content}
    if a.timestamp:
        body["ts"] = parse_time(a.timestamp, "timestamp")
    if isinstance(a, StoreArgs):
        if a.id:
            properties["automem_id"] = a.id
        if a.t_valid:
            body["valid_from"] = parse_time(a.t_valid, "t_valid")
        if a.t_invalid:
            body["valid_until"] = parse_time(a.t_invalid, "t_invalid")
    if properties:
        body["properties"] = properties
    return body


async def store(b: Backend, a: StoreArgs) -> ToolAnswer:
    """Single, supersede or batch mode."""
    if (a.content is None) == (a.memories is None):
        raise InvalidRequest("give either content (one memory) or memories (a batch), not both")
    if a.memories is not None:
        ids = [(await b.append(body_of(m, m.content), None))["event_id"] for m in a.memories]
        return answer(
            {"memory_ids": ids, "stored": len(ids), "message": f"Stored {len(ids)} memories"}
        )
    assert a.content is not None
    body = body_of(a, a.content)
    out: JsonObj = {}
    if a.supersedes_memory_id:
        if a.supersede_relation not in SUPERSEDING:
            raise InvalidRequest("supersede_relation must be INVALIDATED_BY or EVOLVED_INTO")
        old = await find(b, PREFIX, a.supersedes_memory_id, head=True)
        body["supersedes"] = [old["event_id"]]
        entry = {"of": old["event_id"], "relation": a.supersede_relation}
        if a.supersede_reason:
            entry["reason"] = a.supersede_reason
        body.setdefault("properties", {})["supersession"] = [entry]
        out = {"superseded_memory_id": old["event_id"], "association_created": True}
    key = f"{PREFIX}:{a.id}" if a.id else None
    stored = await b.append(body, key)
    out = {"memory_id": stored["event_id"], **out}
    out["message"] = f"Memory stored successfully (ID: {stored['event_id']})"
    return answer(out)


class Extras(msgspec.Struct, kw_only=True):
    """The relation-specific properties an association may carry (AutoMem's
    ASSOCIATION_PROPERTY_SCHEMAS), kept on it."""

    context: str | None = None
    reason: str | None = None
    pattern_type: str | None = None
    confidence: float | None = None
    resolution: str | None = None
    observations: list[str] | None = None
    timestamp: str | None = None
    transformation: str | None = None
    role: str | None = None


class Association(Extras, kw_only=True):
    """One association."""

    memory1_id: str
    memory2_id: str
    type: str
    strength: float


class AssociateArgs(Extras, kw_only=True):
    """associate_memories: one pair, or associations."""

    memory1_id: str | None = None
    memory2_id: str | None = None
    type: str | None = None
    strength: float | None = None
    associations: list[Association] | None = None


async def associate(b: Backend, a: AssociateArgs) -> ToolAnswer:
    """Each association as a relation event, or for the supersession types a new version."""
    if a.associations is None:
        fields = {f: getattr(a, f) for f in Association.__struct_fields__}
        try:
            one = msgspec.convert(fields, Association)
        except msgspec.ValidationError:
            raise InvalidRequest(
                "give memory1_id, memory2_id, type and strength, or associations"
            ) from None
        out = await _associate(b, one)
        return answer({"success": True, "message": out["message"], **out})
    done: list[JsonObj] = []
    failed: list[JsonObj] = []
    for item in a.associations:
        try:
            done.append(await _associate(b, item))
        except MemspineError as exc:
            failed.append(
                {"memory1_id": item.memory1_id, "memory2_id": item.memory2_id, **refused(exc)}
            )
    return answer(
        {
            "success": not failed,
            "message": f"Created {len(done)} associations, {len(failed)} failed",
            "created_count": len(done),
            "failed_count": len(failed),
            "succeeded": done,
            "failed": failed,
        }
    )


async def _associate(b: Backend, a: Association) -> JsonObj:
    """One association: (memory1)-[type]->(memory2)."""
    one = await find(b, PREFIX, a.memory1_id, head=True)
    two = await find(b, PREFIX, a.memory2_id, head=True)
    extra = {f: getattr(a, f) for f in Extras.__struct_fields__ if getattr(a, f) is not None}
    if a.type in SUPERSEDING:  # memory1 is replaced by memory2: a version of memory2 says so
        props = dict(two.get("properties") or {})
        props["supersession"] = [{"of": one["event_id"], "relation": a.type, **extra}]
        body = {"kind": two["kind"], "text": two.get("text"), "properties": props}
        body["supersedes"] = [one["event_id"], two["event_id"]]
        new = await b.append(body, None)
        return {
            "memory1_id": one["event_id"],
            "memory2_id": new["event_id"],
            "type": a.type,
            "message": f"{a.memory1_id} is superseded by {new['event_id']}, a new version of {a.memory2_id}",
        }
    props = {
        "relation": a.type,
        "from": one["event_id"],
        "to": two["event_id"],
        "strength": a.strength,
    }
    props |= extra | {"source_event_ids": [one["event_id"], two["event_id"]]}
    key = f"{PREFIX}:{one['event_id']}-{a.type}-{two['event_id']}"
    await b.append({"kind": "relation", "text": None, "properties": props}, key)
    message = f"Associated {a.memory1_id} -[{a.type}]-> {a.memory2_id}"
    return {
        "memory1_id": one["event_id"],
        "memory2_id": two["event_id"],
        "type": a.type,
        "message": message,
    }


class UpdateArgs(msgspec.Struct):
    """update_memory."""

    memory_id: str
    content: str | None = None
    tags: list[str] | None = None
    importance: float | None = None
    metadata: JsonObj | None = None
    timestamp: str | None = None
    t_valid: str | None = None
    t_invalid: str | None = None
    updated_at: str | None = None
    last_accessed: str | None = None
    type: str | None = None
    confidence: float | None = None


async def update(b: Backend, a: UpdateArgs) -> ToolAnswer:
    """A new version with the changes, superseding the current one."""
    old = await find(b, PREFIX, a.memory_id, head=True)
    props: JsonObj = dict(old.get("properties") or {})
    props.pop("supersession", None)  # what this version replaced is the update itself
    for f in ("tags", "importance", "type", "confidence", "updated_at", "last_accessed"):
        if getattr(a, f) is not None:
            props[f] = getattr(a, f)
    if a.metadata is not None:
        props["metadata"] = {**(props.get("metadata") or {}), **a.metadata}
    body: JsonObj = {
        "kind": (a.type or "").lower() or old["kind"],
        "text": a.content if a.content is not None else old.get("text"),
        "properties": props,
        "supersedes": [old["event_id"]],
        "ts": parse_time(a.timestamp, "timestamp") if a.timestamp else old["ts"],
    }
    for arg, field in (("t_valid", "valid_from"), ("t_invalid", "valid_until")):
        value = getattr(a, arg)
        if value is not None:
            body[field] = parse_time(value, arg)
        elif old.get(field) is not None:
            body[field] = old[field]
    new = await b.append(body, None)
    return answer(
        {
            "memory_id": new["event_id"],
            "message": f"Memory updated: {new['event_id']} supersedes {old['event_id']}",
        }
    )


class DeleteArgs(msgspec.Struct):
    """delete_memory."""

    memory_id: str | None = None
    tags: list[str] | None = None


async def delete(b: Backend, a: DeleteArgs) -> ToolAnswer:
    """One memory with its earlier versions, or every memory with any of the tags."""
    if (a.memory_id is None) == (a.tags is None):
        raise InvalidRequest("give either memory_id or tags")
    if a.memory_id is not None:
        ev = await find(b, PREFIX, a.memory_id, head=True)
        gone = await delete_chain(b, ev)
        return answer({"memory_id": ev["event_id"], "deleted": gone, "message": "Memory deleted"})
    want = {t.lower() for t in a.tags or []}
    tagged = [ev async for ev in events(b) if want & set(tags_of(ev))]
    count = 0
    for ev in tagged:
        count += bool(await delete_chain(b, ev))
    return answer({"deleted_count": count, "tags": a.tags, "message": f"Deleted {count} memories"})
