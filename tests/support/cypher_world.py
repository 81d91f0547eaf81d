"""The seed's operations day for the Cypher tests: a real EventLog with short names for its
events (storage), the same day through the API (server), the seed's question of whose
instruction each write followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec

from storage.cypher import CypherResult, run
from storage.log.eventlog import EventLog
from storage.model import NewEvent

DAY = 1_791_244_800_000_000  # 2026-10-06 00:00 UTC in microseconds, the seed's Tuesday


def at(hms: str, day: int = 0) -> int:
    """A timestamp on the seed's day (plus `day` days) from "HH:MM:SS"."""
    h, m, s = (int(part) for part in hms.split(":"))
    return DAY + ((day * 24 + h) * 3600 + m * 60 + s) * 1_000_000


class Tenant:
    """A real log plus the ids its events got, by the short names the tests use."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.ids: dict[str, str] = {}

    def add(
        self,
        name: str,
        kind: str,
        ts: int,
        text: str,
        props: dict[str, Any] | None = None,
        sources: tuple[str, ...] = (),
        supersedes: tuple[str, ...] = (),
    ) -> str:
        """Append one event whose sources and supersedes are given by short name."""
        event = NewEvent(
            kind=kind,
            ts=ts,
            text=text,
            properties_raw=msgspec.json.encode(props) if props is not None else None,
            source_ids=tuple(self.ids[s] for s in sources),
            supersedes=tuple(self.ids[s] for s in supersedes),
        )
        [result] = self.log.append_batch([event])
        assert not isinstance(result, Exception)
        self.ids[name] = result.event_id
        return result.event_id

    def query(
        self, query: str, params: dict[str, Any] | None = None, **limits: int
    ) -> CypherResult:
        """Run query in one read transaction."""
        with self.log.reader() as reader:
            return run(reader, query, params, **limits)

    def rows(self, query: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """Only the rows of query."""
        return self.query(query, params).rows


def turn_props(actor: str, role: str, supplier: str, **more: Any) -> dict[str, Any]:
    return {"actor": actor, "role": role, "supplier": supplier, **more}


def call_props(tool: str, supplier: str, effect: str, **more: Any) -> dict[str, Any]:
    return {"tool": tool, "supplier": supplier, "effect": effect, **more}


# The seed's operations tenant: twelve events on one Tuesday, three of them writes, each
# write linked to its instruction and lookups. (name, kind, time, text, properties, sources)
OPS: list[tuple[str, str, str, str, dict[str, Any], tuple[str, ...]]] = [
    ("I1", "turn", "09:11:40", "Priya: move Northfield (SUP-2207) to net 45 payment terms",
     turn_props("priya.n", "ap_manager", "SUP-2207"), ()),
    ("L1", "tool_call", "09:11:58", "get_supplier(SUP-2207) -> Northfield Metals, net 30, active",
     call_props("get_supplier", "SUP-2207", "read", duration_ms=120), ()),
    ("L2", "tool_call", "09:12:05",
     "get_contract(SUP-2207) -> framework agreement FA-118 allows net 45",
     call_props("get_contract", "SUP-2207", "read", duration_ms=340), ()),
    ("W1", "tool_call", "09:12:12", "set_payment_terms(SUP-2207, net 45) -> ok, change CHG-9031",
     call_props("set_payment_terms", "SUP-2207", "write", change="CHG-9031", duration_ms=410),
     ("I1", "L1", "L2")),
    ("F1", "fact", "09:12:13", "Northfield (SUP-2207) is on net 45 payment terms",
     {"topic": "payment_terms", "supplier": "SUP-2207"}, ("L2", "W1")),
    ("I2", "turn", "11:40:02",
     "Daniel: release PO-7741 for Northfield, the quality hold was cleared this morning",
     turn_props("daniel.o", "buyer", "SUP-2207"), ()),
    ("L3", "tool_call", "11:40:25",
     "get_po(PO-7741) -> SUP-2207, 18,400.00 EUR, on hold: incoming inspection",
     call_props("get_po", "SUP-2207", "read", duration_ms=95, amount=18400.0), ()),
    ("L4", "tool_call", "11:40:27", "get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55",
     call_props("get_inspection", "SUP-2207", "read", duration_ms=210), ()),
    ("W2", "tool_call", "11:40:30", "release_po(PO-7741) -> released, change CHG-9038",
     call_props("release_po", "SUP-2207", "write", change="CHG-9038", duration_ms=380),
     ("I2", "L3", "L4")),
    ("I3", "turn", "15:03:40",
     "Priya: put Calder Packaging on hold until the insurance certificate is renewed",
     turn_props("priya.n", "ap_manager", "SUP-3310", urgent=True), ()),
    ("L5", "tool_call", "15:03:54",
     "get_supplier(SUP-3310) -> Calder Packaging, active, insurance certificate expired",
     call_props("get_supplier", "SUP-3310", "read", duration_ms=150), ()),
    ("W3", "tool_call", "15:03:57", "set_supplier_status(SUP-3310, on hold) -> ok, change CHG-9044",
     call_props("set_supplier_status", "SUP-3310", "write", change="CHG-9044"), ("I3", "L5")),
]  # fmt: skip


def open_tenant(
    path: Path, events: list[tuple[str, str, str, str, dict[str, Any], tuple[str, ...]]]
) -> Tenant:
    tenant = Tenant(EventLog.open(path, embedding_dim=4))
    for name, kind, hms, text, props, sources in events:
        tenant.add(name, kind, at(hms), text, props, sources)
    return tenant


WHO = """MATCH (a:Event)-[:SOURCE_FROM]->(i:Event)
WHERE a.supplier = $supplier AND a.effect = $effect AND i.kind = $kind
RETURN a.change, a.tool, i.actor, i.role
ORDER BY a.ts"""


def load_ops(client: httpx.Client) -> dict[str, str]:
    """The seed's operations day through the API; writes carry their change as
    Idempotency-Key and their instruction and lookups as source_event_ids, as the seed's do."""
    ids: dict[str, str] = {}
    for name, kind, hms, text, props, sources in OPS:
        properties = dict(props)
        if sources:
            properties["source_event_ids"] = [ids[s] for s in sources]
        headers = {"Idempotency-Key": props["change"]} if "change" in props else {}
        body = {"kind": kind, "ts": at(hms), "text": text, "properties": properties}
        resp = client.post("/v1/memory/event", json=body, headers=headers)
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["event_id"]
    return ids
