"""The real memspine-admin command, run as a subprocess against a data directory in tmp_path: its
help, the tenants-and-keys path, a revocation from another process, a data directory that is a
file (tests/server/test_admin_commands.py runs every other command through main() in process)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memspine.verifier import KeyVerifier
from memspine_admin.control import ControlDB
from storage.errors import Unauthorized

SCRIPT = Path(sys.executable).parent / "memspine-admin"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "memspine_admin.cli"]


class Admin:
    """Runs memspine-admin with MEMSPINE_DATA_DIR pointing at one data directory: as its own
    process, or (in_process) its main() in this one with stdin, stdout and stderr captured."""

    def __init__(self, data_dir: Path, cwd: Path, *, in_process: bool = False) -> None:
        self.data_dir = data_dir
        self.cwd = cwd
        self.in_process = in_process

    def run(self, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Any:
        extra = {"MEMSPINE_DATA_DIR": str(self.data_dir), **(env or {})}
        if self.in_process:
            return self._main(list(args), stdin, extra)
        return subprocess.run(
            [*COMMAND, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **extra},
            cwd=self.cwd,
            timeout=60,
        )

    def _main(self, args: list[str], stdin: str, env: dict[str, str]) -> Any:
        """What the process would have done, without its seconds of start: the exit status
        and what it wrote. An exception escapes (a real process would print a traceback)."""
        from memspine_admin.cli import main

        saved = (sys.stdin, sys.stdout, sys.stderr, dict(os.environ), os.getcwd())
        out, err = io.StringIO(), io.StringIO()
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
        os.environ.update(env)
        os.chdir(self.cwd)
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 0
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved[:3]
            os.environ.clear()
            os.environ.update(saved[3])
            os.chdir(saved[4])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    def ok(self, *args: str, stdin: str = "") -> str:
        result = self.run(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return str(result.stdout)

    def json(self, *args: str, stdin: str = "") -> Any:
        return json.loads(self.ok(*args, "--json", stdin=stdin))

    def error(self, *args: str) -> dict[str, str]:
        result = self.run(*args, "--json")
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stdout == ""
        error: dict[str, str] = json.loads(result.stderr)
        return error


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
