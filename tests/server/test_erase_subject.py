"""Erasure by subject over HTTP (the app in process): the dry run, the real run's one delete and
one purge, the receipt (stored, listed, signed, verified), bad input, and canaries that no file
under the data directory holds afterwards."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage import receipts
from tests.support.auth import ADMIN_KEY, Issued, admin_cli
from tests.support.erasure import scan
from tests.support.servers import InProcessServer, cheap_hasher

NAME, EMAIL, ORDER = "Zelda Quarrington", "zelda.q@example.org", "ORD-77123-XQ"
CANARY_VECTOR = [0.123456789, -0.987654321, 0.555111222, 0.314159265]


@pytest.fixture
def app(tmp_path: Path) -> Iterator[InProcessServer]:
    server = InProcessServer(tmp_path / "data").start()
    yield server
    server.stop()


@pytest.fixture
def client(app: InProcessServer) -> Iterator[httpx.Client]:
    with app.client("shop") as c:
        yield c


def post(client: httpx.Client, text: str, **extra: Any) -> str:
    resp = client.post("/v1/memory/event", json={"kind": "note", "text": text, **extra})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["event_id"])


def erase(client: httpx.Client, subject: str, **body: Any) -> httpx.Response:
    return client.post(f"/v1/memory/subjects/{subject}/erase", json=body)


def world(client: httpx.Client) -> dict[str, str]:
    """A customer tagged on two events, a fact derived from one, an untagged tool call naming
    her, her canaries in text, properties and a vector, and events about someone else."""
    ids = {
        "turn": post(
            client,
            f"Hi, I am {NAME}, my email is {EMAIL}",
            subjects=["cust-42"],
            embedding=CANARY_VECTOR,
        ),
        "order": post(
            client,
            "order placed",
            subjects=["cust-42"],
            properties={"order": ORDER, "note": {"contact": EMAIL}},
        ),
        "other": post(client, "Bob ordered socks", subjects=["cust-7"]),
        "untagged": post(client, "noon weather report"),
    }
    ids["fact"] = post(
        client,
        "the customer prefers evening delivery",
        properties={"source_event_ids": [ids["turn"]]},
    )
    ids["call"] = post(client, f"lookup_order({ORDER}) -> shipped", kind="tool_call")
    return ids


def test_the_dry_run_lists_every_event_and_why_and_changes_nothing(client: httpx.Client) -> None:
    ids = world(client)
    resp = erase(client, "cust-42", identifiers=[ORDER, "quarrington zelda"])
    assert resp.status_code == 200, resp.text
    body = resp.json()
    reasons = {e["event_id"]: e["reasons"] for e in body["events"]}
    assert reasons == {
        ids["turn"]: ["subject", "identifier"],
        ids["order"]: ["subject", "identifier"],
        ids["fact"]: ["derived"],
        ids["call"]: ["identifier"],
    }
    assert body["subject"] == "cust-42" and body["count"] == 4
    assert {e["kind"] for e in body["events"]} == {"note", "tool_call"}
    assert all(client.get(f"/v1/memory/event/{e}").status_code == 200 for e in ids.values())
    none = erase(client, "cust-42", cascade="none").json()
    assert {e["event_id"] for e in none["events"]} == {ids["turn"], ids["order"]}
    assert erase(client, "nobody-at-all").json() == {
        "subject": "nobody-at-all",
        "events": [],
        "count": 0,
    }


def test_the_real_run_erases_in_one_purge_and_answers_a_signed_receipt(
    app: InProcessServer, client: httpx.Client
) -> None:
    ids = world(client)
    resp = erase(
        client,
        "cust-42",
        dry_run=False,
        identifiers=[NAME, EMAIL, ORDER],
        confirm_ids=[ids["call"]],
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()
    gone = {ids[k] for k in ("turn", "order", "fact", "call")}
    assert set(out["deleted_ids"]) == gone
    receipt = out["receipt"]["receipt"]
    assert receipt["receipt_id"] == out["receipt_id"]
    assert receipt["counts"] == {"subject": 2, "identifier": 1, "derived": 1}
    assert receipt["subject_sha256"] == receipts.digest("cust-42")
    assert receipt["stores_purged"] == ["events", "keyword", "vectors"]
    assert receipt["clean"] is True, receipt
    assert all(f["found_in"] == [] for f in receipt["scan_identifiers"] + receipt["scan_event_ids"])
    assert {f["found_in"] == [] for f in receipt["scan_event_ids"]} == {True}
    for e in gone:
        assert client.get(f"/v1/memory/event/{e}").status_code == 404
    for e in ("other", "untagged"):
        assert client.get(f"/v1/memory/event/{ids[e]}").status_code == 200
    # kept, listed, fetched byte for byte, verified; a changed byte fails
    listed = client.get("/v1/memory/receipts").json()["receipts"]
    assert [r["receipt_id"] for r in listed] == [out["receipt_id"]]
    stored = client.get(f"/v1/memory/receipts/{out['receipt_id']}")
    assert stored.status_code == 200
    key = app.request("GET", "/v1/receipts/key").json()
    trusted = __import__("base64").b64decode(key["public_key"])
    assert receipts.verify(stored.content, trusted) is not None
    changed = stored.content.replace(b'"derived":1', b'"derived":0')
    assert changed != stored.content and receipts.verify(changed) is None
    assert client.get("/v1/memory/receipts/" + "0" * 32).status_code == 404
    with app.client("elsewhere") as other:
        assert other.get(f"/v1/memory/receipts/{out['receipt_id']}").status_code == 404
    # nothing of her left in any file under the data directory
    assert held(app.data_dir, [NAME, EMAIL, ORDER]) == {}
    # the ids, as text, only in the receipt (the log keeps them raw in its erasure ledger)
    receipt_file = str(Path(receipts.DIR, "shop", f"{out['receipt_id']}.json"))
    assert held(app.data_dir, sorted(gone)) == {e: [receipt_file] for e in gone}
    assert not vector_held(app.data_dir, CANARY_VECTOR)
    key_file = app.data_dir / receipts.DIR / receipts.KEY_FILE
    assert os.stat(key_file).st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("body", "path_subject", "says"),
    [
        ({"identifiers": [f"id-{i}" for i in range(21)]}, "c", "identifiers may hold at most 20"),
        ({"identifiers": ["ok-one", "ab"]}, "c", "identifiers[1] must be at least 3 characters"),
        ({}, "x" * 129, "subject may be at most 128 bytes"),
        ({"confirm_ids": ["nope"]}, "c", "confirm_ids[0] is not an event id"),
        ({"cascade": "all"}, "c", "cascade"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    client: httpx.Client, body: dict[str, Any], path_subject: str, says: str
) -> None:
    resp = erase(client, path_subject, **body)
    assert resp.status_code == 400, resp.text
    assert says in resp.json()["detail"]


def test_a_confirmed_id_the_identifiers_did_not_find_erases_nothing(client: httpx.Client) -> None:
    ids = world(client)
    resp = erase(client, "cust-42", dry_run=False, confirm_ids=[ids["other"]])
    assert resp.status_code == 400
    assert "confirm_ids[0]" in resp.json()["detail"]
    assert client.get(f"/v1/memory/event/{ids['turn']}").status_code == 200
    assert client.get("/v1/memory/receipts").json() == {"receipts": []}


def test_the_access_export_holds_the_subject_and_what_derives(client: httpx.Client) -> None:
    ids = world(client)
    resp = client.get("/v1/memory/subjects/cust-42/export")
    assert resp.status_code == 200
    lines = [__import__("json").loads(x) for x in resp.content.splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["events"] == 3
    assert [x["event_id"] for x in lines[1:-1]] == [ids["turn"], ids["order"], ids["fact"]]
    assert lines[-1]["type"] == "end" and lines[-1]["events"] == 3
    assert client.get("/v1/memory/subjects/nobody/export").content.count(b"\n") == 2


def test_the_admin_route_erases_across_tenants(tmp_path: Path) -> None:
    data_dir = tmp_path / "issued"
    admin_cli(data_dir, "init")
    server = InProcessServer(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}, hasher=cheap_hasher())
    server.start()
    try:
        issued = Issued(server)
        tenants = [issued.tenant(n) for n in ("a", "b", "c")]
        clients = [issued.client(issued.key(t)["api_key"]) for t in tenants]
        in_a, in_b = (
            post(clients[0], "a", subjects=["p-1"]),
            post(clients[1], "b", subjects=["p-1"]),
        )
        keep = post(clients[2], "c", subjects=["p-2"])
        dry = issued.admin.post("/v1/admin/subjects/p-1/erase", json={})
        assert dry.status_code == 200, dry.text
        assert sorted(dry.json()["tenants"]) == sorted(tenants[:2])
        assert [d["count"] for d in dry.json()["dry_runs"]] == [1, 1]
        real = issued.admin.post("/v1/admin/subjects/p-1/erase", json={"dry_run": False})
        assert real.status_code == 200, real.text
        assert sorted(d for r in real.json()["receipts"] for d in r["deleted_ids"]) == sorted(
            [in_a, in_b]
        )
        assert clients[2].get(f"/v1/memory/event/{keep}").status_code == 200
        assert clients[0].get(f"/v1/memory/event/{in_a}").status_code == 404
        listed = clients[0].get("/v1/memory/receipts").json()["receipts"]
        assert [r["key_id"] for r in listed] == ["admin"]
        assert clients[2].get("/v1/memory/receipts").json() == {"receipts": []}
        for c in clients:
            c.close()
    finally:
        server.stop()


def held(root: Path, needles: list[str]) -> dict[str, list[str]]:
    """Which files under root (relative paths) hold which needles (ASCII case ignored)."""
    return scan(root, {n: n.lower().encode() for n in needles}, any_case=True)


def vector_held(root: Path, vector: list[float]) -> bool:
    """Whether a file under root holds the vector as float32s or float64s (either order)."""
    forms = {f"{o}{t}": struct.pack(f"{o}{len(vector)}{t}", *vector) for o in "<>" for t in "fd"}
    return bool(scan(root, forms))


def test_a_subject_with_a_space_travels_percent_encoded(client: httpx.Client) -> None:
    tagged = post(client, "hello", subjects=["agent 7"])
    dry = client.post("/v1/memory/subjects/agent%207/erase", json={}).json()
    assert (dry["subject"], [e["event_id"] for e in dry["events"]]) == ("agent 7", [tagged])
    lines = client.get("/v1/memory/subjects/agent%207/export").content.splitlines()
    assert len(lines) == 3 and tagged.encode() in lines[1]


def test_a_legal_hold_on_the_subject_refuses_its_erasure(tmp_path: Path) -> None:
    data_dir = tmp_path / "held"
    admin_cli(data_dir, "init")
    server = InProcessServer(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}, hasher=cheap_hasher())
    server.start()
    try:
        issued = Issued(server)
        tenant = issued.tenant("held")
        with issued.client(issued.key(tenant)["api_key"]) as c:
            kept = post(c, "about her", subjects=["p-9"])
            hold = issued.admin.post(
                f"/v1/admin/tenants/{tenant}/holds", json={"reason": "litigation", "subject": "p-9"}
            )
            assert hold.status_code in (200, 201), hold.text
            resp = erase(c, "p-9", dry_run=False)
            assert resp.status_code == 409 and resp.json()["error"] == "legal_hold", resp.text
            assert hold.json()["hold_id"] in resp.json()["detail"]
            assert c.get(f"/v1/memory/event/{kept}").status_code == 200
            assert c.get("/v1/memory/receipts").json() == {"receipts": []}
            issued.admin.delete(f"/v1/admin/tenants/{tenant}/holds/{hold.json()['hold_id']}")
            assert erase(c, "p-9", dry_run=False).status_code == 200
    finally:
        server.stop()
