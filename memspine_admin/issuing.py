"""Issuing a key, the part both control planes share: checks, the secret, its hash, the records.

A backend (memspine_admin/control.py, memspine_admin/control_pg.py) checks the request, finds
the tenant's route, drafts the key outside its write transaction (argon2 is slow and writers are
serialised), stores `draft.record()` under a key id no other key has, and returns
`draft.issued()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from argon2 import PasswordHasher

from memspine_admin import keys
from memspine_admin.records import (
    MAX_REQUESTS_PER_MINUTE,
    IssuedKey,
    KeyRecord,
    check_limit,
    check_name,
    check_scopes,
    check_ttl,
)


def check_rate(requests_per_minute: object) -> int | None:
    """A key's requests_per_minute: None (the server's default) or 1 to a million."""
    return check_limit(requests_per_minute, "requests_per_minute", MAX_REQUESTS_PER_MINUTE)


class KeyRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an admin asked for, checked: a key's name, scopes, lifetime and rate."""

    name: str
    scopes: tuple[str, ...]
    ttl_secs: int | None
    requests_per_minute: int | None
    require_purpose: bool = False

    @classmethod
    def check(
        cls,
        name: object,
        scopes: Iterable[str],
        ttl_secs: object,
        requests_per_minute: object,
        require_purpose: bool = False,
    ) -> KeyRequest:
        """The request if every part is valid, else InvalidRequest naming the bad part."""
        return cls(
            name=check_name(name, "name"),
            scopes=check_scopes(scopes),
            ttl_secs=check_ttl(ttl_secs),
            requests_per_minute=check_rate(requests_per_minute),
            require_purpose=bool(require_purpose),
        )

    def draft(self, tenant_id: str, route: str, hasher: PasswordHasher, now: int) -> KeyDraft:
        """A new key for the tenant with this route, created at `now` (µs): id, secret, hash."""
        generated = keys.generate_key(route)
        return KeyDraft(
            request=self,
            tenant_id=tenant_id,
            route=route,
            generated=generated,
            secret_hash=keys.hash_secret(hasher, generated.secret),
            created_at=now,
            expires_at=None if self.ttl_secs is None else now + self.ttl_secs * 1_000_000,
        )


class KeyDraft(msgspec.Struct, frozen=True, kw_only=True):
    """A key made but not yet stored; `key_id` may still change if another key holds it."""

    request: KeyRequest
    tenant_id: str
    route: str
    generated: keys.GeneratedKey
    secret_hash: str
    created_at: int
    expires_at: int | None

    @property
    def key_id(self) -> str:
        """The id this key will be stored under."""
        return self.generated.key_id

    def with_new_key_id(self) -> KeyDraft:
        """The same key under a fresh id with the same route (after an id collision)."""
        fresh = keys.with_new_key_id(self.generated, self.route)
        return msgspec.structs.replace(self, generated=fresh)

    def record(self) -> KeyRecord:
        """The record to store: the hash, never the secret."""
        return KeyRecord(
            key_id=self.key_id,
            tenant_id=self.tenant_id,
            name=self.request.name,
            scopes=self.request.scopes,
            created_at=self.created_at,
            expires_at=self.expires_at,
            secret_hash=self.secret_hash,
            requests_per_minute=self.request.requests_per_minute,
            require_purpose=self.request.require_purpose,
        )

    def issued(self) -> IssuedKey:
        """What the caller gets, once: the record's fields and the plaintext token."""
        return IssuedKey(
            key_id=self.key_id,
            api_key=self.generated.token,
            tenant_id=self.tenant_id,
            name=self.request.name,
            scopes=self.request.scopes,
            created_at=self.created_at,
            expires_at=self.expires_at,
            requests_per_minute=self.request.requests_per_minute,
            require_purpose=self.request.require_purpose,
        )

    def audit_detail(self) -> dict[str, Any]:
        """What the audit log records of the key's creation (its rate only when it has one)."""
        request = self.request
        detail: dict[str, Any] = {
            "name": request.name,
            "scopes": list(request.scopes),
            "expires_at": self.expires_at,
        }
        if request.requests_per_minute is not None:
            detail["requests_per_minute"] = request.requests_per_minute
        if request.require_purpose:
            detail["require_purpose"] = True
        return detail
