"""Erasure through a real server, the way users reach the tenants that used to keep their deleted
text: README's first session and a restart, a tenant written only by an embedded `memspine mcp`
(which purges its own deletes too),
a tenant closed for idleness, one evicted from the LRU, and a purge the disk cannot hold. Two
server starts on one data directory (a small tmpfs where the machine lets us mount one)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memspine.engine import PURGE_PENDING_ROOM
from storage.erasure import swap
from storage.index import vecfile
from tests.support.erasure import ballast, scan
from tests.support.mcp_calls import call, stdio, text
from tests.support.servers import ServerProcess
from tests.support.wait import wait_until

FIRST_ENV = {  # every tenant closes soon: after 1 s idle, or when two others were used since
    "MEMSPINE_TENANT_IDLE_SECS": "1",
    # Two, not one: the background purger may hold a slot while a request wants another.
    "MEMSPINE_MAX_OPEN_TENANTS": "2",
    "MEMSPINE_PURGE_INTERVAL_SECS": "0.5",
}
# Tenants stay open here: while the disk is full, only the purge should meet it.
SECOND_ENV = {"MEMSPINE_PURGE_INTERVAL_SECS": "0.5"}
TURN = {
    "kind": "turn",
    "ts": 1791208939000000,
    "text": "Lena: the billing cutover is planned for Saturday 10 October",
    "properties": {"speaker": "lena", "conversation": "c-1"},
}
FACT_TEXT = "Billing cutover planned for 2026-10-10"
MCP_TENANT = "agent-1"
MCP_TEXTS = [
    "Prefers answers in French.",
    "Home address: 12 Quai Zqvbrt, Lyon.",
    "Badge number Xkwqpl-5521 opens the lab.",
]
EMBEDDED_SECRET = "Locker combination Rrtvbq-0813."  # deleted while the embedded server runs


class World:
    """One data directory; a first server, then the second one started on it after a restart."""

    def __init__(self, data_dir: Path, on_tmpfs: bool) -> None:
        self.data_dir = data_dir
        self.on_tmpfs = on_tmpfs
        self.first = ServerProcess(data_dir, FIRST_ENV)
        self.second: ServerProcess | None = None
        self.mcp_ids: list[str] = []
        self.embedded_purge_secs: float | None = None  # None: the embedded purger never did it

    def restarted(self) -> ServerProcess:
        """The second server (stopping the first, which closes every tenant it has open)."""
        if self.second is None:
            self.first.stop()
            self.second = ServerProcess(self.data_dir, SECOND_ENV).start()
        return self.second


def mount_tmpfs(path: Path, size: str) -> bool:
    """Mount a tmpfs at path; False where that is refused (not root)."""
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    data_dir = tmp_path_factory.mktemp("attacks") / "data"
    on_tmpfs = mount_tmpfs(data_dir, "32m")
    w = World(data_dir, on_tmpfs)
    try:
        # A tenant written only by an embedded MCP server: no embeddings, closed when it exits.
        env = {"MEMSPINE_EMBEDDING_DIM": "4", "MEMSPINE_PURGE_INTERVAL_SECS": "0.3"}
        params = stdio(["--data-dir", str(data_dir), "--tenant", MCP_TENANT], env)

        async def agent() -> None:
            async with Client(params) as c:
                for line in MCP_TEXTS:
                    made = await call(c, "memory_append", {"kind": "fact", "text": line})
                    w.mcp_ids.append(made["event_id"])
                made = await call(c, "memory_append", {"kind": "fact", "text": EMBEDDED_SECRET})
                await call(c, "memory_delete", {"id": made["event_id"], "dry_run": False})
                started = time.monotonic()
                while time.monotonic() - started < 15:  # the embedded server's own purger
                    if not scan(data_dir, {"secret": EMBEDDED_SECRET.encode()}):
                        w.embedded_purge_secs = time.monotonic() - started
                        break
                    await anyio.sleep(0.1)

        anyio.run(agent)
        assert (data_dir / MCP_TENANT / "vectors.hnsw").stat().st_size == vecfile.HEADER.size
        w.first.start()
        yield w
    finally:
        w.first.stop()
        if w.second is not None:
            w.second.stop()
        if on_tmpfs:
            subprocess.run(["umount", "-l", str(data_dir)], check=False)


def tenant_closed(server: ServerProcess, tenant: str, timeout: float = 10) -> None:
    """Wait until the tenant's closing has saved its (empty) vector file."""
    path = server.data_dir / tenant / "vectors.hnsw"
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{tenant} was not closed"
        time.sleep(0.05)
    assert path.stat().st_size == vecfile.HEADER.size  # the shape: a vector file with no record


