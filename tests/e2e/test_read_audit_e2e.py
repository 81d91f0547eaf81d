"""Read audit with real processes: kill -9 under read load in each mode, restart, the chain
verified by `memspine-admin audit verify` (and found broken once a record is edited); MCP over
Streamable HTTP and the embedded stdio bridge leave their records; a real full disk (a small
tmpfs, tests/support/disk_full.py) in each mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx as httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memspine_admin.control import ControlDB
from memspine_admin.readaudit import verify_reads
from storage.readlog import records
from storage.readlog.format import HEADER_BYTES, decode_header, frames
from storage.readlog.logfile import reads_path
from tests.support.disk_full import check_refusal, fill_disk
from tests.support.mcp_calls import stdio
from tests.support.servers import ServerProcess, cheap_hasher
from tests.support.wait import wait_until

ADMIN = Path(sys.executable).parent / "memspine-admin"
READERS = 6
MIN_ANSWERED = 150


def issue(data_dir: Path) -> dict[str, str]:
    with ControlDB.open(data_dir, create=True, hasher=cheap_hasher()) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
        rw = db.create_key(tenant, "rw", ("read", "write"), actor="test").api_key
        audit = db.create_key(tenant, "auditor", ("audit",), actor="test").api_key
    return {"tenant": tenant, "rw": rw, "audit": audit}


class Reader(threading.Thread):
    """Reads as fast as the server answers; keeps each answered request's id and event ids."""

    def __init__(self, url: str, token: str, ids: list[str], number: int) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.ids, self.number = url, token, ids, number
        self.answered: dict[str, list[str]] = {}

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Memspine-Purpose": "load test"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=10) as c:
            for n in range(100_000):
                try:
                    if n % 2:
                        r = c.post("/v1/memory/recall", json={"text": f"note {n % 7}", "k": 3})
                        got = (
                            [h["event_id"] for h in r.json()["hits"]]
                            if r.status_code == 200
                            else []
                        )
                    else:
                        r = c.get(f"/v1/memory/event/{self.ids[(n + self.number) % len(self.ids)]}")
                        got = [r.json()["event_id"]] if r.status_code == 200 else []
                except (httpx.HTTPError, ValueError):
                    return  # the server died; what was answered before counts
                if r.status_code != 200:
                    return
                if got:
                    self.answered[r.headers["x-request-id"]] = got


def admin(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    env["MEMSPINE_DATA_DIR"] = str(data_dir)
    command = [str(ADMIN)] if ADMIN.exists() else [sys.executable, "-m", "memspine_admin.cli"]
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=60)


def recorded(data_dir: Path, tenant: str) -> dict[str, list[str]]:
    """Every record of the tenant by request id (ids of one request joined)."""
    out: dict[str, list[str]] = {}
    for f in records(data_dir / tenant):
        out.setdefault(f.read.request_id, []).extend(f.read.event_ids)
    return out


def load_and_kill(
    server: ServerProcess, keys: dict[str, str], ids: list[str]
) -> dict[str, list[str]]:
    readers = [Reader(server.url, keys["rw"], ids, i) for i in range(READERS)]
    for r in readers:
        r.start()
    deadline = time.monotonic() + 60
    while sum(len(r.answered) for r in readers) < MIN_ANSWERED and time.monotonic() < deadline:
        time.sleep(0.01)
    server.stop(signal.SIGKILL)
    for r in readers:
        r.join(timeout=15)
    answered: dict[str, list[str]] = {}
    for r in readers:
        answered.update(r.answered)
    assert len(answered) >= MIN_ANSWERED
    return answered


