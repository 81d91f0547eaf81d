"""Issued keys through the API: the app in process over a control database made by the real
`memspine-admin init`, keys hashed at argon2's lowest cost (the verification cost is not the
point here; tests/e2e/test_auth_fairness.py measures it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from memspine.auth import LOCAL_TOKEN_DETAIL
from memspine.verifier import UNAUTHORIZED_DETAIL
from memspine_admin import keys
from tests.support.auth import ADMIN_KEY, Issued, admin_cli
from tests.support.erasure import scan
from tests.support.servers import InProcessServer, cheap_hasher
from tests.support.wait import wait_for

UNAUTHORIZED = {"error": "unauthorized", "detail": UNAUTHORIZED_DETAIL}
NO_ROUTE = {"error": "not_found", "detail": "no such route"}


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issued]:
    """One app for the module: control database from the real CLI, admin key set."""
    data_dir = tmp_path_factory.mktemp("issued") / "data"
    admin_cli(data_dir, "init")
    env = {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}
    server = InProcessServer(data_dir, env, hasher=cheap_hasher()).start()
    yield Issued(server)
    server.stop()


def _append(client: httpx.Client, body: dict[str, Any]) -> str:
    r = client.post("/v1/memory/event", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["event_id"])


def _seed_conversation(agent: httpx.Client) -> dict[str, str]:
    """The seed's disputed delivery: a message, two lookups, the reply citing them, the objection."""
    ts = 1791208900000000
    message = _append(agent, {
        "kind": "turn", "ts": ts, "embedding": [0.2, 0.8, 0.0, 0.0],
        "text": "Customer: order 88213 shows delivered on 1 October but nothing arrived",
        "properties": {"speaker": "customer", "conversation": "c-1005-01"},
    })  # fmt: skip
    order = _append(agent, {
        "kind": "tool_call", "ts": ts + 10_000_000,
        "text": "get_order(88213) -> 1 item, shipped 2026-09-29, carrier ref PX-55790112",
        "properties": {"tool": "get_order"},
    })  # fmt: skip
    track = _append(agent, {
        "kind": "tool_call", "ts": ts + 20_000_000,
        "text": "track_parcel(PX-55790112) -> delivered, signed for at no. 16, 1 Oct 14:12",
        "properties": {"tool": "track_parcel"},
    })  # fmt: skip
    reply = _append(agent, {
        "kind": "turn", "ts": ts + 39_000_000, "embedding": [0.9, 0.1, 0.0, 0.0],
        "text": "Agent: the carrier shows it signed for at number 16, on 1 October at 14:12. "
        "Please check there",
        "properties": {"speaker": "agent", "conversation": "c-1005-01",
                       "source_event_ids": [message, order, track]},
    })  # fmt: skip
    objection = _append(agent, {
        "kind": "turn", "ts": ts + 60_000_000, "embedding": [0.3, 0.7, 0.0, 0.0],
        "text": "Customer: there is no number 16 on my street. I want a refund",
        "properties": {"speaker": "customer", "conversation": "c-1005-01"},
    })  # fmt: skip
    return {
        "message": message,
        "order": order,
        "track": track,
        "reply": reply,
        "objection": objection,
    }


