"""The one request pipeline: every door checks a request here before an operation runs.

An `Operation` declares a route once: method, path, the key scope it needs, its query
parameters with their parsers, the headers it reads, its body Struct, its answers by status
and the function that does the work. `serve` takes a request as ASGI hands it over (scope,
receive, path parameters) and runs it through the same steps for every door: the key, the
scope, the query string, the body (bounded read, nesting, decode), then the operation, and
renders whatever comes out (errors included) as an `Answer`. Litestar's handlers
(memspine/routes/doors.py) and the hot routes (memspine/hot.py) call `serve`; the MCP
backend (memspine/mcp/backend.py) calls the operations' typed functions and the checks below
with Python values. memspine/openapi.py builds /schema/openapi.json from the same
declarations, so the document and the checks cannot drift apart.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qsl

import msgspec

from memspine.body import TOO_LARGE, ClientGone, read_body
from memspine.errors import error_body, unexpected_error
from memspine.readaudit import PURPOSE_HEADER, Reader, check_purpose
from memspine.schemas import decode_body
from memspine.verifier import Principal
from storage.errors import InvalidRequest, MemspineError

if TYPE_CHECKING:
    from memspine.allowance import Allowance
    from memspine.auth import Authenticator
    from memspine.config import Settings
    from memspine.engine import Engine
    from memspine.retention import Retention
    from memspine_admin.plane import ControlPlane
    from storage import Quota, QuotaSource

JSON = "application/json"
# Who may call an operation: a key with the read or write scope, any valid key, the admin key,
# or anyone (no Authorization at all).
READ, WRITE, ANY_KEY, ADMIN, PUBLIC = "read", "write", "any key", "admin", "public"
AUDIT = "audit"  # reads the tenant's read records only (memspine/routes/audit.py)
PROP_PREFIX = "prop."
PURPOSE = PURPOSE_HEADER.lower().encode()
EVENT_ID_DETAIL = "event id must be a UUID such as 009cfbc7-bc4d-48c4-9a4a-7ad5f4cc17da"


def bearer_token(header: bytes | str | None) -> str | None:
    """The token of an Authorization header value of the Bearer scheme, or None."""
    if not header:
        return None
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    scheme, _, token = text.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def event_id(value: str) -> str:
    """An event id in a path or a tool argument must be a UUID; its canonical form."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest(EVENT_ID_DETAIL) from None


@dataclass(frozen=True)
class Query:
    """A query parameter: its parser (str -> value, InvalidRequest when bad) and its schema."""

    name: str
    parse: Callable[[str], Any]
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True)
class Header:
    """A request header an operation reads (documented; the operation parses it)."""

    name: str
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True)
class Reply:
    """One documented answer: the type of its body (None: none), a sentence, its headers."""

    type: Any
    description: str
    headers: tuple[str, ...] = ()
    media_type: str = JSON


@dataclass(frozen=True)
class Services:
    """What operations work with: the engine, the authenticator, the settings, the metrics and
    what each key and tenant is allowed (None: no limits)."""

    engine: Engine
    auth: Authenticator
    settings: Settings
    metrics: Any = None
    allowance: Allowance | None = None
    retention: Retention | None = None  # memspine/retention.py: windows, holds, runs


@dataclass(frozen=True, eq=False)
class Operation:
    """One route, declared once: the checks `serve` makes, the work, the document's entry."""

    name: str
    method: str
    path: str  # Litestar's template: what routing matches and what logs and metrics name
    scope: str
    run: Callable[[Call], Awaitable[Outcome]]
    summary: str
    query: tuple[Query, ...] = ()
    props: bool = False  # takes prop.NAME=VALUE parameters (GET /v1/memory/events)
    headers: tuple[Header, ...] = ()
    body: type[msgspec.Struct] | None = None
    replies: Mapping[int, Reply] = field(default_factory=dict)
    errors: tuple[int, ...] = ()  # statuses beyond the ones every operation of its scope has
    strict_query: bool = True  # False: unknown parameters pass (/health and /metrics)
    body_limit: str = "max_body_bytes"  # the Settings field bounding the body (MEMSPINE_<NAME>)
    stores: bool = False  # appends events: a tenant its quota just refused is refused unread
    keys_in_body: bool = False  # its events may carry idempotency keys (replays) in the body
    audited: bool = False  # reads event content: its reads are recorded (memspine/readaudit.py)
    description: str = ""
    tag: str = "memory"
    params: dict[str, Query] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Index the parameters by name once."""
        object.__setattr__(self, "params", {q.name: q for q in self.query})

    def parse_query(self, query_string: bytes) -> tuple[dict[str, Any], dict[str, str]]:
        """The declared parameters parsed, and the prop.NAME values; 400 for an unknown one.

        memspine/edge.py already refused repeated and empty parameters on every route; the
        repeat check here keeps an operation strict wherever it is served.
        """
        params = self.params
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, separator="&")
        raw: dict[str, str] = {}
        for name, value in pairs:
            if name in raw:
                raise InvalidRequest(f"query parameter '{name}' is given more than once")
            if (
                self.strict_query
                and name not in params
                and not (self.props and name.startswith(PROP_PREFIX))
            ):
                raise InvalidRequest(f"unknown query parameter '{name}'")
            raw[name] = value
        parsed = {q.name: q.parse(raw[q.name]) for q in self.query if q.name in raw}
        props = {k[len(PROP_PREFIX) :]: v for k, v in raw.items() if k.startswith(PROP_PREFIX)}
        return parsed, props if self.props else {}


class Call(NamedTuple):
    """A request that passed the checks, as the operation sees it."""

    services: Services
    principal: Principal | None  # None for admin and public operations
    control: ControlPlane | None  # the control plane, for admin operations
    query: dict[str, Any]
    props: dict[str, str]
    headers: dict[bytes, bytes]  # lower-case names, the first of repeated headers
    body: Any
    path: Mapping[str, Any]
    quota: Quota | QuotaSource | None = None  # what its tenant may store (tenant operations)
    reader: Reader | None = None  # who reads, for the read audit (audited operations)

    @property
    def tenant_id(self) -> str:
        """The caller's tenant (tenant operations only)."""
        assert self.principal is not None
        return self.principal.tenant_id

    def header(self, name: bytes) -> str | None:
        """A header's value as text, or None."""
        value = self.headers.get(name)
        return value.decode("latin-1") if value is not None else None