@pytest.mark.parametrize("mode", ["durable", "buffered"])
def test_kill_9_under_read_load_then_restart(tmp_path: Path, mode: str) -> None:
    data_dir = tmp_path / "data"
    keys = issue(data_dir)
    env = {"MEMSPINE_READ_AUDIT": mode}
    server = ServerProcess(data_dir, env).start()
    with server.client(keys["rw"]) as c:
        ids = [
            c.post(
                "/v1/memory/event", json={"kind": "note", "text": f"note {i} of the log"}
            ).json()["event_id"]
            for i in range(20)
        ]
        # Reads answered and committed well before the crash (buffered: seen by the auditor).
        early = {}
        for i in range(5):
            r = c.get(f"/v1/memory/event/{ids[i]}")
            early[r.headers["x-request-id"]] = [ids[i]]
    with server.client(keys["audit"]) as c:
        deadline = time.monotonic() + 30
        while len(c.get("/v1/memory/audit/reads").json()["reads"]) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    answered = load_and_kill(server, keys, ids)
    server.start()  # the tail a crash cut short is dropped on the next write
    found = recorded(data_dir, keys["tenant"])
    for request_id, got in early.items():
        assert found[request_id] == got
    for request_id, got in found.items():  # nothing recorded that was not asked for
        assert got == answered.get(request_id, got)
    if mode == "durable":  # every answered read has its record
        missing = [rid for rid in answered if rid not in found]
        assert missing == []
        for request_id, got in answered.items():
            assert found[request_id] == got
    with server.client(keys["rw"]) as c:  # the chain goes on after the restart
        c.get(f"/v1/memory/event/{ids[0]}", headers={"Memspine-Purpose": "after"})
    server.stop()
    verdict = admin(data_dir, "audit", "verify", keys["tenant"])
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "intact" in verdict.stdout


def test_verify_names_an_edited_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    keys = issue(data_dir)
    server = ServerProcess(data_dir).start()
    with server.client(keys["rw"]) as c:
        made = c.post("/v1/memory/event", json={"kind": "note", "text": "x"}).json()["event_id"]
        for _ in range(6):
            c.get(f"/v1/memory/event/{made}")
    server.stop()  # the writer hands its heads over when it stops
    assert admin(data_dir, "audit", "verify", keys["tenant"]).returncode == 0
    # A backup carries the read records, and the restored directory verifies.
    assert admin(data_dir, "backup", str(tmp_path / "bk")).returncode == 0
    restored = tmp_path / "restored"
    assert admin(restored, "restore", str(tmp_path / "bk")).returncode == 0
    assert [f.read for f in records(restored / keys["tenant"])] == [
        f.read for f in records(data_dir / keys["tenant"])
    ]
    assert admin(restored, "audit", "verify", keys["tenant"]).returncode == 0
    path = reads_path(data_dir / keys["tenant"])
    buf = bytearray(path.read_bytes())
    third = list(frames(bytes(buf), HEADER_BYTES, decode_header(bytes(buf)).base_seq))[2]
    buf[third.end - 1] ^= 0xFF  # the last byte of record 3's event id
    path.write_bytes(bytes(buf))
    out = admin(data_dir, "--json", "audit", "verify", keys["tenant"])
    assert out.returncode == 1
    assert '"bad_seq":4' in out.stdout.replace(" ", "")
    assert "record 4" in out.stdout


def test_mcp_over_http_and_the_embedded_bridge_leave_records(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    keys = issue(data_dir)
    server = ServerProcess(data_dir).start()
    with server.client(keys["rw"]) as c:
        made = c.post("/v1/memory/event", json={"kind": "note", "text": "billing moved"}).json()

    async def over_http() -> dict[str, Any]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {keys['rw']}"}, timeout=30) as h,
            Client(streamable_http_client(server.url + "/mcp", http_client=h)) as client,
        ):
            result = await client.call_tool(
                "memory_recall", {"text": "billing", "purpose": "support"}
            )
            out: dict[str, Any] = result.structured_content
            return out

    hits = anyio.run(over_http)
    server.stop()
    mine = [f.read for f in records(data_dir / keys["tenant"]) if f.read.door == "mcp"]
    assert [(r.route, r.purpose, r.event_ids) for r in mine] == [
        ("memory_recall", "support", [h["event_id"] for h in hits["hits"]])
    ]
    assert made["event_id"] in mine[0].event_ids

    # The embedded bridge on the same directory (the server has stopped).
    params = stdio(["--data-dir", str(data_dir), "--tenant", keys["tenant"]])

    async def over_stdio() -> dict[str, Any]:
        async with Client(params) as client:
            result = await client.call_tool("memory_get", {"id": made["event_id"], "purpose": "p"})
            out: dict[str, Any] = result.structured_content
            return out

    got = anyio.run(over_stdio)
    assert got["event_id"] == made["event_id"]
    bridged = [f.read for f in records(data_dir / keys["tenant"]) if f.read.door == "bridge"]
    assert [(r.key_id, r.route, r.purpose, r.event_ids) for r in bridged] == [
        ("embedded", "memory_get", "p", [made["event_id"]])
    ]
    verdict = admin(data_dir, "audit", "verify", keys["tenant"])
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


