"""The Python client of the memspine HTTP API (docs/python.md): `Memspine` and `AsyncMemspine`
for a tenant's key, `MemspineAdmin` and `AsyncMemspineAdmin` for the admin key.

It needs httpx, msgspec and anyio and nothing of the server (tests/storage/test_import_rule.py).
"""

from __future__ import annotations

from memspine.client.aio import AsyncMemspine, AsyncMemspineAdmin
from memspine.client.errors import (
    APIError,
    Conflict,
    ConnectionFailed,
    EmbeddingMismatch,
    Forbidden,
    IdempotencyMismatch,
    InternalError,
    InvalidRequest,
    MemspineClientError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RequestTimeout,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from memspine.client.models import (
    Appended,
    AuditEntry,
    AuditPage,
    CypherResult,
    Deleted,
    Event,
    EventPage,
    Health,
    Hit,
    IssuedKey,
    Key,
    RecallResult,
    Tenant,
    TenantDeleted,
    Walk,
    WhoAmI,
    Withheld,
    WouldDelete,
)
from memspine.client.retry import NEVER, Retry
from memspine.client.sync import Memspine, MemspineAdmin

__all__ = [
    "NEVER",
    "APIError",
    "Appended",
    "AsyncMemspine",
    "AsyncMemspineAdmin",
    "AuditEntry",
    "AuditPage",
    "Conflict",
    "ConnectionFailed",
    "CypherResult",
    "Deleted",
    "EmbeddingMismatch",
    "Event",
    "EventPage",
    "Forbidden",
    "Health",
    "Hit",
    "IdempotencyMismatch",
    "InternalError",
    "InvalidRequest",
    "IssuedKey",
    "Key",
    "Memspine",
    "MemspineAdmin",
    "MemspineClientError",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RecallResult",
    "RequestTimeout",
    "Retry",
    "Tenant",
    "TenantDeleted",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "Walk",
    "WhoAmI",
    "Withheld",
    "WouldDelete",
]
