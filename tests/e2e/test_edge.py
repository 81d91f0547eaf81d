"""The HTTP edge, attacked as a client would: deep and out-of-range JSON, repeated query
parameters, DNS rebinding, CORS, GET /mcp, idle half-requests by the thousand, slow headers
and slow bodies. One real server (local mode, loopback, small timeouts and caps) for all."""

from __future__ import annotations

import json
import random
import resource
import select
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from litestar.routes import HTTPRoute
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memspine.app import create_app
from memspine.config import Settings
from memspine.edge import Edge
from memspine.jsonbounds import MAX_NESTING, max_depth, nesting_exceeds, skeleton
from tests.support.servers import ServerProcess

# Bounds on time (floods, latency, timeouts): run alone, after the rest (see Makefile).
pytestmark = pytest.mark.timing

TENANT = "edge-tenant"
HEADER_TIMEOUT = 1.5
BODY_TIMEOUT = 1.5
PER_CLIENT = 40
ALLOWED_ORIGIN = "https://agent.example.com"
ADMIN_KEY = "edge-admin-key-0123456789"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
SOME_ID = "5233a1d0-0a16-4e20-ae86-d848bd072c0c"
NUMBER_PROPERTY = '{"kind": "num", "text": "x", "properties": {"n": N}}'
NUMBER_PARAM = '{"query": "RETURN $n AS n", "params": {"n": N}}'


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("edge") / "data",
        {
            "MEMSPINE_HEADER_TIMEOUT_SECS": str(HEADER_TIMEOUT),
            "MEMSPINE_BODY_TIMEOUT_SECS": str(BODY_TIMEOUT),
            "MEMSPINE_MAX_CONNECTIONS": "400",
            "MEMSPINE_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
            "MEMSPINE_MCP_ALLOWED_ORIGINS": ALLOWED_ORIGIN,
            "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
        },
    ).start()
    yield server
    server.stop()
    log = server.log_path.read_text()
    assert '"status":500' not in log and "unhandled" not in log, log[-3000:]


def nested(depth: int) -> Any:
    """A value of `depth` nested arrays around a number."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    """The JSON text of nested(depth), written out (json.dumps recurses too)."""
    return "[" * depth + "1" + "]" * depth


def append_body(depth: int, kind: str = "deep") -> str:
    """An append whose properties nest `depth` levels (the properties object is one)."""
    inner = nested_text(depth - 1)
    return f'{{"kind": "{kind}", "text": "nesting probe", "properties": {{"p": {inner}}}}}'


@asynccontextmanager
async def mcp_client(srv: ServerProcess, token: str = TENANT) -> AsyncIterator[Client]:
    """The official SDK's Streamable HTTP client."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        Client(streamable_http_client(srv.url + "/mcp", http_client=http)) as client,
    ):
        yield client


