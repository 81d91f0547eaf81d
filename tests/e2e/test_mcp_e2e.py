"""MCP through a real memspine-server: the SDK's Streamable HTTP client with issued keys, the
client SDK, and `memspine mcp` over stdio, embedded and as a client of the server (tests/server/
test_mcp.py has every tool in process)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memspine.client import AsyncMemspine
from memspine.client import errors as client_errors
from storage.errors import Unavailable
from storage.readlog import READS_JOURNAL
from tests.support.mcp_calls import (
    ALL_TOOLS,
    COMMAND,
    FORBIDDEN,
    NO_EVENT,
    READ_TOOLS,
    call,
    issue_keys,
    refused,
    stdio,
    text,
)
from tests.support.servers import ServerProcess


class Remote:
    """A real memspine-server over a control database with issued keys."""

    def __init__(self, server: ServerProcess, keys: dict[str, str]) -> None:
        self.server = server
        self.keys = keys
        self.url = server.url + "/mcp"

    @asynccontextmanager
    async def client(self, key: str, mode: str = "auto") -> AsyncIterator[Client]:
        """The SDK's Streamable HTTP client sending this key."""
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
            Client(streamable_http_client(self.url, http_client=http), mode=mode) as client,
        ):
            yield client


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    data_dir = tmp_path_factory.mktemp("mcp") / "data"
    keys = issue_keys(data_dir)
    server = ServerProcess(data_dir).start()
    yield Remote(server, keys)
    server.stop()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_streamable_http_with_issued_keys(remote: Remote, mode: str) -> None:
    async def main() -> None:
        async with remote.client(remote.keys["rw"], mode) as c:
            assert {t.name for t in (await c.list_tools()).tools} == ALL_TOOLS
            made = await call(
                c,
                "memory_append",
                {"kind": "fact", "text": f"Gate code for the {mode} depot is 4417."},
            )
        async with remote.client(remote.keys["read"], mode) as c:
            assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS
            hits = await call(c, "memory_recall", {"text": f"gate code {mode} depot"})
            assert hits["hits"][0]["event_id"] == made["event_id"]
            assert (
                await refused(c, "memory_append", {"kind": "fact", "text": "sneaky"}) == FORBIDDEN
            )
            got = await call(c, "memory_get", {"id": made["event_id"]})
        http = remote.server.client(remote.keys["read"])
        same = http.get(f"/v1/memory/event/{made['event_id']}").json()
        assert got == same  # the structured content is the route's JSON
        texts = [
            e["text"]
            for e in http.get("/v1/memory/events", params={"limit": 1000}).json()["events"]
        ]
        assert "sneaky" not in texts

    anyio.run(main)


def test_the_client_carries_the_servers_errors(remote: Remote) -> None:
    async def main() -> None:
        async with AsyncMemspine(remote.server.url, remote.keys["read"]) as client:
            who = await client.whoami()
            assert who.tenant_id == remote.keys["tenant"] and who.scopes == ["read"]
            with pytest.raises(client_errors.Forbidden, match="missing the 'write' scope"):
                await client.append("fact", "x")
        async with AsyncMemspine(remote.server.url, remote.keys["rw"]) as client:
            made = await client.append("fact", "client", idempotency_key="c-1")
            again = await client.append("fact", "client", idempotency_key="c-1")
            assert (again.event_id, again.replayed) == (made.event_id, True)
            derived = await client.append("x", source_event_ids=[made.event_id])
            would = await client.would_delete(made.event_id, cascade=True)
            assert would.would_delete == [made.event_id, derived.event_id]
            page = await client.list_events(kind="x", limit=5)
            assert [e.event_id for e in page.events] == [derived.event_id]
            with pytest.raises(client_errors.NotFound, match="no event with that id"):
                await client.get("00000000-0000-4000-8000-000000000000")
            with pytest.raises(client_errors.NotFound, match="no such route"):  # quoted
                await client.get("../../v1/whoami")

    anyio.run(main)


# -- stdio -------------------------------------------------------------------------------------


def test_stdio_embedded_on_a_data_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    params = stdio(
        ["--data-dir", str(data_dir), "--tenant", "agent-1"], {"MEMSPINE_EMBEDDING_DIM": "4"}
    )

    async def main() -> None:
        async with Client(params) as c:
            assert {t.name for t in (await c.list_tools()).tools} == ALL_TOOLS
            made = await call(
                c, "memory_append", {"kind": "preference", "text": "Prefers answers in French."}
            )
            hits = await c.call_tool("memory_recall", {"text": "French"})
            assert hits.structured_content["hits"][0]["event_id"] == made["event_id"]
            assert f"{made['event_id']} · preference ·" in text(hits)
        read_only = stdio(["--data-dir", str(data_dir), "--tenant", "agent-1", "--read-only"])
        async with Client(read_only) as c:
            assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS
            assert await refused(c, "memory_append", {"kind": "x", "text": "y"}) == FORBIDDEN
            assert (await call(c, "memory_get", {"id": made["event_id"]}))[
                "text"
            ] == "Prefers answers in French."

    anyio.run(main)
    assert (data_dir / "agent-1").is_dir()


