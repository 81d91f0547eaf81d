"""memspine-admin's commands through its main() in this process (stdin, stdout, stderr and the
exit status as the command gives them) against a data directory in tmp_path; tests/e2e/
test_admin_cli.py runs the command as its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memspine_admin import keys
from memspine_admin.control import ControlDB
from tests.support.admin import Admin


@pytest.fixture
def admin(tmp_path: Path) -> Admin:
    return Admin(tmp_path / "data", tmp_path, in_process=True)


@pytest.fixture
def ready(admin: Admin) -> Admin:
    admin.ok("init")
    return admin


def test_without_init_every_command_names_the_fix(admin: Admin) -> None:
    result = admin.run("tenant", "list")
    assert result.returncode == 1
    assert "no control database: run memspine-admin init" in result.stderr
    assert admin.error("key", "list") == {
        "error": "conflict",
        "detail": "no control database: run memspine-admin init",
    }
    assert not (admin.data_dir / "_control").exists()


def test_init_creates_once(admin: Admin) -> None:
    assert "created control database" in admin.ok("init")
    again = admin.json("init")
    assert again["created"] is False and again["path"] == str(admin.data_dir / "_control")
    assert ControlDB.exists(admin.data_dir)


def test_data_dir_flag_goes_before_or_after_the_command(admin: Admin, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    admin.ok("--data-dir", str(other), "init")
    admin.ok("tenant", "create", "acme", "--data-dir", str(other))
    listed = json.loads(admin.ok("--json", "--data-dir", str(other), "tenant", "list"))
    assert [t["name"] for t in listed] == ["acme"]
    assert not (admin.data_dir / "_control").exists()


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--scopes", "read,admin"], "invalid_request", "'admin'"),
        (["--ttl-secs", "0"], "invalid_request", "ttl_secs"),
        (["--ttl-secs", "-5"], "invalid_request", "ttl_secs"),
        (["--ttl-secs", "999999999999"], "invalid_request", "ttl_secs"),
        (["--scopes", ","], "invalid_request", "empty"),
    ],
)
def test_bad_key_requests(ready: Admin, args: list[str], code: str, fragment: str) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    error = ready.error("key", "create", tid, "agent", *args)
    assert error["error"] == code and fragment in error["detail"]
    assert ready.json("key", "list") == []


def test_unknown_ids_are_not_found(ready: Admin) -> None:
    unknown = "4a2cd816-0f6f-4f89-ac26-41ef06c06e47"
    assert ready.error("key", "create", unknown, "agent")["error"] == "not_found"
    assert ready.error("key", "create", "../../etc", "agent")["error"] == "not_found"
    assert ready.error("tenant", "delete", unknown, "--yes")["error"] == "not_found"
    assert ready.error("key", "revoke", "abcdefghijkl", "--yes")["error"] == "not_found"
    assert ready.error("key", "list", "--tenant", "_control")["error"] == "not_found"


def test_revoke_asks_first(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    key_id = ready.json("key", "create", tid, "agent")["key_id"]
    for answer in ("n\n", "", "yes please\n"):
        result = ready.run("key", "revoke", key_id, stdin=answer)
        assert result.returncode == 3 and "aborted" in result.stderr
    assert ready.json("key", "list")[0]["revoked_at"] is None
    revoked = json.loads(ready.ok("key", "revoke", key_id, "--json", stdin="y\n"))
    assert revoked["revoked_at"] is not None
    assert ready.json("key", "revoke", key_id) == revoked  # already revoked: no question


def test_tenant_delete_revokes_keys_and_erases_the_directory(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    key_ids = [ready.json("key", "create", tid, f"k{i}")["key_id"] for i in range(2)]
    tenant_dir = ready.data_dir / tid / "events"
    tenant_dir.mkdir(parents=True)
    (tenant_dir / "data.mdb").write_bytes(b"door code 4471")

    declined = ready.run("tenant", "delete", tid, stdin="n\n")
    assert declined.returncode == 3 and "2 active key(s)" in declined.stderr
    assert tenant_dir.exists()

    done = ready.json("tenant", "delete", tid, "--yes")
    assert sorted(done["revoked_keys"]) == sorted(key_ids) and done["erased"] is True
    assert not (ready.data_dir / tid).exists()
    assert sorted(p.name for p in ready.data_dir.iterdir()) == ["_control"]
    assert all(k["revoked_at"] is not None for k in ready.json("key", "list"))
    assert ready.json("tenant", "list") == []


def test_audit_records_who_did_what_and_no_secret(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    issued = ready.json("key", "create", tid, "agent")
    ready.ok("key", "revoke", issued["key_id"], "--yes")
    page = ready.json("audit")
    actions = [e["action"] for e in page["entries"]]
    assert actions == ["control.init", "tenant.create", "key.create", "key.revoke"]
    assert page["next_cursor"] is None
    assert all(e["actor"].startswith("cli:") for e in page["entries"])
    parsed = keys.parse_token(issued["api_key"])
    assert parsed is not None
    raw = ready.ok("audit", "--json") + ready.ok("audit")
    assert parsed.secret not in raw and "argon2" not in raw

    first = ready.json("audit", "--limit", "2")
    assert [e["seq"] for e in first["entries"]] == [1, 2] and first["next_cursor"] == 2
    rest = ready.json("audit", "--after", "2", "--limit", "2")
    assert [e["seq"] for e in rest["entries"]] == [3, 4]
    mine = ready.json("audit", "--tenant", tid)
    assert {e["tenant_id"] for e in mine["entries"]} == {tid}
    assert "more: --after 2" in ready.ok("audit", "--limit", "2")
    assert ready.error("audit", "--limit", "5000")["error"] == "invalid_request"


def test_key_revoke_takes_the_id_as_key_list_shows_it(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    first, second = (ready.json("key", "create", tid, name) for name in ("a", "b"))
    shown = [line.split()[0] for line in ready.ok("key", "list").splitlines()[1:]]
    assert shown == [f"smk_live_{first['key_id']}", f"smk_live_{second['key_id']}"]
    revoked = ready.json("key", "revoke", shown[0], "--yes")  # as listed
    assert revoked["key_id"] == first["key_id"] and revoked["revoked_at"] is not None
    assert ready.json("key", "revoke", second["key_id"], "--yes")["revoked_at"] is not None
    whole = ready.error("key", "revoke", first["api_key"], "--yes")  # a secret: refused
    assert whole["error"] == "invalid_request" and "whole api key" in whole["detail"]


def test_init_lists_the_local_mode_tenants_it_strands(admin: Admin) -> None:
    for name in ("my-project", "other"):
        (admin.data_dir / name / "events").mkdir(parents=True)
    (admin.data_dir / ".erasing-x" / "events").mkdir(parents=True)  # not a tenant
    (admin.data_dir / "notes").mkdir()  # no event log: not a tenant either
    out = admin.ok("init").splitlines()
    assert out[2] == (
        "found 2 local-mode tenants that issued keys cannot reach: my-project, other "
        f"(their files stay as they are in {admin.data_dir})"
    )
    assert "memspine-admin tenant adopt DIRNAME NAME" in out[3]
    assert admin.json("init")["local_tenants"] == ["my-project", "other"]
    assert (admin.data_dir / "my-project" / "events").is_dir()  # untouched