def metric(server: ServerProcess, name: str) -> float:
    """One unlabelled value from /metrics."""
    body = httpx.get(server.url + "/metrics", timeout=10).text
    found = re.search(rf"^{name}(?:_total)? ([0-9.e+]+)$", body, re.M)
    assert found, name
    return float(found.group(1))


def texts(server: ServerProcess, tenant: str, n: int, word: str) -> list[str]:
    """Append n text-only events, each with a word no other event has; their ids."""
    c = server.client(tenant)
    ids = []
    for i in range(n):
        resp = c.post("/v1/memory/event", json={"kind": "turn", "text": f"{word}{i:03d} said hi"})
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["event_id"])
    return ids


def purged(server: ServerProcess, tenant: str, event_id: str) -> None:
    """DELETE ?purge=true must answer that the bytes are gone."""
    resp = server.client(tenant).delete(f"/v1/memory/event/{event_id}?purge=true")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"deleted": True, "purged": True, "deleted_ids": [event_id]}


def test_a_tenant_closed_for_idleness_is_purged(world: World) -> None:
    server = world.first
    opens, closes = (metric(server, f"memspine_tenant_{m}") for m in ("opens", "idle_closes"))
    ids = texts(server, "idle-1", 5, "Qzvdrk")
    # No other request comes: only the idle closer can close it, once per open (on a busy
    # machine an append can wait out the idle second, and the tenant is reopened).
    wait_until(
        lambda: (
            metric(server, "memspine_tenant_idle_closes") - closes
            >= metric(server, "memspine_tenant_opens") - opens
        ),
        "idle-1 closed for idleness",
    )
    tenant_closed(server, "idle-1")
    purged(server, "idle-1", ids[2])
    assert scan(world.data_dir, {"text": b"Qzvdrk002"}) == {}
    assert scan(world.data_dir, {"kept": b"Qzvdrk003"})  # the scan can fail


def test_an_evicted_tenant_is_purged(world: World) -> None:
    server = world.first
    evictions = metric(server, "memspine_tenant_evictions")
    ids = texts(server, "evict-1", 3, "Wbxnrt")
    for other in ("evict-2", "evict-3"):  # two slots: the least recently used makes room
        texts(server, other, 1, "Hjkvbn")
    tenant_closed(server, "evict-1")
    assert metric(server, "memspine_tenant_evictions") > evictions
    purged(server, "evict-1", ids[0])
    assert scan(world.data_dir, {"text": b"Wbxnrt000"}) == {}


def test_readmes_first_session_then_a_restart(world: World) -> None:
    c = world.first.client("my-project")
    turn = c.post("/v1/memory/event", json=TURN)
    assert turn.status_code == 201
    fact_body = {
        "kind": "fact",
        "ts": 1791208999000000,
        "text": FACT_TEXT,
        "properties": {"topic": "cutover_date", "source_event_ids": [turn.json()["event_id"]]},
    }
    made = c.post("/v1/memory/event", json=fact_body, headers={"Idempotency-Key": "fact-cutover-1"})
    assert made.status_code == 201
    fact = made.json()["event_id"]

    server = world.restarted()  # `make run` stopped and started again
    patterns = {"text": FACT_TEXT.encode(), "property": b"cutover_date"}
    assert scan(world.data_dir / "my-project", patterns)
    purged(server, "my-project", fact)
    assert scan(world.data_dir, patterns) == {}
    assert scan(world.data_dir, {"turn": TURN["text"].encode()})  # the turn was not deleted
    again = server.client("my-project").delete(f"/v1/memory/event/{fact}?purge=true")
    assert again.status_code == 404