class Outcome(NamedTuple):
    """What an operation answers: status, a value msgspec encodes (or bytes as they are)."""

    status: int
    value: Any
    headers: dict[str, str] | None = None
    media_type: str = JSON


class Answer(NamedTuple):
    """An answer ready to send: status, body bytes (or a stream of them), headers, media type."""

    status: int
    body: bytes
    headers: dict[str, str] | None = None
    media_type: str = JSON
    stream: AsyncIterator[bytes] | None = None


@dataclass(frozen=True)
class Streamed:
    """An operation's body sent as it is read, of a length known before the first byte."""

    chunks: AsyncIterator[bytes]
    length: int


def first_headers(raw: Any) -> dict[bytes, bytes]:
    """ASGI headers by lower-case name, the first of repeated ones (as Litestar reads them)."""
    headers: dict[bytes, bytes] = {}
    for name, value in raw:
        headers.setdefault(name, value)
    return headers


async def admit(
    op: Operation,
    services: Services,
    scope: dict[str, Any],
    receive: Any,
    path: Mapping[str, Any],
) -> Call:
    """The checks, in order: key, scope, the key's rate, query string, body size, body shape."""
    headers = first_headers(scope["headers"])
    principal = control = quota = None
    if op.scope == ADMIN:
        control = services.auth.check_admin(bearer_token(headers.get(b"authorization")))
    elif op.scope != PUBLIC:
        principal = await services.auth.authenticate_async(
            bearer_token(headers.get(b"authorization"))
        )
        if op.scope != ANY_KEY:
            principal.require(op.scope)
        scope.setdefault("state", {})["principal"] = principal  # the request log names the key
        if services.allowance is not None:  # 429 before the body is read
            quota = services.allowance.admit(principal)
    reader = _reader(op, principal, headers, scope) if op.audited else None
    query, props = op.parse_query(scope["query_string"]) if scope["query_string"] else ({}, {})
    body = None
    # A full tenant's append is refused before its body is read, or at least decoded, unless
    # it may be an idempotent replay (answered as before, full or not).
    fresh = principal.tenant_id if op.stores and principal is not None else None
    replay_key = headers.get(b"idempotency-key")
    if fresh and not op.keys_in_body:
        services.engine.refuse_if_full(fresh, replay_key=replay_key)
    if op.body is not None:
        limit, too_large = _body_limit(op, services.settings)
        raw = await read_body(receive, limit, headers.get(b"content-length"), too_large)
        if fresh and b'"idempotency_key"' not in raw:  # no event of it can be a replay
            services.engine.refuse_if_full(fresh, batch=op.keys_in_body, replay_key=replay_key)
        body = decode_body(raw, op.body)
    return Call(services, principal, control, query, props, headers, body, path, quota, reader)


def purpose_text(raw: bytes | None) -> str | None:
    """A Memspine-Purpose header's text: UTF-8, or Latin-1 (HTTP's own reading of header
    bytes) when it is not; its length is checked on the text as UTF-8."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _reader(
    op: Operation, principal: Principal | None, headers: dict[bytes, bytes], scope: dict[str, Any]
) -> Reader:
    """Who reads through an audited operation; 400 for a purpose missing or malformed."""
    purpose = check_purpose(purpose_text(headers.get(PURPOSE)), principal)
    state = scope.get("state") or {}
    return Reader(
        key_id=principal.key_id if principal is not None else "-",
        door="http",
        route=op.path,
        request_id=str(state.get("request_id") or "-"),
        purpose=purpose,
    )


def _body_limit(op: Operation, settings: Settings) -> tuple[int, str]:
    """The largest body op takes, and the detail of the 413 past it."""
    limit: int = getattr(settings, op.body_limit)
    if op.body_limit == "max_body_bytes":
        return limit, TOO_LARGE
    return (
        limit,
        f"the request body is larger than MEMSPINE_{op.body_limit.upper()} ({limit} bytes)",
    )


def render(outcome: Outcome) -> Answer:
    """An operation's outcome as bytes."""
    value = outcome.value
    if isinstance(value, Streamed):
        headers = {**(outcome.headers or {}), "Content-Length": str(value.length)}
        return Answer(outcome.status, b"", headers, outcome.media_type, value.chunks)
    body = value if isinstance(value, bytes) else msgspec.json.encode(value)
    return Answer(outcome.status, body, outcome.headers, outcome.media_type)


def error_answer(exc: MemspineError) -> Answer:
    """Any error as {"error", "detail"} with its status and headers."""
    return Answer(exc.status, error_body(exc.code, exc.detail), exc.headers or None)


async def serve(
    op: Operation, services: Services, scope: dict[str, Any], receive: Any, path: Mapping[str, Any]
) -> Answer:
    """Check the request, run the operation, render the outcome or the error.

    memspine.body.ClientGone passes through: there is no one to answer.
    """
    try:
        call = await admit(op, services, scope, receive, path)
        return render(await op.run(call))
    except ClientGone:
        raise
    except MemspineError as exc:
        return error_answer(exc)
    except Exception as exc:  # a bug or a failing disk: logged there, nothing leaks here
        return error_answer(unexpected_error(exc))
