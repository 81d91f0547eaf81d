"""One function renders every error as {"error": code, "detail": sentence}; nothing else leaks."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException

from storage import names_full_disk
from storage.errors import MemspineError, Unavailable

log = logging.getLogger("memspine.errors")

# Litestar's own HTTP errors, by status, as (code, detail) in our vocabulary.
HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("invalid_request", "the request is malformed"),
    401: ("unauthorized", "invalid or expired api key"),
    403: ("forbidden", "this key may not do that"),
    404: ("not_found", "no such route"),
    405: ("method_not_allowed", "this route does not take that method"),
    413: ("payload_too_large", "the request body is larger than MEMSPINE_MAX_BODY_BYTES"),
    415: ("invalid_request", "send the body as application/json"),
    429: ("too_many_requests", "slow down"),
    503: ("unavailable", "the server is busy; retry shortly"),
}


def error_body(code: str, detail: str) -> bytes:
    """The error body as JSON bytes, for answers sent without Litestar (memspine/hot.py)."""
    return msgspec.json.encode({"error": code, "detail": detail})


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> Response[Any]:
    """The error body every route uses."""
    return Response(
        content={"error": code, "detail": detail},
        status_code=status,
        headers=headers or {},
        media_type="application/json",
    )


def handle_memspine_error(_request: Request[Any, Any, Any], exc: MemspineError) -> Response[Any]:
    """Our own errors carry their status, code and a sentence written for the caller."""
    return error_response(exc.status, exc.code, exc.detail, exc.headers)


def handle_http_exception(_request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's errors (unknown route, wrong method, body too large) in our shape, without internals."""
    status = exc.status_code
    if isinstance(exc, NotAuthorizedException):
        status = 401
    code, detail = HTTP_CODES.get(
        status, ("invalid_request" if status < 500 else "internal", "request failed")
    )
    if isinstance(exc, ValidationException) and exc.detail:
        detail = str(exc.detail)
    headers = dict(exc.headers or {})
    if status == 405 and "allow" not in {k.lower() for k in headers}:
        headers = {}
    return error_response(status, code, detail, headers)


def unexpected_error(exc: BaseException) -> MemspineError:
    """What a client is told of a failure that is not ours: a full disk (503) or an internal error.

    The failure is logged here with its traceback; the client hears nothing about it.
    """
    if names_full_disk(exc) or "MDB_MAP_FULL" in str(exc):
        # The transaction was aborted, so nothing was acknowledged; the caller may retry later.
        log.error("disk full: request refused, nothing written")
        return Unavailable(
            "the server is out of disk space; nothing was written", headers={"Retry-After": "60"}
        )
    log.error("unhandled %s", type(exc).__name__, exc_info=exc)
    return MemspineError("the server failed to handle this request")


def handle_unexpected(_request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A bug or a failing disk: log it with its traceback, tell the client nothing about it."""
    error = unexpected_error(exc)
    return error_response(error.status, error.code, error.detail, error.headers)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    MemspineError: handle_memspine_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
