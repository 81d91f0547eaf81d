"""The seed's support and project tenants as rows, loaded through the API, and its reviewer's
recall (tests/server/test_recall_seed.py in process, tests/e2e/test_doors.py over a socket).

The texts are the seed's where it shows them and written to fit where it only describes them (no
turn but the reply and the objection shares a word with the reviewer's query); the 4-dim
embeddings were set by hand, as the seed's were."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

MIN = 60_000_000  # one minute in microseconds


SUPPORT_TS = 1_791_208_939_000_000  # the reply, Mon 2026-10-05 14:02:19 UTC


MONDAY_9 = 1_791_190_800_000_000  # Mon 2026-10-05 09:00:00 UTC


def append(client: httpx.Client, body: dict[str, Any]) -> str:
    """Append one event and return its id."""
    resp = client.post("/v1/memory/event", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["event_id"])


# fmt: off
# name, minutes from the reply, kind, text, embedding, properties, sources (by name, link order)
SUPPORT: list[tuple[str, float, str, str, list[float] | None, dict[str, Any], list[str]]] = [
    ("message", -1.5, "turn",
     "Customer: order 88213 shows delivered on 1 October but nothing arrived",
     [0.8, 0.2, 0.1, 0.0], {"speaker": "customer"}, []),
    ("get_order", -1.2, "tool_call",
     "get_order(88213) -> 1 item, shipped 2026-09-29, carrier ref PX-55790112",
     None, {"tool": "get_order"}, []),
    ("track", -0.8, "tool_call",
     "track_parcel(PX-55790112) -> delivered, signed for at no. 16, 2026-10-01 14:12",
     None, {"tool": "track_parcel"}, []),
    ("reply", 0, "turn",
     "Agent: the carrier shows it signed for at number 16, on 1 October at 14:12. Please check there",
     [0.9, 0.1, 0.0, 0.0], {"speaker": "agent"}, ["message", "get_order", "track"]),
    ("objection", 0.4, "turn",
     "Customer: there is no number 16 on my street. I want a refund",
     [0.7, 0.3, 0.0, 0.1], {"speaker": "customer"}, []),
    ("open_case", 0.6, "tool_call",
     "open_case(88213, disputed delivery) -> case C-5117 opened",
     None, {"tool": "open_case"}, []),
    ("handover", 0.7, "turn",
     "Agent: I have opened case C-5117; a colleague will contact you within one working day",
     [0.2, 0.8, 0.0, 0.0], {"speaker": "agent"}, []),
    ("case_fact", 0.78, "fact",
     "Case C-5117: customer disputes the delivery of order 88213; street has no number 16",
     [0.6, 0.4, 0.0, 0.0], {"topic": "case"}, ["track", "objection", "open_case"]),
    ("door_turn", 2.2, "turn",
     "Customer: next time, the door code is 4471, please leave parcels in the hall",
     [0.0, 0.2, 0.9, 0.0], {"speaker": "customer"}, []),
    ("door_fact", 2.38, "fact",
     "Delivery instruction: door code 4471, leave parcels in the hall",
     [0.0, 0.1, 1.0, 0.0], {"topic": "delivery"}, ["door_turn"]),
]


# name, minutes after Monday 09:00, kind, text, embedding, properties, sources (by name)
PROJECT: list[tuple[str, float, str, str, list[float] | None, dict[str, Any], list[str]]] = [
    ("plan_turn", 8, "turn",
     "Lena: we move billing to the new ledger; cutover on Saturday 10 October",
     [0.6, 0.2, 0.1, 0.4], {"speaker": "lena"}, []),
    ("old_date", 9, "fact",
     "Billing cutover to the new ledger is planned for Saturday 2026-10-10",
     [0.9, 0.2, 0.0, 0.5], {"topic": "cutover_date"}, ["plan_turn"]),
    ("pref_turn", 10, "turn",
     "Lena: keep status notes short, three bullets, never tables",
     [0.0, 0.1, 0.9, 0.0], {"speaker": "lena"}, []),
    ("preference", 11, "fact",
     "Lena wants status notes as three bullets, no tables",
     [0.0, 0.0, 1.0, 0.0], {"topic": "status_notes"}, ["pref_turn"]),
    ("measure", 40, "tool_call",
     "table_stats(invoices) -> 48.2 million rows, 212 GB",
     None, {"tool": "table_stats"}, []),
    ("size", 41, "fact",
     "The invoices table holds 48 million rows, 212 GB",
     [0.3, 0.9, 0.0, 0.0], {"topic": "table_size"}, ["measure"]),
    ("dry_run", 24 * 60 + 60, "tool_call",
     "dry_run(copy invoices) -> finished in 6:40:12, 0 errors",
     None, {"tool": "dry_run"}, []),
    ("copy_time", 24 * 60 + 61, "fact",
     "A full copy of invoices took 6 h 40 min in the dry run",
     [0.1, 0.8, 0.0, 0.1], {"topic": "copy_time"}, ["dry_run"]),
    ("moved_turn", 24 * 60 + 330, "turn",
     "Lena: finance closes September on 12 October, so we go a week later, on the 17th",
     [0.8, 0.1, 0.0, 0.3], {"speaker": "lena"}, []),
    # The seed's moved.json, Tue 14:32:40: `supersedes` is the application's own property here.
    ("new_date", 24 * 60 + 332 + 40 / 60, "fact",
     "Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October",
     [1.0, 0.0, 0.0, 0.2], {"topic": "cutover_date", "supersedes": "@old_date"},
     ["moved_turn", "old_date"]),
    ("freeze_turn", 24 * 60 + 360, "turn",
     "Lena: no dual-write, we stop writes to billing while the copy runs",
     [0.5, 0.3, 0.0, 0.4], {"speaker": "lena"}, []),
    ("decision", 24 * 60 + 361, "fact",
     "Decision: writes to billing are frozen during the copy; dual-write was rejected",
     [0.2, 0.7, 0.0, 0.2], {"topic": "design"}, ["freeze_turn"]),
    ("wednesday", 48 * 60, "turn",
     "Lena: can you draft the status note for the steering group?",
     [0.1, 0.1, 0.8, 0.1], {"speaker": "lena"}, []),
]
# fmt: on


def load(client: httpx.Client, rows: list[Any], t0: int, extra: dict[str, Any]) -> dict[str, str]:
    """Append rows in order through the server; '@name' property values become that event's id."""
    ids: dict[str, str] = {}
    for name, minutes, kind, text, emb, props, sources in rows:
        properties = {k: ids[v[1:]] if str(v).startswith("@") else v for k, v in props.items()}
        properties.update(extra if kind == "turn" else {})
        if sources:
            properties["source_event_ids"] = [ids[s] for s in sources]
        body: dict[str, Any] = {"kind": kind, "ts": t0 + round(minutes * MIN), "text": text}
        if emb is not None:
            body["embedding"] = emb
        body["properties"] = properties
        ids[name] = append(client, body)
    return ids


