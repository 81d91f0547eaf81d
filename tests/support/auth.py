"""Issued keys for the auth tests: the real memspine-admin CLI to initialise a control database,
an app with an admin key, and helpers to make tenants and keys."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.support.admin import COMMAND
from tests.support.servers import InProcessServer, ServerProcess

ADMIN_KEY = "test-admin-key-7c1f0e9a2b"


def admin_cli(data_dir: Path, *args: str) -> str:
    """Run memspine-admin on `data_dir` as its own process; return stdout."""
    env = {**os.environ, "MEMSPINE_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Issued:
    """The issued-key server (in process or a process of its own) with an admin client and
    helpers to make tenants and keys."""

    def __init__(self, server: InProcessServer | ServerProcess, admin_key: str = ADMIN_KEY) -> None:
        self.server = server
        self.admin = server.client(admin_key)

    def tenant(self, name: str) -> str:
        r = self.admin.post("/v1/admin/tenants", json={"name": name})
        assert r.status_code == 201, r.text
        return str(r.json()["tenant_id"])

    def key(self, tenant_id: str, name: str = "k", **extra: Any) -> dict[str, Any]:
        r = self.admin.post("/v1/admin/keys", json={"tenant_id": tenant_id, "name": name, **extra})
        assert r.status_code == 201, r.text
        issued: dict[str, Any] = r.json()
        return issued

    def client(self, token: str) -> httpx.Client:
        return self.server.client(token)
