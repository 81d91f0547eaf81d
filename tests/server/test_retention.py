"""Retention and legal holds through the app in process over a control plane, with a clock the
test moves (the Retention object's, injected; no sleep): windows per kind, runs that delete,
purge and leave a receipt, derived events of longer windows that stay and lose their link,
holds that stop every deletion until lifted, and what GET /v1/admin/tenants/{id} shows."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.auth import Authenticator
from memspine.config import load_settings
from memspine.retention import Retention
from memspine_admin.plane import open_control
from memspine_admin.records import now_us
from storage import receipts
from storage.tenants.runs import JOURNAL, RUNS, Journal
from tests.support.control import CHEAP_HASHER as CHEAP
from tests.support.erasure import scan


def receipts_key(data: Path) -> bytes:
    """The raw public key of the server's receipts."""
    return base64.b64decode(receipts.public_key(data).public_key)


ADMIN_KEY = "admin-key-for-the-retention-tests-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
DAY = 86_400 * 1_000_000
NOW = now_us()


@dataclass
class Server:
    """The app over a control plane with one tenant, its key, and the clock of its retention."""

    client: TestClient[Any]
    data: Path
    tenant_id: str
    key: dict[str, str]
    retention: Retention
    now: int = NOW

    def at(self, days: float) -> None:
        """Move the retention clock to `days` after the test's start."""
        self.now = NOW + int(days * DAY)

    def append(self, kind: str, text: str, days_ago: float, sources: list[str] = ()) -> str:  # type: ignore[assignment]
        body: dict[str, Any] = {"kind": kind, "ts": NOW - int(days_ago * DAY), "text": text}
        if sources:
            body["properties"] = {"source_event_ids": list(sources)}
        r = self.client.post("/v1/memory/event", json=body, headers=self.key)
        assert r.status_code == 201, r.text
        return str(r.json()["event_id"])

    def exists(self, event_id: str) -> bool:
        r = self.client.get(f"/v1/memory/event/{event_id}", headers=self.key)
        assert r.status_code in (200, 404), r.text
        return r.status_code == 200

    def patch(self, retention: Any) -> Any:
        return self.client.patch(
            f"/v1/admin/tenants/{self.tenant_id}", json={"retention": retention}, headers=ADMIN
        )

    def shown(self) -> dict[str, Any]:
        r = self.client.get(f"/v1/admin/tenants/{self.tenant_id}", headers=ADMIN)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def sweep(self) -> list[Any]:
        """One retention sweep on the app's own event loop, as the purger makes it."""
        return list(self.client.blocking_portal.call(self.retention.sweep))

    def hold(self, reason: str, subject: str | None = None) -> str:
        body = {"reason": reason} | ({"subject": subject} if subject else {})
        r = self.client.post(f"/v1/admin/tenants/{self.tenant_id}/holds", json=body, headers=ADMIN)
        assert r.status_code == 201, r.text
        return str(r.json()["hold_id"])

    def lift(self, hold_id: str) -> Any:
        path = f"/v1/admin/tenants/{self.tenant_id}/holds/{hold_id}"
        return self.client.delete(path, headers=ADMIN)

    def sources_of(self, event_id: str) -> list[str]:
        query = "MATCH (d {event_id: $id})-[:SOURCE_FROM]->(s) RETURN s.event_id"
        body = {"query": query, "params": {"id": event_id}}
        r = self.client.post("/v1/memory/cypher", json=body, headers=self.key)
        assert r.status_code == 200, r.text
        return [row[0] for row in r.json()["rows"]]


