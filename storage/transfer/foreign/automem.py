"""AutoMem's files as records: its backup (the gzipped FalkorDB JSON of automem/backup.py, alone
or in the tar.gz of GET /backup with the Qdrant points beside it) and its GET /graph/snapshot.

A `Memory` node becomes an event whose kind is its `type`; `INVALIDATED_BY` and `EVOLVED_INTO`
(old -> new) make the new memory supersede the old; every other relationship becomes a
`relation` event drawn from both memories, so a walk from either reaches the other.
"""

from __future__ import annotations

from typing import Any

import msgspec

from storage.errors import InvalidRequest
from storage.transfer.foreign import source as src
from storage.transfer.foreign.records import (
    Conversion,
    Record,
    Report,
    key_of,
    kind_of,
    micros,
    ordered,
    window,
)

PREFIX = "automem"
SUPERSEDING = ("INVALIDATED_BY", "EVOLVED_INTO")  # AutoMem's STATE_SUPPRESSING_RELATIONS
# Node properties with a place of their own, and those AutoMem derives or keeps for its own work.
_PLACED = ("id", "content", "timestamp", "type", "t_valid", "t_invalid", "metadata")
_DERIVED = {
    "tag_prefixes": "derived from tags",
    "processed": "AutoMem's enrichment queue state",
    "relevance_score": "AutoMem's decay score, recomputed by its consolidation",
    "embedding": "vectors live in Qdrant; kept from there when their model is named",
    "color": "a graph snapshot's drawing hint",
    "radius": "a graph snapshot's drawing hint",
    "opacity": "a graph snapshot's drawing hint",
}
MAPPING = [
    "Memory node id -> Idempotency-Key automem:<id> (event_id derived) and properties.automem_id",
    "content -> text",
    "timestamp -> ts",
    "type -> kind (lowercased; memory when absent)",
    "t_valid -> valid_from, t_invalid -> valid_until",
    "tags, importance, confidence, metadata and any other node property -> properties",
    "(old)-[INVALIDATED_BY|EVOLVED_INTO]->(new) -> new supersedes old; the edge's properties -> "
    "properties.supersession of the new memory",
    "any other relationship -> a `relation` event with source_event_ids [from, to] and "
    "properties {relation, from, to, ...the edge's properties}",
    "Qdrant point vector -> embedding, with --embedding-model naming its model",
]


class Backup(msgspec.Struct):
    """automem/backup.py's export_falkordb_artifact, and GET /graph/snapshot (nodes and edges)."""

    nodes: list[dict[str, Any]]
    relationships: list[dict[str, Any]] | None = None
    edges: list[dict[str, Any]] | None = None
    timestamp: str | None = None
    graph_name: str | None = None
    stats: dict[str, Any] | None = None


class Points(msgspec.Struct):
    """automem/backup.py's export_qdrant_artifact."""

    points: list[dict[str, Any]]


def convert(raw: bytes, *, embedding_model: str | None = None, name: str = "file") -> Conversion:
    """Records of an AutoMem backup or graph snapshot."""
    data = src.gunzip(raw, name)
    members = src.tar_members(data, name)
    vectors: dict[str, list[float]] = {}
    if members is not None:
        graph = _member(members, "falkordb/", name)
        if graph is None:
            raise InvalidRequest(f"{name}: the archive holds no falkordb/*.json.gz")
        points = _member(members, "qdrant/", name)
        data = graph[1]
        if points is not None:
            vectors = _vectors(src.decode(points[1], Points, points[0]), points[0])
        name = graph[0]
    backup = src.decode(data, Backup, name)
    report = Report(source="automem", mapping=list(MAPPING))
    fallback = _backup_time(backup.timestamp)
    memories, internal = _memories(backup, name, report, fallback)
    if vectors:
        _attach(memories, vectors, embedding_model, report)
    relations = _relationships(backup, name, memories, internal, report)
    if backup.edges is not None and backup.relationships is None:
        report.notes.append(
            "a graph snapshot carries no t_valid or t_invalid: import a backup to keep validity"
        )
    records = ordered([*memories.values(), *relations], report)
    for rec in records:
        report.created[rec.kind] = report.created.get(rec.kind, 0) + 1
    return Conversion(records=records, report=report)


def _member(members: dict[str, bytes], folder: str, name: str) -> tuple[str, bytes] | None:
    """The first member under folder, unzipped."""
    for member, data in sorted(members.items()):
        if member.startswith(folder) and member.endswith((".json", ".json.gz")):
            where = f"{name}:{member}"
            return where, src.gunzip(data, where)
    return None


def _backup_time(stamp: str | None) -> int | None:
    """The backup's own time (automem/backup.py writes %Y%m%d_%H%M%S, UTC)."""
    if not stamp:
        return None
    digits = stamp.replace("_", "")
    if len(digits) != 14 or not digits.isdigit():
        return None
    iso = f"{digits[:4]}-{digits[4:6]}-{digits[6:8]}T{digits[8:10]}:{digits[10:12]}:{digits[12:]}"
    return micros(iso, "timestamp")


