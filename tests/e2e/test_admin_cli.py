"""The real memspine-admin command, run as a subprocess against a data directory in tmp_path: its
help, the tenants-and-keys path, a revocation from another process, a data directory that is a
file (tests/server/test_admin_commands.py runs every other command through main() in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memspine.verifier import KeyVerifier
from memspine_admin.control import ControlDB
from storage.errors import Unauthorized
from tests.support.admin import Admin


@pytest.fixture
def admin(tmp_path: Path) -> Admin:
    return Admin(tmp_path / "data", tmp_path)


@pytest.fixture
def ready(admin: Admin) -> Admin:
    admin.ok("init")
    return admin


def test_help_lists_every_command(admin: Admin) -> None:
    out = admin.ok("--help")
    for word in ("init", "tenant", "key", "audit", "--data-dir", "--json"):
        assert word in out
    assert admin.run("key", "create").returncode == 2  # usage errors are argparse's exit 2


def test_tenants_and_keys_end_to_end(ready: Admin) -> None:
    tenant = ready.json("tenant", "create", "customer-4417")
    assert set(tenant) == {"tenant_id", "name", "created_at"}
    tid = tenant["tenant_id"]
    dup = ready.error("tenant", "create", "customer-4417")
    assert dup["error"] == "conflict" and tid in dup["detail"]

    agent = ready.json("key", "create", tid, "support-agent")
    assert agent["scopes"] == ["read", "write"] and agent["expires_at"] is None
    assert agent["api_key"].startswith("smk_live_" + agent["key_id"] + "_")
    review = ready.json(
        "key", "create", tid, "case-C-5117", "--scopes", "read", "--ttl-secs", "86400"
    )
    assert review["scopes"] == ["read"]
    assert review["expires_at"] - review["created_at"] == 86_400 * 1_000_000

    human = ready.ok("key", "create", tid, "human")
    assert "api key: smk_live_" in human and "cannot be shown again" in human

    listing = ready.ok("key", "list", "--tenant", tid)
    assert "smk_live_" + agent["key_id"] in listing and agent["api_key"] not in listing
    listed = ready.json("key", "list")
    assert {k["key_id"] for k in listed} >= {agent["key_id"], review["key_id"]}
    assert all("secret_hash" not in k and "api_key" not in k for k in listed)
    assert "customer-4417" in ready.ok("tenant", "list")


def test_cli_revocation_reaches_a_running_verifier(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    issued = ready.json("key", "create", tid, "agent")
    with ControlDB.open(ready.data_dir) as db:  # this process plays the server
        verifier = KeyVerifier(db)
        assert verifier.verify(issued["api_key"]).tenant_id == tid
        assert verifier.verify(issued["api_key"]).tenant_id == tid  # now from the cache
        ready.ok("key", "revoke", issued["key_id"], "--yes")  # another process
        with pytest.raises(Unauthorized):
            verifier.verify(issued["api_key"])


@pytest.mark.parametrize("command", [["init"], ["tenant", "list"], ["key", "list"]])
def test_a_data_directory_that_is_a_file_is_one_sentence(admin: Admin, command: list[str]) -> None:
    result = admin.run("--data-dir", "/etc/passwd", *command)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "memspine-admin: --data-dir: '/etc/passwd' exists and is not a directory\n"
    )
    below = admin.run("--data-dir", "/etc/passwd/data", *command)
    assert below.returncode == 2 and "Traceback" not in below.stderr
    assert len(below.stderr.splitlines()) == 1 and "/etc/passwd/data" in below.stderr
