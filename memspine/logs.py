"""Structured logs: JSON lines on stderr, and one line per request with its id, route and outcome."""

from __future__ import annotations

import itertools
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import IO, Any, cast

import msgspec
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

request_log = logging.getLogger("memspine.request")

REQUEST_ID_HEADER = "x-request-id"
# A caller's own request id is echoed only if it is short and plain; anything else is replaced.
_CALLER_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# Routes polled by machines: their successes are logged at DEBUG so they do not drown the rest.
QUIET_ROUTES = frozenset({"/health", "/metrics"})
UNMATCHED = "unmatched"
# Methods are reported as sent only from this set: a label must not take any value a client picks.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_FRAMES = 20

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What one HTTP request did: never a key, a body or a query string."""

    request_id: str
    method: str
    route: str  # the route template, e.g. /v1/memory/event/{event_id:str}; never the raw path
    status: int
    duration: float  # seconds
    tenant_id: str | None = None
    key_id: str | None = None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields.

    An exception is logged as its type and stack frames, not its message, which may quote data.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                out[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, _exc, tb = record.exc_info
            out["exc_type"] = exc_type.__name__
            frames = traceback.extract_tb(tb)[-MAX_FRAMES:]
            out["stack"] = [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]
        return msgspec.json.encode(out, enc_hook=str).decode()


def configure_logging(level: str, stream: IO[str] | None = None) -> None:
    """Send every logger (uvicorn's included) to stream as JSON lines at level and above."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def log_request(record: RequestRecord) -> None:
    """Write one request line (DEBUG for successful health and metrics polls)."""
    quiet = record.route in QUIET_ROUTES and record.status < 400
    level = logging.DEBUG if quiet else logging.INFO
    if not request_log.isEnabledFor(level):  # the usual case under load: build nothing
        return
    request_log.log(
        level,
        "request",
        extra={
            "request_id": record.request_id,
            "method": record.method,
            "route": record.route,
            "status": record.status,
            "duration_ms": round(record.duration * 1000, 3),
            "tenant_id": record.tenant_id,
            "key_id": record.key_id,
        },
    )


def request_id_of(scope: Scope) -> str:
    """The caller's X-Request-Id when it is plain enough to echo, else a new random one."""
    for name, value in cast(dict[str, Any], scope).get("headers", ()):
        if name == REQUEST_ID_HEADER.encode():
            given: str = value.decode("latin-1")
            if _CALLER_ID.match(given):
                return given
            break
    return _new_request_id()


# A random per-process prefix and a counter: unique like a uuid4, a fraction of its cost on
# the hot path, where uuid4 showed in the event loop's profile under append load.
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count()


def _new_request_id() -> str:
    """A 32-hex-digit id no other request of any process is likely to share."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def install_request_observer(
    app: Litestar, observers: Iterable[Callable[[RequestRecord], None]]
) -> None:
    """Wrap the app so every HTTP request, routed or not, is timed and reported to observers.

    The wrapper sits inside Litestar's outermost handler (app.asgi_handler), around its exception
    handling, so it sees the final status of errors and of unknown routes, which app-level
    middleware (run only for matched routes, inside the exception handler) would miss.
    """
    inner: ASGIApp = app.asgi_handler
    report = list(observers)

    async def observed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await inner(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_of(scope)
        # The read audit names the request (memspine/pipeline.py reads it from here).
        cast(dict[str, Any], scope).setdefault("state", {})["request_id"] = request_id
        status = 500  # if nothing is sent, the client sees a dropped connection: count it as ours

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                start = cast(dict[str, Any], message)  # each message is built for this one send
                status = int(start["status"])
                start["headers"] = [
                    *start.get("headers", ()),
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        try:
            await inner(scope, receive, send_with_id)
        finally:
            record = _record(scope, request_id, status, time.perf_counter() - started)
            for observe in report:
                try:
                    observe(record)
                except Exception:  # an observer's bug must not turn an answer into an error
                    logging.getLogger("memspine.logs").exception("request observer failed")

    app.asgi_handler = observed


def _record(scope: Scope, request_id: str, status: int, duration: float) -> RequestRecord:
    """Build the request record from what routing and the auth guard left in the scope."""
    fields = cast(dict[str, Any], scope)
    principal = (fields.get("state") or {}).get("principal")
    method = str(fields.get("method", ""))
    return RequestRecord(
        request_id=request_id,
        method=method if method in METHODS else "OTHER",
        route=str(fields.get("path_template") or UNMATCHED),
        status=status,
        duration=duration,
        tenant_id=getattr(principal, "tenant_id", None),
        key_id=getattr(principal, "key_id", None),
    )
