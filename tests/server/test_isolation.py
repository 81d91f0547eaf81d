"""A state machine over two tenants and their keys: no request ever sees or changes another tenant's data.

Runs in-process through the Litestar app (the real HTTP stack) on real LMDB, Tantivy and hnswlib
in a temporary directory, with a cheap argon2id profile and a clock the machine moves forward.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    multiple,
    precondition,
    rule,
)
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.auth import Authenticator
from memspine.config import Settings
from memspine_admin.control import ControlDB
from tests.support.budget import size
from tests.support.control import CHEAP_HASHER

ADMIN_KEY = "isolation-admin-key-0042"
# Still argon2id through the same code path; the default profile would spend the test's budget.
WORDS = ("parcel", "refund", "door", "carrier")
SCOPE_SETS = (("read",), ("write",), ("read", "write"))
UNAUTHORIZED = {"error": "unauthorized", "detail": "invalid or expired api key"}
NO_EVENT = {"error": "not_found", "detail": "no event with that id"}


class Clock:
    """Microseconds since the epoch that only move when the machine says so."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1000

    def __call__(self) -> int:
        return self.now


@dataclass
class Key:
    """What the model knows of an issued key."""

    token: str
    key_id: str
    tenant: int
    scopes: tuple[str, ...]
    expires_at: int | None
    revoked: bool = False


@dataclass(frozen=True)
class Event:
    """An event some request created, and the tenant it was written to."""

    event_id: str
    tenant: int