REVIEW_QUERY = {"text": "signed for at number 16", "kind": "turn", "k": 3, "hops": 1}


def recall(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """One recall that must succeed."""
    resp = client.post("/v1/memory/recall", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


def names(ids: dict[str, str], hits: list[dict[str, Any]]) -> list[str]:
    """The fixture names of hits, for readable assertions."""
    by_id = {v: k for k, v in ids.items()}
    return [by_id[h["event_id"]] for h in hits]


def review(client: httpx.Client, ids: dict[str, str]) -> None:
    """The seed's reviewer recall over the support tenant: the reply, the objection, then the reply's sources."""
    result = recall(client, REVIEW_QUERY)
    hits = result["hits"]
    assert names(ids, hits) == ["reply", "objection", "message", "get_order", "track"]
    assert [h["kind"] for h in hits] == ["turn", "turn", "turn", "tool_call", "tool_call"]
    assert ["via" in h for h in hits[:2]] == [False, False]
    assert [h["via"] for h in hits[2:]] == [ids["reply"]] * 3
    assert [h["hop"] for h in hits[2:]] == [1, 1, 1]
    assert hits[0]["score"] == pytest.approx(1 / 61)
    assert hits[1]["score"] == pytest.approx(1 / 62)
    assert hits[0]["text"].startswith("Agent: the carrier shows it signed for at number 16")
    # The seed's response was silent about the case fact; ours says the allowance left it out.
    assert result["walk"] == {"reached": 4, "returned": 3, "omitted": [ids["case_fact"]]}
    # Properties come back as sent, source ids included.
    assert hits[0]["properties"]["source_event_ids"] == [
        ids["message"],
        ids["get_order"],
        ids["track"],
    ]
