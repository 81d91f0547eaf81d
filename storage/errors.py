"""One error root for the engine: each class carries its HTTP status and error code, and
`ERRORS` is the one table of every (status, code) a client may meet (docs/api.md's table, the
OpenAPI document's Error schema and the Python client's classes are tested against it:
tests/server/test_error_codes.py)."""

from __future__ import annotations


class MemspineError(Exception):
    """Root of every error a client may see; rendered as {"error": code, "detail": sentence}."""

    status: int = 500
    code: str = "internal"
    headers: dict[str, str] = {}  # noqa: RUF012 -- never mutated: an instance sets its own

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if headers:
            self.headers = headers


class InvalidRequest(MemspineError):
    """The request is malformed or out of range (400)."""

    status = 400
    code = "invalid_request"


class Unauthorized(MemspineError):
    """No usable credentials (401); one message for every cause."""

    status = 401
    code = "unauthorized"


class Forbidden(MemspineError):
    """The key lacks a scope (403)."""

    status = 403
    code = "forbidden"


class NotFound(MemspineError):
    """Unknown id, or an id that belongs to another tenant (404)."""

    status = 404
    code = "not_found"


class Conflict(MemspineError):
    """The request conflicts with work in progress or with server state (409)."""

    status = 409
    code = "conflict"


class LegalHold(Conflict):
    """A legal hold keeps what a deletion would remove (409); the detail names the hold."""

    code = "legal_hold"

    def __init__(self, detail: str, *, hold_id: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.hold_id = hold_id


class MethodNotAllowed(MemspineError):
    """A known route with another method (405)."""

    status = 405
    code = "method_not_allowed"


class RequestTimeout(MemspineError):
    """The request did not arrive in time (408); the connection is closed after the answer."""

    status = 408
    code = "request_timeout"


class Misdirected(MemspineError):
    """The request reached a node that does not hold its tenant (421)."""

    status = 421
    code = "misdirected"


class HeadersTooLarge(InvalidRequest):
    """A request line and headers over 64 KiB (431, answered by memspine/connguard.py)."""

    status = 431


class PayloadTooLarge(MemspineError):
    """The body exceeds MEMSPINE_MAX_BODY_BYTES (413)."""

    status = 413
    code = "payload_too_large"


class IdempotencyMismatch(MemspineError):
    """Same Idempotency-Key, different body (422)."""

    status = 422
    code = "idempotency_mismatch"


class EmbeddingMismatch(MemspineError):
    """Embedding length or model differs from what the tenant recorded (422)."""

    status = 422
    code = "embedding_mismatch"


class QuotaExceeded(MemspineError):
    """A write would take the tenant past one of its limits (403); `limit` names it
    (max_events or max_bytes). Reads and deletes are never refused for it."""

    status = 403
    code = "quota_exceeded"

    def __init__(self, detail: str, *, limit: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.limit = limit


class TooManyRequests(MemspineError):
    """Too many requests: failed attempts for one key id, or a key over its requests per
    minute; wait `Retry-After` seconds (429)."""

    status = 429
    code = "too_many_requests"


class Unavailable(MemspineError):
    """Every open tenant slot is busy (503)."""

    status = 503
    code = "unavailable"


class DiskFull(Unavailable):
    """The data directory's filesystem is full (503 with Retry-After): the detail says what was
    not done; nothing acknowledged before is lost, and the server recovers once space is freed."""

    RETRY_AFTER_SECS = 30

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers or {"Retry-After": str(self.RETRY_AFTER_SECS)})


class CypherSyntaxError(InvalidRequest):
    """A Cypher query that does not parse; the detail names line and column."""

    def __init__(self, message: str, *, line: int, col: int, query: str = "") -> None:
        self.line = line
        self.col = col
        detail = f"{message} (line {line}, column {col})"
        if query:
            lines = query.split("\n")  # as the parser counts lines: \r and U+2028 do not end one
            if 1 <= line <= len(lines):
                detail += "\n" + lines[line - 1] + "\n" + " " * max(col - 1, 0) + "^"
        super().__init__(detail)


# Every (status, code) a client may meet, by status: the root itself is 500 `internal`.
ERRORS: tuple[type[MemspineError], ...] = (
    InvalidRequest,
    Unauthorized,
    Forbidden,
    QuotaExceeded,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    Conflict,
    LegalHold,
    PayloadTooLarge,
    Misdirected,
    IdempotencyMismatch,
    EmbeddingMismatch,
    TooManyRequests,
    HeadersTooLarge,
    MemspineError,
    Unavailable,
)
CODES: tuple[str, ...] = tuple(dict.fromkeys(cls.code for cls in ERRORS))
