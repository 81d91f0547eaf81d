"""The tenants the console's browser tests read: the seed's support case, its supplier audit and
its project, loaded through a real server with issued keys, plus a tenant of hostile events."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from memspine_admin.control import ControlDB
from tests.support.cypher_world import load_ops
from tests.support.seed import MONDAY_9, PROJECT, SUPPORT, SUPPORT_TS, load
from tests.support.servers import ServerProcess

ADMIN_KEY = "console-admin-key-4b1e9d27"

# Markup and script in every field a customer controls: kind, text, property names and values.
HOSTILE_TEXT = (
    "<script>window.__pwned = 1; alert('script')</script>"
    "<img src=x onerror=\"window.__pwned = 2; alert('img')\">"
    "<a href=\"javascript:alert('link')\">click me</a>"
)
HOSTILE_KIND = "<img src=x onerror=alert('kind')>"
HOSTILE_PROPERTIES = {
    "homepage": "javascript:alert('property link')",
    "bio": "<svg onload=alert('svg')><style>body{display:none}</style>",
    "<b onmouseover=alert('name')>name</b>": "<iframe src=javascript:alert('frame')></iframe>",
    "nested": {"html": "<img src=x onerror=alert('nested')>"},
}


@dataclass
class Seeded:
    """A running server, the keys it issued by role, and the seeded events' ids by tenant
    (the key of role "revoked" is there for a test to revoke)."""

    server: ServerProcess
    keys: dict[str, str] = field(default_factory=dict)
    tenants: dict[str, str] = field(default_factory=dict)
    ids: dict[str, dict[str, str]] = field(default_factory=dict)

    def client(self, role: str) -> httpx.Client:
        """An HTTP client with the key of this role."""
        return self.server.client(self.keys[role])


def _tenant_and_key(
    admin: httpx.Client, seeded: Seeded, tenant: str, roles: dict[str, list[str]]
) -> None:
    r = admin.post("/v1/admin/tenants", json={"name": tenant})
    assert r.status_code == 201, r.text
    seeded.tenants[tenant] = r.json()["tenant_id"]
    for role, scopes in roles.items():
        body = {"tenant_id": seeded.tenants[tenant], "name": role, "scopes": scopes}
        if scopes == ["read"]:
            body["ttl_secs"] = 86400  # as the seed's reviewer key: a day
        k = admin.post("/v1/admin/keys", json=body)
        assert k.status_code == 201, k.text
        seeded.keys[role] = k.json()["api_key"]


def _load_project(client: httpx.Client) -> dict[str, str]:
    """The project tenant, with the moved date superseding Monday's (top-level supersedes)."""
    ids = load(client, [row for row in PROJECT if row[0] != "new_date"], MONDAY_9, {})
    name, minutes, kind, text, emb, _props, sources = next(r for r in PROJECT if r[0] == "new_date")
    body: dict[str, Any] = {
        "kind": kind,
        "ts": MONDAY_9 + round(minutes * 60_000_000),
        "text": text,
        "embedding": emb,
        "supersedes": [ids["old_date"]],
        "properties": {"topic": "cutover_date", "source_event_ids": [ids[s] for s in sources]},
    }
    r = client.post("/v1/memory/event", json=body)
    assert r.status_code == 201, r.text
    ids[name] = r.json()["event_id"]
    return ids


def start_seeded(data_dir: Path) -> Seeded:
    """Init a control database, start the server with an admin key, load the tenants."""
    ControlDB.init(data_dir, actor="test:console")
    server = ServerProcess(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    seeded = Seeded(server)
    try:
        with server.client(ADMIN_KEY) as admin:
            _tenant_and_key(
                admin,
                seeded,
                "customer-4417",
                {"agent": ["read", "write"], "reviewer": ["read"], "revoked": ["read"]},
            )
            _tenant_and_key(
                admin, seeded, "purchasing", {"ops": ["read", "write"], "auditor": ["read"]}
            )
            _tenant_and_key(admin, seeded, "billing-ledger", {"assistant": ["read", "write"]})
            _tenant_and_key(admin, seeded, "hostile", {"hostile": ["read", "write"]})
        with seeded.client("agent") as agent:
            seeded.ids["support"] = load(agent, SUPPORT, SUPPORT_TS, {"conversation": "c-1005-01"})
        with seeded.client("ops") as ops:
            seeded.ids["ops"] = load_ops(ops)
        with seeded.client("assistant") as assistant:
            seeded.ids["project"] = _load_project(assistant)
        with seeded.client("hostile") as hostile:
            base = {"kind": HOSTILE_KIND, "ts": SUPPORT_TS, "text": HOSTILE_TEXT}
            r = hostile.post("/v1/memory/event", json=base | {"properties": HOSTILE_PROPERTIES})
            assert r.status_code == 201, r.text
            first = r.json()["event_id"]
            props = {"speaker": "<script>alert('speaker')</script>", "source_event_ids": [first]}
            r = hostile.post(
                "/v1/memory/event",
                json={
                    "kind": "turn",
                    "ts": SUPPORT_TS + 1,
                    "text": HOSTILE_TEXT,
                    "properties": props,
                },
            )
            assert r.status_code == 201, r.text
            seeded.ids["hostile"] = {"first": first, "second": r.json()["event_id"]}
    except BaseException:
        server.stop()
        raise
    return seeded
