"""memspine-admin's data commands through its main() in this process: export and import, backup
and restore, tenant create --id and tenant adopt, against data directories in tmp_path
(tests/e2e/test_move.py runs them beside a real server)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from memspine_admin.control import ControlDB
from storage import files
from storage.datalock import hold
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from storage.transfer import backup as bk
from tests.support.admin import Admin
from tests.support.transfer_world import DIM, answers, populate

MOVED = "7c1d3f5e-8a2b-4c6d-9e0f-1a2b3c4d5e6f"


def cli(data_dir: Path, cwd: Path) -> Admin:
    """memspine-admin on data_dir, its main() run in this process."""
    return Admin(data_dir, cwd, in_process=True)


def make_tenant(data_dir: Path, tenant_id: str, n: int = 60) -> tuple[list[str], dict[str, object]]:
    """A populated tenant, closed again, and its answers."""
    t = Tenant.open(tenant_id, data_dir / tenant_id, embedding_dim=DIM)
    try:
        ids = populate(t, n=n)
        t.purge()
        return ids, answers(t, ids)
    finally:
        t.close()


def same_answers(data_dir: Path, tenant_id: str, ids: list[str], seen: object) -> None:
    t = Tenant.open(tenant_id, data_dir / tenant_id, embedding_dim=DIM)
    try:
        assert answers(t, ids) == seen
    finally:
        t.close()


def test_export_then_import_moves_a_local_tenant(tmp_path: Path) -> None:
    old, new = cli(tmp_path / "old", tmp_path), cli(tmp_path / "new", tmp_path)
    ids, seen = make_tenant(old.data_dir, "acme")
    out = old.json("export", "acme", "--out", str(tmp_path / "acme.ndjson"))
    assert out["events"] == len(_live(tmp_path / "acme.ndjson")) and out["tenant_id"] == "acme"
    done = new.json("import", "acme", "--in", str(tmp_path / "acme.ndjson"))
    assert done["events"] == out["events"] and done["registered"] is None  # local mode
    same_answers(new.data_dir, "acme", ids, seen)
    # again into the same tenant: refused, nothing changed; --merge adds nothing new
    again = new.error("import", "acme", "--in", str(tmp_path / "acme.ndjson"))
    assert again["error"] == "conflict" and f"holds {out['events']} events" in again["detail"]
    merged = new.json("import", "acme", "--in", str(tmp_path / "acme.ndjson"), "--merge")
    assert (merged["events"], merged["skipped"]) == (0, out["events"])
    same_answers(new.data_dir, "acme", ids, seen)


def _live(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.startswith(b'{"type":"event"')]


def test_a_damaged_file_is_refused_with_its_line_and_nothing_lands(tmp_path: Path) -> None:
    old, new = cli(tmp_path / "old", tmp_path), cli(tmp_path / "new", tmp_path)
    make_tenant(old.data_dir, "acme", n=50)
    old.ok("export", "acme", "--out", str(tmp_path / "acme.ndjson"))
    lines = (tmp_path / "acme.ndjson").read_bytes().splitlines(keepends=True)
    lines[9] = lines[9].replace(b'"kind":"', b'"kind":"x', 1)
    (tmp_path / "bad.ndjson").write_bytes(b"".join(lines))
    refused = new.run("import", "acme", "--in", str(tmp_path / "bad.ndjson"))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"memspine-admin: line {len(lines)}: the checksum")
    (tmp_path / "cut.ndjson").write_bytes(b"".join(lines[:12])[:-5])
    cut = new.error("import", "acme", "--in", str(tmp_path / "cut.ndjson"))
    assert cut == {
        "error": "invalid_request",
        "detail": "line 12: the file ends in the middle of a line (truncated)",
    }
    assert not new.data_dir.exists() or list(new.data_dir.iterdir()) == []


def test_a_killed_export_leaves_no_file_that_looks_whole(tmp_path: Path) -> None:
    """--out goes through a temp file: a file of that name is always a whole export."""
    old = cli(tmp_path / "old", tmp_path)
    assert old.error("export", "acme", "--out", str(tmp_path / "x.ndjson"))["error"] == "not_found"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no tenant: no file, no temp


def test_import_into_a_tenant_directory_the_server_holds_is_refused(tmp_path: Path) -> None:
    old, new = cli(tmp_path / "old", tmp_path), cli(tmp_path / "new", tmp_path)
    make_tenant(old.data_dir, "acme", n=50)
    old.ok("export", "acme", "--out", str(tmp_path / "acme.ndjson"))
    Tenant.open("acme", new.data_dir / "acme", embedding_dim=DIM).close()  # empty, has a dir
    lock = hold(new.data_dir, "memspine-server", "http://127.0.0.1:7781")
    try:
        busy = new.error("import", "acme", "--in", str(tmp_path / "acme.ndjson"))
        assert busy["error"] == "conflict"
        assert "memspine-server (pid" in busy["detail"] and "stop it" in busy["detail"]
        # a tenant without a directory lands beside a running server
        assert new.json("import", "other", "--in", str(tmp_path / "acme.ndjson"))["events"] > 0
    finally:
        lock.close()
    assert new.json("import", "acme", "--in", str(tmp_path / "acme.ndjson"))["events"] > 0


def test_tenant_create_takes_an_id(tmp_path: Path) -> None:
    admin = cli(tmp_path / "data", tmp_path)
    admin.ok("init")
    made = admin.json("tenant", "create", "acme", "--id", MOVED.upper())
    assert made["tenant_id"] == MOVED  # canonical form
    assert admin.error("tenant", "create", "other", "--id", MOVED) == {
        "error": "conflict",
        "detail": f"a tenant with id {MOVED} already exists",
    }
    bad = admin.error("tenant", "create", "other", "--id", "acme")
    assert bad["error"] == "invalid_request" and "UUIDv4" in bad["detail"]
    assert admin.json("key", "create", MOVED, "agent")["tenant_id"] == MOVED


def test_an_import_into_a_controlled_directory_says_what_to_register(tmp_path: Path) -> None:
    old, new = cli(tmp_path / "old", tmp_path), cli(tmp_path / "new", tmp_path)
    ids, seen = make_tenant(old.data_dir, MOVED, n=50)
    old.ok("export", MOVED, "--out", str(tmp_path / "t.ndjson"))
    new.ok("init")
    assert new.error("import", "acme", "--in", str(tmp_path / "t.ndjson"))["error"] == (
        "invalid_request"
    )
    out = new.ok("import", MOVED, "--in", str(tmp_path / "t.ndjson"))
    assert f"memspine-admin tenant create NAME --id {MOVED}" in out
    new.ok("tenant", "create", "acme", "--id", MOVED)
    assert new.json("import", MOVED, "--in", str(tmp_path / "t.ndjson"), "--merge")["registered"]
    same_answers(new.data_dir, MOVED, ids, seen)


def test_adopt_registers_a_local_tenant_under_a_new_id(tmp_path: Path) -> None:
    admin = cli(tmp_path / "data", tmp_path)
    ids, seen = make_tenant(admin.data_dir, "my-project", n=50)
    Tenant.open(MOVED, admin.data_dir / MOVED, embedding_dim=DIM).close()
    admin.ok("init")
    assert admin.error("tenant", "adopt", "nope", "x")["error"] == "not_found"
    lock = hold(admin.data_dir, "memspine-server")
    try:
        busy = admin.error("tenant", "adopt", "my-project", "My project")
        assert busy["error"] == "conflict" and "renamed" in busy["detail"]
        # a directory named by a UUIDv4 keeps its name: adopted beside the server
        kept = admin.json("tenant", "adopt", MOVED, "Kept")
        assert kept["tenant_id"] == MOVED and (admin.data_dir / MOVED).is_dir()
    finally:
        lock.close()
    adopted = admin.json("tenant", "adopt", "my-project", "My project")
    tenant_id = adopted["tenant_id"]
    assert not (admin.data_dir / "my-project").exists()
    same_answers(admin.data_dir, tenant_id, ids, seen)
    assert admin.json("init")["local_tenants"] == []
    assert admin.error("tenant", "adopt", tenant_id, "again")["error"] == "conflict"
    names = {t["tenant_id"]: t["name"] for t in admin.json("tenant", "list")}
    assert names == {MOVED: "Kept", tenant_id: "My project"}
    # a name in use: refused, and the directory keeps its local name
    make_tenant(admin.data_dir, "second", n=50)
    assert admin.error("tenant", "adopt", "second", "Kept")["error"] == "conflict"
    assert (admin.data_dir / "second" / files.LOG).is_dir()


def test_backup_then_restore_with_the_control_database(tmp_path: Path) -> None:
    admin = cli(tmp_path / "data", tmp_path)
    admin.ok("init")
    admin.ok("tenant", "create", "acme", "--id", MOVED)
    key = admin.json("key", "create", MOVED, "agent")
    ids, seen = make_tenant(admin.data_dir, MOVED, n=50)
    done = admin.json("backup", str(tmp_path / "bk"))
    assert done["tenants"] == 1 and done["environments"] == ["_control"]
    assert "and the control database" in admin.ok("backup", str(tmp_path / "bk2"))
    restored = cli(tmp_path / "restored", tmp_path)
    out = restored.json("restore", str(tmp_path / "bk"))
    assert (out["tenants"], out["events"]) == (1, done["events"])
    same_answers(restored.data_dir, MOVED, ids, seen)
    keys = restored.json("key", "list")
    assert [k["key_id"] for k in keys] == [key["key_id"]]
    assert ControlDB.exists(restored.data_dir)
    again = restored.error("restore", str(tmp_path / "bk"))
    assert again["error"] == "conflict" and "not empty" in again["detail"]


def test_a_restore_of_an_old_backup_is_refused_unless_asked(tmp_path: Path) -> None:
    admin = cli(tmp_path / "data", tmp_path)
    Tenant.open("acme", admin.data_dir / "acme", embedding_dim=DIM).close()
    t = Tenant.open("acme", admin.data_dir / "acme", embedding_dim=DIM)
    t.submit_append([NewEvent(kind="turn", ts=1, text="old")]).result()
    t.close()
    admin.ok("backup", str(tmp_path / "bk"))
    manifest = tmp_path / "bk" / bk.MANIFEST
    body = msgspec.json.decode(manifest.read_bytes())
    body["taken_at"] -= 40 * 86_400 * 1_000_000
    manifest.write_bytes(json.dumps(body).encode())
    target = cli(tmp_path / "restored", tmp_path)
    old = target.error("restore", str(tmp_path / "bk"))
    assert old["error"] == "conflict" and "40 days old" in old["detail"]
    assert not target.data_dir.exists()
    assert target.json("restore", str(tmp_path / "bk"), "--max-age-days", "60")["events"] == 1


@pytest.mark.parametrize("command", [["export", "../x"], ["import", ".hidden"]])
def test_a_tenant_id_that_is_no_directory_name_is_refused(
    tmp_path: Path, command: list[str]
) -> None:
    admin = cli(tmp_path / "data", tmp_path)
    refused = admin.error(*command)
    assert refused["error"] == "invalid_request" and "local mode" in refused["detail"]


def test_the_admin_route_takes_a_tenant_id(tmp_path: Path) -> None:
    from tests.support.servers import InProcessServer, cheap_hasher, serve

    ControlDB.init(tmp_path / "data", actor="test")
    srv = InProcessServer(
        tmp_path / "data", {"MEMSPINE_ADMIN_KEY": "k" * 32}, hasher=cheap_hasher()
    )
    for s in serve(srv):
        with s.client("k" * 32) as c:
            made = c.post("/v1/admin/tenants", json={"name": "acme", "tenant_id": MOVED.upper()})
            assert made.status_code == 201 and made.json() == {"tenant_id": MOVED, "name": "acme"}
            twice = c.post("/v1/admin/tenants", json={"name": "b", "tenant_id": MOVED})
            assert twice.status_code == 409 and twice.json()["error"] == "conflict"
            bad = c.post("/v1/admin/tenants", json={"name": "c", "tenant_id": "acme"})
            assert bad.status_code == 400 and "UUIDv4" in bad.json()["detail"]
            wrong = c.post("/v1/admin/tenants", json={"name": "d", "tenant_id": 7})
            assert wrong.status_code == 400
            listed = c.get("/v1/admin/tenants").json()["tenants"]
            assert [t["tenant_id"] for t in listed] == [MOVED]


def test_import_and_restore_hold_a_tenant_to_its_quota(tmp_path: Path) -> None:
    """465 events into a tenant of max_events 10 was accepted: import and restore now refuse
    what an append would, and leave nothing behind."""
    old, new = cli(tmp_path / "old", tmp_path), cli(tmp_path / "new", tmp_path)
    make_tenant(old.data_dir, MOVED, n=50)
    old.ok("export", MOVED, "--out", str(tmp_path / "t.ndjson"))
    new.ok("init")
    new.ok("tenant", "create", "acme", "--id", MOVED)
    new.ok("tenant", "limits", MOVED, "--max-events", "10")
    refused = new.error("import", MOVED, "--in", str(tmp_path / "t.ndjson"))
    assert refused["error"] == "quota_exceeded" and "at most 10 live events" in refused["detail"]
    assert not (new.data_dir / MOVED).exists()  # nothing landed
    new.ok("tenant", "limits", MOVED, "--max-events", "none")
    assert new.json("import", MOVED, "--in", str(tmp_path / "t.ndjson"))["events"] > 10
    # A backup of it restored where its record says max_events 10: refused, no target.
    new.ok("tenant", "limits", MOVED, "--max-events", "10")
    new.ok("backup", str(tmp_path / "bk"))
    gone = cli(tmp_path / "restored", tmp_path).error("restore", str(tmp_path / "bk"))
    assert gone["error"] == "quota_exceeded" and not (tmp_path / "restored").exists()
    # The server's default bounds a local-mode import the same way.
    local = cli(tmp_path / "local", tmp_path)
    out = local.run(
        "import",
        "acme",
        "--in",
        str(tmp_path / "t.ndjson"),
        "--json",
        env={"MEMSPINE_DEFAULT_MAX_EVENTS": "10"},
    )
    assert out.returncode != 0 and json.loads(out.stdout or out.stderr)["error"] == "quota_exceeded"
    assert not (local.data_dir / "acme").exists()
