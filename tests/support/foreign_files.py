"""Files of other memory servers, built from their own schemas (docs/migrate.md names the file
and commit each was read from): AutoMem's FalkorDB backup (automem/backup.py, the node
properties of automem/api/memory.py), Mem0's get_all with history rows (mem0/memory/main.py,
mem0/memory/storage.py) and a Graphiti dump (graphiti_core/nodes.py, graphiti_core/edges.py).

Each holds a chain of supersession, validity, a relationship and fields memspine does not keep.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from typing import Any

# AutoMem: ids are uuid4 strings; FalkorDB's own node ids are integers.
A_OLD = "5f0c1b1e-7d1a-4c55-9a61-0b7a1f3e9a01"  # PostgreSQL, invalidated
A_MID = "5f0c1b1e-7d1a-4c55-9a61-0b7a1f3e9a02"  # CockroachDB, evolved
A_HEAD = "5f0c1b1e-7d1a-4c55-9a61-0b7a1f3e9a03"  # CockroachDB 24.1: the head
A_PREF = "5f0c1b1e-7d1a-4c55-9a61-0b7a1f3e9a04"


def _memory(mid: str, content: str, kind: str, ts: str, **extra: Any) -> dict[str, Any]:
    """A Memory node's properties as automem/api/memory.py's store sets them."""
    props = {
        "id": mid,
        "content": content,
        "timestamp": ts,
        "importance": 0.8,
        "tags": ["billing", "database"],
        "tag_prefixes": ["billing", "database"],
        "type": kind,
        "confidence": 0.9,
        "t_valid": ts,
        "t_invalid": None,
        "updated_at": ts,
        "last_accessed": ts,
        "metadata": json.dumps({"files_modified": ["db.ts"]}),
        "processed": True,
        "relevance_score": 0.61,
    }
    props.update(extra)
    return props


def automem_backup() -> dict[str, Any]:
    """export_falkordb_artifact's document."""
    nodes = [
        _memory(
            A_OLD,
            "Billing service stores invoices in PostgreSQL",
            "Decision",
            "2025-01-10T09:00:00+00:00",
            t_invalid="2025-03-01T00:00:00+00:00",
        ),
        _memory(
            A_MID,
            "Billing service moved its invoices to CockroachDB for multi-region writes",
            "Decision",
            "2025-03-01T00:00:00+00:00",
        ),
        _memory(
            A_HEAD,
            "Billing service runs CockroachDB 24.1 in three regions for its invoices",
            "Insight",
            "2025-05-02T12:30:00+00:00",
        ),
        _memory(
            A_PREF,
            "User prefers early returns over nested conditionals",
            "Preference",
            "2025-02-02T08:00:00Z",
            tags=["code-style"],
            tag_prefixes=["code-style"],
        ),
    ]
    wrapped = [{"id": i, "labels": ["Memory"], "properties": p} for i, p in enumerate(nodes)]
    wrapped.append(
        {"id": 4, "labels": ["Entity"], "properties": {"id": "ent-1", "name": "Billing"}}
    )
    rels = [
        {"source_id": 0, "type": "INVALIDATED_BY", "target_id": 1,
         "properties": {"reason": "migration", "timestamp": "2025-03-01T00:00:00+00:00"}},
        {"source_id": 1, "type": "EVOLVED_INTO", "target_id": 2, "properties": {"confidence": 0.8}},
        {"source_id": 3, "type": "RELATES_TO", "target_id": 2, "properties": {"strength": 0.5}},
        {"source_id": 2, "type": "MENTIONS", "target_id": 4, "properties": {}},
    ]  # fmt: skip
    return {
        "timestamp": "20250601_120000",
        "graph_name": "memories",
        "nodes": wrapped,
        "relationships": rels,
        "stats": {"node_count": len(wrapped), "relationship_count": len(rels)},
    }


def automem_file() -> bytes:
    """The backup as its script writes it: gzipped JSON, indented."""
    return gzip.compress(json.dumps(automem_backup(), indent=2).encode())


