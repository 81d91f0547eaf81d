"""Zep's and Graphiti's graph as records: `episodes` (graphiti_core/nodes.py's EpisodicNode),
`edges` (graphiti_core/edges.py's EntityEdge) and optionally `nodes` (EntityNode), each as its
model_dump(mode="json") writes it (docs/migrate.md has the few lines that write the file).

Episodes become turns; each entity edge becomes a fact drawn from its episodes, valid from
`valid_at` until `invalid_at` (or, without one, until `expired_at`). Graphiti does not record
which edge invalidated which: an expired edge is superseded by the newest edge of the same
source node and name created between its own creation and its expiry, where there is one.
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
    micros,
    ordered,
    window,
)

PREFIX = "zep"
MAPPING = [
    "episode uuid -> Idempotency-Key zep:<uuid> (event_id derived) and properties.zep_uuid",
    "episode -> kind turn: content -> text, valid_at (else created_at) -> ts; name, source, "
    "source_description, group_id, episode_metadata -> properties",
    "entity edge -> kind fact: fact -> text, created_at -> ts, valid_at -> valid_from, "
    "invalid_at (else expired_at) -> valid_until, episodes -> source_event_ids",
    "edge name -> properties.relation; its nodes -> properties.source_node / target_node "
    "({uuid, name}); attributes, expired_at, reference_time, group_id -> properties",
    "an expired edge -> superseded by the newest edge of the same source node and name "
    "created before its expiry",
    "fact_embedding -> embedding, with --embedding-model naming its model",
]
_EPISODE_PROPS = ("name", "group_id", "source", "source_description", "episode_metadata", "labels")
_EDGE_PROPS = ("group_id", "attributes", "expired_at", "reference_time", "valid_at", "invalid_at")


class Graph(msgspec.Struct):
    """Episodes, entity edges and (for their names) entity nodes."""

    episodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []


def convert(raw: bytes, *, embedding_model: str | None = None, name: str = "file") -> Conversion:
    """Records of a Graphiti/Zep graph dump."""
    data = src.gunzip(raw, name)
    graph = src.decode(data, Graph, name)
    if not graph.episodes and not graph.edges:
        raise InvalidRequest(f"{name}: neither episodes nor edges: not a Graphiti graph dump")
    report = Report(source="zep", mapping=list(MAPPING))
    names = _node_names(graph.nodes, name, report)
    episodes = {
        r.key: r
        for r in (
            _episode(e, f"{name}: episodes[{i}]", report) for i, e in enumerate(graph.episodes)
        )
    }
    edges = [
        _edge(e, f"{name}: edges[{i}]", names, embedding_model, report)
        for i, e in enumerate(graph.edges)
    ]
    _supersede(edges, graph.edges, report)
    if embedding_model is not None and any(r.embedding is not None for r in edges):
        report.embedding_model = embedding_model
        if len({len(r.embedding) for r in edges if r.embedding is not None}) > 1:
            raise InvalidRequest(f"{name}: the fact embeddings have different lengths")
    records = ordered([*episodes.values(), *edges], report)
    for rec in records:
        report.created[rec.kind] = report.created.get(rec.kind, 0) + 1
    return Conversion(records=records, report=report)


def _node_names(nodes: list[dict[str, Any]], name: str, report: Report) -> dict[str, str]:
    """Each entity node's name by uuid; the nodes themselves are not events."""
    out: dict[str, str] = {}
    for _i, node in enumerate(nodes):
        report.count("entity nodes")
        uuid, label = node.get("uuid"), node.get("name")
        if isinstance(uuid, str) and isinstance(label, str):
            out[uuid] = label
        if node.get("summary"):
            report.drop("entity node summary (Graphiti's generated digest of its edges)")
        if node.get("name_embedding") is not None:
            report.drop("entity node name_embedding")
        if node.get("attributes"):
            report.drop("entity node attributes")
    if nodes:
        report.notes.append(
            f"{len(nodes)} entity nodes are not events: their names are kept on the facts"
        )
    return out