def _serve(tmp_path: Path, url: str | None, env: dict[str, str] | None = None) -> Iterator[Server]:
    data = tmp_path / "data"
    with open_control(data, url, create=True, actor="test", hasher=CHEAP):
        pass
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(data),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
            **({"MEMSPINE_CONTROL_URL": url} if url else {}),
            **(env or {}),
        }
    )
    auth = Authenticator(data, ADMIN_KEY, hasher=CHEAP, control_url=url)
    app = create_app(settings, auth=auth)
    with TestClient(app) as client:
        r = client.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        tenant_id = r.json()["tenant_id"]
        r = client.post("/v1/admin/keys", json={"tenant_id": tenant_id, "name": "k"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        key = {"Authorization": f"Bearer {r.json()['api_key']}"}
        retention: Retention = app.state.retention
        server = Server(client, data, tenant_id, key, retention)
        retention.clock = lambda: server.now
        yield server


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    yield from _serve(tmp_path, None)


def held(root: Path, needles: list[bytes]) -> list[str]:
    """Files under root holding any of the needles."""
    found = scan(root, {n.decode(): n for n in needles})
    return [f"{path}: {label}" for label, paths in found.items() for path in paths]


def test_events_come_due_per_kind_and_leave_the_disk(srv: Server) -> None:
    assert srv.patch({"turn": 30, "fact": 365}).status_code == 200
    old_turn = srv.append("turn", "Ortolan said the vault code is 7731-quince", 40)
    new_turn = srv.append("turn", "a recent turn about marzipan", 10)
    fact = srv.append("fact", "the customer prefers quince", 40, [old_turn])
    note = srv.append("note", "a note of a kind without a window, zebu", 4000)
    assert srv.sources_of(fact) == [old_turn]
    shown = srv.shown()
    state = shown["retention_state"]
    assert shown["retention"] == {"turn": 30, "fact": 365}
    assert state["in_force"] == {"turn": 30, "fact": 365}  # no server default: "*" keeps
    assert (state["due_now"], state["due_next_7_days"], state["last_run"]) == (1, 1, None)
    assert state["oldest_event"] == NOW - 4000 * DAY
    assert sorted(state["kinds"]) == ["fact", "note", "turn"]

    (receipt,) = srv.sweep()
    assert (receipt.deleted_ids, receipt.deleted, receipt.purged) == ([old_turn], 1, 1)
    assert not srv.exists(old_turn)
    assert all(srv.exists(e) for e in (new_turn, fact, note))
    assert srv.sources_of(fact) == []  # the derived fact of a longer window stays, unlinked
    assert held(srv.data / srv.tenant_id, [b"Ortolan", b"7731-quince"]) == []
    # The receipt holds ids and counts, never text; it is signed and served like an erasure's.
    listed = srv.client.get("/v1/memory/receipts", headers=srv.key).json()["receipts"]
    assert [(r["type"], r["receipt_id"]) for r in listed] == [("retention", receipt.receipt_id)]
    body = srv.client.get(f"/v1/memory/receipts/{receipt.receipt_id}", headers=srv.key).content
    assert b"Ortolan" not in body and b"7731" not in body
    assert receipts.verify(body, receipts_key(srv.data)) == receipt
    forged = body.replace(b'"purged":1', b'"purged":0')
    assert forged != body and receipts.verify(forged) is None
    last = srv.shown()["retention_state"]["last_run"]
    assert (last["receipt_id"], last["deleted"], last["purged"]) == (receipt.receipt_id, 1, 1)

    assert srv.sweep() == []  # nothing more is due: no run, no receipt
    srv.at(17)  # the recent turn is 27 days old: due within 7 days, not yet
    state = srv.shown()["retention_state"]
    assert (state["due_now"], state["due_next_7_days"]) == (0, 1)
    assert srv.sweep() == []
    srv.at(21)
    (receipt,) = srv.sweep()
    assert receipt.deleted_ids == [new_turn]
    assert srv.exists(fact) and srv.exists(note)


def test_the_server_default_covers_the_kinds_a_tenant_names_not(tmp_path: Path) -> None:
    for srv in _serve(tmp_path, None, {"MEMSPINE_RETENTION_DAYS": "100"}):
        assert srv.patch({"turn": 1000}).status_code == 200
        turn = srv.append("turn", "an old turn", 200)
        note = srv.append("note", "an old note", 200)
        assert srv.shown()["retention_state"]["in_force"] == {"turn": 1000, "*": 100}
        (receipt,) = srv.sweep()
        assert receipt.deleted_ids == [note] and srv.exists(turn)
        assert srv.patch({"*": 365}).json()["retention_state"]["in_force"]["*"] == 365


def test_runs_go_in_batches_and_resume_an_interrupted_run(srv: Server) -> None:
    assert srv.patch({"*": 30}).status_code == 200
    old = [srv.append("turn", f"old turn {i}", 40 + i) for i in range(7)]
    keep = srv.append("turn", "a young turn", 1)
    # A run a kill -9 stopped after its first batch: journaled, deleted, not purged, no receipt.
    root = srv.data / srv.tenant_id
    journal = Journal.begin(root, srv.now)
    journal.intend(old[:2])
    r = srv.client.delete(f"/v1/memory/event/{old[0]}", headers=srv.key)
    assert r.status_code in (200, 202), r.text
    r = srv.client.delete(f"/v1/memory/event/{old[1]}", headers=srv.key)
    assert r.status_code in (200, 202), r.text
    srv.retention.batch = 2
    (receipt,) = srv.sweep()
    assert receipt.receipt_id == journal.run_id  # the interrupted run, finished
    assert sorted(receipt.deleted_ids) == sorted(old) and receipt.deleted == 7
    assert not (root / RUNS / JOURNAL).exists()
    assert not any(srv.exists(e) for e in old) and srv.exists(keep)


def test_holds_stop_every_deletion_and_lifting_lets_retention_resume(srv: Server) -> None:
    assert srv.patch({"turn": 30}).status_code == 200
    old = srv.append("turn", "held turn", 40)
    hold = srv.hold("dispute 2026-114")
    listed = srv.client.get(f"/v1/admin/tenants/{srv.tenant_id}/holds", headers=ADMIN).json()
    assert [h["hold_id"] for h in listed["holds"]] == [hold]
    assert srv.sweep() == [] and srv.exists(old)  # retention
    r = srv.client.delete(f"/v1/memory/event/{old}", headers=srv.key)  # a single delete
    assert r.status_code == 409 and r.json()["error"] == "legal_hold", r.text
    assert hold in r.json()["detail"]
    r = srv.client.delete(f"/v1/memory/event/{old}?cascade=derived", headers=srv.key)
    assert r.status_code == 409 and r.json()["error"] == "legal_hold"
    r = srv.client.delete(f"/v1/admin/tenants/{srv.tenant_id}", headers=ADMIN)  # the tenant
    assert r.status_code == 409 and r.json()["error"] == "legal_hold" and hold in r.text
    assert srv.exists(old)
    shown = srv.shown()
    assert [h["reason"] for h in shown["holds"]] == ["dispute 2026-114"]
    assert shown["retention_state"]["due_now"] == 1  # due, and held

    # A hold on one data subject keeps only the events about that subject.
    subject_hold = srv.hold("an access request", subject="person-77")
    assert srv.lift(hold).json() == {"hold_id": hold, "tenant_id": srv.tenant_id, "lifted": True}
    (receipt,) = srv.sweep()  # the old turn is about nobody: the subject hold does not keep it
    assert receipt.deleted_ids == [old]
    assert srv.lift(subject_hold).status_code == 200
    assert srv.lift(subject_hold).status_code == 404
    audit = srv.client.get(f"/v1/admin/audit?tenant_id={srv.tenant_id}", headers=ADMIN).json()
    actions = [(e["action"], e["detail"].get("hold_id")) for e in audit["entries"]]
    assert [a for a in actions if a[0].startswith("hold.")] == [
        ("hold.place", hold),
        ("hold.place", subject_hold),
        ("hold.lift", hold),
        ("hold.lift", subject_hold),
    ]


@pytest.mark.parametrize(
    ("retention", "fragment"),
    [
        ({"turn": 0}, "from 1 to 36500"),
        ({"turn": -3}, "from 1 to 36500"),
        ({"turn": 1.5}, "retention"),
        ({"turn": True}, "retention"),
        ({"": 5}, "is not a kind"),
        ({f"k{i}": 5 for i in range(65)}, "at most 64 kinds"),
        ([1, 2], "retention"),
    ],
)
def test_bad_windows_are_refused_and_change_nothing(
    srv: Server, retention: Any, fragment: str
) -> None:
    assert srv.patch({"turn": 9}).status_code == 200
    r = srv.patch(retention)
    assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
    assert fragment in r.json()["detail"]
    assert srv.shown()["retention"] == {"turn": 9}


def test_windows_merge_null_removes_and_a_typo_is_warned(srv: Server) -> None:
    srv.append("turn", "a turn", 1)
    srv.append("tool_call", "a call", 1)
    r = srv.patch({"turns": 90, "tool_call": 30})
    assert r.status_code == 200
    (warning,) = r.json()["warnings"]
    assert "'turns'" in warning and "'turn'" in warning
    assert srv.patch({"turns": None, "turn": 90}).json()["retention"] == {
        "tool_call": 30,
        "turn": 90,
    }
    assert "warnings" not in srv.shown()
    assert srv.patch({"tool_call": None, "turn": None}).json()["retention"] is None
    r = srv.client.patch(
        f"/v1/admin/tenants/{srv.tenant_id}",
        json={"max_events": 0, "retention": {"turn": 5}},
        headers=ADMIN,
    )
    assert r.status_code == 400 and srv.shown()["retention"] is None  # nothing half-applied


def test_both_planes_keep_windows_and_holds(tmp_path: Path, url: str | None) -> None:
    with open_control(tmp_path, url, create=True, actor="test", hasher=CHEAP) as plane:
        tenant = plane.create_tenant("acme", actor="t")
        record = plane.set_retention(tenant.tenant_id, {"turn": 90, "*": 365}, actor="t")
        assert record.retention == {"turn": 90, "*": 365}
        record = plane.set_retention(tenant.tenant_id, {"turn": None}, actor="t")
        fetched = plane.get_tenant(tenant.tenant_id)
        assert record.retention == {"*": 365} and fetched is not None
        assert fetched.retention == {"*": 365}
        hold = plane.place_hold(tenant.tenant_id, "case 9", "person-1", actor="t")
        assert plane.list_holds(tenant.tenant_id) == [hold]
        with pytest.raises(Exception, match="legal hold") as refused:
            plane.delete_tenant(tenant.tenant_id, actor="t")
        assert getattr(refused.value, "code", None) == "legal_hold"
        assert plane.lift_hold(tenant.tenant_id, hold.hold_id, actor="t") == hold
        assert plane.list_holds(tenant.tenant_id) == []
        with pytest.raises(Exception, match="no hold"):
            plane.lift_hold(tenant.tenant_id, hold.hold_id, actor="t")
        actions = [e.action for e in plane.audit(tenant_id=tenant.tenant_id)[0]]
        assert actions[1:] == ["tenant.retention", "tenant.retention", "hold.place", "hold.lift"]
        plane.delete_tenant(tenant.tenant_id, actor="t")


def test_local_mode_applies_the_server_default_to_every_tenant(start_server: Any) -> None:
    server = start_server(env={"MEMSPINE_RETENTION_DAYS": "30"})
    retention: Retention = server.app.state.retention
    retention.clock = lambda: NOW
    with server.client("acme") as c:
        old = c.post("/v1/memory/event", json={"kind": "turn", "ts": NOW - 40 * DAY, "text": "x"})
        young = c.post("/v1/memory/event", json={"kind": "note", "ts": NOW - DAY, "text": "y"})
        assert old.status_code == young.status_code == 201
        (receipt,) = server.runner.blocking_portal.call(retention.sweep)
        assert receipt.deleted_ids == [old.json()["event_id"]]
        assert c.get(f"/v1/memory/event/{young.json()['event_id']}").status_code == 200


def test_an_interrupted_run_is_finished_after_its_windows_were_removed(srv: Server) -> None:
    assert srv.patch({"turn": 30}).status_code == 200
    old = srv.append("turn", "an old turn", 40)
    journal = Journal.begin(srv.data / srv.tenant_id, srv.now)
    journal.intend([old])
    assert srv.client.delete(f"/v1/memory/event/{old}", headers=srv.key).status_code in (200, 202)
    assert srv.patch({"turn": None}).json()["retention"] is None
    (receipt,) = srv.sweep()
    assert (receipt.receipt_id, receipt.deleted_ids, receipt.windows) == (journal.run_id, [old], {})
    assert srv.sweep() == []


def test_null_removes_every_window_at_once(srv: Server) -> None:
    assert srv.patch({"turn": 30, "*": 90}).json()["retention"] == {"turn": 30, "*": 90}
    shown = srv.patch(None).json()
    assert shown["retention"] is None and shown["retention_state"]["in_force"] == {}
    audit = srv.client.get(f"/v1/admin/audit?tenant_id={srv.tenant_id}", headers=ADMIN).json()
    details = [e["detail"] for e in audit["entries"] if e["action"] == "tenant.retention"]
    assert details == [{"turn": 30, "*": 90}, {"all": None}]
