"""Each answer leaves the server in one socket write (memspine/wire.py), and what a client reads
is unchanged: answers with and without a body, errors, HEAD, pipelined requests in order."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import ServerProcess

TENANT = "wire-tenant"
REQUESTS = 60
RECALL_BODY = b'{"text": "parcel signed", "k": 3}'


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # WARNING: no request log lines, which would be writes of their own.
    server = ServerProcess(
        tmp_path_factory.mktemp("wire") / "data", {"MEMSPINE_LOG_LEVEL": "WARNING"}
    ).start()
    yield server
    server.stop()


def _request(method: str, path: str, body: bytes = b"", token: str | None = TENANT) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if body:
        lines.append("Content-Type: application/json")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _read_answer(
    conn: socket.socket, buffered: bytes, *, head_only: bool = False
) -> tuple[int, bytes, bytes]:
    """One answer's status and body from a kept-alive connection, and the bytes after it."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if head_only:
        return status, b"", rest
    while len(rest) < length:
        chunk = conn.recv(65536)
        assert chunk, "the server closed the connection"
        rest += chunk
    return status, rest[:length], rest[length:]


def _write_calls(pid: int) -> int:
    """Write system calls the process made so far (all its threads)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/PID/io")


def test_each_answer_is_one_write(srv: ServerProcess) -> None:
    """One write per answer where uvicorn made two (head, then body).

    Counted on /health before any tenant exists: an open tenant's background work (the
    keyword fold's commits) writes files of its own at times no test controls. The hot routes
    send through the same request cycle.
    """
    assert srv.proc is not None
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as conn:
        request = _request("GET", "/health", token=None)
        conn.sendall(request)  # warm: the first request of a route builds caches
        assert _read_answer(conn, b"")[0] == 200
        before = _write_calls(srv.proc.pid)
        for _ in range(REQUESTS):
            conn.sendall(request)
            status, answer, rest = _read_answer(conn, b"")
            assert status == 200 and answer and not rest
        writes = _write_calls(srv.proc.pid) - before
    # Two writes an answer would be 2 * REQUESTS or more.
    assert REQUESTS <= writes < 1.5 * REQUESTS, writes


def test_answers_read_as_before(srv: ServerProcess) -> None:
    """A HEAD's head alone, an error's body, and pipelined requests answered in order."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as conn:
        # A HEAD answer writes no body: its head is sent when the answer completes (200 for
        # /health; 405 for a route that takes no HEAD, whose error body uvicorn drops).
        conn.sendall(_request("HEAD", "/health", token=None))
        status, body, rest = _read_answer(conn, b"", head_only=True)
        assert status == 200 and body == b"" and rest == b""
        conn.sendall(_request("HEAD", "/metrics", token=None))
        status, body, rest = _read_answer(conn, b"", head_only=True)
        assert status == 405 and body == b"" and rest == b""
        conn.sendall(_request("POST", "/v1/memory/recall", b"{}"))
        status, body, rest = _read_answer(conn, rest)
        assert status == 400 and b'"error"' in body
        pipelined = [
            _request("GET", "/health", token=None),
            _request("POST", "/v1/memory/recall", RECALL_BODY),
            _request("POST", "/v1/memory/recall", b"[1]"),
            _request("GET", "/health", token=None),
        ]
        conn.sendall(b"".join(pipelined))
        statuses = []
        for _ in pipelined:
            status, body, rest = _read_answer(conn, rest)
            statuses.append(status)
        assert statuses == [200, 200, 400, 200]
        assert rest == b""