def test_seed_first_session_keys_and_isolation(issued: Issued) -> None:
    """The seed's tenant, agent and reviewer keys, the refused delete and the blind second customer."""
    r = issued.admin.post("/v1/admin/tenants", json={"name": "customer-4417"})
    assert r.status_code == 201
    created = r.json()
    assert set(created) == {"tenant_id", "name"} and created["name"] == "customer-4417"
    tenant = created["tenant_id"]
    assert uuid.UUID(tenant).version == 4

    agent_key = issued.key(tenant, "support-agent")
    assert set(agent_key) == {
        "key_id", "api_key", "tenant_id", "name", "scopes", "expires_at", "requests_per_minute",
        "require_purpose",
    }  # fmt: skip
    assert agent_key["scopes"] == ["read", "write"] and agent_key["expires_at"] is None
    assert agent_key["tenant_id"] == tenant and agent_key["name"] == "support-agent"
    assert keys.parse_token(agent_key["api_key"]).key_id == agent_key["key_id"]  # type: ignore[union-attr]

    before = time.time_ns() // 1000
    review_key = issued.key(tenant, "case-C-5117", scopes=["read"], ttl_secs=86400)
    assert review_key["scopes"] == ["read"]
    assert before + 86_400_000_000 <= review_key["expires_at"] <= before + 86_460_000_000

    agent, review = issued.client(agent_key["api_key"]), issued.client(review_key["api_key"])
    ids = _seed_conversation(agent)

    r = review.post(
        "/v1/memory/recall",
        json={"text": "signed for at number 16", "kind": "turn", "k": 3, "hops": 1},
    )
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits[0]["event_id"] == ids["reply"]
    assert {h["event_id"] for h in hits} <= set(ids.values())

    r = review.delete(f"/v1/memory/event/{ids['reply']}")
    assert (r.status_code, r.text) == (
        403,
        '{"error":"forbidden","detail":"api key is missing the \'write\' scope"}',
    )
    assert review.post("/v1/memory/event", json={"kind": "turn", "text": "x"}).status_code == 403
    assert agent.get(f"/v1/memory/event/{ids['reply']}").status_code == 200

    other_tenant = issued.tenant("customer-5820")
    other = issued.client(issued.key(other_tenant, "support-agent")["api_key"])
    r = other.get(f"/v1/memory/event/{ids['reply']}")
    assert (r.status_code, r.json()) == (
        404,
        {"error": "not_found", "detail": "no event with that id"},
    )
    r = other.post("/v1/memory/recall", json={"text": "order 88213 delivered", "k": 5})
    assert (r.status_code, r.content) == (200, b'{"hits":[]}')
    assert other.get("/v1/memory/events").json()["events"] == []
    assert other.delete(f"/v1/memory/event/{ids['reply']}").status_code == 404
    assert agent.get(f"/v1/memory/event/{ids['reply']}").status_code == 200
    r = agent.post("/v1/memory/recall", json={"text": "order 88213 delivered", "k": 5})
    assert ids["message"] in {h["event_id"] for h in r.json()["hits"]}

    r = review.get("/v1/whoami")
    assert r.json() == {
        "tenant_id": tenant,
        "key_id": review_key["key_id"],
        "scopes": ["read"],
        "expires_at": review_key["expires_at"],
        "requests_per_minute": None,
        # Dimension 4 and no embedder (tests/support/servers.py): the tenant's vectors are its clients'.
        "vector_space": {
            "made_by": "client",
            "model": None,
            "dim": 4,
            "server_embeds": False,
            "unembedded": 0,
        },
    }
    assert other.get("/v1/whoami").json()["tenant_id"] == other_tenant
    # Each tenant is its own directory; nothing of the first customer is in the second's.
    data = issued.server.data_dir
    assert (data / tenant).is_dir() and (data / other_tenant).is_dir()
    assert not scan(data / other_tenant, {"the first's text": b"88213"})


def test_revocation_takes_effect_on_the_next_request(issued: Issued) -> None:
    """Revoked through the route or by the CLI in another process: the very next request is 401."""
    tenant = issued.tenant("revocation")
    first, second, third = (issued.key(tenant, f"k{i}") for i in range(3))
    a, b, c = (issued.client(k["api_key"]) for k in (first, second, third))
    event = _append(a, {"kind": "note", "text": "kept"})
    for client in (a, b, c):  # warm every key
        assert client.get(f"/v1/memory/event/{event}").status_code == 200

    r = issued.admin.delete(f"/v1/admin/keys/{first['key_id']}")
    assert r.status_code == 200 and r.json()["status"] == "revoked"
    r = a.get(f"/v1/memory/event/{event}")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    assert b.get(f"/v1/memory/event/{event}").status_code == 200
    again = issued.admin.delete(f"/v1/admin/keys/{first['key_id']}")
    assert again.status_code == 200 and again.json()["revoked_at"] == _revoked_at(issued, first)

    admin_cli(issued.server.data_dir, "key", "revoke", second["key_id"], "--yes")
    r = b.get(f"/v1/memory/event/{event}")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    assert c.get(f"/v1/memory/event/{event}").status_code == 200


