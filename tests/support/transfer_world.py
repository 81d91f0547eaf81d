"""A tenant with every shape an export must carry, and every answer a copy of it must repeat.

`populate` appends through a real Tenant (links, supersession chains, validity windows,
Idempotency-Key appends, properties with odd bytes, deletes of linked events, a purge); `answers`
asks the tenant every GET, listing, recall, Cypher and current-state question the tests compare.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import msgspec

from storage.cypher import Limits
from storage.model import NewEvent
from storage.read.listing import ListQuery
from storage.read.recall import RecallQuery
from storage.tenants.tenant import Tenant

WORDS = [
    "invoice",
    "supplier",
    "parcel",
    "signed",
    "number",
    "courier",
    "refund",
    "warehouse",
    "delay",
    "ticket",
    "customer",
    "password",
    "reset",
    "quarterly",
    "report",
    "lunch",
    "budget",
    "migration",
    "server",
    "outage",
    "rollback",
]
KINDS = ("turn", "fact", "tool_call", "summary")
BASE_TS = 1_791_208_939_000_000
MODEL = "test-model-v1"
DIM = 4


def _text(rng: random.Random, i: int) -> str:
    return f"{' '.join(rng.sample(WORDS, rng.randint(2, 6)))} note{i}"


def _properties(rng: random.Random, i: int, sources: list[str]) -> bytes | None:
    """Stored bytes as clients send them: compact, spaced, pretty-printed, unicode, none."""
    shape = i % 5
    if shape == 0:
        return None
    body: dict[str, Any] = {"supplier": f"SUP-{i % 7}", "n": i % 3, "flag": i % 2 == 0}
    if sources:
        body["source_event_ids"] = sources
    if shape == 1:
        return msgspec.json.encode(body)
    if shape == 2:
        return b'{ "supplier" : "SUP-%d",\n  "n": %d, "note": "caf\\u00e9 \xe2\x98\x83" }' % (
            i % 7,
            i % 3,
        )
    if shape == 3:
        nested = {"deep": {"list": [1, 2.5, None, "x"]}, "supplier": f"SUP-{i % 7}"}
        return msgspec.json.encode(nested)
    return b'{"z": 1, "a": 2, "dup": 1, "dup": 2}'  # key order and a repeated key, as sent


def populate(t: Tenant, seed: int = 7, n: int = 160) -> list[str]:
    """Append n events with links, supersessions, windows and idempotent appends; delete a
    few (linked ones among them), purge, append some more. Returns every id made."""
    rng = random.Random(seed)
    made: list[str] = []

    def append(ev: NewEvent) -> str:
        result = t.submit_append([ev]).result()[0]
        made.append(result.event_id)
        return str(result.event_id)

    for i in range(n):
        sources = rng.sample(made, min(len(made), rng.randint(0, 3))) if made and i % 3 else []
        if i % 11 == 0:
            sources.append("00000000-0000-4000-8000-000000000000")  # names no event: unlinked
        supersedes = [made[-1]] if made and i % 9 == 4 else []
        key = f"key-{i}" if i % 6 == 0 else None
        event_id = body_hash = None
        if key is not None:
            import uuid

            ns = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + t.tenant_id)
            event_id = str(uuid.uuid5(ns, key))
            body_hash = hashlib.sha256(key.encode()).digest()
        append(
            NewEvent(
                kind=KINDS[i % len(KINDS)],
                ts=BASE_TS + i * 1_000_000 + rng.randint(0, 999),
                text=_text(rng, i) if i % 13 else None,
                embedding=[rng.uniform(-1, 1) for _ in range(DIM)] if i % 4 else None,
                embedding_model=MODEL if i % 4 and i % 8 else None,
                properties_raw=_properties(rng, i, sources),
                source_ids=tuple(sources),
                supersedes=tuple(supersedes),
                valid_from=BASE_TS + i * 500_000 if i % 10 == 3 else None,
                valid_until=BASE_TS + (i + 40) * 1_000_000 if i % 10 in (3, 7) else None,
                event_id=event_id,
                body_hash=body_hash,
            )
        )
    doomed = [made[5], made[6], made[12], made[30], made[len(made) // 2]]  # 6 and 12: keyed
    t.submit_delete(doomed).result()
    t.purge()
    t.submit_delete([made[40], made[41]]).result()  # deleted, not yet purged
    for i in range(n, n + 20):
        append(
            NewEvent(
                kind="fact",
                ts=BASE_TS + i * 1_000_000,
                text=_text(rng, i),
                embedding=[rng.uniform(-1, 1) for _ in range(DIM)],
                embedding_model=MODEL,
                source_ids=(made[1], made[5]),  # one live, one deleted: unlinked
                supersedes=(made[i - 3],),
            )
        )
    return made


CYPHER = (
    "MATCH (e:Event) RETURN e.event_id, e.kind, e.ts ORDER BY e.ts",
    "MATCH (a:Event)-[:SOURCE_FROM]->(b:Event) RETURN a.event_id, b.event_id ORDER BY a.ts, b.ts",
    "MATCH (a)-[:SUPERSEDES]->(b) RETURN a.event_id, b.event_id ORDER BY a.ts",
    "MATCH (e:Event {kind: 'fact'}) WHERE e.supplier = 'SUP-3' RETURN e ORDER BY e.ts",
    "MATCH (e:Event) RETURN e.kind, count(*) AS n ORDER BY e.kind",
    "MATCH (a)-[:SOURCE_FROM*1..3]->(b) RETURN count(*)",
    "MATCH (e) WHERE e.n >= 1 AND e.flag = true RETURN e.event_id ORDER BY e.event_id",
)


def _plain(value: Any) -> Any:
    """A storage answer as plain values, without the log's internal op numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "seq"}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def answers(t: Tenant, ids: list[str], seed: int = 11) -> dict[str, Any]:
    """Every answer the tests compare between a tenant and its copy."""
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    out["get"] = [_plain(msgspec.to_builtins(t.get(e))) for e in ids]
    queries = [ListQuery(limit=1000), ListQuery(limit=7), ListQuery(current=False, limit=1000)]
    queries += [ListQuery(kind=k, limit=1000) for k in KINDS]
    queries += [ListQuery(filters={"supplier": ["SUP-3"]}, limit=1000)]
    queries += [ListQuery(as_of=BASE_TS + 80 * 1_000_000, limit=1000)]
    pages = []
    for q in queries:
        events, cursor = t.list_events(q)
        page = [_plain(msgspec.to_builtins(e)) for e in events]
        while cursor is not None and q.limit == 7:
            events, cursor = t.list_events(msgspec.structs.replace(q, cursor=cursor))
            page += [_plain(msgspec.to_builtins(e)) for e in events]
        pages.append(page)
    out["list"] = pages
    recalls = []
    for i in range(24):
        text = " ".join(rng.sample(WORDS, 2)) if i % 3 != 1 else None
        vector = [rng.uniform(-1, 1) for _ in range(DIM)] if i % 3 != 0 else None
        q = RecallQuery(
            text=text,
            embedding=vector,
            embedding_model=MODEL if vector is not None and i % 2 else None,
            kind=KINDS[i % 4] if i % 5 == 0 else None,
            k=1 + i % 10,
            hops=i % 4,
            filters={"supplier": "SUP-2"} if i % 7 == 0 else {},
            current=i % 6 != 5,
            as_of=BASE_TS + 100 * 1_000_000 if i % 8 == 3 else None,
            explain=True,
        )
        recalls.append(_plain(msgspec.to_builtins(t.recall(q))))
    out["recall"] = recalls
    limits = Limits(timeout_ms=10_000, max_rows=10_000)
    out["cypher"] = [msgspec.to_builtins(t.cypher(q, None, limits)) for q in CYPHER]
    return out