class IsolationMachine(RuleBasedStateMachine):
    """Two tenants, keys with every scope set, revocation, expiry, appends, reads and deletes."""

    keys = Bundle("keys")
    events = Bundle("events")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memspine-isolation-"))
        ControlDB.init(self.dir, actor="test")
        self.clock = Clock()
        config = Settings(data_dir=self.dir, admin_key=ADMIN_KEY, embedding_dim=4)
        auth = Authenticator(self.dir, ADMIN_KEY, hasher=CHEAP_HASHER, clock=self.clock)
        self.client = TestClient(create_app(config, auth=auth))
        self.client.__enter__()
        self.admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        self.tenant_ids = [self._create_tenant(name) for name in ("tenant-a", "tenant-b")]
        # Never revoked and never expiring: the machine's own view of each tenant.
        self.masters = [self._issue(t, ("read", "write"), None) for t in (0, 1)]
        self.live: list[dict[str, str]] = [{}, {}]  # per tenant: event id -> text
        self.counter = 0

    def teardown(self) -> None:
        self.client.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------

    def _create_tenant(self, name: str) -> str:
        r = self.client.post("/v1/admin/tenants", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        return str(r.json()["tenant_id"])

    def _issue(self, tenant: int, scopes: tuple[str, ...], ttl: int | None) -> Key:
        body: dict[str, Any] = {"tenant_id": self.tenant_ids[tenant], "name": "k"}
        body["scopes"] = list(scopes)
        if ttl is not None:
            body["ttl_secs"] = ttl
        r = self.client.post("/v1/admin/keys", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        out = r.json()
        return Key(out["api_key"], out["key_id"], tenant, tuple(out["scopes"]), out["expires_at"])

    def _usable(self, key: Key) -> bool:
        return not key.revoked and (key.expires_at is None or self.clock.now < key.expires_at)

    def _expect_refusal(self, key: Key, scope: str, response: Any) -> bool:
        """Check a 401/403 when the key may not do this; True if the request was refused."""
        if not self._usable(key):
            assert (response.status_code, response.json()) == (401, UNAUTHORIZED)
            return True
        if scope not in key.scopes:
            assert response.status_code == 403, response.text
            assert response.json()["detail"] == f"api key is missing the '{scope}' scope"
            return True
        return False

    def _auth(self, key: Key) -> dict[str, str]:
        return {"Authorization": f"Bearer {key.token}"}

    # -- rules -----------------------------------------------------------------------------

    @initialize(target=keys)
    def first_keys(self) -> Any:
        return multiple(*(self._issue(t, ("read", "write"), None) for t in (0, 1)))

    @rule(
        target=keys,
        tenant=st.sampled_from((0, 1)),
        scopes=st.sampled_from(SCOPE_SETS),
        ttl=st.none() | st.integers(1, 120),
    )
    def create_key(self, tenant: int, scopes: tuple[str, ...], ttl: int | None) -> Key:
        return self._issue(tenant, scopes, ttl)

    @rule(key=keys)
    def revoke(self, key: Key) -> None:
        r = self.client.delete(f"/v1/admin/keys/{key.key_id}", headers=self.admin)
        assert r.status_code == 200 and r.json()["status"] == "revoked"
        key.revoked = True

    @rule(secs=st.integers(1, 90))
    def let_time_pass(self, secs: int) -> None:
        self.clock.now += secs * 1_000_000

    @rule(target=events, key=keys, word=st.sampled_from(WORDS))
    def append(self, key: Key, word: str) -> Any:
        self.counter += 1
        text = f"{word} note{self.counter}"
        r = self.client.post(
            "/v1/memory/event", json={"kind": "note", "text": text}, headers=self._auth(key)
        )
        if self._expect_refusal(key, "write", r):
            return multiple()
        assert r.status_code == 201, r.text
        event_id = r.json()["event_id"]
        for other in self.live:
            assert event_id not in other
        self.live[key.tenant][event_id] = text
        return Event(event_id, key.tenant)

    @rule(key=keys, event=events)
    def read(self, key: Key, event: Event) -> None:
        r = self.client.get(f"/v1/memory/event/{event.event_id}", headers=self._auth(key))
        if self._expect_refusal(key, "read", r):
            return
        text = self.live[key.tenant].get(event.event_id)
        if text is None:  # another tenant's, or deleted: the same 404 either way
            assert (r.status_code, r.json()) == (404, NO_EVENT)
        else:
            assert r.status_code == 200 and r.json()["text"] == text

    @rule(key=keys, event=events)
    def delete(self, key: Key, event: Event) -> None:
        r = self.client.delete(f"/v1/memory/event/{event.event_id}", headers=self._auth(key))
        if self._expect_refusal(key, "write", r):
            return
        if self.live[key.tenant].pop(event.event_id, None) is None:
            assert (r.status_code, r.json()) == (404, NO_EVENT)
        else:
            assert r.status_code == 200 and r.json()["deleted"] is True
            assert r.json().get("deleted_ids", [event.event_id]) == [event.event_id]

    @rule(key=keys)
    def list_events(self, key: Key) -> None:
        r = self.client.get("/v1/memory/events", params={"limit": 1000}, headers=self._auth(key))
        if self._expect_refusal(key, "read", r):
            return
        assert {e["event_id"] for e in r.json()["events"]} == set(self.live[key.tenant])

    @rule(key=keys, word=st.sampled_from(WORDS))
    def recall(self, key: Key, word: str) -> None:
        body = {"text": word, "k": 100}
        r = self.client.post("/v1/memory/recall", json=body, headers=self._auth(key))
        if self._expect_refusal(key, "read", r):
            return
        expected = {i for i, text in self.live[key.tenant].items() if text.startswith(word + " ")}
        assert {h["event_id"] for h in r.json()["hits"]} == expected

    @rule(key=keys)
    def whoami(self, key: Key) -> None:
        r = self.client.get("/v1/whoami", headers=self._auth(key))
        if not self._usable(key):
            assert (r.status_code, r.json()) == (401, UNAUTHORIZED)
            return
        assert r.json()["tenant_id"] == self.tenant_ids[key.tenant]
        assert tuple(r.json()["scopes"]) == key.scopes

    @precondition(lambda self: any(self.live))
    @rule(tenant=st.sampled_from((0, 1)))
    def tenant_holds_exactly_its_events(self, tenant: int) -> None:
        master = self.masters[tenant]
        r = self.client.get("/v1/memory/events", params={"limit": 1000}, headers=self._auth(master))
        assert r.status_code == 200
        listed = {e["event_id"]: e["text"] for e in r.json()["events"]}
        assert listed == self.live[tenant]


IsolationMachine.TestCase.settings = settings(
    max_examples=size(30, 10),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestIsolation = pytest.mark.long(IsolationMachine.TestCase)
