"""Control-plane records (msgpack in LMDB) and the validation of what admins send."""

from __future__ import annotations

import re
import time
import unicodedata
import uuid
from collections.abc import Iterable
from typing import Any

import msgspec

from storage.errors import InvalidRequest
from storage.tenants.directory import is_tenant_id

SCOPES = ("read", "write", "audit")  # audit: reads the read records only (docs/audit.md)
DEFAULT_SCOPES = ("read", "write")
MAX_TTL_SECS = 10 * 365 * 86_400
MAX_NAME_BYTES = 128
MAX_QUOTA = 2**62  # max_events, max_bytes, max_memory (bigint columns in PostgreSQL)
MAX_REQUESTS_PER_MINUTE = 1_000_000
LIMITS = ("max_events", "max_bytes", "max_memory")  # what PATCH /v1/admin/tenants/{id} sets


def now_us() -> int:
    """Microseconds since the Unix epoch."""
    return time.time_ns() // 1000


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tenant: its id (a UUIDv4, also its directory name), name and creation time (µs);
    in a cluster, the node that holds it (shown only then); its own limits, when it has them
    (without one, the server's default applies)."""

    tenant_id: str
    name: str
    created_at: int
    node: str | None = None  # None: not placed (one node, or no MEMSPINE_NODE)
    max_events: int | None = None
    max_bytes: int | None = None
    max_memory: int | None = None
    retention: dict[str, int] | None = None  # kind -> days, "*" for the rest (docs/erasure.md)


class HoldRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A legal hold on a tenant (subject None) or on one data subject's events: while it stands
    no retention run, erasure or delete removes what it keeps."""

    hold_id: str
    tenant_id: str
    reason: str
    subject: str | None = None
    placed_at: int
    placed_by: str


class KeyInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What may be shown about a key: no secret and no hash."""

    key_id: str
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    requests_per_minute: int | None = None  # None: the server's default (if any)
    require_purpose: bool = False  # reads without a Memspine-Purpose are refused (400)

    def status(self, now: int) -> str:
        """One of "active", "revoked" or "expired" at time `now` (µs)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"


class KeyCounts(msgspec.Struct, frozen=True, kw_only=True):
    """How many of a tenant's keys are active, revoked and expired."""

    active: int = 0
    revoked: int = 0
    expired: int = 0

    @classmethod
    def of(cls, keys: list[KeyInfo], now: int) -> KeyCounts:
        """The counts of these keys at time `now` (µs)."""
        statuses = [k.status(now) for k in keys]
        return cls(
            active=statuses.count("active"),
            revoked=statuses.count("revoked"),
            expired=statuses.count("expired"),
        )


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A key as stored: KeyInfo's fields plus the argon2id hash of the secret."""

    key_id: str
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    secret_hash: str
    requests_per_minute: int | None = None
    require_purpose: bool = False

    def __repr__(self) -> str:
        # The hash is not the secret, but it is what an offline guesser needs: keep it out of logs.
        return f"KeyRecord(key_id={self.key_id!r}, tenant_id={self.tenant_id!r}, hash=<hidden>)"

    def info(self) -> KeyInfo:
        """The displayable part of the record."""
        fields = msgspec.structs.asdict(self)
        del fields["secret_hash"]
        return KeyInfo(**fields)


class IssuedKey(msgspec.Struct, frozen=True, kw_only=True):
    """A key just created, with its plaintext `api_key`: returned once, never stored."""

    key_id: str
    api_key: str
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None = None
    requests_per_minute: int | None = None
    require_purpose: bool = False

    def __repr__(self) -> str:
        return f"IssuedKey(key_id={self.key_id!r}, tenant_id={self.tenant_id!r}, api_key=<hidden>)"


class ReadMark(msgspec.Struct, frozen=True):
    """A point of a tenant's read chain: a record's seq and the chain value after it."""

    seq: int
    hash: bytes


class AuditEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One admin action: who, what, when, on which tenant or key; never a secret."""

    seq: int
    ts: int
    actor: str
    action: str
    tenant_id: str | None = None
    key_id: str | None = None
    detail: dict[str, Any] = {}


# Before issued keys (local mode) a tenant's directory is named by its token: one of these.
LOCAL_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")


TENANT_ID_DETAIL = "tenant_id must be a UUIDv4, such as 0b5a8a3e-4f4e-4c57-9d4b-8f1e2f3a4b5c"


def check_tenant_id(value: object) -> str:
    """A tenant id an operator chose: a UUIDv4 (any case), in its canonical form."""
    if isinstance(value, str) and len(value) == 36:
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.version == 4 and is_tenant_id(str(parsed)):
            return str(parsed)
    raise InvalidRequest(TENANT_ID_DETAIL)


def check_name(name: object, what: str) -> str:
    """Return `name` if it is a usable tenant or key name, else raise InvalidRequest."""
    if not isinstance(name, str):
        raise InvalidRequest(f"{what} must be a string")
    if not name.strip():
        raise InvalidRequest(f"{what} must not be empty")
    if name != name.strip():
        raise InvalidRequest(f"{what} must not start or end with whitespace")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise InvalidRequest(f"{what} must be at most {MAX_NAME_BYTES} bytes")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise InvalidRequest(f"{what} must not contain control characters")
    return name


def check_scopes(scopes: object) -> tuple[str, ...]:
    """Return the scopes in canonical order without duplicates; InvalidRequest names a bad one."""
    # A bare string would iterate as letters; insist on a list of names.
    if isinstance(scopes, str | bytes) or not isinstance(scopes, Iterable):
        raise InvalidRequest("scopes must be a list of scope names")
    given = list(scopes)
    for scope in given:
        if scope not in SCOPES:
            shown = repr(scope)[:40]  # echo the culprit, but never a megabyte of it
            raise InvalidRequest(f"unknown scope {shown} (known scopes: {', '.join(SCOPES)})")
    if not given:
        raise InvalidRequest("scopes must not be empty")
    return tuple(s for s in SCOPES if s in given)


def check_limit(value: object, what: str, most: int) -> int | None:
    """Return `value` if it is None or a whole number from 1 to `most`, else InvalidRequest."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidRequest(
            f"{what} must be a whole number from 1 to {most}, or null to have none of its own "
            "(none on the command line): the server's default then applies"
        )
    return value


def check_ttl(ttl_secs: object) -> int | None:
    """Return `ttl_secs` if it is None or an integer from 1 s to 10 years, else InvalidRequest."""
    if ttl_secs is None:
        return None
    if isinstance(ttl_secs, bool) or not isinstance(ttl_secs, int):
        raise InvalidRequest("ttl_secs must be an integer number of seconds")
    if not 1 <= ttl_secs <= MAX_TTL_SECS:
        raise InvalidRequest(f"ttl_secs must be between 1 and {MAX_TTL_SECS} (10 years)")
    return ttl_secs