def test_a_key_is_revoked_by_its_id_as_listed(issued: Issued) -> None:
    """Listings show smk_live_<id>: the route takes that form as well as the bare id."""
    tenant = issued.tenant("listed-form")
    key = issued.key(tenant)
    agent = issued.client(key["api_key"])
    assert agent.get("/v1/whoami").status_code == 200
    listed = issued.admin.get("/v1/admin/keys", params={"tenant_id": tenant}).json()["keys"]
    assert listed[0]["prefix"] == f"smk_live_{key['key_id']}"
    whole = issued.admin.delete(f"/v1/admin/keys/{key['api_key']}")
    assert (whole.status_code, whole.json()["error"]) == (400, "invalid_request")
    assert agent.get("/v1/whoami").status_code == 200  # a refused revoke changed nothing
    r = issued.admin.delete(f"/v1/admin/keys/{listed[0]['prefix']}")
    assert r.status_code == 200 and r.json()["key_id"] == key["key_id"]
    assert r.json()["status"] == "revoked"
    assert (agent.get("/v1/whoami").status_code, agent.get("/v1/whoami").json()) == (
        401,
        UNAUTHORIZED,
    )


def _revoked_at(issued: Issued, key: dict[str, Any]) -> int | None:
    """The key's revoked_at as the key listing shows it."""
    listed = issued.admin.get("/v1/admin/keys", params={"tenant_id": key["tenant_id"]}).json()
    return next(k["revoked_at"] for k in listed["keys"] if k["key_id"] == key["key_id"])


def test_expired_key_is_refused(issued: Issued) -> None:
    """A key works until created_at + ttl_secs and is 401 from then on, even while cached."""
    tenant = issued.tenant("expiry")
    short = issued.key(tenant, "short", ttl_secs=4)  # room for a cold argon2 run on a busy machine
    client = issued.client(short["api_key"])
    r = client.get("/v1/whoami")
    assert r.status_code == 200 and r.json()["expires_at"] == short["expires_at"]
    assert client.get("/v1/whoami").status_code == 200  # warm
    time.sleep(max(0.0, short["expires_at"] / 1e6 - time.time()) + 0.05)
    r = client.get("/v1/memory/events")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    listed = issued.admin.get("/v1/admin/keys", params={"tenant_id": tenant}).json()["keys"]
    assert [k["status"] for k in listed] == ["expired"]


def test_tampered_junk_and_crossed_tokens_are_401(issued: Issued) -> None:
    """Every bad token gets the one 401; the admin key is no tenant key and vice versa."""
    tenant = issued.tenant("tamper")
    good = issued.key(tenant)["api_key"]
    parsed = keys.parse_token(good)
    assert parsed is not None
    flipped = good[:-8] + ("A" if good[-8] != "A" else "B") + good[-7:]
    other_secret = keys.format_token(parsed.key_id, keys.random_base62(keys.SECRET_LEN))
    unknown_id = keys.format_token(keys.random_base62(keys.KEY_ID_LEN), parsed.secret)
    bad_tokens: list[str | bytes] = [
        flipped,  # fails the checksum
        other_secret,  # valid checksum, wrong secret: argon2 says no
        unknown_id,
        good[:-1],
        good + "x",
        good.upper(),
        tenant,  # a local-mode token means nothing once keys are issued
        ADMIN_KEY,
        "x" * 600,
        "smk_live_" + "a" * 100_000,
        b"\xff\xfe\x80" + good.encode()[3:],
    ]
    for token in bad_tokens:
        headers = {
            "Authorization": b"Bearer " + (token if isinstance(token, bytes) else token.encode())
        }
        r = issued.server.request("GET", "/v1/memory/events", headers=headers, timeout=30)
        assert (r.status_code, r.json()) == (401, UNAUTHORIZED), token[:40]
    for headers in ({}, {"Authorization": f"Basic {good}"}, {"Authorization": "Bearer"}):
        r = issued.server.request("GET", "/v1/whoami", headers=headers, timeout=30)
        assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    with issued.client(good) as tenant_client:
        for method, path in (("GET", "/v1/admin/tenants"), ("GET", "/v1/admin/audit")):
            r = tenant_client.request(method, path)
            assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
        assert tenant_client.get("/v1/whoami").status_code == 200  # the server took it all
    r = issued.admin.get("/v1/memory/events")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)


