"""memspine-admin's retention and hold commands through its main() in this process: `tenant
retention`, `tenant hold`, `tenant holds`, `tenant unhold`, and what `tenant show` says of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from memspine_admin.records import now_us
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.admin import Admin

DAY = 86_400 * 1_000_000


@pytest.fixture
def ready(tmp_path: Path) -> Admin:
    admin = Admin(tmp_path / "data", tmp_path, in_process=True)
    admin.ok("init")
    return admin


def test_windows_are_set_shown_and_removed(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    tenant = Tenant.open(tid, ready.data_dir / tid, embedding_dim=4)
    now = now_us()
    try:
        events = [
            NewEvent(kind="turn", ts=now - 40 * DAY, text="old"),
            NewEvent(kind="turn", ts=now - 25 * DAY, text="soon"),
            NewEvent(kind="fact", ts=now - 40 * DAY, text="kept"),
        ]
        tenant.submit_append(events).result()
    finally:
        tenant.close()
    set_ = ready.json("tenant", "retention", tid, "turns=30", "*=3650")
    assert set_["retention"] == {"turns": 30, "*": 3650}
    assert "'turn'" in set_["warnings"][0]  # a typo of a kind the tenant has
    assert "warning:" in ready.ok("tenant", "retention", tid, "turns=31")
    ready.ok("tenant", "retention", tid, "turns=none", "turn=30")
    shown = ready.json("tenant", "show", tid)
    assert shown["retention"] == {"*": 3650, "turn": 30}
    state = shown["retention_state"]
    assert (state["due_now"], state["due_next_7_days"], state["last_run"]) == (1, 2, None)
    assert state["oldest_event"] == now - 40 * DAY
    human = ready.ok("tenant", "show", tid)
    assert "retention: *=3650d, turn=30d" in human and "due now 1, within 7 days 2" in human
    assert "last retention run: none" in human and "holds: 0" in human
    audit = ready.json("audit", "--tenant", tid)["entries"]
    assert next(e["detail"] for e in audit if e["action"] == "tenant.retention") == {
        "turns": 30,
        "*": 3650,
    }


@pytest.mark.parametrize(
    ("window", "fragment"),
    [
        ("turn=0", "from 1 to 36500"),
        ("turn=-4", "from 1 to 36500"),
        ("turn=soon", "expected a whole number of days"),
        ("turn", "expected KIND=DAYS"),
    ],
)
def test_bad_windows_are_refused(ready: Admin, window: str, fragment: str) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    result = ready.run("tenant", "retention", tid, window)
    assert result.returncode in (1, 2) and fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert ready.json("tenant", "show", tid)["retention"] is None


def test_holds_are_placed_listed_shown_and_lifted(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    hold = ready.json("tenant", "hold", tid, "--reason", "case 12")
    subject = ready.json("tenant", "hold", tid, "--reason", "a request", "--subject", "p-9")
    listed = ready.json("tenant", "holds", tid)["holds"]
    assert [h["hold_id"] for h in listed] == [hold["hold_id"], subject["hold_id"]]
    assert "subject p-9" in ready.ok("tenant", "show", tid)
    assert ready.error("tenant", "delete", tid, "--yes")["error"] == "legal_hold"
    ready.ok("tenant", "unhold", tid, hold["hold_id"])
    ready.ok("tenant", "unhold", tid, subject["hold_id"])
    assert ready.error("tenant", "unhold", tid, hold["hold_id"])["error"] == "not_found"
    assert ready.ok("tenant", "holds", tid) == "no holds\n"
    ready.ok("tenant", "delete", tid, "--yes")


def test_an_import_drops_what_is_past_its_window(ready: Admin, tmp_path: Path) -> None:
    source = Admin(tmp_path / "old", tmp_path, in_process=True)
    tid = "7c1d3f5e-8a2b-4c6d-9e0f-1a2b3c4d5e6f"
    now = now_us()
    tenant = Tenant.open(tid, source.data_dir / tid, embedding_dim=4)
    try:
        old, young = tenant.submit_append(
            [
                NewEvent(kind="turn", ts=now - 200 * DAY, text="an old turn"),
                NewEvent(kind="turn", ts=now - 2 * DAY, text="a young turn"),
            ]
        ).result()
        (fact,) = tenant.submit_append(
            [NewEvent(kind="fact", ts=now - 200 * DAY, text="derived", source_ids=(old.event_id,))]
        ).result()
    finally:
        tenant.close()
    source.ok("export", tid, "--out", str(tmp_path / "t.ndjson"))
    ready.ok("tenant", "create", "acme", "--id", tid)
    ready.ok("tenant", "retention", tid, "turn=30")
    done = ready.json("import", tid, "--in", str(tmp_path / "t.ndjson"))
    assert (done["events"], done["retention_dropped"]) == (2, 1)
    assert "dropped 1 past their retention window" in ready.ok(
        "import", tid, "--in", str(tmp_path / "t.ndjson"), "--merge"
    )
    tenant = Tenant.open(tid, ready.data_dir / tid, embedding_dim=4)
    try:
        assert tenant.get(old.event_id) is None
        assert tenant.get(young.event_id) is not None
        assert tenant.get(fact.event_id) is not None
        assert tenant.snapshot_read(lambda r: r.links_out(fact.event_id, "SOURCE_FROM")) == []
    finally:
        tenant.close()
    ready.ok("tenant", "hold", tid, "--reason", "case 5")  # a held tenant keeps what comes in
    again = ready.json("import", tid, "--in", str(tmp_path / "t.ndjson"), "--merge")
    assert (again["events"], again["retention_dropped"]) == (1, 0)


def test_a_restore_drops_what_is_past_its_window_unless_held(ready: Admin, tmp_path: Path) -> None:
    now = now_us()
    kept: dict[str, list[str]] = {}
    for name in ("acme", "held"):
        tid = ready.json("tenant", "create", name)["tenant_id"]
        ready.ok("tenant", "retention", tid, "turn=30")
        tenant = Tenant.open(tid, ready.data_dir / tid, embedding_dim=4)
        try:
            results = tenant.submit_append(
                [
                    NewEvent(kind="turn", ts=now - 90 * DAY, text="old"),
                    NewEvent(kind="turn", ts=now - DAY, text="young"),
                ]
            ).result()
            kept[tid] = [r.event_id for r in results]
        finally:
            tenant.close()
        if name == "held":
            ready.ok("tenant", "hold", tid, "--reason", "case 3")
    ready.ok("backup", str(tmp_path / "bk"))
    restored = Admin(tmp_path / "restored", tmp_path, in_process=True)
    out = restored.json("restore", str(tmp_path / "bk"))
    assert (out["events"], out["retention_dropped"]) == (3, 1)
    for tid, (old, young) in kept.items():
        tenant = Tenant.open(tid, restored.data_dir / tid, embedding_dim=4)
        try:
            held = restored.json("tenant", "holds", tid)["holds"] != []
            assert (tenant.get(old) is not None) == held and tenant.get(young) is not None
        finally:
            tenant.close()


def test_the_cli_erasure_honours_a_legal_hold(ready: Admin) -> None:
    """memspine-admin subject erase runs the server's erasure on the data directory: a hold on
    the subject stops it (legal_hold, nothing erased), and once lifted it goes through."""
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    tenant = Tenant.open(tid, ready.data_dir / tid, embedding_dim=4)
    try:
        events = [NewEvent(kind="turn", ts=now_us(), text="about p-9", subjects=("p-9",))]
        tenant.submit_append(events).result()
    finally:
        tenant.close()
    hold = ready.json("tenant", "hold", tid, "--reason", "a dispute", "--subject", "p-9")
    refused = ready.error("subject", "erase", tid, "p-9")
    assert refused["error"] == "legal_hold" and hold["hold_id"] in refused["detail"]
    assert ready.json("subject", "erase", tid, "p-9", "--dry-run")["count"] == 1
    ready.ok("tenant", "unhold", tid, hold["hold_id"])
    assert len(ready.json("subject", "erase", tid, "p-9")["deleted_ids"]) == 1
