"""Current state through the API (the app in process): the seed's third session with a
top-level `supersedes`, what get, listing and delete show, and what append refuses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import InProcessServer
from tests.support.times import HOUR, MIN, T0

MONDAY_9 = 1_791_190_800_000_000  # Mon 2026-10-05 09:00:00 UTC
DAY = 24 * HOUR
STATUS_QUERY = {
    "text": "cutover plan for billing: date, freeze, copy time",
    "embedding": [0.7, 0.4, 0.0, 0.6],
    "kind": "fact",
    "k": 3,
}
# The seed's third session: name, ts, kind, text, embedding, sources.
SESSION: list[tuple[str, int, str, str, list[float] | None, tuple[str, ...]]] = [
    ("plan_turn", 8 * MIN, "turn", "Lena: we move billing to the new ledger; cutover on Saturday 10 October", [0.6, 0.2, 0.1, 0.4], ()),
    ("old_date", 9 * MIN, "fact", "Billing cutover to the new ledger is planned for Saturday 2026-10-10", [0.9, 0.2, 0.0, 0.5], ("plan_turn",)),
    ("pref_turn", 10 * MIN, "turn", "Lena: keep status notes short, three bullets, never tables", [0.0, 0.1, 0.9, 0.0], ()),
    ("preference", 11 * MIN, "fact", "Lena wants status notes as three bullets, no tables", [0.0, 0.0, 1.0, 0.0], ("pref_turn",)),
    ("measure", 40 * MIN, "tool_call", "table_stats(invoices) -> 48.2 million rows, 212 GB", None, ()),
    ("size", 41 * MIN, "fact", "The invoices table holds 48 million rows, 212 GB", [0.3, 0.9, 0.0, 0.0], ("measure",)),
    ("dry_run", DAY + HOUR, "tool_call", "dry_run(copy invoices) -> finished in 6:40:12, 0 errors", None, ()),
    ("copy_time", DAY + HOUR + MIN, "fact", "A full copy of invoices took 6 h 40 min in the dry run", [0.1, 0.8, 0.0, 0.1], ("dry_run",)),
    ("moved_turn", DAY + 5 * HOUR + 30 * MIN, "turn", "Lena: finance closes September on 12 October, so we go a week later, on the 17th", [0.8, 0.1, 0.0, 0.3], ()),
    ("new_date", DAY + 5 * HOUR + 32 * MIN + 40_000_000, "fact", "Billing cutover moved to Saturday 2026-10-17: finance closes September on 12 October", [1.0, 0.0, 0.0, 0.2], ("moved_turn", "old_date")),
    ("freeze_turn", DAY + 6 * HOUR, "turn", "Lena: no dual-write, we stop writes to billing while the copy runs", [0.5, 0.3, 0.0, 0.4], ()),
    ("decision", DAY + 6 * HOUR + MIN, "fact", "Decision: writes to billing are frozen during the copy; dual-write was rejected", [0.2, 0.7, 0.0, 0.2], ("freeze_turn",)),
    ("wednesday", 2 * DAY, "turn", "Lena: can you draft the status note for the steering group?", [0.1, 0.1, 0.8, 0.1], ()),
]  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One app for the module; each test uses its own tenants."""
    server = InProcessServer(tmp_path_factory.mktemp("current") / "data").start()
    yield server
    server.stop()


def client(srv: InProcessServer) -> httpx.Client:
    """A client for a fresh tenant (local mode: the token is the tenant id)."""
    return srv.client(f"cur-{uuid.uuid4().hex[:12]}")