def test_listings_and_audit_leak_nothing_and_record_every_change(issued: Issued) -> None:
    """Key listings and the audit log hold ids and names only; every admin change is one entry."""
    tenant = issued.tenant("audited")
    made = [issued.key(tenant, "writer"), issued.key(tenant, "reader", scopes=["read"])]
    issued.admin.delete(f"/v1/admin/keys/{made[1]['key_id']}")
    secrets = [m["api_key"] for m in made] + [keys.parse_token(m["api_key"]).secret for m in made]  # type: ignore[union-attr]

    for params in ({}, {"tenant_id": tenant}):
        r = issued.admin.get("/v1/admin/keys", params=params)
        assert r.status_code == 200
        assert not any(s in r.text for s in secrets) and "argon2" not in r.text
        for k in r.json()["keys"]:
            assert set(k) == {
                "key_id", "prefix", "tenant_id", "name", "scopes",
                "created_at", "expires_at", "revoked_at", "status", "requests_per_minute",
                "require_purpose",
            }  # fmt: skip
    mine = issued.admin.get("/v1/admin/keys", params={"tenant_id": tenant}).json()["keys"]
    assert [(k["name"], k["status"]) for k in mine] == [("writer", "active"), ("reader", "revoked")]

    r = issued.admin.delete(f"/v1/admin/tenants/{tenant}")
    assert r.json() == {
        "tenant_id": tenant, "deleted": True, "revoked_keys": [made[0]["key_id"]], "erased": False,
    }  # fmt: skip

    entries, cursor, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 2, "tenant_id": tenant}
        if cursor is not None:
            params["cursor"] = cursor
        r = issued.admin.get("/v1/admin/audit", params=params)
        assert r.status_code == 200
        assert not any(s in r.text for s in secrets) and "argon2" not in r.text
        entries += r.json()["entries"]
        cursor, pages = r.json()["next_cursor"], pages + 1
        if cursor is None:
            break
    assert pages >= 3
    assert [(e["action"], e["key_id"]) for e in entries] == [
        ("tenant.create", None),
        ("key.create", made[0]["key_id"]),
        ("key.create", made[1]["key_id"]),
        ("key.revoke", made[1]["key_id"]),
        ("tenant.delete", None),
    ]
    assert {e["actor"] for e in entries} == {"admin-api"}
    assert entries[-1]["detail"] == {"name": "audited", "revoked_keys": [made[0]["key_id"]]}
    first = issued.admin.get("/v1/admin/audit", params={"limit": 1}).json()["entries"][0]
    assert first["action"] == "control.init" and first["actor"].startswith("cli:")
    control_bytes = b"".join(
        p.read_bytes() for p in (issued.server.data_dir / "_control").iterdir()
    )
    assert not any(s.encode() in control_bytes for s in secrets)


def test_tenant_deletion_revokes_and_erases(issued: Issued) -> None:
    """Deleting a tenant that holds events: its keys stop at once and its directory is gone."""
    tenant = issued.tenant("doomed")
    key = issued.key(tenant)
    client = issued.client(key["api_key"])
    event = _append(client, {"kind": "note", "text": "door code 4471"})
    assert (issued.server.data_dir / tenant).is_dir()
    r = issued.admin.delete(f"/v1/admin/tenants/{tenant}")
    assert r.status_code == 200 and r.json()["erased"] is True
    assert r.json()["revoked_keys"] == [key["key_id"]]
    r = client.get(f"/v1/memory/event/{event}")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    assert not (issued.server.data_dir / tenant).exists()
    assert not [p for p in issued.server.data_dir.iterdir() if p.name.startswith(".erasing-")]
    tenants = issued.admin.get("/v1/admin/tenants").json()["tenants"]
    assert tenant not in {t["tenant_id"] for t in tenants}
    assert issued.admin.delete(f"/v1/admin/tenants/{tenant}").status_code == 404
    assert issued.tenant("doomed") != tenant  # the name is free again