def _uuid(item: dict[str, Any], where: str) -> str:
    """An item's uuid."""
    value = item.get("uuid")
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.uuid: expected a uuid string")
    return value


def _episode(ep: dict[str, Any], where: str, report: Report) -> Record:
    """An episode as a turn."""
    report.count("episodes")
    uuid = _uuid(ep, where)
    ts = micros(ep.get("valid_at"), f"{where}.valid_at")
    if ts is None:
        ts = micros(ep.get("created_at"), f"{where}.created_at") or 0
    properties: dict[str, Any] = {"zep_uuid": uuid}
    for field in _EPISODE_PROPS:
        if ep.get(field) not in (None, [], {}):
            properties[field] = ep[field]
    if ep.get("created_at") is not None:
        properties["created_at"] = ep["created_at"]
    if ep.get("entity_edges"):
        report.drop("episode entity_edges (the facts name their episodes instead)")
    return Record(
        key=key_of(PREFIX, uuid),
        kind="turn",
        ts=ts,
        text=src.text(ep.get("content"), f"{where}.content"),
        properties=properties,
        where=where,
    )


def _edge(
    edge: dict[str, Any],
    where: str,
    names: dict[str, str],
    model: str | None,
    report: Report,
) -> Record:
    """An entity edge as a fact drawn from its episodes."""
    report.count("edges")
    uuid = _uuid(edge, where)
    properties: dict[str, Any] = {"zep_uuid": uuid}
    if isinstance(edge.get("name"), str):
        properties["relation"] = edge["name"]
    for end in ("source", "target"):
        node = edge.get(f"{end}_node_uuid")
        if isinstance(node, str):
            properties[f"{end}_node"] = {"uuid": node, "name": names.get(node)}
    for field in _EDGE_PROPS:
        if edge.get(field) not in (None, [], {}):
            properties[field] = edge[field]
    until = micros(edge.get("invalid_at"), f"{where}.invalid_at")
    if until is None:
        until = micros(edge.get("expired_at"), f"{where}.expired_at")
    episodes = edge.get("episodes") or []
    if not isinstance(episodes, list):
        raise InvalidRequest(f"{where}.episodes: expected a list of episode uuids")
    embedding = src.vector(edge.get("fact_embedding"), f"{where}.fact_embedding")
    if embedding is not None and model is None:
        report.drop("fact_embedding (the file does not name its model: give --embedding-model)")
        embedding = None
    rec = Record(
        key=key_of(PREFIX, uuid),
        kind="fact",
        ts=micros(edge.get("created_at"), f"{where}.created_at") or 0,
        text=src.text(edge.get("fact"), f"{where}.fact"),
        properties=properties,
        sources=[key_of(PREFIX, e) for e in episodes],
        valid_from=micros(edge.get("valid_at"), f"{where}.valid_at"),
        valid_until=until,
        embedding=embedding,
        where=where,
    )
    return window(rec, report)


def _supersede(records: list[Record], edges: list[dict[str, Any]], report: Report) -> None:
    """Link each expired edge to the edge that most likely replaced it (module docstring)."""
    by_head: dict[tuple[Any, Any], list[tuple[int, Record]]] = {}
    for rec, edge in zip(records, edges, strict=True):
        if edge.get("expired_at") is None:
            by_head.setdefault((edge.get("source_node_uuid"), edge.get("name")), []).append(
                (rec.ts, rec)
            )
    for rec, edge in zip(records, edges, strict=True):
        expired = micros(edge.get("expired_at"), "expired_at")
        if expired is None:
            continue
        report.count("expired edges")
        head = (edge.get("source_node_uuid"), edge.get("name"))
        later = [(ts, r) for ts, r in by_head.get(head, []) if rec.ts <= ts <= expired]
        if later:
            max(later, key=lambda c: c[0])[1].supersedes.append(rec.key)
        else:  # its validity alone retires it
            report.count("expired edges with no replacing edge found")