def _memories(
    backup: Backup, name: str, report: Report, fallback: int | None
) -> tuple[dict[str, Record], dict[Any, str]]:
    """The Memory nodes as records by key, and each node's internal id -> its key."""
    memories: dict[str, Record] = {}
    internal: dict[Any, str] = {}
    for i, node in enumerate(backup.nodes):
        where = f"{name}: nodes[{i}]"
        wrapped = "properties" in node and "labels" in node  # the backup's shape
        props = node["properties"] if wrapped else node
        if not isinstance(props, dict):
            raise InvalidRequest(f"{where}.properties: expected an object")
        labels = (node.get("labels") or ["Memory"]) if wrapped else ["Memory"]
        if "Memory" not in labels:
            report.count("other nodes")
            report.drop(f"{'/'.join(map(str, labels)) or 'unlabelled'} node (not a memory)")
            continue
        report.count("memories")
        rec = _memory(props, where, report, fallback)
        memories[rec.key] = rec
        internal[node.get("id") if wrapped else props.get("id")] = rec.key
    return memories, internal


def _memory(props: dict[str, Any], where: str, report: Report, fallback: int | None) -> Record:
    """One Memory node's properties as a record."""
    source_id = props.get("id")
    if not isinstance(source_id, str | int) or source_id == "":
        raise InvalidRequest(f"{where}: a Memory node without an id")
    ts = micros(props.get("timestamp"), f"{where}.timestamp")
    if ts is None:
        ts = fallback if fallback is not None else 0
        report.drop("timestamp (absent: the backup's time, else 1970, is the event's ts)")
    properties: dict[str, Any] = {"automem_id": source_id}
    for field, value in props.items():
        if field in _DERIVED:
            report.drop(f"{field} ({_DERIVED[field]})")
        elif field not in _PLACED and value is not None:
            properties[field] = value
    metadata = props.get("metadata")
    if isinstance(metadata, str):  # FalkorDB holds it as JSON text
        try:
            metadata = msgspec.json.decode(metadata)
        except msgspec.DecodeError:
            report.drop("metadata that is not JSON (kept as a string)")
    if metadata not in (None, {}):
        properties["metadata"] = metadata
    rec = Record(
        key=key_of(PREFIX, source_id),
        kind=kind_of(props.get("type"), "memory"),
        ts=ts,
        text=src.text(props.get("content"), f"{where}.content"),
        properties=properties,
        valid_from=micros(props.get("t_valid"), f"{where}.t_valid"),
        valid_until=micros(props.get("t_invalid"), f"{where}.t_invalid"),
        where=where,
    )
    return window(rec, report)


def _vectors(points: Points, name: str) -> dict[str, list[float]]:
    """Each Qdrant point's vector by its id (the memory's)."""
    out: dict[str, list[float]] = {}
    for i, point in enumerate(points.points):
        vec = point.get("vector")
        if isinstance(vec, dict):  # named vectors: the first
            vec = next(iter(vec.values()), None)
        value = src.vector(vec, f"{name}: points[{i}].vector")
        if value is not None:
            out[key_of(PREFIX, point.get("id"))] = value
    return out


def _attach(
    memories: dict[str, Record],
    vectors: dict[str, list[float]],
    model: str | None,
    report: Report,
) -> None:
    """The Qdrant vectors on their memories, when the operator named their model."""
    matched = [k for k in vectors if k in memories]
    report.count("qdrant points", len(vectors))
    if len(matched) != len(vectors):
        report.drop("qdrant point of no memory in the graph", len(vectors) - len(matched))
    if model is None:
        report.drop(
            "embedding (the backup does not name its model: give --embedding-model)", len(matched)
        )
        return
    dims = {len(vectors[k]) for k in matched}
    if len(dims) > 1:
        raise InvalidRequest(f"the Qdrant points hold vectors of {len(dims)} different lengths")
    report.embedding_model = model
    for key in matched:
        memories[key].embedding = vectors[key]


def _relationships(
    backup: Backup,
    name: str,
    memories: dict[str, Record],
    internal: dict[Any, str],
    report: Report,
) -> list[Record]:
    """Supersession edges onto their new memory; every other relationship as a relation event."""
    rels = backup.relationships if backup.relationships is not None else backup.edges or []
    field = "relationships" if backup.relationships is not None else "edges"
    out: list[Record] = []
    for i, rel in enumerate(rels):
        where = f"{name}: {field}[{i}]"
        report.count("relationships")
        kind = rel.get("type")
        if not isinstance(kind, str) or not kind:
            raise InvalidRequest(f"{where}.type: expected the relationship's type")
        a = internal.get(rel.get("source_id", rel.get("source")))
        b = internal.get(rel.get("target_id", rel.get("target")))
        props = rel.get("properties") or {}
        if not isinstance(props, dict):
            raise InvalidRequest(f"{where}.properties: expected an object")
        if a is None or b is None:
            report.drop(f"{kind} relationship with an end that is not a memory")
            continue
        old, new = memories[a], memories[b]
        if kind in SUPERSEDING:
            new.supersedes.append(old.key)
            entry = {"of": old.properties["automem_id"], "relation": kind, **props}
            new.properties.setdefault("supersession", []).append(entry)
            continue
        out.append(_relation(kind, old, new, props, where))
    return out


def _relation(kind: str, a: Record, b: Record, props: dict[str, Any], where: str) -> Record:
    """A relationship as an event drawn from both memories."""
    ids = (a.properties["automem_id"], b.properties["automem_id"])
    return Record(
        key=key_of(PREFIX, f"{ids[0]}-{kind}-{ids[1]}"),
        kind="relation",
        ts=max(a.ts, b.ts),
        properties={"relation": kind, "from": ids[0], "to": ids[1], **props},
        sources=[a.key, b.key],
        where=where,
    )