def test_bad_admin_input(issued: Issued) -> None:
    """Unknown tenant 404, unknown scope 400 naming it, ttl out of range 400, duplicate name 409."""
    tenant = issued.tenant("bad-input")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"tenant_id": str(uuid.uuid4()), "name": "k"}, 404, "no tenant with that id"),
        ({"tenant_id": "../../etc", "name": "k"}, 404, "no tenant with that id"),
        ({"tenant_id": tenant, "name": "k", "scopes": ["read", "admin"]}, 400, "'admin'"),
        ({"tenant_id": tenant, "name": "k", "scopes": []}, 400, "must not be empty"),
        ({"tenant_id": tenant, "name": "k", "ttl_secs": 0}, 400, "ttl_secs"),
        ({"tenant_id": tenant, "name": "k", "ttl_secs": -5}, 400, "ttl_secs"),
        ({"tenant_id": tenant, "name": "k", "ttl_secs": 10**12}, 400, "ttl_secs"),
        ({"tenant_id": tenant, "name": "k", "ttl_secs": 1.5}, 400, "ttl_secs"),
        ({"tenant_id": tenant, "name": "k", "owner": "x"}, 400, "owner"),
        ({"tenant_id": tenant}, 400, "name"),
    ]
    for body, status, fragment in cases:
        r = issued.admin.post("/v1/admin/keys", json=body)
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error", "detail"} and fragment in r.json()["detail"]
    r = issued.admin.post("/v1/admin/tenants", json={"name": "bad-input"})
    assert r.status_code == 409 and tenant in r.json()["detail"]
    assert issued.admin.post("/v1/admin/tenants", json={"name": " "}).status_code == 400
    assert issued.admin.post("/v1/admin/tenants", content=b"{").status_code == 400
    assert issued.admin.get("/v1/admin/keys", params={"tenant_id": "nope"}).status_code == 404
    assert issued.admin.delete("/v1/admin/keys/nope").status_code == 404
    assert issued.admin.get("/v1/admin/audit", params={"cursor": "!!"}).status_code == 400
    assert issued.admin.get("/v1/admin/audit", params={"limit": 1001}).status_code == 400
    assert issued.admin.get("/v1/admin/tenants", params={"x": 1}).status_code == 400
    keys_now = issued.admin.get("/v1/admin/keys", params={"tenant_id": tenant}).json()["keys"]
    assert keys_now == []  # nothing was issued by a refused request


def test_admin_routes_are_404_without_an_admin_key(start_server: Any) -> None:
    """Without MEMSPINE_ADMIN_KEY the admin routes do not exist; local mode is untouched."""
    server = start_server()
    with server.client("anything-at-all-0123") as c:
        for method, path in (
            ("POST", "/v1/admin/tenants"),
            ("GET", "/v1/admin/tenants"),
            ("DELETE", f"/v1/admin/tenants/{uuid.uuid4()}"),
            ("POST", "/v1/admin/keys"),
            ("GET", "/v1/admin/keys"),
            ("DELETE", "/v1/admin/keys/abcdefghijkl"),
            ("GET", "/v1/admin/audit"),
        ):
            r = c.request(method, path)
            assert (r.status_code, r.json()) == (404, NO_ROUTE), (method, path)
    with server.client("t1") as c:
        assert c.get("/v1/whoami").json() == {
            "tenant_id": "t1", "key_id": "local", "scopes": ["read", "write"], "expires_at": None,
            "requests_per_minute": None, "vector_space": {
                "made_by": "none", "model": None, "dim": 4, "server_embeds": False, "unembedded": 0,
            },
        }  # fmt: skip
    r = server.request("GET", "/v1/whoami", headers={"Authorization": "Bearer ../t1"})
    assert (r.status_code, r.json()["detail"]) == (401, LOCAL_TOKEN_DETAIL)  # no secret to hide


def test_admin_key_before_and_after_init(start_server: Any, tmp_path: Path) -> None:
    """409 until memspine-admin init runs beside the live server; then issued keys only."""
    server = start_server(env={"MEMSPINE_ADMIN_KEY": ADMIN_KEY}, hasher=cheap_hasher())
    admin = server.client(ADMIN_KEY)
    r = admin.get("/v1/admin/tenants")
    assert (r.status_code, r.json()) == (
        409,
        {"error": "conflict", "detail": "no control database: run memspine-admin init"},
    )
    local = server.client("t1")
    assert local.post("/v1/memory/event", json={"kind": "note", "text": "x"}).status_code == 201
    r = admin.get("/v1/memory/events")  # the admin key is never a tenant
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)

    admin_cli(server.data_dir, "init")
    r = admin.post("/v1/admin/tenants", json={"name": "first"})
    assert r.status_code == 201
    tenant = r.json()["tenant_id"]
    wait_for(lambda: local.get("/v1/memory/events").status_code != 200, "local mode ends")
    r = local.get("/v1/memory/events")
    assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
    r = admin.post("/v1/admin/keys", json={"tenant_id": tenant, "name": "k"})
    with server.client(r.json()["api_key"]) as c:
        assert c.get("/v1/whoami").json()["tenant_id"] == tenant