def mcp_call(srv: ServerProcess, name: str, raw_arguments: str) -> dict[str, Any]:
    """tools/call with arguments written as raw JSON text (to send what json.dumps would not)."""
    params = f'{{"name": "{name}", "arguments": {raw_arguments}}}'
    body = f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {params}}}'
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {TENANT}"}
    r = httpx.post(srv.url + "/mcp", content=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


# -- the nesting scan ---------------------------------------------------------------------------


def reference_depth(raw: bytes) -> int:
    """Byte by byte: the deepest bracket outside strings (a backslash escapes the next byte)."""
    depth = best = 0
    in_string = escaped = False
    for c in raw:
        if escaped:
            escaped = False
            if not in_string and c in b"[{":
                depth += 1
                best = max(best, depth)
            elif not in_string and c in b"]}":
                depth -= 1
        elif c == ord("\\"):
            escaped = True
        elif c == ord('"'):
            in_string = not in_string
        elif not in_string and c in b"[{":
            depth += 1
            best = max(best, depth)
        elif not in_string and c in b"]}":
            depth -= 1
    return best


def test_the_nesting_scan_agrees_with_a_byte_by_byte_reading() -> None:
    rng = random.Random(14)
    alphabet = b'[]{}"\\,a:'
    for _ in range(600):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for chunk in (1, 3, 7, 1 << 20):  # state carried across chunk boundaries
            assert max_depth(raw, chunk) == reference_depth(raw), (raw, chunk)
    body = json.dumps({"text": "[[[[" * 50 + '\\"[[', "p": nested(MAX_NESTING)}).encode()
    assert max_depth(body) == MAX_NESTING + 1  # brackets in strings are text
    assert not nesting_exceeds(body, MAX_NESTING + 1)
    assert nesting_exceeds(json.dumps({"p": nested(MAX_NESTING + 1)}).encode(), MAX_NESTING + 1)


def test_the_skeleton_the_scan_reads_has_the_depth_of_the_bytes() -> None:
    rng = random.Random(19)
    alphabet = b'[]{}"\\,a:0.-e nu/x\xc3'  # kept bytes, dropped ones, escape letters
    dropped = 0
    for _ in range(3000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        thin = skeleton(raw)
        dropped += len(thin) < len(raw)
        assert max_depth(thin) == reference_depth(raw), (raw, thin)
    assert dropped > 1000  # the fast path was taken, not only the bytes kept whole
    vectors = json.dumps({"events": [{"embedding": [0.125] * 384}] * 3}).encode()
    assert skeleton(vectors) == b'{"nt"[{"bn"[]}{"bn"[]}{"bn"[]}]}'


# -- deep and out-of-range JSON -------------------------------------------------------------------


def test_deep_properties_are_refused_and_mcp_keeps_reading_the_tenant(srv: ServerProcess) -> None:
    with srv.client(TENANT) as c:
        for depth in (1000, 200, MAX_NESTING + 1):
            r = c.post("/v1/memory/event", content=append_body(depth))
            assert r.status_code == 400, (depth, r.text)
            assert "at most 32 levels" in r.json()["detail"]
        kept = c.post("/v1/memory/event", content=append_body(MAX_NESTING))
        assert kept.status_code == 201, kept.text
        # The other doors that decode JSON bodies refuse the same way.
        deep_params = f'{{"query": "RETURN 1 AS x", "params": {{"p": {nested_text(1000)}}}}}'
        assert c.post("/v1/memory/cypher", content=deep_params).status_code == 400
        deep_filter = f'{{"text": "probe", "filter": {{"a": {nested_text(1000)}}}}}'
        assert c.post("/v1/memory/recall", content=deep_filter).status_code == 400
        stored = c.get("/v1/memory/events", params={"kind": "deep"}).json()["events"]
    assert [e["event_id"] for e in stored] == [kept.json()["event_id"]]

    async def main() -> None:
        async with mcp_client(srv) as client:
            listed = await client.call_tool("memory_list", {"kind": "deep"})
            assert not listed.is_error
            assert listed.structured_content["events"][0]["properties"] == {
                "p": nested(MAX_NESTING - 1)
            }  # 32 levels: the properties object and 31 arrays
            got = await client.call_tool("memory_get", {"id": kept.json()["event_id"]})
            assert not got.is_error
            hits = await client.call_tool("memory_recall", {"text": "nesting probe"})
            assert not hits.is_error and hits.structured_content["hits"]
            too_deep = {"kind": "deep", "text": "x", "properties": {"p": nested(MAX_NESTING + 1)}}
            refused = await client.call_tool("memory_append", too_deep)
            assert refused.is_error
            assert "at most 32 levels" in refused.structured_content["detail"]

    anyio.run(main)
    arguments = f'{{"kind": "deep", "text": "x", "properties": {{"p": {nested_text(1000)}}}}}'
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {TENANT}"}
    params = f'{{"name": "memory_append", "arguments": {arguments}}}'
    body = f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {params}}}'
    r = httpx.post(srv.url + "/mcp", content=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text  # the SDK's parser stops at 200 levels: a parse error


def test_numbers_out_of_range_are_400_over_http_and_tool_errors_over_mcp(
    srv: ServerProcess,
) -> None:
    with srv.client(TENANT) as c:
        for raw in ("1e400", "-1e400", "NaN", "Infinity", "1" * 5000):
            body = NUMBER_PROPERTY.replace("N", raw)
            r = c.post("/v1/memory/event", content=body)
            assert r.status_code == 400, (raw[:10], r.text)
            assert r.json()["error"] == "invalid_request"
    for raw in ("1e400", "NaN", "Infinity", "-Infinity"):
        arguments = NUMBER_PROPERTY.replace("N", raw)
        result = mcp_call(srv, "memory_append", arguments)
        assert result["isError"], raw
        assert "numbers must be finite" in result["structuredContent"]["detail"]
        cypher = mcp_call(srv, "memory_cypher", NUMBER_PARAM.replace("N", raw))
        assert cypher["isError"], raw
    with srv.client(TENANT) as c:
        assert c.get("/v1/memory/events", params={"kind": "num"}).json()["events"] == []


# -- query strings ----------------------------------------------------------------------------


def test_a_repeated_dry_run_deletes_nothing(srv: ServerProcess) -> None:
    with srv.client(TENANT) as c:
        event_id = c.post("/v1/memory/event", json={"kind": "keep", "text": "x"}).json()["event_id"]
        url = f"/v1/memory/event/{event_id}"
        for query in (
            "?dry_run=false&dry_run=true",
            "?dry_run=true&dry_run=false",
            "?dry_run",
            "?dry_run=",
            "?dry_run=true&dry%5Frun=false",
            "?cascade=derived&cascade=x",
        ):
            r = c.delete(url + query)
            assert r.status_code == 400, (query, r.text)
        assert c.get(url).status_code == 200
        assert "given more than once" in c.delete(url + "?purge=false&purge=false").json()["detail"]
        assert c.get(url).status_code == 200


def _every_route(tmp_path: Path) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, path parameters filled in."""
    app = create_app(Settings(data_dir=tmp_path / "routes", embedding_dim=4))
    found = []
    for route in app.routes:
        path = route.path.replace("{event_id:str}", SOME_ID).replace("{tenant_id:str}", SOME_ID)
        path = path.replace("{key_id:str}", "k1")
        methods = route.methods if isinstance(route, HTTPRoute) else {"POST"}
        for method in sorted(methods - {"HEAD", "OPTIONS"}):
            found.append((method, path.split("{")[0]))
    return found


def test_a_repeated_query_parameter_is_400_on_every_route(
    srv: ServerProcess, tmp_path: Path
) -> None:
    routes = _every_route(tmp_path)
    assert ("POST", "/mcp") in routes and ("GET", "/metrics") in routes
    assert ("DELETE", f"/v1/memory/event/{SOME_ID}") in routes
    headers = {"Authorization": f"Bearer {TENANT}"}
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for n, (method, path) in enumerate(routes):
            query = "limit=5&limit=5" if n % 2 else "x=1&x=2"
            r = client.request(
                method,
                f"{path}?{query}",
                headers=admin if path.startswith("/v1/admin") else headers,
                content=b'{"kind": "t"}' if method == "POST" else None,
            )
            assert r.status_code == 400, (method, path, query, r.text)
            assert "given more than once" in r.json()["detail"]


# -- Host, Origin, CORS, GET /mcp ---------------------------------------------------------------


def test_a_rebound_domain_or_a_foreign_origin_is_refused_on_rest_routes(srv: ServerProcess) -> None:
    port = srv.port
    attacks = [
        {"Host": f"evil.example:{port}"},
        {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Host": f"localhost.evil.example:{port}"},
    ]
    with srv.client(TENANT) as c:
        for headers in attacks:
            assert c.get("/v1/memory/events", headers=headers).status_code == 403, headers
            write = c.post(
                "/v1/memory/event", json={"kind": "rebound", "text": "x"}, headers=headers
            )
            assert write.status_code == 403, headers
            assert c.get("/v1/whoami", headers=headers).status_code == 403, headers
            assert c.post("/mcp", json={}, headers={**MCP_HEADERS, **headers}).status_code == 403
        r = c.get("/v1/memory/events", headers={"Host": f"evil.example:{port}"})
        assert r.json()["error"] == "forbidden" and "MEMSPINE_ALLOWED_HOSTS" in r.json()["detail"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert c.get("/v1/whoami", headers={"Host": host}).status_code == 200, host
        local_page = {"Origin": "http://localhost:3000"}
        assert c.get("/v1/whoami", headers=local_page).status_code == 200
        assert c.get("/v1/memory/events", params={"kind": "rebound"}).json()["events"] == []


def test_the_edge_checks_host_in_local_mode_whatever_the_bind(tmp_path: Path) -> None:
    """Bound to all interfaces, Host matters only while tokens are tenant ids (local mode)."""
    answered: list[int] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    local = [True]
    settings = Settings(
        host="0.0.0.0", data_dir=tmp_path, allowed_hosts=frozenset({"mem.internal"})
    )
    edge = Edge(inner, settings, local_mode=lambda: local[0])

    async def status(host: str) -> int:
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/v1/whoami",
            "query_string": b"",
            "headers": [(b"host", host.encode())],
            "server": ("10.1.2.3", 7781),
        }
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        await edge(scope, receive, send)
        return int(sent[0]["status"])

    async def main() -> None:
        answered.extend(
            [await status(h) for h in ("evil.example", "mem.internal:7781", "10.1.2.3")]
        )
        local[0] = False  # issued keys: a secret key is what a rebound page lacks
        answered.append(await status("evil.example"))

    anyio.run(main)
    assert answered == [403, 204, 204, 204]


def test_the_cors_preflight_of_mcp_answers_allowed_origins(srv: ServerProcess) -> None:
    ask = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, mcp-protocol-version",
    }
    for origin in ("http://localhost:6274", ALLOWED_ORIGIN):
        r = httpx.options(srv.url + "/mcp", headers={"Origin": origin, **ask})
        assert r.status_code == 204, r.text
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"]
        assert "mcp-protocol-version" in r.headers["access-control-allow-headers"]
        assert int(r.headers["access-control-max-age"]) > 0
        assert "Origin" in r.headers["vary"]
        init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {**MCP_HEADERS, "Origin": origin}
        ok = httpx.post(
            srv.url + "/mcp",
            json=init,
            headers={**headers, "Authorization": f"Bearer {TENANT}"},
            timeout=30,
        )
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin
        no_key = httpx.post(srv.url + "/mcp", json=init, headers=headers, timeout=30)
        assert no_key.status_code == 401  # the browser may read why
        assert no_key.headers["access-control-allow-origin"] == origin
        assert "www-authenticate" in no_key.headers["access-control-expose-headers"]
    evil = httpx.options(srv.url + "/mcp", headers={"Origin": "https://evil.example", **ask})
    assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    plain = httpx.post(
        srv.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={**MCP_HEADERS, "Authorization": f"Bearer {TENANT}"},
        timeout=30,
    )
    assert "access-control-allow-origin" not in plain.headers  # no browser, no CORS


def test_get_and_delete_on_mcp_are_405_at_once(srv: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {TENANT}", "Accept": "text/event-stream"}
    for method in ("GET", "DELETE"):
        started = time.monotonic()
        r = httpx.request(method, srv.url + "/mcp", headers=headers, timeout=5)
        assert r.status_code == 405, r.text
        assert r.headers["allow"] == "POST, OPTIONS"
        assert r.json()["error"] == "method_not_allowed"
        assert time.monotonic() - started < 2
    assert httpx.get(srv.url + "/mcp", timeout=5).status_code == 405  # with no key as well


# -- connections and read timeouts --------------------------------------------------------------


def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def _read_until_closed(s: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (b"" if it did not within timeout)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return b"(still open)" + data
    return data


@pytest.fixture
def many_fds() -> Iterator[None]:
    """This process may open the attacker's sockets (the soft limit raised toward the hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1400
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard open-file limit {hard} is below {want}")
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_one_client_with_1200_idle_half_requests_leaves_others_served(
    srv: ServerProcess, many_fds: None
) -> None:
    assert srv.proc is not None
    pid = srv.proc.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (1100, hard))  # fewer fds than attackers
    attackers: list[socket.socket] = []
    try:
        for i in range(1200):
            s = _connect(srv.port, "127.0.0.2")  # another address than the victim's
            if i % 2:
                s.sendall(b"POST /v1/memory/event HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            attackers.append(s)
        with httpx.Client(
            base_url=srv.url, headers={"Authorization": "Bearer victim"}, timeout=5
        ) as victim:
            for n in range(10):
                r = victim.post("/v1/memory/event", json={"kind": "turn", "text": f"victim {n}"})
                assert r.status_code == 201, r.text
            assert victim.get("/v1/memory/events").status_code == 200
        answers = [_read_until_closed(s, 1 + HEADER_TIMEOUT) for s in attackers]
        late = sum(a.startswith(b"HTTP/1.1 408") for a in answers)  # admitted, then timed out
        refused = sum(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers)  # at accept
        assert 0 < late <= PER_CLIENT, late
        assert refused + late == 1200, [a[:40] for a in answers if not a.startswith(b"HTTP")][:3]
    finally:
        for s in attackers:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))


