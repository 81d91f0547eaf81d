"""What the client raises: one class per error code of the API, and one for no answer at all."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

import msgspec


class MemspineClientError(Exception):
    """Root of everything the client raises."""


class ConnectionFailed(MemspineClientError):
    """No answer came: the server was unreachable, or the connection broke before its answer."""

    def __init__(self, detail: str, *, attempts: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.attempts = attempts


class APIError(MemspineClientError):
    """The server answered with an error: its status, its code and its sentence.

    `retry_after` is the wait in seconds the answer asked for (or None), `request_id` the
    X-Request-Id the server's log line carries.
    """

    status: int = 0
    code: str = "unknown"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, detail={self.detail!r})"


class InvalidRequest(APIError):
    """400: malformed or out of range; the detail names the field and what to send."""

    status, code = 400, "invalid_request"


class Unauthorized(APIError):
    """401: no key, or one the server does not accept."""

    status, code = 401, "unauthorized"


class Forbidden(APIError):
    """403: the key lacks the route's scope, or the request's Origin or Host is refused."""

    status, code = 403, "forbidden"


class QuotaExceeded(APIError):
    """403: the tenant is at one of its limits; the detail names it."""

    status, code = 403, "quota_exceeded"


class NotFound(APIError):
    """404: unknown id (or another tenant's), or no such route."""

    status, code = 404, "not_found"


class MethodNotAllowed(APIError):
    """405: a known route with another method."""

    status, code = 405, "method_not_allowed"


class RequestTimeout(APIError):
    """408: the request did not arrive in time."""

    status, code = 408, "request_timeout"


class Conflict(APIError):
    """409: the same Idempotency-Key is still being written, or the admin request conflicts."""

    status, code = 409, "conflict"


class LegalHold(Conflict):
    """409: a delete refused because a legal hold covers the event; the detail names the hold."""

    status, code = 409, "legal_hold"


class PayloadTooLarge(APIError):
    """413: the body is over the server's MEMSPINE_MAX_BODY_BYTES."""

    status, code = 413, "payload_too_large"


class Misdirected(APIError):
    """421: in a cluster, a node that does not hold the key's tenant: send to the proxy."""

    status, code = 421, "misdirected"


class HeadersTooLarge(InvalidRequest):
    """431: the request line and headers are over 64 KiB."""

    status = 431


class IdempotencyMismatch(APIError):
    """422: the Idempotency-Key was used before with another body."""

    status, code = 422, "idempotency_mismatch"


class EmbeddingMismatch(APIError):
    """422: the embedding's length or model is not the tenant's."""

    status, code = 422, "embedding_mismatch"


class TooManyRequests(APIError):
    """429: slow down for `retry_after` seconds."""

    status, code = 429, "too_many_requests"


class InternalError(APIError):
    """500: a bug in the server (its log has the traceback)."""

    status, code = 500, "internal"


class Unavailable(APIError):
    """503: busy or out of disk; nothing was done, retry after `retry_after` seconds."""

    status, code = 503, "unavailable"


class UnexpectedAnswer(APIError):
    """A successful status whose body is not what the route answers (a proxy's page, say)."""

    code = "unexpected_answer"


class BrokenExport(UnexpectedAnswer):
    """An export that was cut short or does not match its trailer: not a whole export."""

    code = "broken_export"


CLASSES: tuple[type[APIError], ...] = (
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
    InternalError,
    Unavailable,
)
# HeadersTooLarge shares its code with InvalidRequest: a body's code names InvalidRequest.
BY_CODE: dict[str, type[APIError]] = {
    cls.code: cls for cls in CLASSES if cls is not HeadersTooLarge
}
# An answer without the API's error body (a proxy's page, say): the class its status stands for.
BY_STATUS: dict[int, type[APIError]] = {
    cls.status: cls for cls in CLASSES if cls not in (QuotaExceeded, IdempotencyMismatch, LegalHold)
}


class _Body(msgspec.Struct):
    error: str
    detail: str


def retry_after(value: str | None) -> float | None:
    """The seconds a Retry-After header asks for (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from(status: int, headers: Mapping[str, str], content: bytes) -> APIError:
    """The APIError an error answer stands for, chosen by its code (or its status, when the
    body is not the API's `{"error", "detail"}`)."""
    wait = retry_after(headers.get("retry-after"))
    request_id = headers.get("x-request-id")
    try:
        body = msgspec.json.decode(content, type=_Body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        cls = BY_STATUS.get(status, APIError)
        code = None if cls is not APIError else f"http_{status}"
        detail = f"the server answered HTTP {status} without an error body of the memspine API"
        return cls(detail, status=status, code=code, retry_after=wait, request_id=request_id)
    cls = BY_CODE.get(body.error, APIError)
    return cls(body.detail, status=status, code=body.error, retry_after=wait, request_id=request_id)