@asynccontextmanager
async def mcp_client(server: ServerProcess, tenant: str) -> AsyncIterator[Client]:
    """The SDK's Streamable HTTP client on the server's /mcp (local mode: the token is the tenant)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {tenant}"}, timeout=30) as http,
        Client(streamable_http_client(server.url + "/mcp", http_client=http)) as client,
    ):
        yield client


def wait_until_clean(
    data_dir: Path, tenant: str, patterns: dict[str, bytes], timeout: float = 20
) -> None:
    """Until no file holds any pattern and the tenant's marker is gone (the background purger)."""
    marker = data_dir / tenant / swap.PENDING
    deadline = time.monotonic() + timeout
    while scan(data_dir, patterns) or marker.exists():
        assert time.monotonic() < deadline, (scan(data_dir, patterns), marker.exists())
        time.sleep(0.1)


def test_a_tenant_written_only_over_mcp_is_purged(world: World) -> None:
    assert world.embedded_purge_secs is not None  # erased while `memspine mcp` ran
    server = world.restarted()
    now, later = world.mcp_ids[1], world.mcp_ids[2]

    async def agent() -> dict[str, Any]:
        async with mcp_client(server, MCP_TENANT) as c:
            done = await call(c, "memory_delete", {"id": now, "dry_run": False, "purge": True})
            result = await c.call_tool("memory_delete", {"id": later, "dry_run": False})
            assert "leave the disk at the next purge" in text(result)
            return done

    assert anyio.run(agent) == {"deleted": True, "purged": True, "deleted_ids": [now]}
    assert scan(world.data_dir, {"address": b"Zqvbrt"}) == {}
    wait_until_clean(
        world.data_dir, MCP_TENANT, {"badge": b"Xkwqpl"}
    )  # the background purger's work
    assert scan(world.data_dir, {"kept": MCP_TEXTS[0].encode()})


def test_a_purge_the_disk_cannot_hold_is_pending_then_done(world: World) -> None:
    if not world.on_tmpfs:
        pytest.skip("needs a small file system (mounting a tmpfs needs root)")
    server = world.restarted()
    c = server.client("full-1")
    filler = "lorem ipsum dolor sit amet " * 300
    bodies = [{"kind": "turn", "text": f"{filler} Vvkxzq{i:03d}"} for i in range(80)]
    with ThreadPoolExecutor(8) as pool:
        ids = list(
            pool.map(lambda b: c.post("/v1/memory/event", json=b).json()["event_id"], bodies)
        )
    weight = ballast(world.data_dir, leave=256 << 10)  # room for a delete, not for a purge
    try:
        resp = c.delete(f"/v1/memory/event/{ids[7]}?purge=true")
        assert resp.status_code == 202, resp.text
        assert resp.json() == {
            "deleted": True,
            "purged": False,
            "purge_pending": True,
            "deleted_ids": [ids[7]],
            "detail": PURGE_PENDING_ROOM,
        }
        assert c.get(f"/v1/memory/event/{ids[7]}").status_code == 404  # the delete stands

        async def agent() -> tuple[dict[str, Any], str]:
            async with mcp_client(server, "full-1") as m:
                args = {"id": ids[8], "dry_run": False, "purge": True}
                result = await m.call_tool("memory_delete", args)
                assert not result.is_error, text(result)
                return result.structured_content, text(result)

        out, said = anyio.run(agent)
        assert out == resp.json() | {"deleted_ids": [ids[8]]}  # the same answer as the route
        assert "still on disk" in said
        assert (world.data_dir / "full-1" / swap.PENDING).exists()
        gone = {f"word {i}": f"Vvkxzq{i:03d}".encode() for i in (7, 8)}
        assert set(scan(world.data_dir / "full-1", gone)) == set(gone)
        time.sleep(1.2)  # two sweeps of the background purger meet the full disk too
        assert set(scan(world.data_dir / "full-1", gone)) == set(gone)
    finally:
        weight.unlink()
    wait_until_clean(world.data_dir, "full-1", gone)  # room again: the background purger finishes
    assert scan(world.data_dir, {"kept": b"Vvkxzq009"})
    assert shutil.disk_usage(world.data_dir).free > 1 << 20