def post(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/v1/memory/event", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def load_session(c: httpx.Client, *, top_level: bool) -> dict[str, str]:
    """The project's thirteen events; the new date names the old one as a property, as in the
    seed, and with top_level also in the top-level `supersedes`. Returns name -> id."""
    ids: dict[str, str] = {}
    for name, offset, kind, text, emb, sources in SESSION:
        props: dict[str, Any] = {"source_event_ids": [ids[s] for s in sources]} if sources else {}
        body: dict[str, Any] = {
            "kind": kind,
            "ts": MONDAY_9 + offset,
            "text": text,
            "properties": props,
        }
        if emb is not None:
            body["embedding"] = emb
        if name == "new_date":
            props["supersedes"] = ids["old_date"]
            if top_level:
                body["supersedes"] = [ids["old_date"]]
        ids[name] = post(c, body)["event_id"]
    return ids


def named(ids: dict[str, str], hits: list[dict[str, Any]]) -> list[str]:
    by_id = {v: k for k, v in ids.items()}
    return [by_id[h["event_id"]] for h in hits]


def hits_of(c: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = c.post("/v1/memory/recall", json=body)
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["hits"]
    return out


def test_seed_third_session_with_top_level_supersedes(srv: InProcessServer) -> None:
    with client(srv) as seed, client(srv) as c:
        # As in the seed, a `supersedes` property means nothing to the server: both dates come back.
        plain = load_session(seed, top_level=False)
        assert named(plain, hits_of(seed, STATUS_QUERY)) == ["old_date", "new_date", "decision"]
        assert seed.get(f"/v1/memory/event/{plain['old_date']}").json()["current"] is True

        ids = load_session(c, top_level=True)
        hits = hits_of(c, STATUS_QUERY)
        assert named(ids, hits) == ["new_date", "decision", "copy_time"]
        assert hits[0]["replaces"] == [ids["old_date"]]
        # The answer counts what current state kept out; the seed's client above sees no new field.
        answer = c.post("/v1/memory/recall", json=STATUS_QUERY).json()
        assert answer["withheld"] == {"superseded": 1, "expired": 0, "not_yet_valid": 0}
        assert set(seed.post("/v1/memory/recall", json=STATUS_QUERY).json()) == {"hits"}
        assert hits[0]["text"].startswith("Billing cutover moved to Saturday 2026-10-17")
        assert hits[0]["score"] == pytest.approx(hits_of(seed, STATUS_QUERY)[0]["score"])
        assert all("replaces" not in h for h in hits[1:])
        # The same question asked as of Monday evening: the old date was the settled one then.
        monday = hits_of(c, {**STATUS_QUERY, "as_of": MONDAY_9 + 10 * HOUR})
        assert named(ids, monday)[0] == "old_date" and "replaces" not in monday[0]
        assert "new_date" not in named(ids, monday)
        # Opting out of current state gives the seed's answer.
        assert named(ids, hits_of(c, {**STATUS_QUERY, "current": False})) == [
            "old_date",
            "new_date",
            "decision",
        ]


def test_get_listing_and_delete_show_and_change_the_state(srv: InProcessServer) -> None:
    with client(srv) as c:
        ids = load_session(c, top_level=True)
        old = c.get(f"/v1/memory/event/{ids['old_date']}").json()
        assert old["current"] is False and old["superseded_by"] == [ids["new_date"]]
        assert old["text"].startswith("Billing cutover to the new ledger")  # GET always returns it
        new = c.get(f"/v1/memory/event/{ids['new_date']}").json()
        assert new["current"] is True and new["superseded_by"] == []
        assert new["supersedes"] == [ids["old_date"]]
        assert new["properties"]["supersedes"] == ids["old_date"]  # the application's own, as sent

        def facts(**params: Any) -> list[str]:
            r = c.get("/v1/memory/events", params={"kind": "fact", **params})
            assert r.status_code == 200, r.text
            return [e["event_id"] for e in r.json()["events"]]

        assert ids["old_date"] not in facts() and ids["new_date"] in facts()
        assert ids["old_date"] in facts(current="false") and len(facts(current="false")) == 6
        assert facts(as_of=MONDAY_9 + 10 * HOUR) == [
            ids["size"],
            ids["preference"],
            ids["old_date"],
        ]
        assert c.get("/v1/memory/events", params={"current": "maybe"}).status_code == 400

        assert c.delete(f"/v1/memory/event/{ids['new_date']}").status_code == 200
        old = c.get(f"/v1/memory/event/{ids['old_date']}").json()
        assert old["current"] is True and old["superseded_by"] == []
        hits = hits_of(c, STATUS_QUERY)
        assert named(ids, hits)[0] == "old_date" and "replaces" not in hits[0]


def test_append_validates_supersedes_and_windows(srv: InProcessServer) -> None:
    with client(srv) as c:
        base = {"kind": "fact", "text": "a fact"}
        known = post(c, base)["event_id"]
        missing = str(uuid.uuid4())
        out = post(c, {**base, "supersedes": [known, missing, "not-a-uuid", missing]})
        assert out["unlinked"] == [missing, "not-a-uuid"]
        got = c.get(f"/v1/memory/event/{out['event_id']}").json()
        assert got["supersedes"] == [known]
        assert "unlinked" not in post(c, {**base, "supersedes": []})
        window = post(c, {**base, "valid_from": T0 + 10, "valid_until": T0 + 20})
        got = c.get(f"/v1/memory/event/{window['event_id']}").json()
        assert (got["valid_from"], got["valid_until"], got["current"]) == (T0 + 10, T0 + 20, False)
        for bad in (
            {"supersedes": known},
            {"supersedes": [1, 2]},
            {"valid_from": T0 + 20, "valid_until": T0 + 20},
            {"valid_from": T0 + 30, "valid_until": T0 + 20},
            {"valid_until": -1},
        ):
            r = c.post("/v1/memory/event", json={**base, **bad})
            assert r.status_code == 400, bad
            assert r.json()["error"] == "invalid_request" and set(r.json()) == {"error", "detail"}
        plain = c.get(f"/v1/memory/event/{known}").json()
        assert "valid_from" not in plain and "supersedes" not in plain
        assert plain["current"] is False and plain["superseded_by"] == [out["event_id"]]