def automem_tarball(dim: int = 4) -> bytes:
    """GET /backup's tar.gz: the FalkorDB file and the Qdrant points beside it."""
    points = [
        {"id": p["properties"]["id"], "vector": [0.1 * (i + 1)] * dim, "payload": {}}
        for i, p in enumerate(automem_backup()["nodes"][:4])
    ]
    members = {
        "falkordb/falkordb_20250601_120000.json.gz": automem_file(),
        "qdrant/qdrant_20250601_120000.json.gz": gzip.compress(
            json.dumps({"timestamp": "20250601_120000", "points": points}).encode()
        ),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


M_COFFEE = "0b8e4c1c-2a54-4bd8-8f1d-6f6d0d5d1a01"
M_CITY = "0b8e4c1c-2a54-4bd8-8f1d-6f6d0d5d1a02"
M_BOB = "0b8e4c1c-2a54-4bd8-8f1d-6f6d0d5d1a03"
M_GONE = "0b8e4c1c-2a54-4bd8-8f1d-6f6d0d5d1a04"


def _row(
    rid: str, mid: str, old: str | None, new: str | None, event: str, at: str
) -> dict[str, Any]:
    """A row of mem0/memory/storage.py's history table."""
    return {
        "id": rid, "memory_id": mid, "old_memory": old, "new_memory": new, "event": event,
        "created_at": "2025-02-01T10:00:00-08:00", "updated_at": at, "is_deleted": int(event == "DELETE"),
        "actor_id": None, "role": "user",
    }  # fmt: skip


def mem0_export() -> dict[str, Any]:
    """get_all's {"results": [...]}, each MemoryItem with its history; a deleted memory's rows."""
    coffee = {
        "id": M_COFFEE,
        "memory": "Likes dark roast coffee",
        "hash": "d41d8cd98f00b204e9800998ecf8427e",
        "metadata": {"source": "chat"},
        "created_at": "2025-02-01T10:00:00-08:00",
        "updated_at": "2025-04-01T10:00:00-08:00",
        "user_id": "alice",
        "history": [
            _row("h1", M_COFFEE, None, "Likes light roast coffee", "ADD", None),
            _row("h2", M_COFFEE, "Likes light roast coffee", "Likes medium roast coffee", "UPDATE",
                 "2025-03-01T10:00:00-08:00"),
            _row("h3", M_COFFEE, "Likes medium roast coffee", "Likes dark roast coffee", "UPDATE",
                 "2025-04-01T10:00:00-08:00"),
        ],
    }  # fmt: skip
    city = {
        "id": M_CITY,
        "memory": "Lives in Lisbon until the end of the decade",
        "hash": "9e107d9d372bb6826bd81d3542a419d6",
        "metadata": None,
        "created_at": "2025-02-03T10:00:00Z",
        "updated_at": None,
        "user_id": "alice",
        "agent_id": "travel-agent",
        "expiration_date": "2030-01-01",
    }
    bob = {
        "id": M_BOB,
        "memory": "Allergic to peanuts",
        "hash": "e4d909c290d0fb1ca068ffaddf22cbd0",
        "created_at": "2025-02-04T10:00:00Z",
        "updated_at": None,
        "user_id": "bob",
    }
    gone = [
        _row("h4", M_GONE, None, "Drinks tea", "ADD", None),
        _row("h5", M_GONE, "Drinks tea", None, "DELETE", "2025-02-05T10:00:00Z"),
    ]
    return {"results": [coffee, city, bob], "history": gone}


def mem0_file() -> bytes:
    """The export as JSON."""
    return json.dumps(mem0_export(), indent=2).encode()


EP_1 = "3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f0001"
EP_2 = "3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f0002"
N_ALICE, N_ACME, N_GLOBEX = (f"3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f01{i}" for i in ["01", "02", "03"])
E_ACME = "3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f0201"
E_GLOBEX = "3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f0202"
E_TEAM = "3c2b3f0e-9a5d-4a0e-8c3b-5b2a9e7f0203"


def _node(uuid: str, name: str) -> dict[str, Any]:
    """EntityNode.model_dump(mode="json")."""
    return {
        "uuid": uuid, "name": name, "group_id": "alice", "labels": ["Entity"],
        "created_at": "2025-01-05T09:00:00Z", "name_embedding": [0.1, 0.2, 0.3],
        "summary": f"{name} appears in Alice's messages", "attributes": {},
    }  # fmt: skip


def _episode(uuid: str, content: str, at: str, edges: list[str]) -> dict[str, Any]:
    """EpisodicNode.model_dump(mode="json")."""
    return {
        "uuid": uuid, "name": f"message {uuid[-1]}", "group_id": "alice", "labels": [],
        "created_at": at, "source": "message", "source_description": "chat",
        "content": content, "valid_at": at, "entity_edges": edges, "episode_metadata": None,
    }  # fmt: skip


def _edge(
    uuid: str, src: str, dst: str, fact: str, eps: list[str], created: str, **times: Any
) -> dict[str, Any]:
    """EntityEdge.model_dump(mode="json")."""
    edge = {
        "uuid": uuid, "group_id": "alice", "source_node_uuid": src, "target_node_uuid": dst,
        "created_at": created, "name": "WORKS_AT", "fact": fact, "fact_embedding": [0.5, 0.5, 0.5],
        "episodes": eps, "expired_at": None, "valid_at": None, "invalid_at": None,
        "reference_time": created, "attributes": {},
    }  # fmt: skip
    edge.update(times)
    return edge


def zep_dump() -> dict[str, Any]:
    """Episodes, entity edges (one expired by a later one) and entity nodes of one group."""
    return {
        "episodes": [
            _episode(EP_1, "alice: I work at Acme on the payments team", "2025-01-05T09:00:00Z",
                     [E_ACME, E_TEAM]),
            _episode(EP_2, "alice: I started at Globex last week", "2025-06-01T09:00:00Z", [E_GLOBEX]),
        ],
        "edges": [
            _edge(E_ACME, N_ALICE, N_ACME, "Alice works at Acme", [EP_1], "2025-01-05T09:00:01Z",
                  valid_at="2024-03-01T00:00:00Z", invalid_at="2025-05-25T00:00:00Z",
                  expired_at="2025-06-01T09:00:02Z"),
            _edge(E_GLOBEX, N_ALICE, N_GLOBEX, "Alice works at Globex", [EP_2], "2025-06-01T09:00:01Z",
                  valid_at="2025-05-25T00:00:00Z"),
            _edge(E_TEAM, N_ALICE, N_ACME, "Alice is on the payments team", [EP_1],
                  "2025-01-05T09:00:01Z", name="MEMBER_OF"),
        ],
        "nodes": [_node(N_ALICE, "Alice"), _node(N_ACME, "Acme"), _node(N_GLOBEX, "Globex")],
    }  # fmt: skip


def zep_file() -> bytes:
    """The dump as JSON."""
    return json.dumps(zep_dump(), indent=2).encode()
