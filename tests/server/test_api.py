"""The seed's requests for append, read, list and delete, against the app in process."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.support.first_session import NOT_FOUND, append, at, first_session, post
from tests.support.servers import InProcessServer, serve

SEED_SOURCES = [
    "e6ed335c-ec81-4e64-b74c-18e807d35ad6",
    "69d26777-6d8c-45e1-adeb-40b736fa797e",
    "94531a1f-68e3-4017-8dff-212a89976207",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One app for the module (each test uses its own tenant), embedding dimension 4 as in the seed."""
    yield from serve(InProcessServer(tmp_path_factory.mktemp("api") / "data"))


@pytest.fixture
def client(srv: InProcessServer, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """A client whose token (the tenant id, in local mode) is unique to the test."""
    with srv.client(f"t-{request.node.name[5:40]}-{uuid.uuid4().hex[:8]}") as c:
        yield c


def listing(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    """Every listed event, newest first, following next_cursor."""
    events: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = c.get("/v1/memory/events", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"events", "next_cursor"}
        events += r.json()["events"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return events


def test_health_has_the_seed_shape(srv: InProcessServer) -> None:
    body = srv.request("GET", "/health").json()
    assert set(body) == {"service", "status", "version"}
    assert body["service"] == "memspine-server" and body["status"] == "ok"
    assert all(part.isdigit() for part in body["version"].split("."))


def test_openapi_document_is_served(srv: InProcessServer) -> None:
    r = srv.request("GET", "/schema/openapi.json")
    assert r.status_code == 200
    assert "/v1/memory/event" in r.json()["paths"]


# -- session 1: the support agent's reply (the parts in this issue) --------------------------


def test_reply_with_sources_then_read_back_and_foreign_tenant_404(
    srv: InProcessServer, client: httpx.Client
) -> None:
    first_session(srv, client)


def test_an_event_without_ts_gets_the_arrival_time(client: httpx.Client) -> None:
    before = datetime.now(UTC).timestamp() * 1e6
    eid = append(client, {"kind": "note"})
    after = datetime.now(UTC).timestamp() * 1e6
    ev = client.get(f"/v1/memory/event/{eid}").json()
    assert before - 1e6 <= ev["ts"] <= after + 1e6
    assert ev["text"] is None and ev["properties"] == {} and "embedding" not in ev


# -- session 2: the operations agent --------------------------------------------------------


# The company's twelve events of 6 October: name, kind, time, text, sources, properties.
# fmt: off
OPS_DAY: list[tuple[str, str, str, str, tuple[str, ...], dict[str, str]]] = [
    ("ask1", "turn", "09:11:58", "Priya: move Northfield to net 45", (), {"actor": "priya.n", "role": "ap_manager", "supplier": "SUP-2207"}),
    ("sup1", "tool_call", "09:12:03", "get_supplier(SUP-2207) -> Northfield Metals, net 30", (), {"tool": "get_supplier", "supplier": "SUP-2207", "effect": "read"}),
    ("con1", "tool_call", "09:12:07", "get_contract(SUP-2207) -> allows net 45 from Q4", (), {"tool": "get_contract", "supplier": "SUP-2207", "effect": "read"}),
    ("w1", "tool_call", "09:12:12", "set_payment_terms(SUP-2207, net 45) -> ok, change CHG-9031", ("ask1", "sup1", "con1"), {"tool": "set_payment_terms", "supplier": "SUP-2207", "effect": "write", "change": "CHG-9031"}),
    ("fact1", "fact", "09:12:13", "Northfield (SUP-2207) is on net 45 from today", ("con1", "w1"), {"supplier": "SUP-2207"}),
    ("ask2", "turn", "11:40:20", "Daniel: release PO-7741 for Northfield, the quality hold was cleared this morning", (), {"actor": "daniel.o", "role": "buyer", "supplier": "SUP-2207"}),
    ("po", "tool_call", "11:40:25", "get_po(PO-7741) -> SUP-2207, 18,400.00 EUR, on hold: incoming inspection", (), {"tool": "get_po", "supplier": "SUP-2207", "effect": "read"}),
    ("insp", "tool_call", "11:40:27", "get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55", (), {"tool": "get_inspection", "supplier": "SUP-2207", "effect": "read"}),
    ("w2", "tool_call", "11:40:30", "release_po(PO-7741) -> released, change CHG-9038", ("ask2", "po", "insp"), {"tool": "release_po", "supplier": "SUP-2207", "effect": "write", "change": "CHG-9038"}),
    ("ask3", "turn", "15:03:50", "Priya: put Calder Packaging on hold until the insurance certificate is renewed", (), {"actor": "priya.n", "role": "ap_manager", "supplier": "SUP-3310"}),
    ("sup3", "tool_call", "15:03:54", "get_supplier(SUP-3310) -> Calder Packaging, active, insurance certificate expired", (), {"tool": "get_supplier", "supplier": "SUP-3310", "effect": "read"}),
    ("w3", "tool_call", "15:03:57", "set_supplier_status(SUP-3310, on hold) -> ok, change CHG-9044", ("ask3", "sup3"), {"tool": "set_supplier_status", "supplier": "SUP-3310", "effect": "write", "change": "CHG-9044"}),
]
# fmt: on


def _ops_day(c: httpx.Client) -> dict[str, str]:
    """Append OPS_DAY; the three writes use their change id as Idempotency-Key, as the seed's agent does."""
    ids: dict[str, str] = {}
    for name, kind, clock, text, sources, props in OPS_DAY:
        properties: dict[str, Any] = dict(props)
        if sources:
            properties["source_event_ids"] = [ids[s] for s in sources]
        body = {"kind": kind, "ts": at(6, clock), "text": text, "properties": properties}
        key = {"Idempotency-Key": props["change"]} if "change" in props else {}
        ids[name] = append(c, body, **key)
    return ids


def test_seed_release_json_with_idempotency_key_replays_the_first_id(client: httpx.Client) -> None:
    tenant = client.headers["Authorization"].removeprefix("Bearer ")
    release = {
        "kind": "tool_call",
        "ts": 1791286830000000,
        "text": "release_po(PO-7741) -> released, change CHG-9038",
        "properties": {
            "tool": "release_po",
            "supplier": "SUP-2207",
            "effect": "write",
            "change": "CHG-9038",
            "source_event_ids": SEED_SOURCES,
        },
    }
    expected = str(uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, "memspine:" + tenant), "CHG-9038"))
    first = post(client, release, **{"Idempotency-Key": "CHG-9038"})
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    # The seed's ids name events of another tenant: here they are unknown, so they stay unlinked.
    assert first.json() == {"event_id": expected, "unlinked": SEED_SOURCES}
    # Same body with different whitespace and key order is the same body.
    again = post(
        client, json.dumps(release, indent=2, sort_keys=True), **{"Idempotency-Key": "CHG-9038"}
    )
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert [e["event_id"] for e in listing(client)] == [expected]

    changed = post(
        client,
        {**release, "text": "release_po(PO-7741) -> not released"},
        **{"Idempotency-Key": "CHG-9038"},
    )
    assert changed.status_code == 422
    assert changed.json()["error"] == "idempotency_mismatch"
    assert "different body" in changed.json()["detail"]
    assert client.get(f"/v1/memory/event/{expected}").json()["text"] == release["text"]
    assert len(listing(client)) == 1


def test_idempotent_ids_depend_on_the_tenant(srv: InProcessServer) -> None:
    ids = []
    for tenant in ("company-a", "company-b"):
        with srv.client(tenant) as c:
            ids.append(
                post(c, {"kind": "tool_call"}, **{"Idempotency-Key": "CHG-1"}).json()["event_id"]
            )
    assert ids[0] != ids[1]


def test_ops_listing_by_kind_and_time_is_newest_first(client: httpx.Client) -> None:
    ids = _ops_day(client)
    assert len(listing(client)) == 12
    events = listing(client, kind="tool_call", since=at(6, "11:00:00"), until=at(6, "16:00:00"))
    rows = [
        (
            datetime.fromtimestamp(e["ts"] / 1e6, UTC).strftime("%H:%M:%S"),
            e["properties"]["effect"],
            e["text"][:72],
        )
        for e in events
    ]
    assert rows == [
        ("15:03:57", "write", "set_supplier_status(SUP-3310, on hold) -> ok, change CHG-9044"),
        (
            "15:03:54",
            "read",
            "get_supplier(SUP-3310) -> Calder Packaging, active, insurance certificat",
        ),
        ("11:40:30", "write", "release_po(PO-7741) -> released, change CHG-9038"),
        ("11:40:27", "read", "get_inspection(PO-7741) -> lot 44 passed 2026-10-06 08:55"),
        (
            "11:40:25",
            "read",
            "get_po(PO-7741) -> SUP-2207, 18,400.00 EUR, on hold: incoming inspection",
        ),
    ]
    for e in events:
        assert set(e) == {
            "event_id",
            "kind",
            "ts",
            "text",
            "properties",
        }  # listing omits embeddings
    # The retry of a write under its change id answers the first id and stores nothing.
    w2 = client.get(f"/v1/memory/event/{ids['w2']}").json()
    body = {k: w2[k] for k in ("kind", "ts", "text", "properties")}
    retry = post(client, body, **{"Idempotency-Key": "CHG-9038"})
    assert (retry.status_code, retry.json()) == (200, {"event_id": ids["w2"]})
    assert len(listing(client)) == 12
    # since is inclusive, until exclusive.
    edge = listing(client, kind="tool_call", since=at(6, "11:40:25"), until=at(6, "11:40:30"))
    assert [e["event_id"] for e in edge] == [ids["insp"], ids["po"]]


def test_unknown_listing_parameter_is_refused_by_name(client: httpx.Client) -> None:
    _ops_day(client)
    r = client.get("/v1/memory/events", params={"kind": "tool_call", "supplier": "SUP-2207"})
    assert r.status_code == 400
    assert r.json() == {"error": "invalid_request", "detail": "unknown query parameter 'supplier'"}
    # What the seed wanted, as memspine offers it: a filter on a filterable property.
    events = listing(
        client, kind="tool_call", **{"prop.supplier": "SUP-2207", "prop.effect": "write"}
    )
    assert [e["properties"]["change"] for e in events] == ["CHG-9038", "CHG-9031"]


def test_listing_pages_with_cursors(client: httpx.Client) -> None:
    ids = _ops_day(client)
    first = client.get("/v1/memory/events", params={"limit": 5}).json()
    assert len(first["events"]) == 5 and isinstance(first["next_cursor"], str)
    assert all(ch.isalnum() or ch in "-_" for ch in first["next_cursor"])  # base64url, no padding
    everything = listing(client, limit=5)
    assert [e["event_id"] for e in everything[:5]] == [e["event_id"] for e in first["events"]]
    assert len(everything) == 12 and {e["event_id"] for e in everything} == set(ids.values())
    ts = [e["ts"] for e in everything]
    assert ts == sorted(ts, reverse=True)


# -- session 3: the assistant over three days ---------------------------------------------


# The project's first eight events over 5-6 October: name, kind, day, time, text, sources,
# embedding, topic. The test appends the seed's moved.json and four more: thirteen, six facts.
# fmt: off
PROJECT: list[tuple[str, str, int, str, str, tuple[str, ...], list[float] | None, str | None]] = [
    ("plan", "turn", 5, "09:10:00", "Lena: we move billing to the new ledger on Saturday 10 October. Status notes as three bullets, no tables please", (), None, None),
    ("pref", "fact", 5, "09:11:00", "Lena wants status notes as three bullets, no tables", ("plan",), [0.0, 0.0, 1.0, 0.1], "status_notes"),
    ("old_date", "fact", 5, "09:12:00", "Billing cutover to the new ledger is planned for Saturday 2026-10-10", ("plan",), [1.0, 0.0, 0.0, 0.0], "cutover_date"),
    ("count", "tool_call", 5, "10:00:00", "count_rows(invoices) -> 41,203,556", (), None, None),
    ("rows", "fact", 5, "10:01:00", "The invoices table holds 41.2 M rows", ("count",), [0.6, 0.0, 0.0, 0.8], "volume"),
    ("dry", "tool_call", 6, "09:00:00", "dry_run_copy(invoices) -> finished in 6:40:12", (), None, None),
    ("copy", "fact", 6, "09:01:00", "A full copy of invoices took 6 h 40 min in the dry run", ("dry",), [0.5, 0.1, 0.0, 0.9], "copy_time"),
    ("close", "turn", 6, "14:30:00", "Lena: finance closes September on 12 October, so the cutover has to move", (), None, None),
]
# fmt: on


def _project(c: httpx.Client) -> dict[str, str]:
    """Append PROJECT and return the ids by name."""
    ids: dict[str, str] = {}
    for name, kind, day, clock, text, sources, embedding, topic in PROJECT:
        body: dict[str, Any] = {"kind": kind, "ts": at(day, clock), "text": text, "properties": {}}
        if sources:
            body["properties"]["source_event_ids"] = [ids[s] for s in sources]
        if topic is not None:
            body["properties"]["topic"] = topic
        if embedding is not None:
            body["embedding"] = embedding
        ids[name] = append(c, body)
    return ids


def test_superseding_fact_is_stored_as_sent_and_the_old_one_deleted(client: httpx.Client) -> None:
    ids = _project(client)
    moved = (
        '{\n  "kind": "fact",\n  "ts": 1791297160000000,\n'
        '  "text": "Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October",\n'
        '  "embedding": [1.0, 0.0, 0.0, 0.2],\n'
        f'  "properties": {{\n    "topic": "cutover_date",\n    "supersedes": "{ids["old_date"]}",\n'
        f'    "source_event_ids": [\n      "{ids["close"]}",\n      "{ids["old_date"]}"\n    ]\n  }}\n}}'
    )
    r = post(client, moved)
    # A `supersedes` *property* means nothing to the server (the seed's point): no link, no unlinked.
    assert r.status_code == 201 and list(r.json()) == ["event_id"]
    new_date = r.json()["event_id"]
    rest = [
        ("turn", 6, "15:00:00", "Lena: freeze writes during the copy, no dual-write"),
        (
            "fact",
            6,
            "15:01:00",
            "Decision: writes to billing are frozen during the copy; dual-write was rejected",
        ),
        ("turn", 7, "08:59:00", "Lena: can you draft the status note for this week?"),
        ("tool_call", 7, "09:00:00", "calendar(2026-10-17) -> Saturday, no conflicts"),
    ]
    for kind, day, clock, text in rest:
        append(client, {"kind": kind, "ts": at(day, clock), "text": text})
    assert len(listing(client)) == 13

    got = client.get(f"/v1/memory/event/{new_date}")
    assert got.json()["properties"] == {
        "topic": "cutover_date",
        "supersedes": ids["old_date"],
        "source_event_ids": [ids["close"], ids["old_date"]],
    }
    assert moved[moved.index('{\n    "topic"') : moved.rindex("\n}")] in got.text  # byte for byte

    facts = listing(client, kind="fact")
    assert [f["ts"] for f in facts] == sorted((f["ts"] for f in facts), reverse=True)
    assert len(facts) == 6 and facts[1]["event_id"] == new_date

    deleted = client.delete(f"/v1/memory/event/{ids['old_date']}")
    assert deleted.status_code == 200
    # The seed's answer, plus (beyond, additive) the ids deleted.
    body = deleted.json()
    assert {k: body[k] for k in ("deleted", "purged")} == {"deleted": True, "purged": False}
    assert set(body) <= {"deleted", "purged", "deleted_ids"}
    assert body.get("deleted_ids", [ids["old_date"]]) == [ids["old_date"]]
    gone = client.get(f"/v1/memory/event/{ids['old_date']}")
    assert (gone.status_code, gone.json()) == (404, NOT_FOUND)
    assert ids["old_date"] not in {f["event_id"] for f in listing(client, kind="fact")}
    assert len(listing(client, kind="fact")) == 5 and len(listing(client)) == 12
    # The new fact keeps the old id in its properties, as sent, although the link is gone.
    assert (
        client.get(f"/v1/memory/event/{new_date}").json()["properties"]["source_event_ids"][1]
        == ids["old_date"]
    )
    again = client.delete(f"/v1/memory/event/{ids['old_date']}")
    assert (again.status_code, again.json()) == (404, NOT_FOUND)


def test_delete_of_an_unknown_id_is_404_and_changes_nothing(client: httpx.Client) -> None:
    _project(client)
    r = client.delete(f"/v1/memory/event/{uuid.uuid4()}")
    assert (r.status_code, r.json()) == (404, NOT_FOUND)
    assert len(listing(client)) == 8