def test_cli_exports_beside_a_running_server_leave_records_in_its_chain(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    keys = issue(data_dir)
    server = ServerProcess(data_dir).start()
    try:
        with server.client(keys["rw"]) as c:
            mine = [
                c.post(
                    "/v1/memory/event",
                    json={"kind": "turn", "text": f"bob's order {i}", "subjects": ["cust-bob"]},
                ).json()["event_id"]
                for i in range(3)
            ]
            other = c.post("/v1/memory/event", json={"kind": "turn", "text": "x"}).json()
            assert c.get(f"/v1/memory/event/{mine[0]}").status_code == 200  # the server's file
            out = admin(
                data_dir, "subject", "export", keys["tenant"], "cust-bob", "--purpose", "art. 15"
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.count('"type":"event"') == 3
            whole = admin(data_dir, "export", keys["tenant"], "--out", str(tmp_path / "all.ndjson"))
            assert whole.returncode == 0, whole.stderr
            bad = admin(
                data_dir, "subject", "export", keys["tenant"], "cust-bob", "--purpose", "a\x01b"
            )
            assert bad.returncode != 0 and "control characters" in bad.stderr
            # The server appends after the commands' records: its chain goes on past them.
            assert c.get(f"/v1/memory/event/{mine[1]}").status_code == 200
        with server.client(keys["audit"]) as c:
            deadline = time.monotonic() + 30
            while len(c.get("/v1/memory/audit/reads").json()["reads"]) < 4:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        server.stop()
    found = [f.read for f in records(data_dir / keys["tenant"])]
    assert [(r.door, r.route) for r in found] == [
        ("http", "/v1/memory/event/{event_id:str}"),
        ("cli", "subject export"),
        ("cli", "export"),
        ("http", "/v1/memory/event/{event_id:str}"),
    ]
    cli = found[1:3]
    assert all(r.key_id.startswith("cli:") for r in cli)
    assert cli[0].purpose == "art. 15" and sorted(cli[0].event_ids) == sorted(mine)
    assert cli[1].purpose is None
    assert sorted(cli[1].event_ids) == sorted([*mine, other["event_id"]])
    verdict = admin(data_dir, "audit", "verify", keys["tenant"])
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


def _read(c: httpx.Client, n: int, ids: list[str]) -> httpx.Response:
    """A GET of one event or a recall by vector, by turns (keyword recall may be refused while
    its index cannot commit on the full disk, docs/operations.md)."""
    if n % 2:
        return c.post("/v1/memory/recall", json={"embedding": [0.5, 0.5, 0.5, 0.5], "k": 8})
    return c.get(f"/v1/memory/event/{ids[n % len(ids)]}")


def _answered_ids(r: httpx.Response) -> list[str]:
    body = r.json()
    return [h["event_id"] for h in body["hits"]] if "hits" in body else [body["event_id"]]


def _full_disk_server(small_fs: Path, tmp_path: Path, mode: str) -> tuple[Any, ...]:
    """A server on the small filesystem with a tenant of a few events and reads recorded
    (its read log made), then the filesystem filled: (server, keys, event ids, filler)."""
    data_dir = small_fs / "data"
    keys = issue(data_dir)
    server = ServerProcess(data_dir, {"MEMSPINE_READ_AUDIT": mode})
    server.log_path = tmp_path / "server.log"
    server.start()
    with server.client(keys["rw"]) as c:
        ids = [
            c.post(
                "/v1/memory/event",
                json={"kind": "note", "text": f"parcel {i}", "embedding": [0.5, 0.5, 0.5, i]},
            ).json()["event_id"]
            for i in range(8)
        ]
        assert c.get(f"/v1/memory/event/{ids[0]}").status_code == 200
        assert _read(c, 1, ids).status_code == 200
    wait_until(lambda: len(recorded(data_dir, keys["tenant"])) == 2, "the first records written")
    return server, keys, ids, fill_disk(small_fs)


def test_a_full_disk_in_buffered_mode_holds_the_records_until_space_returns(
    small_fs: Path, tmp_path: Path
) -> None:
    """Reads go on while the disk is full, their records held in memory; once space is freed
    every answered read has its record, the chain verifies, and both still hold after a
    restart."""
    server, keys, ids, filler = _full_disk_server(small_fs, tmp_path, "buffered")
    data_dir, tenant = server.data_dir, keys["tenant"]
    answered: dict[str, list[str]] = {}
    try:
        with server.client(keys["rw"]) as c:
            for n in range(120):  # far more than the log's last page holds
                r = _read(c, n, ids)
                assert r.status_code == 200, (r.status_code, r.text)
                answered[r.headers["x-request-id"]] = _answered_ids(r)
            # The disk is full: the log cannot have grown past its last page.
            assert len(recorded(data_dir, tenant)) < len(answered)
            filler.unlink()
            wait_until(
                lambda: set(answered) <= set(recorded(data_dir, tenant)),
                "every answered read recorded once space returned",
            )
            r = _read(c, 0, ids)
            answered[r.headers["x-request-id"]] = _answered_ids(r)
        server.stop()
        found = recorded(data_dir, tenant)
        assert all(found[rid] == got for rid, got in answered.items())
        with ControlDB.open(data_dir) as db:
            assert verify_reads(data_dir, db, tenant).ok
        server.start()
        with server.client(keys["rw"]) as c:
            r = _read(c, 1, ids)
            answered[r.headers["x-request-id"]] = _answered_ids(r)
        server.stop()
        found = recorded(data_dir, tenant)
        assert all(found[rid] == got for rid, got in answered.items())
        verdict = admin(data_dir, "audit", "verify", tenant)
        assert verdict.returncode == 0, verdict.stdout + verdict.stderr
        assert "read records held in memory, the disk is full" in server.log_path.read_text()
    finally:
        server.stop()


def test_a_full_disk_in_durable_mode_refuses_reads_it_cannot_record(
    small_fs: Path, tmp_path: Path
) -> None:
    """Durable: once the log cannot grow, reads are refused with 503 and Retry-After (the API's
    error shape); every read answered has its record, and reads are answered again once space
    is freed."""
    server, keys, ids, filler = _full_disk_server(small_fs, tmp_path, "durable")
    data_dir, tenant = server.data_dir, keys["tenant"]
    answered: dict[str, list[str]] = {}
    refused = []
    try:
        with server.client(keys["rw"]) as c:
            for n in range(400):
                r = _read(c, n, ids)
                if r.status_code == 200:
                    answered[r.headers["x-request-id"]] = _answered_ids(r)
                    assert r.headers["x-request-id"] in recorded(data_dir, tenant)
                else:
                    check_refusal(r)
                    refused.append(r)
                    if len(refused) >= 5:
                        break
            assert len(refused) == 5, "the read log never filled the disk"
            filler.unlink()
            for n in range(4):
                r = _read(c, n, ids)
                assert r.status_code == 200, (r.status_code, r.text)
                answered[r.headers["x-request-id"]] = _answered_ids(r)
        found = recorded(data_dir, tenant)
        assert all(found[rid] == got for rid, got in answered.items())
        assert not {r.headers["x-request-id"] for r in refused} & set(found)
        server.stop()
        verdict = admin(data_dir, "audit", "verify", tenant)
        assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    finally:
        server.stop()