def test_slow_headers_and_slow_bodies_are_closed_after_their_timeout(srv: ServerProcess) -> None:
    started = time.monotonic()
    slow_bodies = {}  # sent first: their deadlines run while the headers dribble below
    for path in ("/v1/memory/event", "/v1/memory/cypher", "/mcp", "/v1/memory/recall"):
        s = _connect(srv.port, "127.0.0.1")
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TENANT}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            'Content-Length: 400\r\n\r\n{"kind": '.encode()
        )
        slow_bodies[path] = s
    slow = _connect(srv.port, "127.0.0.1")
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    answered_at: dict[socket.socket, float] = {}
    next_line = started + 0.4
    while slow not in answered_at and time.monotonic() < started + 6:
        waiting = [s for s in (slow, *slow_bodies.values()) if s not in answered_at]
        for s in select.select(waiting, [], [], max(0.0, next_line - time.monotonic()))[0]:
            answered_at[s] = time.monotonic() - started
        if slow not in answered_at and time.monotonic() >= next_line:
            slow.sendall(b"X-Slow: 1\r\n")  # a header line every 0.4 s, never the end
            next_line += 0.4
    answer = _read_until_closed(slow, 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert HEADER_TIMEOUT <= answered_at[slow] < HEADER_TIMEOUT + 1.5
    for path, s in slow_bodies.items():
        answer = _read_until_closed(s, 5)
        assert answer.startswith(b"HTTP/1.1 408"), (path, answer)
        assert b'"request_timeout"' in answer
        took = answered_at.get(s, time.monotonic() - started)
        assert BODY_TIMEOUT <= took < BODY_TIMEOUT + 1.5, (path, took)
    s = _connect(srv.port, "127.0.0.1")
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"x" * (70 << 10))
    assert _read_until_closed(s, 5).startswith(b"HTTP/1.1 431")
    with srv.client(TENANT) as c:  # and the server serves on
        assert c.post("/v1/memory/event", json={"kind": "after", "text": "x"}).status_code == 201
    log = srv.log_path.read_text()
    assert '"status":408' in log  # the request log counts the timeouts as the client's


@pytest.mark.parametrize("pad_kib, status", [(70, b"431"), (60, b"200")])
def test_headers_sent_whole_in_one_write_are_held_to_64_kib(
    srv: ServerProcess, pad_kib: int, status: bytes
) -> None:
    """A 70 KiB header that arrives complete in one chunk is refused as one that trickles in
    (docs/security.md: headers 64 KiB); 60 KiB passes."""
    s = _connect(srv.port, "127.0.0.1")
    pad = b"x" * (pad_kib << 10)
    s.sendall(
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
        + pad
        + b"\r\nConnection: close\r\n\r\n"
    )
    assert _read_until_closed(s, 10).startswith(b"HTTP/1.1 " + status)
    s.close()
