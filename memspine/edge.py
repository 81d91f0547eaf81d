"""The ASGI layer in front of every route (Litestar's, the hot routes, /mcp): Host and Origin
against DNS rebinding and foreign pages, strict query strings, and the body deadline's 408."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import msgspec

from memspine.config import Settings, origin_key
from memspine.segments import keep_encoded_slashes, refuse_bare_slash
from storage.errors import Forbidden, InvalidRequest, MemspineError, RequestTimeout

if TYPE_CHECKING:  # memspine/server.py imports this before --help: Litestar loads later
    from litestar.types import ASGIApp, Receive, Scope, Send

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
MCP_PREFIX = "/mcp"
CROSS_ORIGIN_MCP = "cross-origin requests to /mcp are not allowed"
CROSS_ORIGIN = "cross-origin requests to this server are not allowed"
FOREIGN_HOST = (
    "the Host header names a domain this server does not answer to: a loopback-bound or "
    "local-mode server takes localhost, an IP address or a name in MEMSPINE_ALLOWED_HOSTS"
)
BODY_LATE = "the request body did not arrive within MEMSPINE_BODY_TIMEOUT_SECS"
# Set in the ASGI scope by memspine/connguard.py when the body's deadline passes.
BODY_TIMED_OUT = "memspine.body_timed_out"
MAX_CACHED_HOSTS = 256


def hostname(authority_or_url: str) -> str | None:
    """The lower-case host of a URL or a Host header value, None if it has none."""
    text = authority_or_url if "//" in authority_or_url else "//" + authority_or_url
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


def is_ip(name: str) -> bool:
    """Whether a host name is an IP address literal."""
    try:
        ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether a bind address (MEMSPINE_BIND's host) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def origin_allowed(
    origin: str | None, host: str | None, bind_host: str, listed: frozenset[str] = frozenset()
) -> bool:
    """No Origin (not a browser), a listed origin (MEMSPINE_MCP_ALLOWED_ORIGINS), a loopback
    origin, or the server's own host when not bound to loopback.

    Bound to loopback, only loopback origins pass: a page whose name was rebound to 127.0.0.1
    (DNS rebinding) sends its own name as both Origin and Host, so "same host" proves nothing there.
    """
    if origin is None:
        return True
    if listed and origin_key(origin) in listed:
        return True
    name = hostname(origin)
    if name is None:
        return False  # "null" (sandboxed frames, file://) and junk
    if name in LOOPBACK:
        return True
    if bind_host in LOOPBACK:
        return False
    return host is not None and name == hostname(host)


def host_allowed(host: str, server_host: str | None, listed: frozenset[str]) -> bool:
    """A Host a page rebound to this machine cannot send: localhost, an IP address, the address
    the request arrived at, or a name the operator listed (MEMSPINE_ALLOWED_HOSTS).

    DNS rebinding needs a domain name the attacker controls; it can never make a browser send
    an IP address or "localhost" as the Host of its own page.
    """
    name = hostname(host)
    if name is None:
        return False
    return name in LOOPBACK or is_ip(name) or name == server_host or name in listed


def check_query(query_string: bytes) -> None:
    """400 for a parameter given twice or without a value, on every route.

    Routes read one value per name (Litestar's first, for flags): `?dry_run=false&dry_run=true`
    must not mean whatever the first copy says, and `?dry_run` or `?dry_run=` must not mean false.
    """
    seen: set[str] = set()
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, separator="&")
    for name, value in pairs:
        shown = name[:64]
        if name in seen:
            raise InvalidRequest(f"query parameter '{shown}' is given more than once")
        if not value:
            raise InvalidRequest(f"query parameter '{shown}' has no value")
        seen.add(name)


async def send_error(send: Send, exc: MemspineError) -> None:
    """Answer with an error in the API's shape, from plain ASGI."""
    body = msgspec.json.encode({"error": exc.code, "detail": exc.detail})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Edge:
    """ASGI: refuse what no route may take, then pass the request on with a receive that
    turns a passed body deadline into 408."""

    def __init__(self, inner: ASGIApp, settings: Settings, local_mode: Callable[[], bool]) -> None:
        """`local_mode` says whether tokens are tenant ids (no control database yet)."""
        self.inner = inner
        self.bind_host = settings.host
        self.loopback_bound = is_loopback(settings.host)
        self.local_mode = local_mode
        self.origins = settings.mcp_allowed_origins
        self.hosts = settings.allowed_hosts
        self._hosts_seen: dict[tuple[str, str | None], bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request; refuse it here or serve it with the deadline-aware receive."""
        kind: str = scope["type"]  # a str enum in Litestar's types, a plain str from the server
        if kind != "http":
            await self.inner(scope, receive, send)
            return
        keep_encoded_slashes(scope)  # type: ignore[arg-type]  # a subject's id may hold '/'
        try:
            self._check(scope)
        except MemspineError as exc:
            await send_error(send, exc)
            return
        fields: dict[str, Any] = scope  # type: ignore[assignment]

        async def receive_in_time() -> Any:
            message = await receive()
            if fields.get(BODY_TIMED_OUT):
                raise RequestTimeout(BODY_LATE, headers={"Connection": "close"})
            return message

        await self.inner(scope, receive_in_time, send)

    def _check(self, scope: Scope) -> None:
        """Origin, then Host (loopback-bound or local mode), then the query string."""
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                if host is not None:
                    raise InvalidRequest("the Host header is given more than once")
                host = value.decode("latin-1")
            elif name == b"origin":
                if origin is not None:
                    raise InvalidRequest("the Origin header is given more than once")
                origin = value.decode("latin-1")
        if origin is not None and not origin_allowed(origin, host, self.bind_host, self.origins):
            mcp = scope["path"].startswith(MCP_PREFIX)
            raise Forbidden(CROSS_ORIGIN_MCP if mcp else CROSS_ORIGIN)
        if host is not None and not self._host_ok(host, scope):
            raise Forbidden(FOREIGN_HOST)
        query: bytes = scope["query_string"]
        if query:
            check_query(query)
        refuse_bare_slash(scope["path"])

    def _host_ok(self, host: str, scope: Scope) -> bool:
        """Any Host unless loopback-bound or in local mode; then host_allowed, remembered."""
        if not self.loopback_bound and not self.local_mode():
            return True
        server = scope.get("server")
        server_host = str(server[0]).lower() if server else None
        key = (host, server_host)
        ok = self._hosts_seen.get(key)
        if ok is None:
            ok = host_allowed(host, server_host, self.hosts)
            if len(self._hosts_seen) >= MAX_CACHED_HOSTS:
                self._hosts_seen.clear()
            self._hosts_seen[key] = ok
        return ok