def test_stdio_as_a_client_of_the_server(remote: Remote) -> None:
    http = remote.server.client(remote.keys["rw"])
    r = http.post(
        "/v1/memory/event", json={"kind": "fact", "text": "The stdio bridge reads invoice 5521."}
    )
    assert r.status_code == 201
    event_id = r.json()["event_id"]
    params = stdio(["--url", remote.server.url], {"MEMSPINE_API_KEY": remote.keys["read"]})

    async def main() -> None:
        async with Client(params) as c:
            assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS
            hits = await call(c, "memory_recall", {"text": "invoice 5521"})
            assert hits["hits"][0]["event_id"] == event_id
            got = await call(c, "memory_get", {"id": event_id})
            assert got == http.get(f"/v1/memory/event/{event_id}").json()
            unknown = {"id": "00000000-0000-4000-8000-000000000000"}
            assert await refused(c, "memory_get", unknown) == NO_EVENT

    anyio.run(main)


def test_stdio_takes_the_url_of_the_mcp_endpoint_too(remote: Remote) -> None:
    """README names http://…/mcp for the HTTP endpoint: given to --url it must not hang."""
    params = stdio(["--url", remote.url + "/"], {"MEMSPINE_API_KEY": remote.keys["read"]})

    async def main() -> None:
        with anyio.fail_after(60):
            async with Client(params) as c:
                assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS

    anyio.run(main)


def test_stdio_embedded_refuses_a_directory_a_server_is_serving(remote: Remote) -> None:
    data_dir = remote.server.data_dir
    # The serving server's own read-audit journal comes and goes with its reads: not this.
    before = sorted(p.name for p in data_dir.iterdir() if p.name != READS_JOURNAL)
    done = subprocess.run(
        [*COMMAND, "mcp", "--data-dir", str(data_dir), "--tenant", remote.keys["tenant"]],
        env={k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc_pid(remote.server) is not None
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()  # one sentence, no traceback
    assert line.startswith(f"memspine mcp: {data_dir.resolve()} is in use by memspine-server (pid ")
    assert f"memspine mcp --url {remote.server.url}" in line
    assert sorted(p.name for p in data_dir.iterdir() if p.name != READS_JOURNAL) == before


def test_the_start_line_of_a_server_with_issued_keys(remote: Remote) -> None:
    lines = remote.server.log_path.read_text().splitlines()
    [start] = [
        line for line in lines if '"logger":"memspine.server"' in line and "ready on" in line
    ]
    assert '"auth":"issued keys"' in start
    assert "only keys made by memspine-admin key create are accepted" in start


def proc_pid(server: ServerProcess) -> int | None:
    """The server's pid while it runs."""
    return server.proc.pid if server.proc is not None and server.proc.poll() is None else None


def test_the_first_answer_of_a_silent_server_is_awaited_10_s_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something that accepts the connection and never answers: a sentence, not a hang."""
    from memspine.mcp import stdio as bridge

    monkeypatch.setattr(bridge, "FIRST_ANSWER_SECS", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"no answer from .* within 0 s; is memspine-server"):
            anyio.run(bridge.serve_remote, url, "t1")
    assert time.monotonic() - started < 10


def test_stdio_refuses_a_bad_start(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    (tmp_path / "a-file").write_text("not a directory")
    issued = tmp_path / "issued"
    issue_keys(issued)
    cases = [
        ([], {}, "give --url"),
        (["--tenant", "../etc"], {"MEMSPINE_DATA_DIR": str(tmp_path)}, "--tenant must be"),
        (["--url", "http://127.0.0.1:9"], {"MEMSPINE_API_KEY": "t1"}, "cannot reach"),
        (["--url", "ftp://x"], {"MEMSPINE_API_KEY": "t1"}, "--url must be the server's address"),
        (
            ["--data-dir", str(tmp_path / "a-file"), "--tenant", "t1"],
            {},
            f"--data-dir: '{tmp_path / 'a-file'}' exists and is not a directory",
        ),
        (
            ["--tenant", "t1"],
            {"MEMSPINE_DATA_DIR": str(tmp_path / "a-file" / "data")},
            "MEMSPINE_DATA_DIR: ",
        ),
        (["--data-dir", str(issued), "--tenant", "t1"], {}, "has issued keys"),
    ]
    # All at once: each is its own process, and each waits mostly on its own imports.
    procs = [
        subprocess.Popen(
            [*COMMAND, "mcp", *args],
            env={**clean, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for args, env, _ in cases
    ]
    for proc, (args, _, expected) in zip(procs, cases, strict=True):
        out, err = proc.communicate(timeout=60)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert done.returncode != 0, args
        assert expected in done.stderr, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1, done.stderr  # one sentence, no traceback
        assert done.stdout == ""  # stdout is the protocol's alone
    assert not (issued / "t1").exists()  # refused before anything was opened
